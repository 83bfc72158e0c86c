"""`run(config) -> xarray.Dataset`: one configured study, end to end, without Hydra."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
import yaml

from ._build import betas_of, build_system, save_plan, validate_config
from ._ensemble import check_ensemble, solve_ensemble
from ._errors import NonFiniteStateError, SolverFailure

_DIMS = {
    "x": ("token", "dim"),
    "cluster_sizes": ("cluster",),
    "attention": ("head", "query", "key"),
    "attention_rank": ("head",),
}


# Keys that say what to do with a result, not what the result is.
_NOT_RESULT_KEYS = ("overwrite", "plot")


def config_yaml(cfg: Mapping) -> str:
    """The resolved config as YAML (what is stored in `results.nc`), without the keys
    that do not change the results (`overwrite`, `plot`)."""
    return yaml.safe_dump({k: v for k, v in cfg.items() if k not in _NOT_RESULT_KEYS}, sort_keys=True)


def run(config: Mapping) -> xr.Dataset:
    """Run the study a config describes and return its results.

    `config` is a plain mapping with the keys of `conf/config.yaml` (missing keys take
    their defaults). The Dataset has dimensions `member` and `time` (and `beta` when
    beta is a list), one variable per metric, the states `x` when `save_states`, and
    the resolved config as YAML in `attrs["config"]`.

    `dtype: float64` switches on `jax_enable_x64` for the process (JAX's float64 is a
    global setting); float32 runs stay float32 either way.

    Raises `ConfigError` for an impossible config, `NonFiniteStateError` when a state
    becomes NaN or infinite, `SolverFailure` when a solve stops early; the last two
    carry the computed Dataset as `error.dataset`.
    """
    cfg = validate_config(dict(config))
    if cfg["dtype"] == "float64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.dtype(cfg["dtype"])
    betas, beta_is_list = betas_of(cfg)
    ts, save_every = save_plan(cfg)
    keys = jax.random.split(jax.random.key(cfg["seed"]), cfg["members"])
    result = solve_ensemble(
        build_system(cfg),
        keys,
        jnp.asarray(betas, dtype),
        t0=cfg["t0"],
        t1=cfg["t1"],
        dt=cfg["dt"],
        ts=None if ts is None else jnp.asarray(ts, dtype),
        save_every=save_every,
        solver=cfg["solver"],
        adaptive=cfg["adaptive"],
        rtol=cfg["rtol"],
        atol=cfg["atol"],
        max_steps=cfg["max_steps"],
        chunk_size=cfg["chunk_size"],
        check=False,
    )
    data_vars = {}
    for name, value in result.stats.items():
        if name == "finite":
            continue
        value = np.asarray(value)
        dims = ("beta", "member", "time") + _DIMS.get(name, ())
        data_vars[name] = (dims, value)
    ds = xr.Dataset(
        data_vars,
        coords={"beta": np.asarray(betas), "member": np.arange(cfg["members"]), "time": np.asarray(result.ts)},
        attrs={"config": config_yaml(cfg), "attnflow_version": _version()},
    )
    ds["num_steps"] = (("beta", "member"), np.asarray(result.num_steps))
    if not beta_is_list:
        ds = ds.squeeze("beta")
    _describe(ds)
    try:
        check_ensemble(result, betas)
    except (NonFiniteStateError, SolverFailure) as error:
        # Keep what was computed (NaN where a state blew up) for the caller to inspect.
        error.dataset = ds
        raise
    return ds


def _describe(ds: xr.Dataset) -> None:
    notes = {
        "energy": "interaction energy E_beta = sum_ij exp(beta <x_i,x_j>) / (2 beta n^2)",
        "log_energy": "log of the interaction energy (finite for any beta)",
        "normalized_energy": "mean_ij exp(cos(x_i, x_j))",
        "pair_density": "fraction of pairs i != j with cos(x_i, x_j) > 1 - eps",
        "clusters": "connected components of the graph cos(x_i, x_j) > 1 - eps",
        "cluster_sizes": "cluster sizes, largest first, zero-padded",
        "order_parameter": "|mean_i x_i / |x_i||",
        "attention": "attention matrices a_ij of each head",
        "attention_rank": "numerical rank of each head's attention matrix",
        "x": "token states",
        "num_steps": "solver steps taken",
    }
    for name, text in notes.items():
        if name in ds:
            ds[name].attrs["description"] = text


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("attnflow")
    except Exception:
        return "unknown"


def write_results(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write `ds` to NetCDF atomically: a temporary file in the same folder, then a rename.

    A run that fails or is interrupted leaves no partial file at `path`, and an
    existing file is only ever replaced by a complete one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        ds.to_netcdf(tmp, engine="netcdf4")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_results(path: str | os.PathLike) -> xr.Dataset:
    """Read a `results.nc` written by attnflow (its config is `ds.attrs['config']`)."""
    with xr.open_dataset(path, engine="netcdf4") as ds:
        return ds.load()
