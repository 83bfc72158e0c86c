"""Cross-attention from a config (`cross.*`, `attnflow/schema/system/cross.py`): the
target's flow against a NumPy step of the same equations, the hardmax limit, the
gradient-ascent law of the pull of a fixed source, the source's own flow, the metrics
of the target against the source, the stored source tokens, and the refusals."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from commands import command, load, one_sentence  # noqa: F401 (a fixture)

import attnflow
from attnflow.schema._errors import ConfigError

BASE = {"n": 6, "d": 3, "members": 2, "dtype": "float64", "plot": False, "save_states": True, "saves": 2}


def _run(**config):
    return attnflow.run({**BASE, "metrics": [], **config})


def _softmax_mix(y, keys, values, beta):
    logits = beta * y @ keys.T
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)) @ values


def test_one_euler_step_is_self_attention_plus_cross_attention_by_numpy():
    rng = np.random.default_rng(0)
    q, k, v, o = (rng.normal(size=(3, 3)) for _ in range(4))
    matrix = lambda a: {"kind": "matrix", "value": a.tolist()}
    ds = _run(
        beta=0.8,
        scheme="none",
        solver="euler",
        t1=0.1,
        dt=0.1,
        init="caps",
        cross={
            "enabled": True,
            "m": 5,
            "beta": 1.7,
            "init": {"kind": "caps", "k": 2},
            "weights": {"q": matrix(q), "k": matrix(k), "v": matrix(v), "o": matrix(o)},
        },
    )
    for member in range(2):
        x0, x1 = (ds.x.isel(member=member, time=i).values for i in (0, 1))
        source = ds.source_x.isel(member=member).values
        self_term = _softmax_mix(x0, x0, x0, 0.8)
        cross_term = _softmax_mix(x0 @ q.T, source @ k.T, source @ v.T, 1.7) @ o.T
        np.testing.assert_allclose(x1, x0 + 0.1 * (self_term + cross_term), rtol=1e-12, atol=1e-14)


def test_unnormalized_cross_attention_divides_by_the_source_count():
    ds = _run(
        beta=1.0,
        scheme="none",
        solver="euler",
        t1=0.1,
        dt=0.1,
        attention=False,
        cross={"enabled": True, "m": 4, "attention_kind": "usa", "beta": 2.0},
    )
    x0, x1 = ds.x.isel(member=0, time=0).values, ds.x.isel(member=0, time=1).values
    source = ds.source_x.isel(member=0).values
    np.testing.assert_allclose(x1, x0 + 0.1 * np.exp(2.0 * x0 @ source.T) @ source / 4, rtol=1e-12)


def test_at_large_beta_c_each_target_token_runs_straight_to_its_argmax_source_token():
    """The hardmax limit of cross-attention with V = I: the term at y_i is the source
    token x* maximising <y_i, x_j>; flat space keeps it the maximiser (unit source
    tokens: <y + t x*, x*> grows fastest), so y_i(T) = y_i(0) + T x*."""
    ds = _run(
        beta=1.0,
        scheme="none",
        solver="euler",
        t1=0.5,
        dt=0.05,
        attention=False,
        cross={"enabled": True, "m": 7, "beta": 1e4},
    )
    for member in range(2):
        y0, y1 = ds.x.isel(member=member, time=0).values, ds.x.isel(member=member, time=-1).values
        source = ds.source_x.isel(member=member).values
        chosen = source[np.argmax(y0 @ source.T, axis=1)]
        np.testing.assert_allclose(y1, y0 + 0.5 * chosen, atol=1e-9)


@pytest.mark.parametrize("kind", ["sa", "usa"])
def test_the_pull_of_a_fixed_source_ascends_its_log_sum_exp_potential(kind):
    """With self-attention off, Q = K = V = I on the sphere and the source fixed, each
    target token follows the projected gradient of f(y) = beta_c^-1 log sum_j exp(beta_c <y,x_j>)
    (SA; (beta_c m)^-1 sum_j exp(beta_c <y,x_j>) for USA): sum_i f(y_i) never decreases
    along a projected solver's steps, and it rises."""
    beta_c, m = 3.0, 5
    ds = _run(
        n=12,
        beta=1.0,
        solver="rk4",
        t1=4.0,
        dt=0.05,
        saves=41,
        attention=False,
        cross={"enabled": True, "m": m, "beta": beta_c, "attention_kind": kind},
    )
    for member in range(2):
        y, source = ds.x.isel(member=member).values, ds.source_x.isel(member=member).values
        e = np.exp(beta_c * np.einsum("tid,jd->tij", y, source)).sum(-1)
        f = (np.log(e) / beta_c if kind == "sa" else e / (beta_c * m)).sum(-1)
        assert np.all(np.diff(f) >= -1e-12), np.diff(f).min()
        assert f[-1] - f[0] > 0.1


def test_the_source_runs_its_own_non_causal_flow_then_is_held():
    """cross.source_time = T: the source tokens the target sees are those of the study's
    self-attention flow at cross.source_beta, without the study's causal mask, from the
    same initial source tokens as with T = 0; they are held fixed afterwards."""
    common = dict(n=4, beta=1.0, solver="rk4", dt=0.05, t1=0.2, causal=True)
    start = _run(**common, cross={"enabled": True, "m": 6})
    flowed = _run(**common, cross={"enabled": True, "m": 6, "source_time": 1.5, "source_beta": 2.5})
    field = attnflow.VectorField(
        (
            attnflow.SelfAttention(
                attnflow.Identity(1, 3, "float64"),
                attnflow.Identity(1, 3, "float64"),
                attnflow.Identity(1, 3, "float64"),
                None,
                beta=jnp.asarray(2.5, jnp.float64),
                alibi=None,
                heads=1,
            ),
        ),
        scheme="sphere",
    )
    for member in range(2):
        x0 = start.source_x.isel(member=member).values
        expected = attnflow.simulate(field, jnp.asarray(x0), t1=1.5, dt=0.05, solver="rk4").xs[-1]
        np.testing.assert_allclose(flowed.source_x.isel(member=member).values, expected, rtol=1e-12, atol=1e-13)
        assert np.abs(flowed.source_x.isel(member=member).values - x0).max() > 1e-2


def test_the_metrics_of_the_target_against_the_source_are_their_definitions():
    ds = _run(
        n=16,
        beta=2.0,
        t1=3.0,
        dt=0.1,
        saves=4,
        cluster_eps=0.05,
        metrics=["source_capture", "nearest_source"],
        cross={"enabled": True, "m": 6, "beta": 8.0, "init": {"kind": "caps", "k": 2, "radius": 0.05}},
    )
    eps = 0.05
    for member in range(2):
        source = ds.source_x.isel(member=member).values
        cos_source = source @ source.T
        labels = np.argmax(cos_source > 1 - eps, axis=1)
        for t in range(4):
            y = ds.x.isel(member=member, time=t).values
            cos = y @ source.T
            assert ds.source_capture.isel(member=member, time=t).item() == pytest.approx(np.mean(cos.max(1) > 1 - eps))
            np.testing.assert_array_equal(
                ds.nearest_source.isel(member=member, time=t).values, labels[np.argmax(cos, axis=1)]
            )
    # Two caps of radius 0.05 are two source clusters: every target token is captured by
    # one of them by t = 3 at beta_c = 8, and the labels name at most the two.
    assert ds.source_capture.isel(time=-1).min().item() == 1.0
    assert set(np.unique(ds.nearest_source.isel(time=-1).values)) <= set(np.unique(labels))


def test_the_stored_source_tokens_have_no_time_axis_and_a_beta_axis_with_a_list_of_betas(tmp_path):
    ds = _run(beta=[1.0, 2.0], t1=0.2, dt=0.1, cross={"enabled": True, "m": 3})
    assert ds.source_x.dims == ("beta", "member", "source_token", "dim")
    np.testing.assert_array_equal(ds.source_x.isel(beta=0).values, ds.source_x.isel(beta=1).values)
    assert ds.source_x.isel(member=0).values.tolist() != ds.source_x.isel(member=1).values.tolist()
    path = tmp_path / "results.nc"
    ds.to_netcdf(path)
    assert load(path).source_x.attrs["long_name"]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"cross": {"enabled": True, "m": 0}}, "cross.m must be"),
        ({"metrics": ["source_capture"]}, "need cross.enabled=true"),
        ({"cross": {"m": 4}}, "cross.m does not apply with cross.enabled=false"),
        ({"cross": {"enabled": True, "source_beta": 2.0}}, "cross.source_beta does not apply with cross.source_time=0"),
        ({"cross": {"enabled": True, "source_time": 0.25}, "dt": 0.1}, "whole number of dt"),
        ({"cross": {"enabled": True, "init": {"kind": "caps", "kk": 2}}}, "did you mean cross.init.k"),
        ({"cross": {"enabled": True, "attention_kind": "hardmax"}}, "cross.attention_kind"),
        ({"cross": {"enabled": True, "weights": {"q": {"kind": "none"}}}}, "cross.weights.q"),
        ({"cross": {"dynamics": "usa"}}, "cross.dynamics is called cross.attention_kind"),
        ({"cross": {"enabled": True, "m": 5, "init": {"kind": "orthonormal"}}}, "needs cross.m <= d, got cross.m=5"),
        ({"cross": {"enabled": True, "m": 5, "init": {"kind": "given", "value": [[1.0, 0.0, 0.0]]}}},
         "cross.init.value must have shape (cross.m=5, d=3)"),
    ],
)
def test_impossible_cross_settings_are_one_sentence(config, words):
    with pytest.raises(ConfigError) as error:
        attnflow.validate_config(config)
    assert words in one_sentence(error)


def test_the_command_line_takes_the_source_kind_and_its_keys(command, tmp_path):  # noqa: F811 (the fixture)
    code, _ = command(
        "cross.enabled=true",
        "cross.init.kind=caps",
        "cross.init.k=3",
        "cross.m=5",
        "n=4",
        "members=1",
        "beta=1",
        "t1=0.2",
        "save_states=true",
        "plot=false",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 0
    ds = load(tmp_path / "run" / "results.nc")
    assert ds.source_x.shape == (1, 5, 3)
    assert "k: 3" in ds.attrs["config"] and "kind: caps" in ds.attrs["config"]


def test_the_pieces_of_a_run_carry_the_source_tokens_and_a_resume_reads_them(tmp_path, monkeypatch):
    from attnflow.running._build import resolve_study
    from attnflow.running._ensemble import EnsemblePlan
    from attnflow.running._study import plan_study, solve_study

    study = resolve_study({**BASE, "metrics": [], "chunk_size": 1, "t1": 0.3, "dt": 0.1, "beta": 1.0,
                           "cross": {"enabled": True, "m": 3, "source_time": 0.2}})
    first = solve_study(study, plan_study(study), pieces=tmp_path / "pieces")

    def unsolvable(self, i):
        raise AssertionError("a finished piece was solved again")

    monkeypatch.setattr(EnsemblePlan, "solve", unsolvable)
    again = solve_study(study, plan_study(study), pieces=tmp_path / "pieces")
    np.testing.assert_array_equal(again.to_xarray().source_x.values, first.to_xarray().source_x.values)
    assert again.to_xarray().source_x.shape == (2, 3, 3)


def test_the_study_s_old_name_of_the_attention_kind_is_refused_on_the_command_line(command):  # noqa: F811
    code, lines = command("cross.dynamics=usa")
    assert code == 2 and lines == [
        "attnflow: error: cross.dynamics is called cross.attention_kind, as the study's own key is (dynamics "
        "before attnflow 0.2.0); write cross.attention_kind=usa."
    ], lines
