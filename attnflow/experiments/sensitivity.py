"""Which words of a sentence the next word depends on: token-pair Lyapunov sensitivity
of a trained model against its attention ("Neural ODE Transformers", eq. 7, fig. 3).

`attnflow experiment=sensitivity checkpoint=PATH text="..."` loads the checkpoint and
its tokenizer (as experiment=checkpoint does), embeds the sentence, and follows the
model's own dynamics over depth (`depth_flow`: one Euler or split step per layer is the
real forward pass; `steps` > 1 refines it, weights held per layer). Along that
trajectory `attnflow.analysis.pair_exponents.token_sensitivity` integrates, for each output
position $j$ in `outputs` and every input token $i$, the tangent equation
$\\dot Y_{ji} = J_{ji} Y_{ji}$, $Y_{ji}(0) = I$, with $J_{ji}$ the Jacobian block of token
$j$'s velocity with respect to token $i$, and stores the largest finite-time exponent
$\\lambda_{ji} = \\frac{1}{L} \\log \\sigma_{\\max}(Y_{ji}(L))$ as `exponent` (output,
token); NaN where a causal mask hides $i$ from $j$ ($i > j$). Beside it, `attention`
(output, token) is the attention the model pays, averaged over heads and layers: the
map that attention-based explanations read. The default output is the last position,
whose state predicts the next token; the model's top prediction is stored too
(`prediction`).

An encoder-decoder is read as experiment=checkpoint reads it (`checkpoint_sentence`):
the tokens are its decoder's (the start token, then the text), and the encoder's output,
which the decoder's cross-attention reads, is held fixed: the exponents measure how the
output depends on the decoder's tokens, not on the text through the encoder (attributes
`encoder_tokens`, `decoder_start_id`, `decoder_input`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..running._progress import Progress
from ..schema._config import Solver
from ..schema._errors import CheckpointError, ConfigError
from ..schema._schema import setting
from ..storage._cf import setting_value
from ._common import caption, colormap, config_of, figure, subplots, token_ticks
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._text import FONT, checkpoint_sentence, encoder_attrs, highlight, layout, scaled, shown, token_id_variable

if TYPE_CHECKING:
    import jax
    import xarray as xr
    from matplotlib.figure import Figure

    from ..analysis import pair_exponents
    from ..checkpoints import _flow
else:
    jax = lazy("jax")
    xr = lazy("xarray")
    pair_exponents = lazy("attnflow.analysis.pair_exponents")
    _flow = lazy("attnflow.checkpoints._flow")


@dataclass
class Options:
    outputs: list[int] | None = setting(
        [-1], "output positions j (negative: from the end); null = every token (n times the cost)"
    )
    steps: int = setting(1, "steps per layer (1 = the model's own layer map; more refine it, weights held per layer)")
    solver: Solver = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        Solver.euler,  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "the step of each (sub-)step; euler makes the tangent step the Euler step of eq. 7",
    )


def _prediction(checkpoint, tokenizer, last_state) -> tuple[int, str]:
    """The model's most likely next token after the sentence, or (-1, "") without an LM head."""
    try:
        logits = checkpoint.logits(last_state[None])[0]
    except CheckpointError:
        return -1, ""
    best = int(np.argmax(np.asarray(logits)))
    return best, tokenizer.tokens([best])[0]


class Sensitivity(Experiment):
    title = "Token-pair Lyapunov sensitivity of a trained model beside its attention"
    paper = "Neural ODE Transformers, eq. 7, app. B, fig. 3"
    Options = Options
    # The long names and units of this experiment's own coordinates (units None: text).
    coordinates = {
        "output": ("position of the output token j", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        if not cfg.checkpoint:
            raise ConfigError(
                "experiment=sensitivity needs checkpoint=PATH (a model directory, a .gguf file, or minilm / smollm2)."
            )
        if not cfg.text or not str(cfg.text).strip():
            raise ConfigError('experiment=sensitivity needs a sentence: text="...".')
        steps = options.steps
        if steps < 1:
            raise ConfigError(
                f"experiment.options.steps must be a positive whole number of steps per layer, got {steps!r}."
            )
        outputs = options.outputs
        if outputs is not None and not outputs:
            raise ConfigError(
                f"experiment.options.outputs must be a list of token positions (e.g. [-1], the last) "
                f"or null for every token, got {outputs!r}."
            )
        n = checkpoint_sentence(cfg)[2].size  # a bad checkpoint, or a text it cannot read, stops here
        if outputs is not None and any(not -n <= o < n for o in outputs):
            bad = next(o for o in outputs if not -n <= o < n)
            raise ConfigError(
                f"experiment.options.outputs has position {bad} but the text has {n} tokens; "
                f"use positions from {-n} to {n - 1}."
            )
        # A position counted from the end names the same token as one from the start: one output row each.
        tokens = [o % n for o in outputs or []]
        again = next((i for i, token in enumerate(tokens) if token in tokens[:i]), None)
        if again is not None:
            assert outputs is not None  # tokens come from outputs
            first = outputs[tokens.index(tokens[again])]
            raise ConfigError(
                f"experiment.options.outputs names token {tokens[again]} of the {n} twice ({first} and "
                f"{outputs[again]}); give each position once."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # nothing for the core study runner: everything happens in `analyse`

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg = self.cfg
        checkpoint, tokenizer, ids = checkpoint_sentence(cfg)
        strings = tokenizer.tokens(ids)
        model = _flow.forward(checkpoint, ids)
        steps = int(self.options.steps)
        outputs = self.options.outputs
        count = ids.size if outputs is None else (len(outputs) if isinstance(outputs, list) else 1)
        # One compiled call for every output token (its outputs are static): the line shows
        # the time spent on it.
        with Progress(
            f"sensitivity of {count} output token{'s' if count > 1 else ''} over {checkpoint.depth} layers",
            1,
            unit="solves",
        ) as bar:
            result = jax.block_until_ready(
                pair_exponents.token_sensitivity(
                    _flow.depth_flow(checkpoint),
                    model.hidden[0],
                    dt=1.0 / steps,
                    outputs=outputs,
                    solver=str(self.options.solver),
                )
            )
            bar.advance()
        predicted, predicted_string = _prediction(checkpoint, tokenizer, model.hidden[-1][-1])
        n = ids.size
        source = encoder_attrs(checkpoint)
        return xr.Dataset(
            {
                "token_id": token_id_variable(checkpoint, ids),
                "exponent": (
                    ("output", "token"),
                    np.asarray(result.exponents, np.float64),
                    {
                        "description": "lambda_ji = (1/L) log sigma_max(Y_ji(L)), Y_ji' = J_ji Y_ji, "
                        "Y_ji(0) = I: sensitivity of output token j to input token i (NaN: i "
                        "hidden from j by the causal mask)"
                    },
                ),
                "attention": (
                    ("output", "token"),
                    np.asarray(result.attention, np.float64),
                    {"description": "attention of output j to token i, averaged over heads and layers"},
                ),
            },
            coords={
                "token": np.arange(n),
                "output": np.asarray(result.outputs),
                "token_string": ("token", np.asarray(strings, dtype=object), {"long_name": "the token as text"}),
            },
            attrs={
                "checkpoint": str(cfg.checkpoint),
                "family": checkpoint.family,
                "arrangement": checkpoint.arrangement,
                "causal": int(checkpoint.causal),
                "model_name": checkpoint.name or str(cfg.checkpoint),
                "text": str(cfg.text),
                "prediction_id": predicted,
                "prediction": predicted_string,
                "depth": checkpoint.depth,
                **source,
            },
        )

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        name = ds.attrs.get("model_name", "checkpoint")
        tokens = [str(t) for t in ds.token_string.values]
        n = len(tokens)
        last = int(ds.output.values[-1])
        exponent = ds.exponent.sel(output=last).values
        attention = ds.attention.sel(output=last).values
        if setting_value(ds.attrs.get("causal")):
            attention = np.where(np.arange(n) > last, np.nan, attention)
        steps = cfg["experiment"]["options"]["steps"]
        figures = {}

        # 1. The sentence highlighted by sensitivity and by attention, and both as bars.
        width = 10.0
        fig = figure(figsize=(width + 0.6, 1))
        placed, lines = layout(fig, tokens, width)
        text_height = 0.45 + lines * 1.9 * FONT / 72
        bars = 2.6
        fig.set_size_inches(width + 0.6, 2 * text_height + bars + 0.6)
        grid = fig.add_gridspec(3, 1, height_ratios=[text_height, text_height, bars], hspace=0.35, bottom=0.17)
        reds, blues = colormap("Reds"), colormap("Blues")
        predicted = ds.attrs.get("prediction", "")
        target = f"token {last} ({shown(tokens[last])[0]!r})"
        highlight(
            fig,
            fig.add_subplot(grid[0]),
            placed,
            0.85 * scaled(exponent, last),
            reds,
            f"Lyapunov sensitivity of {target} to each token",
            last,
        )
        highlight(
            fig,
            fig.add_subplot(grid[1]),
            placed,
            0.85 * scaled(attention, last),
            blues,
            f"attention of {target}, mean over heads and layers",
            last,
        )
        ax = fig.add_subplot(grid[2])
        positions = np.arange(n)
        ax.bar(positions - 0.2, exponent, width=0.4, color=reds(0.7), label="sensitivity $\\lambda_{ji}$")
        ax.set_ylabel("$\\lambda_{ji}$ (per layer)")
        twin = ax.twinx()
        twin.bar(positions + 0.2, attention, width=0.4, color=blues(0.7), label="attention $\\bar a_{ji}$")
        twin.set_ylabel("mean attention")
        twin.grid(False)
        ax.set_xticks(positions, [shown(t)[0] for t in tokens], rotation=60, ha="right")
        ax.legend(
            handles=ax.containers[:1] + twin.containers[:1],
            loc="lower left",
            bbox_to_anchor=(0, 1.0),
            ncol=2,
            frameon=False,
        )
        suffix = f"; the model's next word: {predicted!r}" if predicted else ""
        fig.suptitle(f"{name}: sensitivity of {target}{suffix}", y=1.0)
        caption(
            fig,
            r"Red: $\lambda_{ji} = \frac{1}{L} \log \sigma_{\max}(Y_{ji}(L))$ with $Y' = J_{ji} Y$, "
            r"$Y(0) = I$ "
            f"along the model's own layer map ({'one step' if steps == 1 else f'{steps} steps'} per layer, "
            f"$L$ = {ds.attrs['depth']}), "
            "$J_{ji}$ the Jacobian of token $j$'s update with respect to token $i$; blue: the attention of "
            "token $j$ averaged over heads and layers. Each colour scale runs from the smallest to the "
            "largest value over the other tokens; token $j$ itself (outlined), whose own update dominates "
            "its sensitivity, is clipped to it"
            + ("; grey: hidden by the causal mask" if setting_value(ds.attrs.get("causal")) and last < n - 1 else "")
            + (
                f"; the tokens are the decoder's of an encoder-decoder, its start token first, and its source "
                f"(the encoder's output on the text, {ds.attrs['encoder_tokens']} tokens) is held fixed."
                if "encoder_tokens" in ds.attrs
                else "."
            ),
        )
        figures["sentence"] = fig

        # 2. The full maps, when every token was an output.
        if ds.sizes["output"] == n and np.array_equal(ds.output.values, np.arange(n)):
            fig, axes = subplots(1, 2, figsize=(12.5, 5.4), gridspec_kw={"wspace": 0.45})
            labels = [shown(t)[0] for t in tokens]
            # The token strings label both axes of both maps (every k-th when there are many).
            full_attention = ds.attention.values.copy()
            if setting_value(ds.attrs.get("causal")):
                full_attention[np.triu_indices(n, 1)] = np.nan
            for ax, values, cmap, title in (
                (axes[0], ds.exponent.values, "Reds", r"Lyapunov sensitivity $\lambda_{ji}$"),
                (axes[1], full_attention, "Blues", "attention, mean over heads and layers"),
            ):
                colours = colormap(cmap).with_extremes(bad="0.92")
                image = ax.imshow(np.ma.masked_invalid(values), cmap=colours)
                ax.set(title=title, xlabel="input token $i$", ylabel="output token $j$")
                token_ticks(ax, labels, most=40)
                fig.colorbar(image, ax=ax, shrink=0.8, label=r"$\lambda_{ji}$" if cmap == "Reds" else r"$\bar a_{ji}$")
            fig.suptitle(f'{name}: "{ds.attrs["text"]}"')
            caption(
                fig,
                "Row $j$: how output token $j$ responds to each input token $i$, by the largest finite-time "
                "exponent of the pair's tangent equation (left) and by attention (right); grey: hidden by "
                "the causal mask.",
            )
            figures["maps"] = fig
        return figures
