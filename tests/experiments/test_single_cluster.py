"""The single-cluster experiment (three tokens on S^2 at beta = 1.1, Q = K = V = I):
every member's interaction energy never decreases and every member ends in one
cluster, as the survey's theorem 4.2 and lemma 3.3 say; its figures, the interactive
HTML view and the GIF are drawn from the Dataset alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from commands import assert_cf
from PIL import Image

from attnflow import load_results, write_results
from attnflow.experiments import draw_experiment, run_experiment
from attnflow.experiments._animate import plotly_text


@pytest.fixture(scope="module")
def single_cluster():
    # The full-size config with fewer members: the last of 64 members reaches one
    # cluster near t = 12 of the 15 run, so eight members keep a safe margin.
    return run_experiment("single_cluster", {"members": 8, "compilation_cache": False})


def test_energy_never_decreases_and_one_cluster_forms(single_cluster):
    ds = single_cluster
    energy = ds["energy"].transpose("member", "time").values
    increments = np.diff(energy, axis=1)
    # Monotone up to round-off (relative to the energy itself), in every member.
    assert np.all(increments >= -1e-12 * np.abs(energy[:, :-1])), increments.min()
    assert np.all(ds["energy_increase"].values >= -1e-12 * np.abs(energy).max())
    # The energy does grow, up to the single cluster's e^beta/(2 beta): with every pair
    # within 2 eps of cos = 1 (a chain of two eps-close pairs), E >= e^{beta(1 - 2 eps)}/(2 beta).
    beta, eps = float(ds["beta"]), yaml.safe_load(ds.attrs["config"])["cluster_eps"]
    np.testing.assert_allclose(energy[:, -1], np.exp(beta) / (2 * beta), rtol=2 * beta * eps)
    assert np.all(energy[:, -1] > energy[:, 0])
    assert np.all(ds["clusters"].isel(time=-1).values == 1)
    assert np.all(ds["status"].values == 0)


def test_draw_writes_figures_html_and_gif_from_a_file_that_passes_the_cf_checker(single_cluster, tmp_path):
    # Drawn from the file, as `attnflow plot` does.
    path = write_results(single_cluster, tmp_path / "results.nc")
    assert_cf(tmp_path, path)
    ds = load_results(path)
    paths = draw_experiment(ds, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == [f"single_cluster.{s}" for s in ("gif", "html", "pdf", "png")]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    html = (tmp_path / "single_cluster.html").read_text()
    # Self-contained: plotly's JavaScript is inside, with one frame per shown time and a slider.
    assert "Plotly.newPlot" in html and "plotly.js" in html.lower() and "<script src=" not in html
    assert '"frames"' in html or "addFrames" in html
    assert '"sliders"' in html and html.count('"method":"animate"') > 3  # play, pause, a step per time
    # Its text is plotly's (Unicode and <i>, <sub>, <sup>), not LaTeX, which plotly
    # draws only with MathJax, and the offline page does not load it.
    layout = _plotly_layout(html)
    texts = [layout["title"]["text"], layout["sliders"][0]["currentvalue"]["prefix"]]
    texts += [layout["scene"][f"{axis}axis"]["title"]["text"] for axis in "xyz"]
    assert not any("$" in text or "\\" in text for text in texts), texts
    assert "on <i>S</i><sup>2</sup>, β = 1.1" in texts[0] and texts[2] == "<i>x</i><sub>1</sub>", texts
    with Image.open(tmp_path / "single_cluster.gif") as gif:
        assert gif.n_frames > 1
        assert gif.n_frames <= 60
    assert not list(tmp_path.glob(".*.tmp"))


def _plotly_layout(html: str) -> dict:
    """The layout that a plotly HTML page passes to `Plotly.newPlot(id, data, layout, config)`."""
    decoder, rest = json.JSONDecoder(), html[html.index("Plotly.newPlot(") + len("Plotly.newPlot(") :]
    for _ in range(3):  # the id, the data, then the layout
        value, end = decoder.raw_decode(rest.lstrip())
        rest = rest.lstrip()[end:].lstrip().removeprefix(",")
    return value  # pyright: ignore[reportPossiblyUnboundVariable]


def test_plotly_text_writes_mathtext_as_plotly_html():
    assert plotly_text("plain, 2 < 3") == "plain, 2 < 3"
    assert plotly_text("$S^{2}$ and $\\lambda_{12}$, $\\Gamma$ $\\to$ $x_i^2$") == (
        "<i>S</i><sup>2</sup> and λ<sub>12</sub>, Γ → <i>x</i><sub><i>i</i></sub><sup>2</sup>"
    )
