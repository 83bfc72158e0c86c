r"""Particles against their mean-field limit on the circle.

n tokens on $S^1$ under Q = K = V = I attention (softmax by default) start as n
independent draws from the density $\rho_0(\theta) = (1 + A\cos(m\theta))/2\pi$, and the
continuity equation of `attnflow.analysis.meanfield.meanfield_circle` starts from
$\rho_0$ itself. At each saved time the experiment measures the Wasserstein-1 distance on
the circle between the particles' empirical measure and the density
(`circle_wasserstein`), for every n and `members` independent draws (one number for
every n, or one per n: fewer draws where n is large, since one draw costs of order n^2;
the draws an n lacks are NaN in the Dataset, -1 in `particle_clusters`).

Why $n^{-1/2}$. The empirical measure of n independent draws is at $W_1$ distance of
order $n^{-1/2}$ from its law, and the particles' flow moves two measures apart at most
by a factor $e^{Lt}$ (the field is Lipschitz in $W_1$: Dobrushin's stability estimate),
so $W_1(t)$ falls like $n^{-1/2}$ at every fixed time, with a constant that grows with t
(the unstable modes of the uniform density amplify the sampling noise at their rates
$\lambda_k$). The slope of $\log W_1$ against $\log n$ is fitted at every time.

The clusters. The perturbation's mode m grows fastest when it is the most unstable
mode ($m = 3$ at $\beta = 4$ under softmax attention: $\lambda_3 = 0.664$ against
$\lambda_2 = 0.568$ and $\lambda_4 = 0.501$), and the density gathers into m clusters at
the maxima of $\cos(m\theta)$. The density's clusters are its local maxima, each with the
mass between the neighbouring minima (those of mass below `min_mass` are left out); the
particles' clusters are the runs of sorted angles split at gaps wider than `gap` radians,
each placed at its circular mean, leaving out the stragglers between clusters (particles
with fewer than `core` n others within `gap`/2: at n = 1e5 a few of them can close a gap).

Noise. At `sigma` > 0 every particle also carries its own Brownian motion on the circle
(`attnflow.brownian_noise`, kind `projected`: the tangent increment $\sigma P_x\Delta W$
then the retraction), whose generator is $\frac{\sigma^2}{2}\partial_\theta^2$, the PDE's
diffusion term; the particles then approach the PDE at the same sigma, still like
$n^{-1/2}$, and the perturbed mode's coefficient $\frac1n\sum_j\cos(m\theta_j)$ moves at
the linear rate $\lambda_m$ of `circle_growth_rate` (negative above the critical sigma).
The particles are stepped by the core's `simulate` (RK4 for the drift, step `dt`) with
`SelfAttention`, in tiles above `attnflow.numerics._tiled.TILED_ABOVE` tokens, or by
harmonic summation as the config's `summation` and `summation_tol` ask (`auto`, this
experiment's default, from n = 16 times the harmonics on: cost O(n L) instead of
O(n^2); docs/long-sequences.md); one compiled program per n, mapped over the members. The
results keep the angles of the first `SHOWN` particles of the largest n (member 0) for the
histograms: at n = 1e6 all of them would be 48 MB per time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..schema._config import NOT_RESULT_KEYS, Config
from ..schema._errors import ConfigError
from ..schema._harmonic_degree import basis_size, harmonic_degree
from ..schema._schema import setting
from ..schema.system._summation import pays
from ._common import caption, colormap, config_of, counted, finite_number, refuse_given, subplots, whole_number
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import meanfield
    from ..numerics import _field, _noise, _schedules, _simulate, _terms
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    meanfield = lazy("attnflow.analysis.meanfield")
    _field = lazy("attnflow.numerics._field")
    _noise = lazy("attnflow.numerics._noise")
    _schedules = lazy("attnflow.numerics._schedules")
    _simulate = lazy("attnflow.numerics._simulate")
    _terms = lazy("attnflow.numerics._terms")


@dataclass
class Options:
    kind: str = setting("sa", "sa (softmax) or usa (unnormalised) attention")
    beta: float = setting(4.0, "inverse temperature")
    mode: int = setting(3, "initial density (1 + amplitude cos(mode theta)) / 2 pi")
    amplitude: float = setting(0.5, "of the initial perturbation, in [0, 1)")
    n: list[int] = setting(
        [100, 316, 1000, 3162, 10000, 31623, 100000, 316228, 1000000],
        "token counts (one compiled particle program each)",
    )
    members: Any = setting(
        [24, 24, 24, 24, 24, 24, 8, 8, 4], "independent draws of the particles: one number, or one per n"
    )
    times: list[float] = setting([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "times compared, from 0 (whole numbers of dt)")
    dt: float = setting(0.25, "RK4 step of the particles")
    grid: int = setting(2048, "grid points of the PDE (Fourier modes up to grid / 3)")
    sigma: float = setting(0.0, "noise: Brownian motion on the circle in the particles, diffusion sigma^2/2 in the PDE")
    gap: float = setting(0.3, "particle clusters are split at gaps wider than this (radians)")
    core: float = setting(0.001, "a particle with fewer than max(1, core n) others within gap/2 is in no cluster")
    min_mass: float = setting(0.05, "clusters of less mass are not counted")


# The config keys the experiment reads; any other key given is refused.
_READ_KEYS = ("dtype", "seed", "attention_block", "summation", "summation_tol", "experiment", *NOT_RESULT_KEYS)
# The particles of the largest n whose angles the results keep (member 0).
SHOWN = 100_000


def draws(options: Options) -> list[int]:
    """The number of independent draws of the particles at each n."""
    members = options.members
    return list(members) if isinstance(members, list) else [members] * len(options.n)


def summation_degree(cfg: Config, options: Options, n: int) -> int:
    """The degree L of harmonic summation at n tokens, 0 for direct summation: as the
    config's `summation` asks (`auto`: where it pays, `attnflow.schema.system._summation.pays`),
    L from `summation_tol` at the options' beta (`attnflow.harmonic_degree`)."""
    asked = getattr(cfg.summation, "value", cfg.summation)
    if asked == "direct":
        return 0
    degree = harmonic_degree(float(options.beta), 2, float(cfg.summation_tol))
    return degree if asked == "harmonic" or pays(asked, degree, 2, n) else 0


def initial_density(theta, mode: int, amplitude: float):
    """$\\rho_0(\\theta) = (1 + A\\cos(m\\theta))/2\\pi$."""
    return (1 + amplitude * np.cos(mode * np.asarray(theta))) / (2 * np.pi)


def sample_angles(key, n: int, mode: int, amplitude: float):
    """n independent draws from `initial_density`: uniforms through the inverse of its
    distribution function $F(\\theta) = (\\theta + (A/m)\\sin(m\\theta))/2\\pi$, by Newton
    steps from $\\theta = 2\\pi u$ (F is increasing and convex-concave on each period of
    the perturbation; 30 steps reach rounding for A < 1)."""
    u = jax.random.uniform(key, (n,), jnp.float64) * (2 * jnp.pi)

    def newton(theta, _):
        f = theta + amplitude / mode * jnp.sin(mode * theta) - u
        return theta - f / (1 + amplitude * jnp.cos(mode * theta)), None

    theta, _ = jax.lax.scan(newton, u, None, length=30)
    return theta


def _particles(options: Options, n: int, block, degree: int = 0):
    """A compiled map from a key to the angles of the particles at the compared times
    (harmonic summation at `degree`; 0: direct)."""
    dt = float(options.dt)
    times = np.asarray(options.times, np.float64)
    eye = _schedules.Identity(1, 2, "float64")
    attention = _terms.SelfAttention(
        eye,
        eye,
        eye,
        None,
        jnp.asarray(options.beta, jnp.float64),
        None,
        heads=1,
        kind=options.kind,  # pyright: ignore[reportArgumentType]  # check() allows sa or usa
        block=block,
        unit_rows=True,
        attracting=True,  # check() holds beta > 0
        summation="harmonic" if degree else "direct",
        degree=degree,
    )
    steps = np.round(times / dt).astype(int)
    sigma = float(options.sigma)

    def one(key):
        theta = sample_angles(key, n, options.mode, options.amplitude)
        x0 = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)
        noise = None
        if sigma > 0 and steps[-1] > 0:  # the particle's own Brownian path, from a key apart from its draw
            noise = _noise.brownian_noise(
                jax.random.fold_in(key, 2),
                sigma,
                (n, 2),
                t0=0.0,
                t1=float(times[-1]),
                depth=_noise.tree_depth(0.0, float(times[-1]), dt),
                dtype=jnp.float64,
            )
        field = _field.VectorField((attention,), scheme="sphere", noise=noise)
        if steps[-1] == 0:
            xs = x0[None]
        else:
            xs = _simulate.simulate(field, x0, t1=times[-1], dt=dt, solver="rk4", save_steps=steps).xs
        return jnp.mod(jnp.arctan2(xs[..., 1], xs[..., 0]), 2 * jnp.pi)

    return jax.jit(lambda keys: jax.lax.map(one, keys))


def density_clusters(density, min_mass: float):
    """The clusters of a density on a uniform grid of the circle: its local maxima, each
    with the mass between its neighbouring minima; those below `min_mass` left out.
    Returns the angles of the peaks and their masses."""
    rho = np.asarray(density)
    points = rho.size
    h = 2 * np.pi / points
    peaks = np.flatnonzero((rho > np.roll(rho, 1)) & (rho >= np.roll(rho, -1)))
    troughs = np.flatnonzero((rho <= np.roll(rho, 1)) & (rho < np.roll(rho, -1)))
    if peaks.size == 0 or troughs.size == 0:
        return np.zeros(0), np.zeros(0)
    masses = []
    for p in peaks:
        after = troughs[troughs > p]
        before = troughs[troughs < p]
        hi = after[0] if after.size else troughs[0] + points
        lo = before[-1] if before.size else troughs[-1] - points
        masses.append(rho[np.arange(lo, hi) % points].sum() * h)
    masses = np.asarray(masses)
    keep = masses >= min_mass
    # Each peak refined between grid points by the parabola through it and its neighbours.
    left, middle, right = rho[(peaks - 1) % points], rho[peaks], rho[(peaks + 1) % points]
    curvature = left - 2 * middle + right
    offset = np.divide(0.5 * (left - right), curvature, out=np.zeros_like(curvature), where=curvature < 0)
    return np.mod((peaks + offset) * h, 2 * np.pi)[keep], masses[keep]


def particle_clusters(angles, gap: float, min_mass: float, core: float = 0.0):
    """The clusters of points on the circle: runs of the sorted angles split where two
    neighbours lie more than `gap` apart, each at its circular mean with its share of
    all the points; those below `min_mass` left out. A point with fewer than
    max(1, `core` n) others within `gap`/2 of it is a straggler and belongs to no
    cluster (with `core` > 0): between two clusters, a few stragglers would otherwise
    close the gap that separates them, and there are more of them as n grows."""
    theta = np.sort(np.mod(np.asarray(angles), 2 * np.pi))
    total = theta.size
    if core > 0:
        around = np.concatenate([theta - 2 * np.pi, theta, theta + 2 * np.pi])
        others = np.searchsorted(around, theta + gap / 2, "right") - np.searchsorted(around, theta - gap / 2) - 1
        theta = theta[others >= max(1, core * total)]
        if theta.size == 0:
            return np.zeros(0), np.zeros(0)
    n = theta.size
    gaps = np.diff(np.append(theta, theta[0] + 2 * np.pi))
    cuts = np.flatnonzero(gaps > gap)
    if cuts.size == 0:
        groups = [theta]
    else:
        ends = np.append(cuts[1:], cuts[0] + n)  # each run goes from just after one gap to the next
        groups = [theta[np.arange(start + 1, end + 1) % n] for start, end in zip(cuts, ends)]
    positions = np.asarray([np.mod(np.angle(np.mean(np.exp(1j * g))), 2 * np.pi) for g in groups])
    masses = np.asarray([g.size / total for g in groups])
    keep = masses >= min_mass
    order = np.argsort(positions[keep])
    return positions[keep][order], masses[keep][order]


def _circular(a, b):
    return np.abs(np.angle(np.exp(1j * (np.asarray(a) - np.asarray(b)))))


def _pde(options: Options) -> dict[str, np.ndarray]:
    """The mean-field density's solution at the compared times, as arrays (one piece)."""
    theta = np.arange(options.grid) * (2 * np.pi / options.grid)
    rho0 = initial_density(theta, options.mode, options.amplitude)
    pde = meanfield.meanfield_circle(
        rho0,
        np.asarray(options.times, np.float64),
        beta=options.beta,
        kind=options.kind,  # pyright: ignore[reportArgumentType]  # check() allows sa or usa
        sigma=options.sigma,
    )
    return {
        name: np.asarray(getattr(pde, name)) for name in ("coefficients", "density", "mass", "min_density", "steps")
    }


def meanfield_dataset(cfg: Config, options: Options, on_piece=None, keep=None) -> xr.Dataset:
    """The experiment's Dataset; `keep(compute)` keeps each finished part (the PDE, the
    particles at each n) as a piece of the run (`attnflow.experiments._runner.OwnPieces`;
    None: everything is computed)."""
    keep = keep or (lambda compute: compute())
    times = np.asarray(options.times, np.float64)
    ns = np.asarray(options.n, np.int64)
    per_n = draws(options)
    members = max(per_n)
    theta = np.arange(options.grid) * (2 * np.pi / options.grid)
    pde = keep(lambda: _pde(options))
    if on_piece is not None:
        on_piece()
    coefficients = np.asarray(pde["coefficients"])
    peaks, peak_masses = density_clusters(np.asarray(pde["density"])[-1], options.min_mass)
    w1 = np.full((ns.size, members, times.size), np.nan)
    mode = np.full((ns.size, members, times.size), np.nan)
    counts = np.full((ns.size, members), -1, np.int64)
    position_error = np.full((ns.size, members), np.nan)
    mass_error = np.full((ns.size, members), np.nan)
    key = jax.random.key(cfg.seed)
    shown = None
    degrees = [summation_degree(cfg, options, int(n)) for n in ns]
    for a, n in enumerate(ns):
        # Split keys are prefix-consistent: draw m at this n is the same whatever the number of draws.
        keys = jax.random.split(jax.random.fold_in(key, int(n)), per_n[a])
        particles = lambda keys=keys, n=n, degree=degrees[a]: {
            "angles": jax.device_get(_particles(options, int(n), cfg.attention_block, degree)(keys))
        }
        angles = np.asarray(keep(particles)["angles"])
        mode[a, : per_n[a]] = np.cos(options.mode * angles).mean(axis=-1)
        for m in range(per_n[a]):
            for t in range(times.size):
                w1[a, m, t] = meanfield.circle_wasserstein(angles[m, t], coefficients[t])
            where, mass = particle_clusters(angles[m, -1], options.gap, options.min_mass, options.core)
            counts[a, m] = where.size
            if where.size == peaks.size and where.size:
                # Pair the clusters in order of angle, at the rotation that fits best.
                shifts = [np.roll(np.arange(where.size), s) for s in range(where.size)]
                errors = [_circular(where[s], peaks).max() for s in shifts]
                best = shifts[int(np.argmin(errors))]
                position_error[a, m] = min(errors)
                mass_error[a, m] = np.abs(mass[best] - peak_masses).max()
        if a == ns.size - 1:
            shown = angles[0, :, :SHOWN]
        if on_piece is not None:
            on_piece()
    mean = np.nanmean(w1, axis=1)
    slope = np.polyfit(np.log(ns), np.log(mean), 1)[0]
    assert shown is not None  # set at the last n
    ds = xr.Dataset(
        coords={
            "n": ns,
            "member": np.arange(members),
            "time": times,
            "theta": theta,
            "cluster": np.arange(peaks.size),
            "particle": np.arange(shown.shape[-1]),
        }
    )
    ds["members"] = xr.DataArray(
        np.asarray(per_n, np.int64),
        dims="n",
        attrs={"description": "independent draws of the particles at each n (the later members are NaN, clusters -1)"},
    )
    ds["summation_degree"] = xr.DataArray(
        np.asarray(degrees, np.int64),
        dims="n",
        attrs={
            "description": "degree L of the harmonic summation of the particles' attention at each n (0: summed "
            "directly, every pair)"
        },
    )
    ds["w1"] = xr.DataArray(
        w1,
        dims=("n", "member", "time"),
        attrs={
            "description": "Wasserstein-1 distance on the circle between the particles' empirical measure and the "
            "mean-field density",
            "units": "radian",
        },
    )
    ds["w1_mean"] = xr.DataArray(
        mean,
        dims=("n", "time"),
        attrs={"description": "mean over members of the Wasserstein-1 distance", "units": "radian"},
    )
    ds["slope"] = xr.DataArray(
        slope, dims="time", attrs={"description": "least-squares slope of log mean W1 against log n"}
    )
    ds["mode"] = xr.DataArray(
        mode,
        dims=("n", "member", "time"),
        attrs={"description": "the particles' coefficient of the perturbed mode m, the mean of cos(m theta_j)"},
    )
    ds["pde_mode"] = xr.DataArray(
        2 * np.pi * coefficients[:, options.mode].real,  # pyright: ignore[reportAttributeAccessIssue]  # numpy's stub: .real of an unknown dtype
        dims="time",
        attrs={"description": "the density's coefficient of the perturbed mode m, the integral of rho cos(m theta)"},
    )
    ds["density"] = xr.DataArray(
        np.asarray(pde["density"]),
        dims=("time", "theta"),
        attrs={"description": "the mean-field density rho(t, theta)", "units": "1/radian"},
    )
    ds["mass"] = xr.DataArray(
        np.asarray(pde["mass"]),
        dims="time",
        attrs={"description": "mass of the mean-field density, integral of rho over the circle"},
    )
    ds["min_density"] = xr.DataArray(
        np.asarray(pde["min_density"]),
        dims="time",
        attrs={"description": "minimum of the mean-field density on the grid", "units": "1/radian"},
    )
    ds["pde_steps"] = xr.DataArray(int(pde["steps"]), attrs={"description": "accepted steps of the PDE solver (tsit5)"})
    ds["peak"] = xr.DataArray(
        peaks,
        dims="cluster",
        attrs={
            "description": "angle of each cluster (local maximum) of the density at the last time",
            "units": "radian",
        },
    )
    ds["peak_mass"] = xr.DataArray(
        peak_masses,
        dims="cluster",
        attrs={"description": "mass of each cluster of the density at the last time (between its neighbouring minima)"},
    )
    ds["particle_clusters"] = xr.DataArray(
        counts,
        dims=("n", "member"),
        attrs={"description": "number of clusters of the particles at the last time (-1: no such draw at this n)"},
    )
    ds["position_error"] = xr.DataArray(
        position_error,
        dims=("n", "member"),
        attrs={
            "description": "largest angle between a cluster of the density and its particle cluster, at the last time "
            "(NaN where the counts differ or there is no such draw)",
            "units": "radian",
        },
    )
    ds["mass_error"] = xr.DataArray(
        mass_error,
        dims=("n", "member"),
        attrs={
            "description": "largest difference between the mass of a cluster of the density and the particles' share, "
            "at the last time (NaN where the counts differ)"
        },
    )
    ds["angles"] = xr.DataArray(
        shown,
        dims=("time", "particle"),
        attrs={
            "description": f"angles of the first {SHOWN} particles (or all) of the largest n, member 0",
            "units": "radian",
        },
    )
    ds["growth_rate"] = xr.DataArray(
        meanfield.circle_growth_rate(options.mode, options.beta, options.kind, options.sigma),  # pyright: ignore[reportArgumentType]  # check() allows sa or usa
        attrs={"description": "linear growth rate of the perturbed mode at the uniform density (closed form)"},
    )
    return ds


class MeanFieldCircle(Experiment):
    title = "Particles against their mean-field limit on the circle: W1 falls like n^(-1/2)"
    paper = (
        'Geshkovski, Letrouit, Polyanskiy, Rigollet, "A mathematical perspective on Transformers" (2023), '
        "arXiv:2312.10794: the continuity equation of the token density"
    )
    Options = Options
    coordinates = {
        "theta": ("angle on the circle", "radian"),
        "cluster": ("index of a cluster of the mean-field density (in order of angle)", "1"),
        "particle": ("index of a particle of the largest n, member 0", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        name = "experiment.options"
        if not (finite_number(options.sigma) and options.sigma >= 0):
            raise ConfigError(f"{name}.sigma must be a number >= 0, got {options.sigma!r}.")
        if options.kind not in ("sa", "usa"):
            raise ConfigError(f"{name}.kind must be 'sa' or 'usa', got {options.kind!r}.")
        if not (finite_number(options.beta) and options.beta > 0):
            raise ConfigError(f"{name}.beta must be a positive number, got {options.beta!r}.")
        if not whole_number(options.mode, 1):
            raise ConfigError(f"{name}.mode must be a whole number >= 1, got {options.mode!r}.")
        if not (finite_number(options.amplitude) and 0 <= options.amplitude < 1):
            raise ConfigError(f"{name}.amplitude must lie in [0, 1) (a positive density), got {options.amplitude!r}.")
        ns = options.n
        if not isinstance(ns, list) or len(ns) < 2 or not all(whole_number(n, 2) for n in ns) or sorted(set(ns)) != ns:
            raise ConfigError(
                f"{name}.n must be an increasing list of at least two whole numbers >= 2 (a slope is "
                f"fitted), got {ns!r}."
            )
        members = options.members
        if not (
            whole_number(members, 2)
            or isinstance(members, list)
            and len(members) == len(ns)
            and all(whole_number(m, 2) for m in members)
        ):
            raise ConfigError(
                f"{name}.members must be a whole number >= 2 or a list of them, one per n "
                f"({len(ns)} here), got {members!r} (members=24 gives 24 draws at every n)."
            )
        times = options.times
        if (
            not isinstance(times, list)
            or not times
            or not all(finite_number(t) for t in times)
            or times[0] != 0
            or any(b <= a for a, b in zip(times, times[1:]))
        ):
            raise ConfigError(f"{name}.times must be an increasing list of times starting at 0, got {times!r}.")
        if len(times) < 2:
            # The initial draws alone: no step is taken, and dt and the PDE go unused.
            raise ConfigError(
                f"{name}.times={times!r} compares the initial draws only, leaving {name}.dt unused; add a later time."
            )
        if not (finite_number(options.dt) and options.dt > 0):
            raise ConfigError(f"{name}.dt must be a positive number, got {options.dt!r}.")
        if any(abs(t / options.dt - round(t / options.dt)) > 1e-9 for t in times):
            raise ConfigError(
                f"every time of {name}.times must be a whole number of steps dt={options.dt!r}, got {times!r}."
            )
        if not whole_number(options.grid, 4 * options.mode + 4):
            raise ConfigError(
                f"{name}.grid must be a whole number >= 4 mode + 4 = {4 * options.mode + 4}, got {options.grid!r}."
            )
        if options.kind == "usa" and options.beta > meanfield.USA_LARGEST_BETA:
            raise ConfigError(
                f"{name}.beta={options.beta:g} with {name}.kind=usa overflows float64: unnormalised "
                f"attention multiplies by e^beta, held up to beta = {meanfield.USA_LARGEST_BETA:g}; lower beta, or "
                "take kind=sa."
            )
        meanfield.check_kernel_table(options.beta, options.grid, name=f"{name}.beta")
        if not (finite_number(options.gap) and 0 < options.gap < math.pi):
            raise ConfigError(f"{name}.gap must lie in (0, pi) radians, got {options.gap!r}.")
        if not (finite_number(options.core) and 0 <= options.core < 1):
            raise ConfigError(f"{name}.core must lie in [0, 1), got {options.core!r}.")
        if not (finite_number(options.min_mass) and 0 <= options.min_mass < 1):
            raise ConfigError(f"{name}.min_mass must lie in [0, 1), got {options.min_mass!r}.")
        if cfg.dtype.value != "float64":
            raise ConfigError("experiment meanfield_circle compares with a PDE solved in float64: keep dtype=float64.")
        refuse_given(
            cfg,
            [f.name for f in dataclasses.fields(Config) if f.name not in _READ_KEYS],
            "meanfield_circle",
            "Q = K = V = I attention on the circle: it reads dtype, seed, attention_block, "
            "summation and summation_tol, the rest comes from its options",
        )
        degree = harmonic_degree(float(options.beta), 2, cfg.summation_tol)  # refuses a bad summation_tol
        if getattr(cfg.summation, "value", cfg.summation) == "harmonic":
            if not pays("harmonic", degree, 2, min(ns)):
                raise ConfigError(
                    f"summation=harmonic at {name}.beta={options.beta:g} takes degree L={degree} "
                    f"({basis_size(degree, 2)} harmonics), more than the n={min(ns)} tokens it would sum: "
                    "use summation=auto, which sums so few tokens directly."
                )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # everything is computed in `analyse`: one particle program per n, and the PDE

    def pieces(self) -> int:
        """Units of work for the progress bar: the PDE, and one per n."""
        return 1 + len(self.options.n)

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        work = lambda advance: meanfield_dataset(self.cfg, self.options, advance, keep)
        return counted("meanfield_circle", self.pieces(), work, on_piece)

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        options = cfg["experiment"]["options"]
        fig, (left, middle, right) = subplots(1, 3, figsize=(15.0, 4.4), layout="constrained")
        times = ds["time"].values
        ns = ds["n"].values
        theta = ds["theta"].values
        cmap = colormap("viridis")
        bins = np.linspace(0, 2 * np.pi, 97)
        for t, time in enumerate(times):
            color = cmap(t / max(len(times) - 1, 1))
            left.hist(
                ds["angles"].isel(time=t).values,
                bins=bins,
                density=True,
                histtype="step",
                alpha=0.5,
                linewidth=0.7,
                color=color,
            )
            left.plot(theta, ds["density"].isel(time=t).values, color=color, linewidth=1.4, label=f"t = {time:g}")
        for peak in ds["peak"].values:
            left.axvline(peak, color="0.4", linestyle=":", linewidth=0.8)
        left.set_yscale("log")
        left.set_ylim(1e-3, 1.5 * float(ds["density"].max()))
        left.set_xlabel(r"angle $\theta$")
        left.set_ylabel(r"density $\rho(t, \theta)$")
        shown = ds.sizes["particle"]
        drawn = f"{ns[-1]} particles" if shown == ns[-1] else f"{shown} of n = {ns[-1]} particles"
        left.set_title(f"(a) the PDE (lines), {drawn} (histograms)", fontsize=9)
        left.legend(fontsize=7, loc="upper right")
        for t, time in enumerate(times):
            color = cmap(t / max(len(times) - 1, 1))
            w1 = ds["w1"].isel(time=t).values
            middle.loglog(
                ns,
                np.nanmean(w1, axis=1),
                "o-",
                color=color,
                markersize=4,
                label=f"t = {time:g}: slope {float(ds['slope'].isel(time=t)):.2f}",
            )
            middle.fill_between(
                ns,
                np.nanpercentile(w1, 10, axis=1),
                np.nanpercentile(w1, 90, axis=1),
                color=color,
                alpha=0.12,
                linewidth=0,
            )
        guide = ds["w1_mean"].isel(time=0).values[0] * np.sqrt(ns[0] / ns)
        middle.loglog(ns, guide, "k--", linewidth=0.8, label=r"$\propto n^{-1/2}$")
        middle.set_xlabel("n (tokens)")
        middle.set_ylabel(r"$W_1$(particles, PDE)")
        middle.set_title("(b) mean over the draws, 10-90% band", fontsize=9)
        middle.legend(fontsize=7, loc="lower left")
        peaks = ds["peak"].values
        for a, n in enumerate(ns):
            errors = ds["position_error"].isel(n=a).values
            right.semilogy(
                np.full(errors.size, n) * np.exp(np.linspace(-0.08, 0.08, errors.size)),
                errors,
                "o",
                color="C0",
                alpha=0.5,
                markersize=4,
            )
        right.set_xscale("log")
        right.set_xlabel("n (tokens)")
        right.set_ylabel("largest cluster position error (radian)")
        right.set_title(f"(c) clusters at t = {times[-1]:g}: {peaks.size} in the PDE", fontsize=9)
        caption(fig, _caption(ds, options), width=190)
        return {"meanfield_circle": fig}


def _draws(ds) -> str:
    """The number of draws at each n, in words."""
    per_n = ds["members"].values if "members" in ds else np.full(ds.sizes["n"], ds.sizes["member"])
    if np.all(per_n == per_n[0]):
        return f"{per_n[0]} draws per n"
    return ", ".join(str(m) for m in per_n) + " draws at the successive n"


def _summed(ds) -> str:
    """How the particles' attention was summed, in words ("" for direct summation at every n)."""
    if "summation_degree" not in ds:
        return ""
    degrees, ns = ds["summation_degree"].values, ds["n"].values
    if not degrees.any():
        return ""
    first = int(np.argmax(degrees > 0))
    return f"; attention summed in harmonics of degree {int(degrees.max())} from n = {ns[first]}"


def _wrapped(angle: float) -> float:
    """An angle in [-pi, pi), with the rounding of a peak at 0 shown as 0."""
    angle = float(np.angle(np.exp(1j * angle)))
    return 0.0 if abs(angle) < 5e-4 else angle


def _caption(ds, options) -> str:
    ns = ds["n"].values
    slopes = ds["slope"].values
    counts = ds["particle_clusters"]
    same = ((counts == ds.sizes["cluster"]).sum("member") / (counts >= 0).sum("member")).values
    errors = ds["position_error"].isel(n=-1).values
    worst = f"{np.nanmax(errors):.3f} rad" if np.isfinite(errors).any() else "undefined (no draw has the PDE's count)"
    return (
        f"Q = K = V = I {options['kind'].upper()} attention on the circle, $\\beta$ = {options['beta']:g}, sigma = "
        f"{options['sigma']:g}. The particles are n independent draws from $(1 + {options['amplitude']:g}\\cos "
        f"{options['mode']}\\theta)/2\\pi$ (RK4, dt = {options['dt']:g}; {_draws(ds)}{_summed(ds)}); the PDE "
        "starts from that "
        f"density ({ds.sizes['theta']} grid points, tsit5). The perturbed mode's linear growth rate at the uniform "
        f"density is {float(ds['growth_rate']):.3f}. Fitted slopes of log W1 against log n, n = {ns[0]} to {ns[-1]}: "
        + ", ".join(f"{s:.2f} (t = {t:g})" for s, t in zip(slopes, ds["time"].values))
        + f". At t = {ds['time'].values[-1]:g} the PDE has {ds.sizes['cluster']} clusters at "
        + ", ".join(f"{_wrapped(p):.3f}" for p in ds["peak"].values)
        + f" rad; the particles have as many in {same[-1]:.0%} of the draws at n = {ns[-1]} "
        f"({same[0]:.0%} at n = {ns[0]}), their largest position error at n = {ns[-1]} being {worst}."
    )
