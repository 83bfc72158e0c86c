"""`summation` and `summation_tol` from the config: harmonic summation runs a study as
direct summation does (to its tolerance), records its degree and coefficient tail,
refuses what it cannot serve in one sentence, and `auto` chooses it where it serves and
is faster. The kernel itself is held against the direct sums in tests/core/test_harmonic.py."""

import jax
import numpy as np
import pytest

import attnflow as af
from attnflow.running._build import build_system
from attnflow.schema._config import compose, current_config
from attnflow.schema._errors import ConfigError
from attnflow.schema._harmonic_degree import basis_size, degree, error_bound
from attnflow.schema.system._summation import AUTO_RATIO, RADIUS_MARGIN, summation

SMALL = dict(members=2, t1=2, dt=0.1, dtype="float64", save_states=True, compilation_cache=False)
ALL_BELOW_N2 = ["energy", "log_energy", "pair_density", "clusters", "order_parameter"]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(n=300, d=2, beta=4.0, causal=True, alibi=0.05, metrics=ALL_BELOW_N2),
        dict(n=200, d=3, beta=1.0, t1=1.0, attention_kind="usa", solver="rk4", metrics=["log_energy", "order_parameter"]),
    ],
    ids=["circle-sa-causal-alibi", "sphere-usa-rk4"],
)
def test_harmonic_summation_runs_the_study_as_direct_summation_does(overrides):
    """The same study summed directly and harmonically (float64): the states agree to
    the tolerance's order, and so do the metrics (USA at beta = 1: at beta = 4 it moves at
    speed ~e^4, its Runge-Kutta stages at dt = 0.1 leave the sphere by O(1), where the
    two sums differ, as x_j / |x_j| enters the harmonic one); the results file says how
    it summed, at which degree and with which coefficient tail."""
    config = {**SMALL, **overrides}
    direct = af.run(config)
    harmonic = af.run({**config, "summation": "harmonic"})
    assert np.abs(direct.x.values - harmonic.x.values).max() < 1e-6
    for name in config["metrics"]:
        np.testing.assert_allclose(harmonic[name].values, direct[name].values, rtol=1e-7, atol=1e-9, err_msg=name)
    assert direct.attrs["summation"] == "direct" and "summation_degree" not in direct.attrs
    d, beta = config["d"], config["beta"]
    expected = degree(RADIUS_MARGIN * beta, 1e-7, d)
    assert harmonic.attrs["summation"] == "harmonic"
    assert harmonic.attrs["summation_degree"] == expected
    assert harmonic.attrs["summation_error_bound"] == pytest.approx(error_bound(RADIUS_MARGIN * beta, expected, d))
    assert harmonic.attrs["summation_error_bound"] <= 1e-7


def test_the_degree_follows_the_largest_beta_and_the_weights():
    """One degree per study, from its largest beta and the norms of Q and K (their scales
    and factors in time), compiled in: two studies that differ only in data (a weight
    scale) but need other degrees do not share a program."""
    base = dict(n=4096, d=2, summation="harmonic", metrics=["order_parameter"])
    one = summation(compose({**base, "beta": [1.0, 4.0]}))
    assert one.degree == degree(RADIUS_MARGIN * 4.0, 1e-7, 2)
    scaled = summation(compose({**base, "beta": 4.0, "weights": {"k": {"scale": 2.0, "factors": [1.0, 0.5],
                                                                          "switch_times": [1.0]}}}))
    assert scaled.degree == degree(RADIUS_MARGIN * 8.0, 1e-7, 2) > one.degree
    looser = summation(compose({**base, "beta": 4.0, "summation_tol": 1e-3}))
    assert looser.degree < one.degree
    a = build_system({**base, "beta": 4.0, "weights": {"k": {"scale": 1.5}}})
    b = build_system({**base, "beta": 4.0, "weights": {"k": {"scale": 3.0}}})
    assert a.structure.fixed["summation"].degree < b.structure.fixed["summation"].degree
    assert a.structure != b.structure   # the degree is part of what is compiled
    # the metrics below n^2 go the same way: the energy by harmonic summation, the pairs by sorted angles
    energy = build_system({**base, "beta": 4.0, "metrics": ["log_energy", "pair_density"]})
    field, _, recorder = energy(jax.random.key(0), 4.0)
    assert recorder.energy_degree == degree(RADIUS_MARGIN * 4.0, 1e-7, 2) and recorder.on_circle
    assert field.terms[0].summation == "harmonic" and field.terms[0].degree == one.degree


def test_auto_chooses_harmonic_where_it_serves_and_is_faster():
    plan = summation(compose(dict(n=4096, d=2, beta=4.0, summation="auto", metrics=ALL_BELOW_N2)))
    assert plan.method == "harmonic" and basis_size(plan.degree, 2) * AUTO_RATIO <= 4096
    small = summation(compose(dict(n=32, d=2, beta=4.0, summation="auto", metrics=ALL_BELOW_N2)))
    assert small.method == "direct" and "costs about direct summation" in small.reason
    random_k = summation(compose(dict(n=4096, d=2, summation="auto", metrics=ALL_BELOW_N2,
                                      weights={"k": {"kind": "random"}})))
    assert random_k.method == "direct" and "random Q or K" in random_k.reason
    dense_metric = summation(compose(dict(n=4096, d=3, summation="auto", metrics=["pair_density"])))
    assert dense_metric.method == "direct" and "pair_density" in dense_metric.reason


def test_auto_says_in_the_results_why_it_summed_directly():
    ds = af.run(dict(n=16, d=2, members=1, t1=1, summation="auto", compilation_cache=False))
    assert ds.attrs["summation"] == "direct"
    assert ds.attrs["summation_note"].startswith("summation=auto chose direct summation: ")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(d=4), "not d=4"),
        (dict(scheme="none"), "tokens off the sphere (scheme=none)"),
        (dict(scheme="pre"), "tokens off the sphere (scheme=pre)"),
        (dict(attention_kind="hardmax"), "attention_kind=hardmax"),
        (dict(attention_kind="sinkhorn"), "attention_kind=sinkhorn"),
        (dict(cross={"enabled": True}), "cross-attention"),
        (dict(weights={"q": {"kind": "random"}}), "random Q or K"),
        (dict(metrics=["attention"]), "the metric attention"),
        (dict(d=3, metrics=["clusters"]), "the metric clusters"),
        (dict(n=16, beta=30.0), "costs more than direct summation"),
    ],
)
def test_harmonic_summation_refuses_what_it_cannot_serve_in_one_sentence(overrides, words):
    config = {"n": 4096, "d": 2, "beta": 1.0, "summation": "harmonic", "metrics": ["order_parameter"], **overrides}
    with pytest.raises(ConfigError) as error:
        af.validate_config(config)
    message = str(error.value)
    assert words in message and "use summation=direct or summation=auto" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_bad_tolerances_and_a_tolerance_without_harmonic_summation_are_refused():
    for tol in (0, 1, -1e-3):
        with pytest.raises(ConfigError, match="summation_tol must be a number in"):
            af.validate_config({"summation": "harmonic", "summation_tol": tol})
    with pytest.raises(ConfigError, match="summation_tol does not apply with summation=direct"):
        af.validate_config({"summation_tol": 1e-5})


def test_a_config_stored_before_summation_existed_reads_as_direct():
    stored = {key: value for key, value in af.validate_config({}).__dict__.items()}
    config = current_config({"solver": "euler", "n": 8, "d": 2})
    assert config["summation"] == "direct" and config["summation_tol"] == pytest.approx(1e-7)
    assert "summation" in stored
