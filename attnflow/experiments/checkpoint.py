"""A trained transformer beside its own dynamics and beside the theory.

`attnflow experiment=checkpoint checkpoint=PATH text="..."` loads the checkpoint
(`attnflow.checkpoints.load_checkpoint`: a Hugging Face directory, a `.gguf` file or an
installed model name) and its tokenizer, and runs the sentence through:

- **the model**: its reference forward pass, the residual stream `hidden` with dims
  (`depth`, `token`, `dim`): depth 0 the embedding output, depth k the output of
  layer (block) k, before any final norm; `final` the final norm's output;
- **its dynamics**: the vector field built from its weights (`depth_flow`), solved on
  $[0, L]$ with `steps` Euler (or split) steps per layer (one step per layer is the
  layer map, equal to the model to float tolerance), and with an adaptive diffrax
  solver of the unsplit field; their states at the integer depths are `simulated`
  (`run`, `depth`, `token`, `dim`), each run's distance from the model `depth_error`;
- **the theory**: $Q = K = V = I$ self-attention on the sphere at inverse temperature
  `beta` from the model's own embedded tokens (normalized), for the same time $L$.

For every source (the model, each run, the theory) and layer it stores the normalized
interaction energy (`energy`, the off-sphere form), the pair-cosine histogram
(`pair_cosines`), the cluster count at threshold `cluster_eps` (`clusters`), and the cosine
distance of every token to the model's (`cosine_distance`); the attention matrices of
every head, of the model and of the finest run (`attention`, along `layer`: layer l
(0-based) at the states of depth l that enter it). The tokens' text is the coordinate
`token_string` of `token`. With `probes`, the QK/OV
spectra of every head, the tokens its singular vectors decode to, the Traveling Words
embedding distances and the last token's path through the layers are stored too.

An encoder-decoder (T5, BART, Marian) is run as its decoder (`checkpoint_sentence`): the
encoder reads the text, the decoder its start token followed by the same ids, its
cross-attention reading the encoder's output at every layer. The tokens, `hidden`, the
runs and the probes (of the self-attention heads) are the decoder's; the attributes
`encoder_tokens`, `decoder_start_id` and `decoder_input` record the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..running._progress import Progress
from ..schema._config import choice
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, config_of, subplots, token_ticks
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._text import checkpoint_sentence, encoder_attrs, token_id_variable, write_text

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import matplotlib
    import xarray as xr
    from matplotlib.figure import Figure

    from ..checkpoints import _flow, probes
    from ..checkpoints import spectra as checkpoint_spectra
    from ..numerics import _field, _metrics, _schedules, _simulate, _terms
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    matplotlib = lazy("matplotlib")
    xr = lazy("xarray")
    _flow = lazy("attnflow.checkpoints._flow")
    probes = lazy("attnflow.checkpoints.probes")
    checkpoint_spectra = lazy("attnflow.checkpoints.spectra")
    _field = lazy("attnflow.numerics._field")
    _metrics = lazy("attnflow.numerics._metrics")
    _schedules = lazy("attnflow.numerics._schedules")
    _simulate = lazy("attnflow.numerics._simulate")
    _terms = lazy("attnflow.numerics._terms")

Interpolation = choice("Interpolation", ("constant", "linear", "cubic"))


@dataclass
class Options:
    steps: list[int] = setting([1, 2, 4, 8], "Euler/split steps per layer of the simulated runs (1 = the layer map)")
    interpolation: Interpolation = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        Interpolation.constant,  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "weights between layers: constant | linear | cubic",
    )
    adaptive: bool = setting(True, "also an adaptive diffrax solve (tsit5) of the unsplit field (pre-LN models)")
    bins: int = setting(40, "pair-cosine histogram bins on [-1, 1]")
    probes: bool = setting(
        True, "also the probes: QK/OV spectra, head singular vectors, embedding distances, the last token's path"
    )


def _unit(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _layer_metrics(xs, bins: int, eps: float):
    """Energy, pair-cosine histogram and cluster count of states `xs` (..., n, d)."""
    n = xs.shape[-2]
    upper = np.triu_indices(n, 1)
    edges = jnp.linspace(-1.0, 1.0, bins + 1)

    def one(x):
        c = _metrics.cosines(x)
        counts, _ = jnp.histogram(jnp.clip(c[upper], -1, 1), bins=edges)
        return _metrics.normalized_energy(x), counts / max(len(upper[0]), 1), _metrics.cluster_count(_unit(x), eps)

    flat = xs.reshape((-1,) + xs.shape[-2:])
    energy, hist, clusters = jax.lax.map(one, flat)
    shape = xs.shape[:-2]
    return energy.reshape(shape), hist.reshape(shape + (bins,)), clusters.reshape(shape), np.asarray(edges)


def _attention(flow, states):
    """Every head's attention matrices at the states entering each layer."""
    field = flow.field

    def at(layer, x):
        return field.pinned(layer + 0.5).attention_weights(layer, x)

    depth = flow.depth
    return jax.vmap(at)(jnp.arange(depth, dtype=states.dtype), states[:depth])


def _theory(x0, depth: int, beta: float, dt: float):
    d = x0.shape[-1]
    identity = _schedules.Identity(heads=1, dim=d, dtype=str(x0.dtype))
    attention = _terms.SelfAttention(
        query=identity, key=identity, value=identity, output=None, beta=jnp.asarray(beta, x0.dtype), alibi=None, heads=1
    )
    field = _field.VectorField(terms=(attention,), scheme="sphere")
    steps = int(round(depth / dt))
    per_layer = max(steps // depth, 1)
    solution = _simulate.simulate(
        field,
        _unit(x0),
        t1=float(depth),
        dt=depth / (per_layer * depth),
        solver="rk4",
        save_steps=np.arange(0, per_layer * depth + 1, per_layer),
    )
    return solution.xs


def _label(steps: int) -> str:
    return "dt=1" if steps == 1 else f"dt=1/{steps}"


# What the token path's cloud of read-out tokens holds (`token_path` leaves them bare).
_CLOUD = {
    "path_cloud_id": "token ids of the cloud's read-out tokens",
    "path_cloud_token": "the cloud's read-out tokens as text",
    "path_cloud_is_candidate": "1 where the cloud's token is a next-token candidate of some layer",
}


def _probes(ds: xr.Dataset, checkpoint, tokenizer, hidden, ids) -> xr.Dataset:
    spectra = checkpoint_spectra.head_spectra(checkpoint)
    path = probes.token_path(checkpoint, hidden, tokenizer, position=-1, ids=ids)
    heads = probes.decode_head_vectors(checkpoint, tokenizer)
    parts, kept = [ds], {}
    for prefix, part in (("spectra", spectra), ("path", path), ("heads", heads)):
        renamed = part.rename({name: f"{prefix}_{name}" for name in part.data_vars})
        # One dimension per concept: the spectra and the head vectors count layers
        # 0..L-1 along `layer` (as the attention maps do), the token path counts the
        # residual stream 0..L, `depth` here; their coordinates must agree (join="exact").
        if prefix == "path":
            renamed = renamed.rename(layer="depth")
            for name, text in _CLOUD.items():
                renamed[name].attrs.setdefault("description", text)
        # Each part's attributes travel in the file as "prefix__name" (netCDF has no None;
        # CF's attribute names are letters, digits and underscores).
        kept.update({f"{prefix}__{k}": v for k, v in part.attrs.items() if v is not None})
        renamed.attrs = {}
        parts.append(renamed)
    merged = xr.merge(parts, compat="override", combine_attrs="override", join="exact")
    merged.attrs.update(kept)
    merged.attrs["embedding_distances"] = probes.distance_table(probes.embedding_distances(checkpoint))
    return merged


def _sources_colors(sources):

    cmap = matplotlib.colormaps["viridis"]
    runs = [s for s in sources if s not in ("model", "theory")]
    colors = {"model": "black", "theory": "tab:red"}
    colors.update({r: cmap(0.15 + 0.7 * i / max(len(runs) - 1, 1)) for i, r in enumerate(runs)})
    return colors


def current_layout(ds: xr.Dataset) -> xr.Dataset:
    """A Dataset of this experiment in today's dimension names, also when its file was
    written before they were unified: the residual stream then ran along `layer`, the
    attention maps along `block` (1..L); the spectra, head vectors and token path along
    `spectra_layer`, `heads_layer`, `path_layer` (`_unprefixed` reads both)."""
    if "block" not in ds.dims:
        return ds
    ds = ds.rename(layer="depth").rename(block="layer")
    ds = ds.assign_coords(layer=ds["layer"].values - 1)
    return ds.set_coords("token_string") if "token_string" in ds.data_vars else ds


def _unprefixed(ds: xr.Dataset, prefix: str) -> xr.Dataset:
    names = [v for v in ds.data_vars if v.startswith(prefix + "_")]  # pyright: ignore[reportAttributeAccessIssue]  # the variables are named by str
    part = ds[names].rename({v: v[len(prefix) + 1 :] for v in names})  # pyright: ignore[reportIndexIssue]  # the variables are named by str
    part.attrs = {  # "prefix__name"; "prefix:name" in a file written before
        k[len(prefix) + len(mark) :]: v
        for k, v in ds.attrs.items()
        for mark in ("__", ":")
        if k.startswith(prefix + mark)
    }
    # A file written before the dimension names were unified has `spectra_layer`, ...
    old = {d: d[len(prefix) + 1 :] for d in part.dims if str(d).startswith(prefix + "_")}
    part = part.rename(old) if old else part
    return part.rename(depth="layer") if "depth" in part.dims else part


def _adaptive_note(ds: xr.Dataset) -> str:
    """The depth caption's words on the adaptive run: what it is where it was run, why
    there is none for a post-LN model (no unsplit field), nothing where it was turned off."""
    if "adaptive" in ds.run.values:
        return "adaptive: tsit5 on the unsplit field; "
    if ds.attrs.get("arrangement") == "post":
        return "no adaptive run (a post-LN model normalizes after every sub-step: it has no unsplit field); "
    return ""


def _decoder_note(ds: xr.Dataset) -> str:
    """The caption's sentence on an encoder-decoder's run (its decoder's), or nothing."""
    if "encoder_tokens" not in ds.attrs:
        return ""
    start = str(ds.token_string.values[0])
    return (
        f" The model is the decoder of an encoder-decoder: it reads its start token {start!r}, then the text; "
        f"its cross-attention reads the encoder's output on the text ({ds.attrs['encoder_tokens']} tokens) at "
        "every layer, and the theory run reads no source."
    )


class Checkpoint(Experiment):
    title = "A trained transformer against its dynamics and the theory"
    paper = "DESIGN.md sec. 2, 7; Neural ODE Transformers (QK/OV spectra); Traveling Words (probes)"
    Options = Options
    # The long names and units of this experiment's own coordinates (units None: text).
    coordinates = {
        "run": ("the run through depth: dt=1/m (m steps per layer), adaptive, or theory", None),
        "source": ("the states: the model or a run", None),
        "bin": ("centre of a pair-cosine histogram bin", "1"),
        "attention_source": ("the states of the attention maps: the model or the finest run", None),
        "qk_rank": ("eigenvalue or singular value rank of a head QK matrix, largest first", "1"),
        "ov_rank": ("eigenvalue or singular value rank of a head OV matrix, largest first", "1"),
        "vector": ("the side of a singular vector: query or key of QK, input or output of OV", None),
        "matrix": ("the head matrix: QK or OV", None),
        "component": ("singular vector rank, largest singular value first", "1"),
        "top": ("rank of a decoded token, closest first", "1"),
        "rank": ("rank of a next-token candidate under the logit lens, likeliest first", "1"),
        "axis": ("principal axis of the token path", None),
        "word": ("read-out token of the cloud drawn beside the path", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        if not cfg.checkpoint:
            raise ConfigError(
                "experiment=checkpoint needs checkpoint=PATH (a model directory, a .gguf file, or minilm / smollm2)."
            )
        if not cfg.text or not str(cfg.text).strip():
            raise ConfigError('experiment=checkpoint needs a sentence: text="...".')
        steps = options.steps
        if not steps or any(s < 1 for s in steps):
            raise ConfigError(f"experiment.options.steps must be a list of positive whole numbers, got {steps!r}.")
        if options.bins < 2:
            raise ConfigError(f"experiment.options.bins must be a whole number >= 2, got {options.bins!r}.")
        if not isinstance(cfg.beta, (int, float)) or isinstance(cfg.beta, bool):
            raise ConfigError(f"experiment=checkpoint takes one beta (the theory run's), got {cfg.beta!r}.")
        # A bad checkpoint, or a text it has no embedding rows or positions for, stops here.
        checkpoint = checkpoint_sentence(cfg)[0]
        # The weights between layers are read by the runs of more than one step per layer and the adaptive solve (of
        # pre-LN models) alone: one step per layer is the layer map.
        adaptive = options.adaptive and checkpoint.arrangement != "post"
        if options.interpolation != Interpolation.constant and max(steps) == 1 and not adaptive:  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
            raise ConfigError(
                f"experiment.options.interpolation={options.interpolation} does not apply with "
                f"experiment.options.steps={steps} and no adaptive solve (it interpolates the weights of "
                "runs of more than one step per layer); remove it or add such a run."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # nothing for the core study runner: everything happens in `analyse`

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        checkpoint, tokenizer, ids = checkpoint_sentence(cfg)
        strings = tokenizer.tokens(ids)
        model = _flow.forward(checkpoint, ids)
        hidden = model.hidden
        depth = checkpoint.depth

        runs, states = [], []
        layer_map = _flow.depth_flow(checkpoint)
        flow = _flow.depth_flow(checkpoint, str(options.interpolation))  # pyright: ignore[reportArgumentType]  # an Interpolation: one of the three names
        adaptive = options.adaptive and checkpoint.arrangement != "post"
        with Progress(
            f"{checkpoint.name or 'checkpoint'}: runs through depth", len(options.steps) + adaptive + 1, unit="runs"
        ) as bar:
            for steps in options.steps:
                runs.append(_label(steps))
                states.append(
                    jax.block_until_ready(
                        _flow.run_depth(layer_map if steps == 1 else flow, hidden[0], steps_per_layer=steps)
                    )
                )
                bar.advance()
            if adaptive:
                runs.append("adaptive")
                states.append(jax.block_until_ready(_flow.run_depth(flow, hidden[0], adaptive=True)))
                bar.advance()
            runs.append("theory")
            states.append(jax.block_until_ready(_theory(hidden[0], depth, float(cfg.beta), float(cfg.dt))))  # pyright: ignore[reportArgumentType]  # the theory run's fixed dt is set
            bar.advance()
        simulated = jnp.stack(states)

        sources = ["model"] + runs
        every = jnp.concatenate([hidden[None], simulated])
        energy, hist, clusters, edges = _layer_metrics(every, options.bins, float(cfg.cluster_eps))
        cos = jnp.sum(_unit(every) * _unit(hidden)[None], axis=-1)
        error = jnp.linalg.norm(simulated - hidden[None], axis=(-2, -1)) / jnp.linalg.norm(hidden, axis=(-2, -1))[None]
        finest = [r for r in runs if r != "theory"][-1]
        attention = jnp.stack([_attention(layer_map, hidden), _attention(layer_map, simulated[runs.index(finest)])])

        # An encoder-decoder's run is its decoder's (`checkpoint_sentence`): said in the descriptions and attributes.
        source = encoder_attrs(checkpoint)
        ds = xr.Dataset(
            {
                "token_id": token_id_variable(checkpoint, ids),
                "hidden": (
                    ("depth", "token", "dim"),
                    np.asarray(hidden, np.float32),
                    {
                        "description": f"the {'decoder' if source else 'model'}'s residual stream: layer 0 the "
                        "embedding output, layer k the output of block k, before the final norm"
                    },
                ),
                "final": (
                    ("token", "dim"),
                    np.asarray(model.final, np.float32),
                    {"description": "the final norm's output (the last hidden state where there is none)"},
                ),
                "simulated": (
                    ("run", "depth", "token", "dim"),
                    np.asarray(simulated, np.float32),
                    {
                        "description": "states of the dynamics at integer depths: the checkpoint's field with "
                        "dt = 1/m (m steps per layer), adaptive, and the theory run"
                    },
                ),
                "depth_error": (
                    ("run", "depth"),
                    np.asarray(error),
                    {"description": "|simulated - model| / |model| per layer (Frobenius)"},
                ),
                "cosine_distance": (
                    ("source", "depth", "token"),
                    1 - np.asarray(cos),
                    {"description": "1 - cos(state, model state) per token"},
                ),
                "energy": (
                    ("source", "depth"),
                    np.asarray(energy),
                    {"description": "normalized interaction energy (1/n^2) sum_ij exp(cos(x_i, x_j))"},
                ),
                "pair_cosines": (
                    ("source", "depth", "bin"),
                    np.asarray(hist),
                    {"description": "histogram of the pair cosines cos(x_i, x_j), i < j (fractions)"},
                ),
                "clusters": (
                    ("source", "depth"),
                    np.asarray(clusters),
                    {"description": "cluster count: components of the graph cos(x_i, x_j) > 1 - eps"},
                ),
                "attention": (
                    ("attention_source", "layer", "head", "query", "key"),
                    np.asarray(attention, np.float32),
                    {
                        "description": f"attention matrices of each layer at the states entering it: the "
                        f"model's and the {finest} run's"
                    },
                ),
            },
            coords={
                "depth": np.arange(depth + 1),
                "run": runs,
                "source": sources,
                "bin": 0.5 * (edges[1:] + edges[:-1]),
                "attention_source": ["model", finest],
                "layer": np.arange(depth),
                "token_string": ("token", np.asarray(strings, dtype=object)),
            },
            attrs={
                "checkpoint": str(cfg.checkpoint),
                "family": checkpoint.family,
                "arrangement": checkpoint.arrangement,
                "model_name": checkpoint.name or str(cfg.checkpoint),
                "text": str(cfg.text),
                **source,
            },
        )
        if options.probes:
            ds = _probes(ds, checkpoint, tokenizer, hidden, ids)
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        ds = current_layout(ds)
        cfg = config_of(ds)
        name = ds.attrs.get("model_name", "checkpoint")
        sources = [str(s) for s in ds.source.values]
        colors = _sources_colors(sources)
        figures = {}

        # 1. Across depth: energy, clusters, distance from the model.
        fig, axes = subplots(1, 3, figsize=(12, 3.4))
        for s in sources:
            style = dict(color=colors[s], lw=2.0 if s == "model" else 1.2, ls="--" if s == "theory" else "-")
            axes[0].plot(ds.depth, ds.energy.sel(source=s), label=s, **style)
            axes[1].plot(ds.depth, ds.clusters.sel(source=s), **style)
        # A log axis cannot show a distance of 0 (the layer map is the model to the last
        # bit): zeros are left out, not clamped, and a run that is 0 at every layer is named
        # in the panel instead of drawn.
        exact = []
        for r in ds.run.values:
            values = ds.depth_error.sel(run=r).values[1:]
            if not np.any(values > 0):
                exact.append(str(r))
                continue
            axes[2].plot(
                ds.depth[1:],
                np.where(values > 0, values, np.nan),
                color=colors[str(r)],
                ls="--" if r == "theory" else "-",
                label=str(r),
            )
        axes[2].set_yscale("log")
        zero = f"\n({', '.join(exact)}: exactly 0 at every layer, not drawn)" if exact else ""
        axes[0].set(xlabel="layer (depth t)", ylabel="normalized energy", title="interaction energy")
        axes[1].set(
            xlabel="layer (depth t)", ylabel="clusters", title=rf"cluster count ($\varepsilon$ = {cfg['cluster_eps']})"
        )
        axes[2].set(
            xlabel="layer (depth t)",
            ylabel=r"$|x_\mathrm{sim} - x_\mathrm{model}| \,/\, |x_\mathrm{model}|$",
            title="distance from the model" + zero,
        )
        fig.subplots_adjust(wspace=0.3)
        axes[0].legend(ncol=2)
        fig.suptitle(f'{name}: "{ds.attrs["text"]}"', y=1.07 if exact else 0.98)
        caption(
            fig,
            "Black: the model's residual stream. dt = 1/m: the vector field of its weights solved with m "
            f"steps per layer (dt = 1 is the layer map and lies on the model); {_adaptive_note(ds)}dashed red: "
            "the theory model $Q = K = V = I$ on the sphere from the same embedded tokens. Right: distances of "
            "exactly 0 are left out (a log axis has no 0)." + _decoder_note(ds),
        )
        figures["depth"] = fig

        # 2. Pair-cosine histograms across depth, model / finest run / theory side by side.
        shown = ["model", str(ds.attention_source.values[-1]), "theory"]
        fig, axes = subplots(1, 3, figsize=(12, 3.4), sharey=True)
        top = float(ds.pair_cosines.max())
        for ax, s in zip(axes, shown):
            image = ax.pcolormesh(
                ds.depth, ds.bin, ds.pair_cosines.sel(source=s).T, shading="nearest", vmin=0, vmax=top
            )
            ax.set(xlabel="layer (depth t)", title=s)
        axes[0].set_ylabel("pair cosine")
        fig.colorbar(image, ax=axes, label="fraction of pairs")
        caption(fig, r"Histogram of $\cos(x_i, x_j)$ over token pairs at each layer: clustering moves the mass to 1.")
        figures["pair_cosines"] = fig

        # 3. Each token's cosine distance to the model, per run, across depth.
        runs = [str(r) for r in ds.run.values]
        fig, axes = subplots(1, len(runs), figsize=(2.6 * len(runs), 3.2), sharey=True, squeeze=False)
        labels = [str(t) for t in ds.token_string.values]
        for ax, r in zip(axes[0], runs):
            image = ax.pcolormesh(
                ds.depth,
                np.arange(ds.sizes["token"]),
                ds.cosine_distance.sel(source=r).T,
                shading="nearest",
                vmin=0,
                vmax=1,
                cmap="magma",
            )
            ax.set(xlabel="layer (depth t)", title=r)
        axes[0, 0].set_yticks(np.arange(len(labels)), labels if len(labels) <= 40 else None)
        fig.colorbar(image, ax=axes[0], label="1 - cos(state, model)")
        caption(
            fig,
            "Cosine distance of every token's simulated state to the model's, per layer: 0 where the dynamics "
            "follow the model.",
        )
        figures["cosine_distance"] = fig

        # 4. Attention maps (head-averaged) at four blocks, model against the finest run.
        blocks = np.unique(np.linspace(1, int(ds.layer.max()) + 1, 4).round().astype(int))
        # The token strings label both axes of every map.
        fig, axes = subplots(
            2, len(blocks), figsize=(3.2 * len(blocks) + 0.8, 6.6), layout="constrained", squeeze=False
        )
        for row, s in enumerate(ds.attention_source.values):
            for col, b in enumerate(blocks):
                a = ds.attention.sel(attention_source=s, layer=b - 1).mean("head")
                image = axes[row, col].imshow(a, vmin=0, vmax=1, cmap="magma")
                axes[row, col].set_title(f"{s}, block {b}")
                token_ticks(axes[row, col], labels, axes="x" if col else "xy")
                if col:
                    axes[row, col].set_yticks([])
            axes[row, 0].set_ylabel("query")
        for ax in axes[-1]:
            ax.set_xlabel("key")
        fig.colorbar(image, ax=axes, label="attention weight (mean over heads)", shrink=0.8)
        caption(
            fig,
            ("The decoder's self-attention matrices" if "encoder_tokens" in ds.attrs else "Attention matrices")
            + " averaged over heads (rows: queries, columns: keys), entering each block.",
        )
        figures["attention"] = fig

        if "spectra_qk_eigenvalue_real" in ds or any(v.startswith("spectra_") for v in ds.data_vars):  # pyright: ignore[reportAttributeAccessIssue]  # the variables are named by str
            figures.update(checkpoint_spectra.draw_spectra(_unprefixed(ds, "spectra"), name="spectra"))
            figures["token_path"] = probes.draw_token_path(_unprefixed(ds, "path"))
        return figures

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """The tables beside the figures: the heads' decoded vectors and the embedding
        distances."""
        ds = current_layout(ds)
        name = ds.attrs.get("model_name", "checkpoint")
        written = []
        if any(v.startswith("heads_") for v in ds.data_vars):  # pyright: ignore[reportAttributeAccessIssue]  # the variables are named by str
            written += list(probes.write_head_tables(_unprefixed(ds, "heads"), folder, "head_vectors"))
        if "embedding_distances" in ds.attrs:
            table = folder / "embedding_distances.md"
            text = f"# Embedding distances of {name} (Traveling Words, Table 1)\n\n{ds.attrs['embedding_distances']}\n"
            written.append(write_text(table, text))
        return written
