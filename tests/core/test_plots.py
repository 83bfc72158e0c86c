"""The summary figure, drawn from synthetic results Datasets (no simulation).

Each Dataset has the layout `run` writes: dims `(beta?, member, time, ...)`, `beta` a
dimension or a scalar coordinate, the resolved config as YAML in `attrs["config"]`.
"""

import subprocess
import sys
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402
import yaml  # noqa: E402

from attnflow.presentation._plots import plot_summary, summary_figure  # noqa: E402

N = 6
HEADS = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The mean line each metric's panel must draw, from the stored values with dims
# (..., member, time, extra...): the same reduction written independently in NumPy.
PANEL_SERIES = {
    "pair_density": lambda v: v,
    "clusters": lambda v: v,
    "log_energy": lambda v: v,
    "energy": lambda v: v,
    "normalized_energy": lambda v: v,
    "order_parameter": lambda v: v,
    "cluster_sizes": lambda v: v[..., 0] / N,
    "attention_rank": lambda v: v.mean(axis=-1),
    "attention": lambda v: v.max(axis=-1).mean(axis=(-1, -2)),
}


def config(**changes) -> dict:
    """A resolved config as `run` stores it."""
    identity = {
        "kind": "identity", "law": "gaussian", "scale": 1.0, "value": None, "sign": 1.0,
        "switch_times": [], "factors": [], "redraw_every": None, "poly": None,
    }
    cfg = {
        "n": N, "d": 3, "beta": [0.5, 2.0], "attention_kind": "sa", "scheme": "sphere",
        "token_norm": {"kind": "layer", "eps": 0.0, "gamma": None, "shift": None},
        "attention": True, "causal": False, "alibi": None, "heads": HEADS, "d_k": None, "d_v": None,
        "weights": {"shared": True, "q": dict(identity), "k": dict(identity), "v": dict(identity),
                    "o": dict(identity, kind="none")},
        "mlp": {"enabled": False, "hidden": None, "activation": "gelu", "scale": 1.0, "bias": True},
        "init": {"kind": "uniform"}, "members": 8, "seed": 0, "dtype": "float32",
        "t0": 0.0, "t1": 10.0, "dt": 0.1, "solver": "euler_renorm", "adaptive": False,
        "saves": 21, "save_spacing": "linear", "metrics": [], "cluster_eps": 0.01,
    }
    cfg.update(changes)
    return cfg


def results(metrics, beta=(0.5, 2.0), members=8, time=None, states=False, seed=0, **changes) -> xr.Dataset:
    """Random values of the right shapes and ranges for `metrics`; `beta` a tuple gives a
    `beta` dimension, a number a scalar coordinate."""
    rng = np.random.default_rng(seed)
    time = np.linspace(0.0, 10.0, 21) if time is None else np.asarray(time)
    lead = (("beta",) if isinstance(beta, tuple) else ()) + ("member", "time")
    shape = ((len(beta),) if isinstance(beta, tuple) else ()) + (members, time.size)
    logits = rng.normal(size=shape + (HEADS, N, N))
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    values = {
        "pair_density": ((), rng.uniform(0, 1, shape)),
        "clusters": ((), rng.integers(1, N + 1, shape)),
        "log_energy": ((), rng.normal(size=shape)),
        "energy": ((), rng.uniform(1, 5, shape)),
        "normalized_energy": ((), rng.uniform(1, np.e, shape)),
        "order_parameter": ((), rng.uniform(0, 1, shape)),
        "cluster_sizes": (("cluster",), -np.sort(-rng.integers(0, N + 1, shape + (N,)), axis=-1)),
        "attention_rank": (("head",), rng.integers(1, N + 1, shape + (HEADS,))),
        "attention": (("head", "query", "key"), attention),
    }
    data = {name: (lead + values[name][0], values[name][1]) for name in metrics}
    if states:
        data["x"] = (lead + ("token", "dim"), rng.normal(size=shape + (N, 3)))
    data["num_steps"] = (lead[:-1], np.full(shape[:-1], 100))
    cfg = config(beta=[float(b) for b in beta] if isinstance(beta, tuple) else beta, members=members,
                 metrics=list(metrics), save_states=states, **changes)
    return xr.Dataset(
        data,
        coords={"beta": np.asarray(beta), "member": np.arange(members), "time": time},
        attrs={"config": yaml.safe_dump(cfg)},
    )


def data_axes(fig):
    return [ax for ax in fig.axes if ax.axison]


def caption(fig) -> str:
    (text,) = [t for t in fig.texts if t.get_gid() == "caption"]
    return text.get_text()


def legend_texts(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def beta_values(fig) -> list[float]:
    return [float(text.split("=")[1]) for text in legend_texts(fig) if "beta" in text]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("metric", list(PANEL_SERIES))
def test_each_metric_alone_is_one_labelled_panel_of_member_means(metric):
    ds = results([metric])
    fig = summary_figure(ds)
    (ax,) = data_axes(fig)
    assert ax.get_xlabel().startswith("t") and ax.get_ylabel()
    expected = PANEL_SERIES[metric](ds[metric].values.astype(float)).mean(axis=1)
    lines = ax.get_lines()
    assert len(lines) == 2
    for line, mean in zip(lines, expected):
        np.testing.assert_allclose(line.get_xdata(), ds["time"].values)
        np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-12)


def test_default_metrics_show_log_energy_and_not_energy(tmp_path):
    metrics = ["energy", "log_energy", "pair_density", "clusters", "order_parameter"]
    ds = results(metrics, beta=(0.5, 1.0, 2.0))
    fig = summary_figure(ds, title="SA on the sphere")
    axes = data_axes(fig)
    assert len(axes) == 4
    labels = [ax.get_ylabel() for ax in axes]
    assert labels[0].startswith("pair density") and labels[1].startswith("clusters")
    assert labels[2].startswith("log interaction energy") and labels[3].startswith("order parameter")
    assert all(ax.get_xlabel() == "t" for ax in axes)
    assert fig.get_suptitle() == "SA on the sphere"
    assert plot_summary(ds, tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE


def test_panels_wrap_into_rows_of_at_most_three(tmp_path):
    # Without log_energy the energy itself is drawn: every other panel kind at once.
    ds = results([name for name in PANEL_SERIES if name != "log_energy"])
    fig = summary_figure(ds)
    axes = data_axes(fig)
    assert len(axes) == len(PANEL_SERIES) - 1
    assert axes[2].get_ylabel().startswith("interaction energy")
    rows = {round(ax.get_position().y0, 3) for ax in axes}
    columns = {round(ax.get_position().x0, 3) for ax in axes}
    assert len(rows) == 3 and len(columns) == 3
    # Saving renders every label's mathtext.
    assert plot_summary(ds, tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("states", [False, True])
def test_no_time_series_gives_one_panel_saying_what_the_file_holds(states, tmp_path):
    ds = results([], states=states)
    assert plot_summary(ds, tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE
    fig = summary_figure(ds)
    assert data_axes(fig) == []
    (ax,) = fig.axes
    (message,) = ax.texts
    assert "No time-series metric was recorded (metrics = [])" in message.get_text()
    assert ("states x are in results.nc" in message.get_text()) == states
    assert "uniform" in caption(fig)


def test_attention_statistics_only():
    fig = summary_figure(results(["attention", "attention_rank"]))
    axes = data_axes(fig)
    assert [ax.get_ylabel().split("\n")[0] for ax in axes] == ["attention rank", "attention concentration"]
    assert "ε" not in caption(fig)  # no clustering metric is drawn


def test_legend_names_every_beta_of_a_sweep_and_covers_no_data():
    betas = (0.25, 0.5, 1.0, 2.0, 4.0, 9.0)
    fig = summary_figure(results(list(PANEL_SERIES), beta=betas), title="sweep")
    assert beta_values(fig) == list(betas)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    covered = [ax.get_window_extent(renderer) for ax in data_axes(fig)]
    writing = [legend.get_window_extent(renderer) for legend in fig.legends]
    writing += [t.get_window_extent(renderer) for t in fig.texts if t.get_gid() == "caption"]
    for box in writing:
        assert not any(box.overlaps(ax_box) for ax_box in covered)
        assert box.x0 >= figure_box.x0 and box.x1 <= figure_box.x1 + 1


def test_scalar_beta_draws_one_line_per_panel():
    ds = results(["pair_density", "cluster_sizes"], beta=2.0)
    assert "beta" not in ds["pair_density"].dims
    fig = summary_figure(ds)
    for ax, expected in zip(data_axes(fig), [ds["pair_density"].values, ds["cluster_sizes"].values[..., 0] / N]):
        (line,) = ax.get_lines()
        np.testing.assert_allclose(line.get_ydata(), expected.mean(axis=0))
    assert beta_values(fig) == [2.0]


def test_log_spaced_times_are_drawn_against_t_minus_t0_on_a_log_axis():
    t0 = 1.0
    time = np.concatenate([[t0], t0 + np.geomspace(0.1, 9.0, 20)])
    ds = results(["order_parameter"], time=time, t0=t0, t1=10.0, save_spacing="log")
    (ax,) = data_axes(fig := summary_figure(ds))
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel().startswith("t − t0")
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), time[1:] - t0)
    np.testing.assert_allclose(line.get_ydata(), ds["order_parameter"].values[0, :, 1:].mean(axis=0))
    assert "log-spaced" in caption(fig)


def test_nan_members_leave_the_means_and_failures_are_counted():
    ds = results(["pair_density", "clusters"], members=10)
    # Two members of the first beta blow up at t = 5: NaN from then on.
    blown = ds["time"].values >= 5.0
    for name in ("pair_density", "clusters"):
        values = ds[name].values.astype(float)
        values[0, :2, blown] = np.nan
        ds[name] = (ds[name].dims, values)
    ds["status"] = (("beta", "member"), np.array([[1, 2] + [0] * 8, [0] * 10]))
    ds["failure_time"] = (("beta", "member"), np.array([[5.0, 5.0] + [np.nan] * 8, [np.nan] * 10]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fig = summary_figure(ds)
    for ax, name in zip(data_axes(fig), ["pair_density", "clusters"]):
        for line, values in zip(ax.get_lines(), ds[name].values):
            np.testing.assert_allclose(line.get_ydata(), np.nanmean(values, axis=0))
            assert np.isfinite(line.get_ydata()).all()
    text = caption(fig)
    assert "2 of 20 runs" in text and "non-finite" in text and "stopped early" in text and "t = 5" in text


def test_all_nan_values_give_an_empty_panel_without_warnings():
    ds = results(["log_energy"], beta=1.0)
    ds["log_energy"] = ds["log_energy"] * np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        (ax,) = data_axes(fig := summary_figure(ds))
    assert np.isnan(ax.get_lines()[0].get_ydata()).all()
    assert "no finite values" in [t.get_text() for t in ax.texts]
    assert "NaN" in caption(fig)


def test_caption_states_bands_threshold_initial_condition_and_schedule():
    v = {
        "kind": "random", "law": "goe", "scale": 0.5, "value": None, "sign": 1.0,
        "switch_times": [5.0], "factors": [1.0, -1.0], "redraw_every": None, "poly": None,
    }
    ds = results(["pair_density"], cluster_eps=0.05, init={"kind": "caps", "k": 3, "radius": 0.2, "centres": None},
                 attention_kind="usa", scheme="pre", solver="rk4", dt=0.02)
    cfg = yaml.safe_load(ds.attrs["config"])
    cfg["weights"]["v"] = v
    ds.attrs["config"] = yaml.safe_dump(cfg)
    text = " ".join(caption(summary_figure(ds)).split())
    for part in ["10", "90", "8 members", r"$\varepsilon$ = 0.05", "caps (k = 3, radius = 0.2)", "USA", "scheme = pre",
                 "n = 6", "d = 3", "rk4", "dt = 0.02", "V random (goe, scale 0.5", "factors [1, -1]",
                 "t = [5]", "Q = I"]:
        assert part in text


def test_a_config_without_keys_still_gives_a_figure():
    ds = results(["clusters"]).assign_attrs(config="n: 6\n")
    (ax,) = data_axes(fig := summary_figure(ds))
    assert ax.get_xscale() == "linear"
    assert "n = 6" in caption(fig)


def test_importing_attnflow_does_not_import_matplotlib():
    code = "import sys, attnflow.presentation._plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_drawing_leaves_the_backend_the_rcparams_and_pyplot_alone(tmp_path):
    # The user's backend (here svg, not the Agg that attnflow saves with) and rcParams.
    plt.switch_backend("svg")
    try:
        backend, params = matplotlib.get_backend(), dict(matplotlib.rcParams)
        ds = with_switch(results(["clusters", "pair_density"]), switch_times=[5.0], factors=[1.0, -1.0])
        fig = summary_figure(ds, title=r"SA, $\beta$ sweep")
        assert isinstance(fig, matplotlib.figure.Figure)
        assert plot_summary(ds, tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.get_backend() == backend
        assert dict(matplotlib.rcParams) == params
        assert plt.get_fignums() == []
    finally:
        plt.switch_backend("agg")


def with_switch(ds: xr.Dataset, **v) -> xr.Dataset:
    cfg = yaml.safe_load(ds.attrs["config"])
    cfg["weights"]["v"].update(v)
    return ds.assign_attrs(config=yaml.safe_dump(cfg))


def test_weight_switch_times_are_marked_and_labelled_in_every_panel():
    ds = with_switch(results(["clusters", "pair_density"]), kind="random", switch_times=[5.0], factors=[1.0, -1.0])
    fig = summary_figure(ds)
    for ax in data_axes(fig):
        (line,) = [line for line in ax.get_lines() if line.get_gid() == "weight_switch"]
        assert line.get_xdata()[0] == 5.0
        assert [t.get_text().strip() for t in ax.texts if t.get_gid() == "weight_switch"] == ["V switches"]
    assert any("weight switch" in text and "= 5" in text for text in legend_texts(fig))
    # A switch outside the saved times is not drawn; no switch, no mark.
    for ds in (with_switch(results(["clusters"]), switch_times=[50.0], factors=[1.0, 2.0]), results(["clusters"])):
        fig = summary_figure(ds)
        assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "weight_switch"]
        assert not any("weight switch" in text for text in legend_texts(fig))


def test_math_in_the_caption_is_mathtext_and_renders():
    tied = {"kind": "tied", "scale": 1.0, "sign": -1.0, "switch_times": [], "factors": [], "poly": [1.0, 0.0, 2.0]}
    ds = results(["pair_density"], cluster_eps=0.05, d_k=2)
    cfg = yaml.safe_load(ds.attrs["config"])
    cfg["weights"]["v"] = tied
    fig = summary_figure(ds.assign_attrs(config=yaml.safe_dump(cfg)))
    text = caption(fig)
    for part in (r"$\cos(x_i, x_j) > 1 - \varepsilon$", r"$\varepsilon$ = 0.05", r"V = -$Q^\top K$",
                 r"$f(t)$ = 1 + 2 $t^{2}$", "$d_k$ = 2"):
        assert part in text
    # Every line holds whole `$...$` spans (wrapping never cuts one), and mathtext parses them.
    assert all(line.count("$") % 2 == 0 for line in text.splitlines())
    fig.canvas.draw()


def test_a_caption_wraps_between_math_spans_never_inside_one():
    from attnflow.presentation._figures import wrap

    text = r"a pair is close when $\cos(x_i, x_j) > 1 - \varepsilon$, with $\varepsilon$ = 0.01; " * 3
    for width in range(8, 80, 7):
        lines = wrap(text, width)
        assert all(line.count("$") % 2 == 0 for line in lines), width
        assert " ".join(lines) == " ".join(text.split())
