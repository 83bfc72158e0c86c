"""experiment=long_context: the output cosine of one attention layer against its closed form
for equiangular tokens (tests/README.md, "The long-context transition")."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from commands import assert_cf

import attnflow as af
from attnflow.experiments import draw_experiment, run_experiment
from attnflow.experiments import long_context as lc


def _exactly_equiangular(n, rho):
    """x_i = sqrt(rho) e_0 + sqrt(1 - rho) e_i in d = n + 1: <x_i, x_j> = rho exactly."""
    x = np.zeros((n, n + 1))
    x[:, 0] = np.sqrt(rho)
    x[np.arange(n), np.arange(1, n + 1)] = np.sqrt(1 - rho)
    return jnp.asarray(x)


@pytest.mark.parametrize("n,rho", [(7, 0.3), (40, 0.8)])
def test_self_attention_on_equiangular_tokens_gives_the_closed_form(n, rho):
    """The core's SelfAttention, dense and in tiles, on exactly equiangular tokens: every
    pair of outputs has the finite-n closed form, at beta below, at and above the critical
    gamma log n, and beta = 50 (where e^beta alone would lose the off-diagonal terms)."""
    x = _exactly_equiangular(n, rho)
    eye = af.Identity(1, n + 1, "float64")
    rows = jnp.asarray([0, 3, n - 1])

    @jax.jit
    def outputs(beta):
        layer = af.SelfAttention(eye, eye, eye, None, beta, None, heads=1, unit_rows=True)
        return [(dataclasses.replace(layer, block=block)(0.0, x),
                 dataclasses.replace(layer, block=block)(0.0, x, rows=rows)) for block in (0, 4)]

    for beta in (0.5 * np.log(n) / (1 - rho), np.log(n) / (1 - rho), 3 * np.log(n) / (1 - rho), 50.0):
        for y, some in outputs(jnp.asarray(beta)):
            u = np.asarray(y) / np.linalg.norm(np.asarray(y), axis=1, keepdims=True)
            cos = (u @ u.T)[~np.eye(n, dtype=bool)]
            np.testing.assert_allclose(cos, lc.equiangular_cosine(n, rho, beta), rtol=1e-13)
            np.testing.assert_allclose(some, np.asarray(y)[np.asarray(rows)], atol=1e-14)


def test_the_closed_form_tends_to_the_three_limits():
    """At beta = gamma log n the finite-n form approaches 1, 4 rho/(1 + 3 rho) and rho, and
    agrees with the fixed-s form rho (1 + s)^2 / (s^2 + 2 s rho + rho) as n grows."""
    rho = 0.5
    ns = np.array([1e2, 1e4, 1e6, 1e8])
    for ratio, limit in ((0.5, 1.0), (1.0, 4 * rho / (1 + 3 * rho)), (2.0, rho)):
        beta = ratio / (1 - rho) * np.log(ns)
        exact = lc.equiangular_cosine(ns, rho, beta)
        distance = np.abs(exact - limit)
        assert np.all(np.diff(distance) < 0) and distance[-1] < 1e-4, (ratio, distance)
        s = np.exp(beta * (1 - rho)) / ns
        assert np.all(np.abs(lc.asymptotic_cosine(s, rho) - exact) <= 0.3 / ns)  # O(1/n) apart
        assert lc.limit_cosine(ratio, rho) == limit


def test_the_readmes_exact_values_and_weight_factors():
    """The exact equiangular cosines the README quotes at n = 1e5 (rho = 0.5, beta =
    gamma log n), the approach to 0.8 like 0.28/n at the critical gamma, and the weight
    factor e^{beta^2 sigma^2 / 2}, sigma = (1 - rho)/sqrt(d - 1), of the nearly equiangular
    tokens at n = 1e5: 1.067 for d = 1024, 1.30 for d = 256, 1.03 for d = 2048."""
    rho, n = 0.5, 1e5
    beta = lambda ratio, n: ratio / (1 - rho) * np.log(n)  # noqa: E731
    quoted = {0.5: 0.99999, 0.75: 0.99717, 1.5: 0.50158, 2.0: 0.50001}
    for ratio, value in quoted.items():
        np.testing.assert_allclose(lc.equiangular_cosine(n, rho, beta(ratio, n)), value, atol=5e-6)
    ns = np.array([1e3, 1e4, 1e5, 1e6])
    excess = (lc.equiangular_cosine(ns, rho, beta(1.0, ns)) - 0.8) * ns
    np.testing.assert_allclose(excess, 0.28, rtol=0.02)
    for d, factor in ((1024, 1.067), (256, 1.30), (2048, 1.03)):
        sigma = (1 - rho) / np.sqrt(d - 1)
        np.testing.assert_allclose(np.exp((beta(1.0, n) * sigma) ** 2 / 2), factor, atol=0.005)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    # The figure's sizes up to n = 1000 (its n = 100, 316, 1000, its 64 sampled rows).
    overrides = {"d": 1024, "dtype": "float64", "compilation_cache": False,
                 "experiment": {"options": {"n_max": 1000, "n_count": 3, "rows": 64,
                                            "gamma_critical": [0.5, 0.75, 1.0, 1.5, 2.0]}}}
    return run_experiment("long_context", overrides)


def test_a_reduced_run_moves_toward_the_right_limit(reduced):
    """n from 100 to 1000 at d = 1024: below and above the critical gamma the distance to
    the limit (1, rho) shrinks with n; at it the cosine stays by 4 rho/(1 + 3 rho); every
    measured cosine is within the deviation of the nearly equiangular tokens of the
    closed form at its n."""
    ds = reduced.sel(rho=0.5)
    assert list(ds["n"].values) == [100, 316, 1000]
    distance = np.abs(ds["cosine"] - ds["limit"])
    for ratio in (0.5, 0.75, 1.5, 2.0):
        d = distance.sel(gamma_critical=ratio).values
        assert np.all(np.diff(d) < 0), (ratio, d)
        # s = n^(g - 1) with g = ratio: the distance falls like s^2 below, like 1/s above
        assert d[-1] < d[0] / (3 if ratio in (0.5, 2.0) else 2), (ratio, d)
    # At the critical gamma the cosine stays by 0.8: 0.8030, 0.8012, 0.8019 at n = 100, 316, 1000.
    assert np.all(distance.sel(gamma_critical=1.0).values < 0.0035)
    np.testing.assert_allclose(ds["cosine"], ds["exact"], atol=3e-3)
    # (1 - rho) / sqrt(d - 1) against the n - rows tokens outside the exactly equiangular sample
    n = ds["n"].values
    sigma = ds["inner_product_spread"].values
    np.testing.assert_allclose(sigma, 0.5 / np.sqrt(1023) * np.sqrt((n - 64) / (n - 1)), rtol=0.05)
    # The off-diagonal weights grow on average by e^{beta^2 sigma^2 / 2} (the mean of e^{beta g}
    # for a Gaussian g of deviation sigma): measured 1.0047 to 1.095 here, within 0.3% of it.
    predicted = np.exp(ds["beta"].transpose("n", "gamma_critical").values ** 2 * sigma[:, None] ** 2 / 2)
    np.testing.assert_allclose(ds["weight_factor"].transpose("n", "gamma_critical").values, predicted, rtol=0.006)


def test_the_experiment_writes_results_that_pass_the_cf_checker_and_redraws(reduced, tmp_path):
    path = af.write_results(reduced, tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    ds = af.load_results(path)
    np.testing.assert_allclose(ds["cosine"], reduced["cosine"])
    paths = draw_experiment(ds, tmp_path / "figures")
    assert sorted(p.name for p in paths) == ["long_context.pdf", "long_context.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_the_top_of_the_range_follows_the_backend():
    options = lc.Options()
    top = lc.sizes(options.n_min, options.n_max, options.n_count)[-1]
    assert top == (10**6 if jax.default_backend() == "gpu" else 10**5)
    assert list(lc.sizes(options.n_min, 1000, 3)) == [100, 316, 1000]


@pytest.mark.parametrize("overrides, message", [
    ({"experiment": {"options": {"rho": [1.0]}}}, "every experiment.options.rho of experiment long_context must lie"),
    ({"experiment": {"options": {"gamma_critical": [-1]}}},
     "gamma_critical of experiment long_context must lie above 0"),
    ({"experiment": {"options": {"n_max": 50}}}, "n_max of experiment long_context must be null or a whole number"),
    ({"experiment": {"options": {"rows": 500}}}, "rows=500 query tokens cannot be sampled from n_min=100"),
    ({"d": 16}, "needs rows <= d - 1 = 15"),
    ({"n": 64, "members": 3}, "n and members do not apply to experiment long_context"),
    ({"experiment": {"options": {"width": 3}}}, "unknown option experiment.options.width"),
])
def test_bad_options_are_refused_in_one_sentence(overrides, message):
    with pytest.raises(af.ConfigError, match=message) as error:
        run_experiment("long_context", overrides)
    assert str(error.value).count(". ") == 0 and "\n" not in str(error.value)
