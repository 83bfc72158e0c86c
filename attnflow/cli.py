"""The `attnflow` command: Hydra composes the config, `run` does the work.

Errors a person can fix (a bad config value, a run that turned NaN) are printed as one
sentence on stderr with exit code 2 and no traceback; nothing is written then.
"""

from __future__ import annotations

import sys
from pathlib import Path

import logging

import hydra
import xarray as xr
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ._build import config_source
from ._errors import ConfigError, NonFiniteStateError, SolverFailure
from ._study import config_yaml, run, write_results


def _fail(message: str) -> None:
    print(f"attnflow: error: {message}", file=sys.stderr)
    sys.exit(2)


def _existing_config(path: Path) -> str | None:
    try:
        with xr.open_dataset(path, engine="netcdf4") as ds:  # lazy: only the attributes are read
            return ds.attrs.get("config")
    except (OSError, ValueError):
        return None


@hydra.main(version_base=None, config_path=config_source()[0], config_name="config")
def main(cfg: DictConfig) -> None:
    from ._build import validate_config

    # Hydra sets the root logger to INFO; JAX would then report every absent backend.
    logging.getLogger("jax").setLevel(logging.WARNING)
    container = OmegaConf.to_container(cfg, resolve=True)
    out = Path(HydraConfig.get().runtime.output_dir)
    path = out / "results.nc"
    try:
        resolved = validate_config(container)
        if path.exists() and not resolved["overwrite"]:
            if _existing_config(path) == config_yaml(resolved):
                print(f"attnflow: {path} already holds this run; skipping it.")
                return
            raise ConfigError(
                f"{path} holds a different run; choose another hydra.run.dir or set overwrite=true."
            )
        ds = run(container)
    except ConfigError as error:
        _fail(str(error))
    except (NonFiniteStateError, SolverFailure) as error:
        # Nothing computed is lost: the statistics, NaN where the state blew up, go to a
        # file that cannot be mistaken for a finished run.
        kept = write_results(error.dataset, out / "incomplete.nc")
        _fail(f"{str(error).rstrip('.')}; what was computed is in {kept}.")
    write_results(ds, path)
    print(f"attnflow: wrote {path}")
    if resolved["plot"]:
        from ._plots import plot_summary

        figure = plot_summary(ds, out / "summary.png", title=_title(resolved))
        print(f"attnflow: wrote {figure}")


def _title(cfg: dict) -> str:
    return (
        f"{cfg['dynamics'].upper()} on norm={cfg['norm']}, n={cfg['n']}, d={cfg['d']}, "
        f"{cfg['members']} members, {cfg['solver']} dt={cfg['dt']}"
    )


if __name__ == "__main__":
    main()
