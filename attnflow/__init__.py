"""attnflow: self-attention dynamics as an interacting particle system, in JAX.

The one-system entry point is `simulate`; ensembles go through `solve_ensemble`; a
whole configured study (the `attnflow` command without Hydra) is `run(config)`, and a
figure of the literature is `run_experiment(name, overrides)`.

Names are imported on first use (`lazy_loader`, from the names in `__init__.pyi`, which
editors and type checkers read), so that `import attnflow` (and the command line)
only pays for the parts a run needs: matplotlib for plots, diffrax for adaptive runs.
"""

from __future__ import annotations

import os

import lazy_loader

# JAX's CPU LAPACK kernels (eig, svd, qr) run on the OpenBLAS that scipy ships. Its own
# thread pool, stacked on XLA's threads, thrashed a small machine (the QK/OV spectra of
# SmolLM2 ran many times slower than with one thread: benchmarks/README.md); set before
# scipy loads, a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_lazy_getattr, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)


def __getattr__(name: str):
    """A public name, imported on first use; `__version__`, read from the installed
    package's metadata (pyproject.toml's version) when first asked for."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("attnflow")
        except PackageNotFoundError:  # a source tree that was never installed
            return "unknown"
    return _lazy_getattr(name)
