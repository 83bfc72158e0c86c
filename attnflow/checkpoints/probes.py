r"""The geometric probes of "Traveling Words" (002_*.txt) for any loaded checkpoint.

LayerNorm places every token on a sphere of radius $\sqrt d$ (after projecting it onto
$\mathbf 1^\perp$; RMSNorm skips that projection), and the next-token logits are dot
products of a point of that sphere with the rows of the unembedding (eq. 12-13). So
directions of the residual stream can be read as words. This module does three readings:

- `embedding_distances`: how far the embedding matrix is from its normalized image
  (the paper's Table 1: original, centred, scaled by $\sqrt d / E|w_e|$, both);
- `decode_head_vectors`: each head's singular vectors of $W_{QK} = Q_h^\top K_h$ and
  $W_{OV} = O_h V_h$ decoded into their closest tokens (section 3.3, after Millidge and
  Black 2022); `head_table` and `write_head_tables` print them, one table per head;
- `token_path`: one token's residual state after every block read through the final
  normalization and the unembedding (the logit lens), with its top next-token
  candidates and a 3-D principal-component view of its path among the token vectors
  (section 3.4, with PCA in place of UMAP); `draw_token_path` draws it.

Encoders without an LM head (BERT) are read out through the embedding matrix instead.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jaxtyping import Array, Float, Int

from ..numerics._terms import TokenNorm
from ..presentation._figures import caption, colormap, figure, save, styled
from ..schema._errors import CheckpointError
from ..storage._store import write_atomically
from ._canonical import Checkpoint, stack_layers
from .spectra import low_rank_svd, output_value_factors, query_key_factors

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "decode_head_vectors",
    "distance_table",
    "draw_token_path",
    "embedding_distances",
    "head_table",
    "input_norms",
    "logit_lens",
    "normalized_embeddings",
    "output_norm",
    "readout_matrix",
    "token_path",
    "write_head_tables",
]

SETTINGS = ("original", "centered", "scaled", "centered_scaled")
VECTORS = ("qk_query", "qk_key", "ov_input", "ov_output")


# --- which normalization reads what --------------------------------------------------


def _bare(norm: TokenNorm | None) -> TokenNorm:
    """The geometric map of `norm`'s kind: no gain, shift or epsilon (LayerNorm when none)."""
    return TokenNorm("layer" if norm is None or norm.kind == "sphere" else norm.kind)


def _layer_of(norm: TokenNorm, index: int) -> TokenNorm:
    return jax.tree.map(lambda a: a[index], norm)


def input_norms(checkpoint: Checkpoint) -> TokenNorm:
    """The normalization whose output each block's attention reads, stacked over layers
    (gains `(L, d)`): `attn_norm` for pre-LN and parallel blocks; for post-LN blocks the
    norm that ended the previous block (`embed_norm` before block 0, then `mlp_norm`)."""
    blocks = checkpoint.blocks
    if checkpoint.arrangement != "post":
        return blocks.attn_norm
    last, first = blocks.mlp_norm, checkpoint.embed_norm
    ones = jnp.ones(checkpoint.dim, checkpoint.embed.dtype)
    if first is None or first.kind != last.kind:
        first = None  # unnormalized input: the bare map of the same kind is the nearest reading
    gamma = ones if first is None or first.gamma is None else first.gamma
    shift = None if last.shift is None else (0 * ones if first is None or first.shift is None else first.shift)
    before = TokenNorm(last.kind, None if last.gamma is None else gamma, shift, last.eps)
    return stack_layers([before] + [_layer_of(last, l) for l in range(checkpoint.depth - 1)])


def output_norm(checkpoint: Checkpoint) -> TokenNorm | None:
    """The normalization that puts the last residual state on its output sphere:
    `final_norm`, or for post-LN models without one the last block's `mlp_norm`."""
    if checkpoint.final_norm is not None:
        return checkpoint.final_norm
    if checkpoint.arrangement == "post":
        return _layer_of(checkpoint.blocks.mlp_norm, -1)
    return None


def _readout_norm(checkpoint: Checkpoint) -> TokenNorm | None:
    """What the logits apply to a residual state: the final norm (None where the family
    has none, e.g. post-LN BERT, whose states are already normalized)."""
    return checkpoint.final_norm


def normalized_embeddings(
    checkpoint: Checkpoint, at: int | str = "final", gain: bool = True
) -> Float[Array, "vocab d"]:
    r"""The token embeddings $W_E$ mapped onto the model's sphere, row by row.

    `at="final"`: through the output normalization (`final_norm`, or BERT's last
    LayerNorm), the sphere on which the logits are read (eq. 12-13); `at=l`: through
    the normalization that block `l`'s attention reads (the paper's per-layer
    $\hat W_E$ of section 3.2: block `l`'s `attn_norm`; for post-LN blocks the norm
    that closed the block before, the embedding LayerNorm for block 0, see
    `input_norms`). `gain=False` drops gain, shift and epsilon: the bare map
    $\sqrt d\, \tilde x / |\tilde x|$, $\tilde x$ the row centred over its coordinates
    (LayerNorm, eq. 4) or the row itself (RMSNorm); this is Table 1's
    $\mathrm{LayerNorm}(W_E)$."""
    if at == "final":
        norm = output_norm(checkpoint)
    elif isinstance(at, (int, np.integer)) and not isinstance(at, bool) and -checkpoint.depth <= at < checkpoint.depth:
        norm = _layer_of(input_norms(checkpoint), int(at))
    else:
        raise CheckpointError(f"`at` must be 'final' or a block index from 0 to {checkpoint.depth - 1}, got {at!r}.")
    if not gain or norm is None:
        norm = _bare(norm)
    return norm(checkpoint.embed)


def _distances(a: Float[Array, "vocab d"], b: Float[Array, "vocab d"]) -> dict[str, float]:
    l2 = jnp.linalg.norm(a - b, axis=-1)
    cos = jnp.sum(a * b, axis=-1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))
    cosine = jnp.maximum(1 - cos, 0)  # rounding can leave 1 - cos a hair below zero
    return {
        "l2_mean": float(l2.mean()),
        "l2_std": float(l2.std()),
        "cosine_mean": float(cosine.mean()),
        "cosine_std": float(cosine.std()),
    }


def embedding_distances(checkpoint: Checkpoint) -> dict[str, dict[str, float]]:
    r"""Table 1 of Traveling Words: mean and standard deviation over the vocabulary of
    the $\ell_2$ and cosine distances ($1 - \cos$) between the normalized embeddings
    $N(W_E)$ (`normalized_embeddings(..., gain=False)`) and

    - `original`: $W_E$;
    - `centered`: $W_E - E[w_e]$ (the mean embedding removed);
    - `scaled`: $W_E \sqrt d / E|w_e|$;
    - `centered_scaled`: the centred rows scaled the same way by their own mean norm.

    A fifth entry `norms` holds $E|w_e|$, $SD|w_e|$ and $\sqrt d$."""
    embed = checkpoint.embed
    normalized = normalized_embeddings(checkpoint, gain=False)
    root = jnp.sqrt(jnp.asarray(checkpoint.dim, embed.dtype))
    centered = embed - embed.mean(axis=0, keepdims=True)
    norms = jnp.linalg.norm(embed, axis=-1)
    settings = {
        "original": embed,
        "centered": centered,
        "scaled": embed * root / norms.mean(),
        "centered_scaled": centered * root / jnp.linalg.norm(centered, axis=-1).mean(),
    }
    table = {name: _distances(normalized, value) for name, value in settings.items()}
    table["norms"] = {"mean": float(norms.mean()), "std": float(norms.std()), "sqrt_d": float(root)}
    return table


def distance_table(distances: dict[str, dict[str, float]]) -> str:
    """`embedding_distances` as a markdown table in the layout of the paper's Table 1."""
    names = {
        "original": "Original",
        "centered": "Centered",
        "scaled": "Scaled by sqrt(d)",
        "centered_scaled": "Centered + scaled by sqrt(d)",
    }
    rows = ["| setting | mean l2 distance (sd) | mean cosine distance (sd) |", "|---|---|---|"]
    for key in SETTINGS:
        row = distances[key]
        rows.append(
            f"| {names[key]} | {row['l2_mean']:.3f} ({row['l2_std']:.3f}) | "
            f"{row['cosine_mean']:.3f} ({row['cosine_std']:.3f}) |"
        )
    norms = distances.get("norms")
    if norms:
        rows.append("")
        rows.append(f"E|w_e| = {norms['mean']:.3f}, SD|w_e| = {norms['std']:.3f}, sqrt(d) = {norms['sqrt_d']:.3f}")
    return "\n".join(rows)


# --- reading the residual stream as words --------------------------------------------


def readout_matrix(checkpoint: Checkpoint) -> Float[Array, "vocab d"]:
    """The rows the logits are dot products with: the unembedding, or for encoders
    without an LM head (BERT) the token embedding matrix."""
    return checkpoint.embed if checkpoint.unembed is None else checkpoint.unembed


def logit_lens(
    checkpoint: Checkpoint, hidden: Float[Array | np.ndarray, "layers n d"]
) -> Float[Array, "layers n vocab"]:
    """Every layer's residual states read as next-token logits: the final norm, then the
    read-out matrix (`readout_matrix`). At the last layer this is `checkpoint.logits`.
    For BERT (no final norm, no LM head) the states, already normalized by their block,
    are read against the embedding matrix."""
    norm = _readout_norm(checkpoint)
    states = jnp.asarray(hidden)
    if norm is not None:
        states = jax.vmap(norm)(states)
    return states @ readout_matrix(checkpoint).T


def _token_strings(tokenizer, ids) -> list[str]:
    """Readable strings of `ids` (any shape, flattened) from a tokenizer with a
    `tokens(ids) -> list[str]` method, or `#id` without one."""
    flat = [int(i) for i in np.asarray(ids).ravel()]
    if tokenizer is None:
        return [f"#{i}" for i in flat]
    return [str(t) for t in tokenizer.tokens(flat)]


def _strings_like(tokenizer, ids: np.ndarray) -> np.ndarray:
    return np.asarray(_token_strings(tokenizer, ids), dtype=object).reshape(np.shape(ids))


# --- singular vectors of the heads, decoded -------------------------------------------


def _oriented(scores: Float[Array, "*batch vocab"]) -> Float[Array, "*batch"]:
    """+1 or -1 per vector: the sign that makes its best-matching token match positively
    (a singular pair (u, v) and (-u, -v) are the same; the paper keeps the one whose
    reading side is closest to a token)."""
    return jnp.where(scores.max(-1) >= -scores.min(-1), 1.0, -1.0).astype(scores.dtype)


@eqx.filter_jit
def _decoded(checkpoint: Checkpoint, chosen: Int[Array, " layers"], qk: tuple, ov: tuple, k: int, top: int):
    """The token search of `decode_head_vectors`, compiled once: top tokens and scores
    `(layers, 4, H, k, top)` of the singular vectors `qk`, `ov` (`low_rank_svd` of the
    chosen layers)."""
    pick = lambda tree: jax.tree.map(lambda a: a[chosen], tree)
    (qk_left, _, qk_right), (ov_left, _, ov_right) = qk, ov
    embed, readout = checkpoint.embed, readout_matrix(checkpoint)

    def take(vectors: Float[Array, "L H d r"]) -> Float[Array, "L H k d"]:
        return jnp.swapaxes(vectors[..., :k], -1, -2)

    def one_layer(layer):
        norm, queries, keys, outputs, inputs = layer  # (H, k, d) each
        normalized = norm(embed)
        reads = jnp.einsum("vd,hcd->hcv", normalized, jnp.concatenate([queries, keys, inputs], axis=1))
        q, kk, inp = reads[:, :k], reads[:, k : 2 * k], reads[:, 2 * k :]
        out = jnp.einsum("vd,hcd->hcv", readout, outputs)
        s_qk, s_ov = _oriented(q), _oriented(out)
        signed = jnp.stack([q * s_qk[..., None], kk * s_qk[..., None], inp * s_ov[..., None], out * s_ov[..., None]])
        return jax.lax.top_k(signed, top)

    per_layer = (pick(input_norms(checkpoint)), take(qk_left), take(qk_right), take(ov_left), take(ov_right))
    return jax.lax.map(one_layer, per_layer)


def decode_head_vectors(
    checkpoint: Checkpoint, tokenizer=None, k: int = 4, top: int = 5, layers: list[int] | None = None
) -> xr.Dataset:
    r"""The `k` leading singular vectors of every head's $W_{QK}$ and $W_{OV}$ decoded
    into their `top` closest tokens by dot product (Traveling Words, section 3.3).

    With $W_{QK} = \sum \sigma\, a b^\top$ the query side $a$ and the key side $b$ both
    read normalized tokens, so both are decoded against the embeddings through the norm
    that block's attention reads (`normalized_embeddings(checkpoint, at=layer)`). With
    $W_{OV} = \sum \sigma\, a b^\top$ the input side $b$ (the paper's "keys") is decoded
    the same way and the output side $a$ (the "values", added to the residual stream)
    against the read-out matrix. Each pair's sign is the one whose query side (QK) or
    output side (OV) has its best token at a positive dot product.

    Returns a Dataset with `token_id`, `token` and `score` (dims `vector` =
    qk_query/qk_key/ov_input/ov_output, `layer`, `head`, `component`, `top`) and
    `singular` (dims `matrix` = qk/ov, `layer`, `head`, `component`). `tokenizer`: an
    object with `tokens(ids) -> list[str]` (attnflow's `Tokenizer`), or None for `#id`.
    `layers`: the block indices to decode (all by default). The cost is one
    vocabulary-by-$d$ product per layer with $4 k$ vectors per head."""
    chosen = np.arange(checkpoint.depth) if layers is None else np.asarray(layers, dtype=int).reshape(-1)
    if chosen.size == 0 or chosen.min() < -checkpoint.depth or chosen.max() >= checkpoint.depth:
        raise CheckpointError(f"`layers` must list block indices from 0 to {checkpoint.depth - 1}, got {layers!r}.")
    chosen = np.unique(chosen % checkpoint.depth)
    k = int(min(k, checkpoint.head_dim, checkpoint.blocks.attention.value.shape[2]))
    top = int(min(top, checkpoint.embed.shape[0]))
    pick = lambda tree: jax.tree.map(lambda a: a[chosen], tree)
    qk = low_rank_svd(*pick(query_key_factors(checkpoint)))
    ov = low_rank_svd(*pick(output_value_factors(checkpoint)))
    scores, ids = _decoded(checkpoint, jnp.asarray(chosen), qk, ov, k, top)
    scores = np.moveaxis(np.asarray(scores), 1, 0)  # (vector, layer, head, component, top)
    ids = np.moveaxis(np.asarray(ids), 1, 0)
    dims = ("vector", "layer", "head", "component", "top")
    singular = np.stack([np.asarray(qk[1][..., :k]), np.asarray(ov[1][..., :k])])
    return xr.Dataset(
        {
            "token_id": (dims, ids, {"description": "ids of the closest tokens to each singular vector"}),
            "token": (dims, _strings_like(tokenizer, ids), {"description": "their strings"}),
            "score": (dims, scores, {"description": "dot product of the token vector with the unit singular vector"}),
            "singular": (
                ("matrix", "layer", "head", "component"),
                singular,
                {"description": "singular value of the pair"},
            ),
        },
        coords={
            "vector": list(VECTORS),
            "matrix": ["qk", "ov"],
            "layer": chosen,
            "head": np.arange(checkpoint.heads),
            "component": np.arange(k),
            "top": np.arange(top),
        },
        attrs={
            "model": checkpoint.name or checkpoint.family,
            "description": "singular vectors of W_QK = Q^T K (query/key sides, read through the layer's "
            "input norm) and W_OV = O V (input side through the input norm, output side "
            "against the read-out matrix) decoded into tokens",
        },
    )


def _cell(tokens) -> str:
    return ", ".join(repr(str(t)).replace("|", "\\|") for t in tokens)


def head_table(ds: xr.Dataset, layer: int, head: int) -> str:
    """One head's decoded singular vectors (from `decode_head_vectors`) as a markdown
    table: one row per singular pair, its QK query -> key tokens and OV input -> output
    tokens with their singular values."""
    part = ds.sel(layer=layer, head=head)
    rows = [
        f"#### layer {layer}, head {head}",
        "",
        "| k | sigma QK | QK query tokens | QK key tokens | sigma OV | OV input tokens | OV output tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    tokens = part["token"]
    for c in part["component"].values:
        cells = {v: _cell(tokens.sel(vector=v, component=c).values) for v in VECTORS}
        rows.append(
            f"| {c} | {float(part['singular'].sel(matrix='qk', component=c)):.3g} | {cells['qk_query']} | "
            f"{cells['qk_key']} | {float(part['singular'].sel(matrix='ov', component=c)):.3g} | "
            f"{cells['ov_input']} | {cells['ov_output']} |"
        )
    return "\n".join(rows)


def write_head_tables(ds: xr.Dataset, folder: Path, name: str = "head_vectors") -> list[Path]:
    """Write `decode_head_vectors` as `name.md` (one markdown table per head) and
    `name.csv` (one row per token: layer, head, vector, component, singular value, rank,
    token id, token, score). Each file is written whole or not at all."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sections = [f"# Singular vectors of {ds.attrs.get('model', '')}'s heads, decoded into tokens", ""]
    for layer in ds["layer"].values:
        for head in ds["head"].values:
            sections += [head_table(ds, int(layer), int(head)), ""]
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["layer", "head", "vector", "component", "singular", "rank", "token_id", "token", "score"])
    ids, tokens, scores = (np.moveaxis(ds[key].values, 0, 2) for key in ("token_id", "token", "score"))
    singular = ds["singular"].values  # (matrix, layer, head, component)
    layers, heads, vectors, components = (ds[key].values for key in ("layer", "head", "vector", "component"))
    for l, h, v, c, r in np.ndindex(ids.shape):  # (layer, head, vector, component, top)
        matrix = 0 if vectors[v].startswith("qk") else 1  # pyright: ignore[reportAttributeAccessIssue]  # an element of a str array; numpy's stub says ndarray
        writer.writerow(
            [
                int(layers[l]),
                int(heads[h]),
                vectors[v],
                int(components[c]),
                f"{float(singular[matrix, l, h, c]):.6g}",
                r,
                int(ids[l, h, v, c, r]),
                tokens[l, h, v, c, r],
                f"{float(scores[l, h, v, c, r]):.6g}",
            ]
        )
    paths = []
    for suffix, content in (("md", "\n".join(sections)), ("csv", text.getvalue())):
        path = folder / f"{name}.{suffix}"
        write_atomically(path, lambda tmp, content=content: Path(tmp).write_text(content, encoding="utf-8"))  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
        paths.append(path)
    return paths


# --- one token's path across layers ---------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.finfo(x.dtype).tiny)


@eqx.filter_jit
def _read_position(checkpoint: Checkpoint, states: Float[Array, "layers d"], top: int):
    """One token's states `(L + 1, d)` through the logit lens: logits, the `top`
    candidates (logits, ids, probabilities) and the read states themselves."""
    logits = logit_lens(checkpoint, states[:, None])[:, 0]
    best_logits, best = jax.lax.top_k(logits, top)
    probabilities = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), best, axis=-1)
    norm = _readout_norm(checkpoint)
    return logits, best_logits, best, probabilities, states if norm is None else norm(states)


def token_path(
    checkpoint: Checkpoint,
    hidden: Float[Array | np.ndarray, "layers n d"],
    tokenizer=None,
    position: int = -1,
    top: int = 5,
    *,
    ids: Int[Array | np.ndarray, " n"] | None = None,
    cloud: int = 2000,
) -> xr.Dataset:
    r"""The path of the token at `position` through the layers, read as words
    (Traveling Words, section 3.4).

    `hidden` is the residual stream `(L + 1, n, d)` (layer 0 the embedding output, layer
    `l` the output of block `l`, before the final norm), e.g. `forward(checkpoint,
    ids).hidden`. Every layer's state is read through the final norm and the read-out
    matrix (`logit_lens`): its `top` next-token candidates and their probabilities. For
    BERT, which has no LM head, the read-out matrix is the token embedding matrix (the
    candidates are then the nearest input tokens, not predictions).

    The 3-D view: the read states and the read-out rows of the candidates, as unit
    vectors (the logits depend on direction), give the principal axes; the path and
    `cloud` token vectors (the first ids of the vocabulary and every candidate) are
    projected on them. With `ids` (the input ids) the token itself and, where there is
    one, the actual next token's probability and rank per layer are recorded."""
    hidden = jnp.asarray(hidden)
    n = hidden.shape[1]
    if not -n <= position < n:
        raise CheckpointError(f"position {position} is outside the {n} tokens of the hidden states.")
    position = position % n
    readout = np.asarray(readout_matrix(checkpoint))
    vocab = readout.shape[0]
    top = int(min(top, vocab))
    logits, best_logits, best, best_probabilities, read = (
        np.asarray(a) for a in _read_position(checkpoint, hidden[:, position], top)
    )
    path = _unit(read)
    extra = []
    attrs = {
        "model": checkpoint.name or checkpoint.family,
        "position": position,
        "readout": "unembedding" if checkpoint.unembed is not None else "token embeddings (no LM head)",
    }
    data = {}
    if ids is not None:
        ids = np.asarray(ids)
        attrs["token_id"] = int(ids[position])
        attrs["token"] = _token_strings(tokenizer, ids[position : position + 1])[0]
        extra.append(int(ids[position]))
        if position + 1 < ids.shape[0]:
            following = int(ids[position + 1])
            attrs["next_token_id"] = following
            attrs["next_token"] = _token_strings(tokenizer, [following])[0]
            extra.append(following)
            shifted = logits - logits.max(-1, keepdims=True)
            log_partition = np.log(np.exp(shifted).sum(-1))
            data["next_probability"] = (
                ("layer",),
                np.exp(shifted[:, following] - log_partition),
                {"description": "probability of the actual next token"},
            )
            data["next_rank"] = (
                ("layer",),
                np.sum(logits > logits[:, following : following + 1], axis=-1),
                {"description": "rank of the actual next token (0 = top candidate)"},
            )
    candidates = np.unique(np.concatenate([best.ravel(), np.asarray(extra, dtype=int)]))
    words = np.unique(np.concatenate([np.arange(min(cloud, vocab)), candidates]))
    # Principal axes of the path and its candidates (small: numpy, no compilation).
    basis_points = np.concatenate([path, _unit(readout[candidates])])
    centre = basis_points.mean(axis=0)
    _, spread, axes = np.linalg.svd(basis_points - centre, full_matrices=False)
    axes = axes[:3]
    share = (spread**2 / np.sum(spread**2))[:3]
    attrs["explained_variance"] = [float(s) for s in share]
    best_np = np.asarray(best)
    data.update(
        {
            "candidate_id": (("layer", "rank"), best_np, {"description": "top next-token candidates of each layer"}),
            "candidate_token": (("layer", "rank"), _strings_like(tokenizer, best_np), {"description": "their strings"}),
            "candidate_probability": (
                ("layer", "rank"),
                best_probabilities,
                {"description": "their probabilities under the logit lens"},
            ),
            "candidate_logit": (("layer", "rank"), best_logits, {"description": "their logits"}),
            "path": (
                ("layer", "axis"),
                (path - centre) @ axes.T,
                {"description": "the token's read state (unit vector) on the three principal axes"},
            ),
            "cloud": (
                ("word", "axis"),
                (_unit(readout[words]) - centre) @ axes.T,
                {"description": "read-out token vectors (unit) on the same axes"},
            ),
            "cloud_id": (("word",), words),
            "cloud_token": (("word",), _strings_like(tokenizer, words)),
            "cloud_is_candidate": (("word",), np.isin(words, candidates)),
        }
    )
    return xr.Dataset(
        data,
        coords={"layer": np.arange(hidden.shape[0]), "rank": np.arange(top), "axis": ["pc1", "pc2", "pc3"]},
        attrs=attrs,
    )


@styled
def draw_token_path(ds: xr.Dataset, folder: Path | None = None, name: str = "token_path") -> Figure:
    """A `token_path` Dataset as one figure: (a) the 3-D principal view of the token's
    path (coloured by layer) among the token vectors, the top candidate of every layer
    labelled; (b) the top candidates of every layer with their probabilities. Returns
    the figure, saved as `name`.png and .pdf in `folder` when one is given."""
    from matplotlib.cm import ScalarMappable  # lazy: start-up
    from matplotlib.colors import Normalize  # lazy: start-up

    layers = ds["layer"].values
    cmap = colormap("viridis")
    norm = Normalize(layers.min(), max(layers.max(), 1))
    fig = figure(figsize=(11, 6.2), layout="constrained")
    grid = fig.add_gridspec(1, 2, width_ratios=(1.35, 1))
    ax = fig.add_subplot(grid[0], projection="3d")
    cloud = ds["cloud"].values
    marked = ds["cloud_is_candidate"].values
    ax.scatter(*cloud[~marked].T, s=2, color="0.75", alpha=0.4, depthshade=False)
    ax.scatter(*cloud[marked].T, s=10, color="C0", alpha=0.9, depthshade=False)
    word_of = dict(zip(ds["cloud_id"].values.tolist(), range(ds.sizes["word"])))
    for token_id in dict.fromkeys(ds["candidate_id"].values[:, 0].tolist()):
        i = word_of[token_id]
        ax.text(*cloud[i], repr(str(ds["cloud_token"].values[i])), fontsize=7, color="C0")  # pyright: ignore[reportCallIssue]  # a 3-D Axes (x, y, z, s); matplotlib's stub gives the 2-D one
    path = ds["path"].values
    for a, b, layer in zip(path[:-1], path[1:], layers[1:]):
        ax.plot(*np.stack([a, b]).T, color=cmap(norm(layer)), linewidth=1.6)
    ax.scatter(*path.T, c=layers, cmap=cmap, norm=norm, s=14, depthshade=False, zorder=3)
    ax.scatter(*path[-1], s=80, marker="*", color="k", depthshade=False, zorder=4)
    share = ds.attrs.get("explained_variance", [np.nan] * 3)
    ax.set_xlabel(f"PC1 ({100 * share[0]:.0f}%)")
    ax.set_ylabel(f"PC2 ({100 * share[1]:.0f}%)")
    ax.set_zlabel(f"PC3 ({100 * share[2]:.0f}%)")
    token = ds.attrs.get("token")
    title = (
        f"token {token!r} at position {ds.attrs['position']}"
        if token is not None
        else f"position {ds.attrs['position']}"
    )
    ax.set_title(f"(a) {title}: its path among the token vectors")
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer", shrink=0.6)

    text = fig.add_subplot(grid[1])
    text.set_axis_off()
    shown = min(3, ds.sizes["rank"])
    lines = []
    for layer in layers:
        tokens = ds["candidate_token"].values[layer, :shown]
        probabilities = ds["candidate_probability"].values[layer, :shown]
        entry = "  ".join(f"{str(t)[:12]!r} {p:.2f}" for t, p in zip(tokens, probabilities))
        if "next_rank" in ds:
            entry += f"  | next #{int(ds['next_rank'].values[layer])}"
        lines.append(f"{int(layer):>3}  {entry}")
    size = max(5.0, min(8.0, 260.0 / max(len(lines), 1)))
    text.text(0, 1, "\n".join(lines), family="monospace", fontsize=size, va="top", ha="left", transform=text.transAxes)
    text.set_title("(b) top candidates per layer (probability)", loc="left")
    next_token = ds.attrs.get("next_token")
    caption(
        fig,
        (
            f"{ds.attrs.get('model', '')}: each layer's residual state of one token read through the final norm and "
            f"the {ds.attrs['readout']} (logit lens). The 3-D axes are the principal axes of the read states and their "
            f"candidates' vectors (all as unit vectors); grey: other token vectors."
            + (f" Actual next token: {next_token!r}." if next_token is not None else "")
        ),
        width=140,
    )
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        save(fig, folder, name)
    return fig
