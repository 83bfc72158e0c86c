"""Token detection: a causal attention flow that answers "was a 0 in the sequence so far?".

The construction of "A Survey of Continuous Time Dynamics of Transformers" (sec. 5.2.1,
eq. 49-50, fig. 5). The vocabulary is 0-4 with one-hot embeddings e_0, ..., e_4 in
d = 5: 0 is the special token, 1 and 2 are fillers, 3 means YES (a 0 came at or before
this position) and 4 means NO. A sequence's tokens start at their embeddings and follow
causal softmax self-attention on the sphere, token i attending to tokens j <= i, with
Q = K = 0, so that the attention is uniform over j <= i, and a value matrix that
switches at t = 5 (`weights.v.value` holds one matrix per piece; V multiplies the token
as a column vector, 1_{ab} is the matrix with a single 1 in row a, column b):

- stage 1, detection (t < 5): V_1 = 1_{00}. V_1 x keeps only the e_0 component of x, so
  token i is pulled towards e_0 by the mean over j <= i of <e_0, x_j> e_0: nothing moves
  before the first 0 (and the 0 itself sits still, the pull being along it), every
  later token turns towards e_0.
- stage 2, prediction (5 <= t <= 20): V_2 = 1_{30} + 1_{41} + 1_{42} maps e_0 to e_3 and
  the fillers e_1, e_2 to e_4. Positions before the first 0 see only fillers and turn
  towards NO; positions after it, which stage 1 brought near e_0, turn towards YES.

Each token is read out as a distribution over the vocabulary by a softmax of its inner
products with the embeddings at inverse temperature 2 (the survey's "temperature
beta = 2"; beta multiplies the logits throughout the survey): p_i(k) =
softmax_k(2 <e_k, x_i>). One-hot tokens on the unit sphere cap a probability at
e^2 / (e^2 + 4) = 0.65.

Each sequence of the option `sequences` is one panel (default: a 0 at the third
position, and a sequence without 0). Stored per panel: the sequence, the states `x`,
the probabilities `probability`, `zero_position` (1-based, 0 when absent),
`detected_from` (the first position whose most probable token at the switch is 0) and
`answer` (the most probable token of each position at the end).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, config_of, stack_panels, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure
else:
    xr = lazy("xarray")


@dataclass
class Options:
    sequences: list[list[int]] = setting([[1, 2, 0, 2, 1, 1, 2, 1], [1, 2, 1, 2, 2, 1, 2, 1]], "one panel each")
    readout_beta: float = setting(2.0, "p_i(k) = softmax_k(readout_beta <e_k, x_i>)")


ROLES = {0: "special", 1: "filler", 2: "filler", 3: "YES", 4: "NO"}


def readout(x: np.ndarray, beta: float) -> np.ndarray:
    """p(k) = softmax_k(beta <e_k, x>) over the last axis (one-hot embeddings e_k)."""
    logits = beta * x
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _heatmap(ax, p: np.ndarray, sequence: np.ndarray, vmax: float):
    image = ax.imshow(p.T, origin="lower", cmap="magma", vmin=0, vmax=vmax, aspect="auto")
    for i in range(p.shape[0]):
        for k in range(p.shape[1]):
            ax.text(
                i,
                k,
                f"{p[i, k]:.2f}",
                ha="center",
                va="center",
                fontsize=6.5,
                color="k" if p[i, k] > 0.6 * vmax else "w",
            )
    ax.set_xticks(range(p.shape[0]), [f"{i + 1}\n'{k}'" for i, k in enumerate(sequence)])
    ax.set_yticks(range(p.shape[1]), [f"{k} {ROLES.get(k, '')}".strip() for k in range(p.shape[1])])
    ax.set_xlabel("position ('token')")
    ax.grid(False)
    return image


class TokenDetection(Experiment):
    title = "Token detection with a causal mask and a value matrix switching at t = 5"
    paper = "A Survey of Continuous Time Dynamics of Transformers, sec. 5.2.1, eq. 49-50, fig. 5"
    coordinates = {
        "vocabulary": ("vocabulary token (0: the detected token, 4: NO)", "1"),
    }
    Options = Options

    def check(self) -> None:
        cfg = self.cfg
        sequences = self.options.sequences
        if not (sequences and all(sequences)):
            raise ConfigError("experiment.options.sequences must be a non-empty list of non-empty token lists.")
        if len({len(s) for s in sequences}) != 1:
            raise ConfigError(
                f"the sequences of experiment.options.sequences must have one length, got lengths "
                f"{[len(s) for s in sequences]}."
            )
        for s in sequences:
            if not all(0 <= k < cfg.d for k in s):
                raise ConfigError(
                    f"experiment.options.sequences holds {s}: tokens are whole numbers from 0 to "
                    f"{cfg.d - 1} (one per embedding dimension, d = {cfg.d})."
                )
        if cfg.init.kind != "given" or cfg.init.value is not None:  # pyright: ignore[reportAttributeAccessIssue]  # the given kind's field
            raise ConfigError(
                "experiment token_detection builds init.value from experiment.options.sequences; "
                "give the tokens there, not as init."
            )
        beta = self.options.readout_beta
        if not beta > 0:
            raise ConfigError(f"experiment.options.readout_beta must be a positive number, got {beta!r}.")

    def panels(self, base: dict) -> dict[str, dict]:
        """One study per sequence: its one-hot embeddings as the initial tokens."""
        out = {}
        for sequence in self.options.sequences:
            config = copy.deepcopy(base)
            config["n"] = len(sequence)
            config["init"] = {"kind": "given", "value": np.eye(base["d"])[sequence].tolist()}
            out["-".join(map(str, sequence))] = config
        return out

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg = self.cfg
        beta = self.options.readout_beta
        switch = float(cfg.weights.v.switch_times[0]) if cfg.weights.v.switch_times else float(cfg.t0)
        parts = {}
        for (label, ds), sequence in zip(results.items(), self.options.sequences):
            t = ds["time"].values
            x = ds["x"].isel(member=0).values  # (time, token, dim)
            p = readout(x, beta)
            at_switch = int(np.argmin(np.abs(t - switch)))
            zeros = [i for i, k in enumerate(sequence) if k == 0]
            detected = np.flatnonzero(p[at_switch].argmax(-1) == 0)
            parts[label] = xr.Dataset(
                {
                    "sequence": (("token",), np.asarray(sequence), {"description": "the token at each position"}),
                    "x": (("time", "token", "dim"), x, {"description": "the tokens' states"}),
                    "probability": (
                        ("time", "token", "vocabulary"),
                        p,
                        {"description": f"softmax over the vocabulary of {beta:g} <e_k, x_i>"},
                    ),
                    "zero_position": (
                        (),
                        zeros[0] + 1 if zeros else 0,
                        {"description": "first position (1-based) holding token 0; 0 when none does"},
                    ),
                    "detected_from": (
                        (),
                        int(detected[0]) + 1 if detected.size else 0,
                        {
                            "description": "first position (1-based) whose most probable token at t = "
                            f"{t[at_switch]:g} is 0"
                        },
                    ),
                    "answer": (
                        ("token",),
                        p[-1].argmax(-1),
                        {"description": f"most probable token of each position at t = {t[-1]:g}"},
                    ),
                },
                coords={"time": t, "token": np.arange(1, len(sequence) + 1), "vocabulary": np.arange(x.shape[-1])},
            )
        out = stack_panels(parts, dim="panel")
        out["switch_time"] = xr.DataArray(switch).assign_attrs(description="the time at which V switches")
        out["readout_beta"] = xr.DataArray(beta).assign_attrs(description="inverse temperature of the readout")
        return out

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        if "position" in ds.dims:  # a file written before the dimension names were unified
            ds = ds.rename(position="token")
        cfg = config_of(ds)
        t = ds["time"].values
        switch = float(ds["switch_time"])
        at_switch = int(np.argmin(np.abs(t - switch)))
        labels = list(ds["panel"].values)
        rows = len(labels)
        fig, axes = subplots(
            rows,
            4,
            figsize=(15.0, 3.3 * rows),
            layout="constrained",
            squeeze=False,
            gridspec_kw={"width_ratios": [1.2, 1.2, 1, 1]},
        )
        vmax = float(ds["probability"].max())
        positions = ds["token"].values
        colors = colormap("viridis")(np.linspace(0, 0.9, len(positions)))
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        for r, label in enumerate(labels):
            part = ds.sel(panel=label)
            sequence = part["sequence"].values.astype(int)
            p = part["probability"].values
            zero = int(part["zero_position"])
            where = f"0 at position {zero}" if zero else "no 0"
            for c, (index, stage) in enumerate(((at_switch, "end of detection"), (-1, "end of prediction"))):
                image = _heatmap(axes[r, c], p[index], sequence, vmax)
                axes[r, c].set_title(f"({next(letters)}) {where}: t = {t[index]:g}, {stage}")
            for c, (k, name) in enumerate(((0, "token 0 (special)"), (3, "token 3 (YES)")), start=2):
                ax = axes[r, c]
                for i, position in enumerate(positions):
                    ax.plot(t, p[:, i, k], color=colors[i], linewidth=1.2, label=f"{position}: '{sequence[i]}'")
                ax.axvline(switch, color="k", linestyle="--", linewidth=1)
                ax.set_xlabel("time t")
                ax.set_ylabel(f"probability of {name}")
                ax.set_ylim(0, vmax * 1.05)
                ax.set_title(f"({next(letters)}) p(token {k}) over time, by position")
            axes[r, 3].legend(title="position: 'token'", loc="center left", bbox_to_anchor=(1.02, 0.5))
        fig.colorbar(image, ax=axes[:, :2], label="probability", shrink=0.8)
        caption(
            fig,
            (
                f"Causal softmax attention on $S^{{{cfg['d'] - 1}}}$ with Q = K = 0 (uniform attention over the "
                f"positions up to each one), one-hot initial tokens, V = 1_00 until t = {switch:g} (detection), then "
                f"1_30 + 1_41 + 1_42 until t = {t[-1]:g} (prediction); {cfg['solver']} with dt = {cfg['dt']}. "
                f"Probabilities: softmax over the vocabulary of {float(ds['readout_beta']):g} $\\langle e_k, x_i "
                "\\rangle$. Token 0 is detected only from the position where it appears on (the causal mask); in stage "
                "2 probability moves onto 3 (YES) from that position on, 3 being the most probable answer from the "
                "next position on and more so further along the sequence; without a 0 every position answers 4 (NO). "
                "Dashed line: the switch of V."
            ),
            width=170,
        )
        return {"token_detection": fig}
