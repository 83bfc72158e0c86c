r"""A trained DiffEqFormer beside its GPT baseline: how they learn, what their output
states do across training, how their attention weights move across depth, which
words their next-token prediction is sensitive to, and whether the attention of the
trained DiffEqFormer alone makes tokens cluster ("Neural ODE Transformers", sections
5.1, 5.2 and app. C.8; "A Survey of Continuous Time Dynamics of Transformers",
section 5.4).

`attnflow experiment=diffeqformer` reads two training runs of `attnflow train` in
`out` (`out/diffeqformer`, `out/gpt`). A run that is missing or unfinished is trained
(or resumed) there first, with the settings of conf/train.yaml and the overrides of
option `train` (both models, ~25 minutes on two CPU cores at the defaults); a
finished run is only read. Then:

1. **Losses**: the validation losses of both runs (their `metrics.jsonl`).
2. **Energy across training** (survey, section 5.4): every snapshot of both runs
   (steps 0, 1, 2, 4, ... and the last) is run on a fixed sample of held-out
   sequences (`tokens` tokens, whole windows of the model's context). For each
   sequence the output states $X$ (the last layer's residual stream, before the final
   norm) give the normalized interaction energy
   $\frac{1}{n^2}\sum_{ij}\exp(\cos(x_i, x_j))$ (the survey's eq. 52, for states off the
   sphere), and each position's next-token distribution $p$ its divergence
   $\mathrm{KL}(p \,\|\, u) = \sum_v p_v (\log p_v - \log u_v)$ from the unigram
   distribution $u$ of the training tokens (add-one smoothed, so that $\log u$ is
   finite; uniform for the synthetic induction task, whose symbols are uniform). Both
   are averaged over sequences (and positions), together with the sample's
   cross-entropy.
3. **Spectral dynamics** (paper, section 5.1): the eigenvalues of
   $W_{QK} = Q_h(t)^\top K_h(t)$ and $W_{OV} = O_h(t) V_h(t)$ of every head, for the
   DiffEqFormer on a fine grid $t_k = kT/M$, $k < M$ (`spectra_steps` = $M$), with
   the hypernetwork's own $O_h(t)$ (not the step $T/N$ that the populated layers
   fold into it), and for every layer of the GPT. Like `head_spectra`, the raw
   matrices are used (the LayerNorm gains are not folded in, biases are left out).
   The *spectral variation* between neighbouring layers (or grid points) $l, l+1$ of
   a head is the optimal-matching distance of the two eigenvalue sets relative to
   their size,
   $\delta_l = \min_\pi \|\lambda^{(l)} - \lambda^{(l+1)}_\pi\|_2 \,/\,
   \tfrac12(\|\lambda^{(l)}\|_2 + \|\lambda^{(l+1)}\|_2)$
   (the distance that the Hoffman-Wielandt inequality bounds by
   $\|W^{(l)} - W^{(l+1)}\|_F$ for normal matrices); beside it the relative change of
   the matrix itself, $\|W^{(l+1)} - W^{(l)}\|_F / \tfrac12(\|W^{(l)}\|_F + \|W^{(l+1)}\|_F)$.
   Both are compared at the same number of points, the DiffEqFormer's weights at
   the GPT's $L$ layer times $t_l = lT/L$ against the GPT's $L$ layers; the mean over
   heads and neighbours is the *roughness* (0 for weights that do not change).
4. **Token sensitivity** (paper, section 5.2): for the sentence `sentence`, the
   largest finite-time exponent $\lambda_{ji}$ of $\dot Y = J_{ji} Y$, $Y(0) = I$ of the
   last token $j$ with respect to every token $i$ (`attnflow.analysis.pair_exponents`), along the
   DiffEqFormer's own Euler solve of its field on $[0, T]$ in $N$ steps and along the
   GPT's layer map, beside the attention averaged over heads and steps. The
   DiffEqFormer's exponent is per unit of $t$ (its whole depth is $T$), the GPT's per
   layer; $\lambda_{ji}$ times the depth (`log_stretch`, the log of the growth over the
   whole model) compares the two.
5. **Clustering under the learned attention** (paper, section 5.1, app. C.8, fig.
   2c-d): the DiffEqFormer's attention term alone (its learned $Q, K, V, O$ with the
   LayerNorm gains and shifts of $N_1$ folded in, as in its field), in the model's own
   pre-LN form $\dot X = \mathrm{Attn}_{\tau}(N_1(X))$, from the embedded tokens of the
   sentence, over a long horizon $T_c$ (`cluster_horizon`) with the weights stretched
   over it, $\tau = tT/T_c$ (solved as
   $dX/d\tau = (T_c/T)\,\mathrm{Attn}_\tau(N_1(X))$ on $[0, T]$, the output matrix and
   bias scaled by $T_c/T$, by an adaptive Tsit5 solver); and the same with every
   weight frozen at $\tau = $ `frozen_at` $\cdot T$ (weight sharing). Pre-LN, because
   that is how the trained model's attention reads tokens: its logits and updates
   were learned on $N_1(x)$, of norm about $\sqrt d$, and on the unit sphere the
   logits would shrink by a factor of about $d$, a different temperature. Each is run
   with the learned biases and without the two that only add a constant drift (the
   value and output biases: the attention weights of a row sum to one), so that
   clustering by a common drift can be told from clustering by interaction.
   The GPT's attention runs the same way from its own embedding: its layers one after
   the other over $[0, T_c]$ (each in force for $T_c/L$, the core's `depth_flow`), or
   its layer $\lfloor$ `frozen_at` $L\rfloor$ for all time.
   Stored: the cluster count ($\cos > 1 - $ `cluster_eps`), the mean pair cosine and the
   normalized energy over log-spaced times, and the size of the effective weights
   $\|Q(\tau)\|_F, \dots$ across depth (the paper's fig. 2e).

Measures 3 to 5 are also taken on the untrained control (dimension `state`): each
run's snapshot at step 0, the model as initialised, so that what training did can be
told from what the parametrisation does by itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..running._progress import Progress
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, config_of, figure, subplots
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy, on_first_call
from ._text import FONT, highlight, layout, scaled, shown, write_text
from ._trained import check_train_overrides, read_metrics, run_record, trained_run

if TYPE_CHECKING:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..analysis import pair_exponents
    from ..checkpoints import _flow, _load
    from ..checkpoints import spectra as checkpoint_spectra
    from ..diffeqformer import _data, _model, _store
    from ..numerics import _field, _metrics, _schedules, _simulate
else:
    eqx = lazy("equinox")
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    pair_exponents = lazy("attnflow.analysis.pair_exponents")
    _flow = lazy("attnflow.checkpoints._flow")
    _load = lazy("attnflow.checkpoints._load")
    checkpoint_spectra = lazy("attnflow.checkpoints.spectra")
    _data = lazy("attnflow.diffeqformer._data")
    _model = lazy("attnflow.diffeqformer._model")
    _store = lazy("attnflow.diffeqformer._store")
    _field = lazy("attnflow.numerics._field")
    _metrics = lazy("attnflow.numerics._metrics")
    _schedules = lazy("attnflow.numerics._schedules")
    _simulate = lazy("attnflow.numerics._simulate")


@dataclass
class Options:
    out: str = setting("runs/diffeqformer", "folder of the two training runs (diffeqformer/, gpt/)")
    train: dict[str, Any] = setting(
        {}, "attnflow train settings for both runs: +experiment.options.train.train_steps=3000"
    )
    sentence: str = setting(
        "The for statement is used to iterate over the elements of a", "the sentence of the sensitivity study"
    )
    tokens: int = setting(4096, "held-out tokens for the energy / KL study (whole windows of the context)")
    spectra_steps: int = setting(90, "points t_k = k T / M of the DiffEqFormer's spectra")
    cluster_horizon: float = setting(
        20.0, "T_c: the attention-only dynamics runs on t in [0, T_c], weights at t T / T_c"
    )
    frozen_at: float = setting(0.5, "weight sharing: every weight held at tau = frozen_at * T")


MODELS = ("diffeqformer", "gpt")
STATES = ("trained", "untrained")  # the final models, and their snapshots at step 0 (the control)
CURVE_STEPS = (100, 300, 500, 1000)  # validation steps quoted in losses.md
THEORY_SAVES = 61  # t = 0 and 60 log-spaced times up to the horizon
THEORY_RTOL = 1e-5


# --- the training runs ----------------------------------------------------------------


def snapshots(folder: str | Path) -> dict[int, Path]:
    """The model folders of a run's snapshots by training step."""
    found = {}
    for path in sorted((Path(folder) / "snapshots").glob("step-*")):
        if path.is_dir() and path.name[5:].isdigit():
            found[int(path.name[5:])] = path
    return found


# --- checks ------------------------------------------------------------------------------


def _positive_int(name: str, value: int, least: int = 1) -> None:
    if value < least:
        raise ConfigError(f"experiment.options.{name} must be a whole number of at least {least}, got {value!r}.")


def _sentence_ids(model_folder: Path, sentence: str) -> np.ndarray:
    ids = np.asarray(_load.load_tokenizer(model_folder).encode(sentence))
    context = _store.diffeqformer_config(model_folder).context
    if ids.size == 0:
        raise ConfigError(f"the sentence {sentence!r} encodes to no tokens.")
    if ids.size > context:
        raise ConfigError(
            f"the sentence has {ids.size} tokens but the models' context is {context}; give a shorter "
            "experiment.options.sentence."
        )
    return ids


# --- 2. energy and unigram divergence across training ------------------------------------


def unigram_kl(logits, log_unigram):
    r"""$\mathrm{KL}(p \,\|\, u) = \sum_v p_v(\log p_v - \log u_v)$ of the next-token
    distributions $p = \mathrm{softmax}(\text{logits})$ (`(..., vocab)`) from the
    distribution $u$ given by its logarithm (`(vocab,)`); one value per position."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.sum(jnp.exp(log_p) * (log_p - jax.lax.broadcast_to_rank(log_unigram, log_p.ndim)), axis=-1)


def log_unigram(corpus) -> np.ndarray:
    """$\\log u$: the add-one smoothed token frequencies of a corpus's training tokens
    (uniform for the synthetic induction task, whose symbols are drawn uniformly)."""
    tokens = np.asarray(corpus.train)
    counts = np.bincount(tokens, minlength=corpus.vocab).astype(np.float64) + 1.0
    return np.log(counts / counts.sum())


@on_first_call(lambda f: eqx.filter_jit(f))
def _output_statistics(checkpoint, inputs, targets, log_u):
    """Per sequence: the normalized energy of the output states (the last residual
    stream, before the final norm), the mean divergence of its next-token
    distributions from the unigram, and its mean cross-entropy."""

    def one(ids, target):
        states = _flow.forward(checkpoint, ids).hidden[-1]
        logits = checkpoint.logits(states)
        log_p = jax.nn.log_softmax(logits, axis=-1)
        loss = -jnp.take_along_axis(log_p, target[:, None], axis=-1).mean()
        return _metrics.normalized_energy(states), unigram_kl(logits, log_u).mean(), loss

    return jax.vmap(one)(inputs, targets)


def _validation_sample(folder: Path, tokens: int, seed: int):
    """The corpus of a run (with the run's own tokenizer), `tokens` held-out tokens in
    windows of the run's context, and the log unigram of its training tokens."""
    record = run_record(folder)
    settings = record["config"]
    context = int(record["model_config"]["context"])
    corpus, _, _ = _data.load_corpus(
        settings["corpus"],
        vocab=int(settings["vocab"]),
        context=context,
        tokenizer_json=_store.tokenizer_text(folder / "model"),
    )
    sequences = max(1, math.ceil(tokens / context))
    inputs, targets = corpus.batch(jax.random.fold_in(jax.random.key(seed), 7), sequences, context, "validation")
    return corpus, np.asarray(inputs), np.asarray(targets), log_unigram(corpus)


def training_statistics(folder: Path, tokens: int, seed: int) -> xr.Dataset:
    """Energy, unigram divergence and loss of every snapshot of a run (dim
    `snapshot_step`), averaged over the validation sample."""
    _, inputs, targets, log_u = _validation_sample(folder, tokens, seed)
    rows = {"energy": [], "energy_spread": [], "kl": [], "sample_loss": []}
    found = snapshots(folder)
    with Progress(f"snapshots of {folder.name}", len(found), unit="snapshots") as bar:
        for path in found.values():
            checkpoint = _load.load_checkpoint(path)
            energy, kl, loss = (
                np.asarray(a, np.float64)
                for a in _output_statistics(
                    checkpoint, jnp.asarray(inputs), jnp.asarray(targets), jnp.asarray(log_u, checkpoint.embed.dtype)
                )
            )
            rows["energy"].append(energy.mean())
            rows["energy_spread"].append(energy.std())
            rows["kl"].append(kl.mean())
            rows["sample_loss"].append(loss.mean())
            bar.advance()
    return xr.Dataset(
        {k: ("snapshot_step", np.asarray(v)) for k, v in rows.items()},
        coords={"snapshot_step": np.asarray(list(found), np.int64)},
        attrs={"sequences": int(inputs.shape[0]), "context": int(inputs.shape[1])},
    )


# --- 3. spectra across depth -----------------------------------------------------------------


def hypernetwork_checkpoint(model, steps: int):
    """`populate(model, steps)` with the attention output $O_h(t_k)$ of the
    hypernetwork itself at $t_k = kT/N$ instead of $(T/N)\\, O_h(t_k)$: the weights at
    the grid times, as matrices of the continuous-time model (for spectra)."""
    checkpoint = _model.populate(model, steps)
    dtype = jnp.dtype(model.config.dtype)
    h = jnp.asarray(model.config.horizon, dtype) / steps
    times = jnp.asarray(0.0, dtype) + jnp.arange(steps, dtype=dtype) * h  # populate's own times
    return eqx.tree_at(lambda c: c.blocks.attention.output, checkpoint, jax.vmap(model.output)(times))


def spectral_variation(real, imag) -> np.ndarray:
    r"""$\delta_l = \min_\pi \|\lambda^{(l)} - \lambda^{(l+1)}_\pi\|_2 /
    \tfrac12(\|\lambda^{(l)}\|_2 + \|\lambda^{(l+1)}\|_2)$
    for eigenvalues `real + i imag` of shape `(points, heads, r)`: the optimal-matching
    distance of neighbouring spectra (an assignment problem per pair), relative to
    their size; shape `(points - 1, heads)`."""
    from scipy.optimize import linear_sum_assignment  # lazy: start-up

    values = np.asarray(real, np.float64) + 1j * np.asarray(imag, np.float64)
    points, heads, _ = values.shape
    out = np.zeros((points - 1, heads))
    for l in range(points - 1):
        for h in range(heads):
            a, b = values[l, h], values[l + 1, h]
            cost = np.abs(a[:, None] - b[None, :]) ** 2
            rows, cols = linear_sum_assignment(cost)
            size = 0.5 * (np.linalg.norm(a) + np.linalg.norm(b))
            out[l, h] = np.sqrt(cost[rows, cols].sum()) / size if size > 0 else 0.0
    return out


def _matrices(checkpoint) -> dict[str, np.ndarray]:
    """$W_{QK} = Q_h^\\top K_h$ and $W_{OV} = O_h V_h$ of every layer and head, `(L, H, d, d)`."""
    att = checkpoint.blocks.attention
    q, k, v, o = (np.asarray(a, np.float64) for a in (att.query, att.key, att.value, att.output))
    return {"qk": np.einsum("lhrd,lhre->lhde", q, k), "ov": np.einsum("lhdr,lhre->lhde", o, v)}


def matrix_variation(matrix: np.ndarray) -> np.ndarray:
    """$\\|W^{(l+1)} - W^{(l)}\\|_F / \\tfrac12(\\|W^{(l)}\\|_F + \\|W^{(l+1)}\\|_F)$ for
    matrices `(points, heads, d, d)`; shape `(points - 1, heads)`."""
    norms = np.linalg.norm(matrix, axis=(-2, -1))
    change = np.linalg.norm(np.diff(matrix, axis=0), axis=(-2, -1))
    size = 0.5 * (norms[1:] + norms[:-1])
    return np.where(size > 0, change / np.where(size > 0, size, 1.0), 0.0)


def _spectra(model, gpt, fine: int) -> xr.Dataset:
    depth = gpt.depth
    fine_spectra = checkpoint_spectra.head_spectra(hypernetwork_checkpoint(model, fine))
    same = hypernetwork_checkpoint(model, depth)
    same_spectra, gpt_spectra = checkpoint_spectra.head_spectra(same), checkpoint_spectra.head_spectra(gpt)
    horizon = model.config.horizon
    data = {}
    for prefix in ("qk", "ov"):
        for part in ("real", "imag"):
            name = f"{prefix}_eig_{part}"
            data[f"dfq_{name}"] = (
                ("t", "head", f"{prefix}_rank"),
                fine_spectra[name].values,
                {
                    "description": f"{part} parts of the eigenvalues of the DiffEqFormer's "
                    f"{prefix.upper()} matrix at t (hypernetwork weights)"
                },
            )
            data[f"gpt_{name}"] = (
                ("layer", "head", f"{prefix}_rank"),
                gpt_spectra[name].values,
                {"description": f"{part} parts of the eigenvalues of the GPT's {prefix.upper()} matrix of each layer"},
            )
    spectral, weights = [], []
    for spectra, checkpoint in ((same_spectra, same), (gpt_spectra, gpt)):
        spectral.append(
            [spectral_variation(spectra[f"{p}_eig_real"].values, spectra[f"{p}_eig_imag"].values) for p in ("qk", "ov")]
        )
        matrices = _matrices(checkpoint)
        weights.append([matrix_variation(matrices[p]) for p in ("qk", "ov")])
    fine_variation = [
        spectral_variation(fine_spectra[f"{p}_eig_real"].values, fine_spectra[f"{p}_eig_imag"].values)
        for p in ("qk", "ov")
    ]
    dims = ("model", "matrix", "interval", "head")
    data["spectral_variation"] = (
        dims,
        np.asarray(spectral),
        {
            "description": "optimal-matching distance between the eigenvalues of neighbouring layers (the DiffEqFormer "
            "at the GPT's layer times) relative to their size, per head"
        },
    )
    data["weight_variation"] = (
        dims,
        np.asarray(weights),
        {"description": "|W_(l+1) - W_l|_F / mean of |W|_F of neighbouring layers, per head"},
    )
    data["fine_spectral_variation"] = (
        ("matrix", "fine_interval", "head"),
        np.asarray(fine_variation),
        {"description": "spectral variation of the DiffEqFormer between neighbouring points of the fine t grid"},
    )
    coords = {
        "t": fine_spectra["layer"].values * horizon / fine,
        "layer": gpt_spectra["layer"].values,
        "head": gpt_spectra["head"].values,
        "qk_rank": gpt_spectra["qk_rank"].values,
        "ov_rank": gpt_spectra["ov_rank"].values,
        "model": list(MODELS),
        "matrix": ["qk", "ov"],
        "interval": np.arange(depth - 1),
        "fine_interval": np.arange(fine - 1),
    }
    return xr.Dataset(data, coords=coords)


# --- 4. sensitivity -----------------------------------------------------------------------------


@on_first_call(lambda f: eqx.filter_jit(f))
def _next_token_logits(model, gpt, ids):
    """The next-token logits after the sentence of both models, in one compiled program."""
    return model(ids)[-1], gpt.logits(_flow.forward(gpt, ids).hidden[-1][-1:])[0]


def _sensitivity(model, gpt, ids: np.ndarray, tokenizer) -> xr.Dataset:
    c = model.config
    ids_ = jnp.asarray(ids)
    ours = pair_exponents.token_sensitivity(
        model.field(), model.embed_tokens(ids_), t1=c.horizon, dt=c.horizon / c.steps, outputs=[-1]
    )
    theirs = pair_exponents.token_sensitivity(_flow.depth_flow(gpt), gpt.embed_tokens(ids_), outputs=[-1])
    predicted = [int(np.argmax(np.asarray(logits))) for logits in _next_token_logits(model, gpt, ids_)]
    spans = np.asarray([c.horizon, float(gpt.depth)])
    assert ours.attention is not None and theirs.attention is not None  # both fields have attention
    exponent = np.stack([np.asarray(ours.exponents[0], np.float64), np.asarray(theirs.exponents[0], np.float64)])
    attention = np.stack([np.asarray(ours.attention[0], np.float64), np.asarray(theirs.attention[0], np.float64)])
    return xr.Dataset(
        {
            "token_id": ("token", ids, {"description": "token ids of the sentence"}),
            "exponent": (
                ("model", "token"),
                exponent,
                {
                    "description": "lambda_ji = log sigma_max(Y_ji(end)) / depth, Y' = J_ji Y, Y(0) = I, j the last "
                    "token (per unit t for the DiffEqFormer, per layer for the GPT; NaN: none)"
                },
            ),
            "log_stretch": (
                ("model", "token"),
                exponent * spans[:, None],
                {"description": "lambda_ji times the depth: log sigma_max(Y_ji) over the whole model"},
            ),
            "sens_attention": (
                ("model", "token"),
                attention,
                {"description": "attention of the last token to token i, mean over heads and steps (layers)"},
            ),
            "prediction_id": ("model", np.asarray(predicted), {"description": "the model's most likely next token"}),
            "prediction": (
                "model",
                np.asarray(tokenizer.tokens(predicted), dtype=object),
                {"description": "the model's most likely next token, as text"},
            ),
            "depth_span": ("model", spans, {"description": "the time span of the sensitivity integration"}),
        },
        coords={
            "token": np.arange(ids.size),
            "model": list(MODELS),
            "token_string": (
                "token",
                np.asarray(tokenizer.tokens(ids), dtype=object),
                {"long_name": "the token as text"},
            ),
        },
    )


# --- 5. clustering under the learned attention --------------------------------------------------

THEORY_WEIGHTS = ("time-dependent", "frozen")
THEORY_DRIFT = ("learned biases", "no drift biases")
GPT_WEIGHTS = {"time-dependent": "layer by layer", "frozen": "one layer"}  # what the two variants are for the GPT
_SCHEDULES = ("query", "key", "value", "output", "query_bias", "key_bias", "value_bias", "output_bias")


def attention_only_field(
    field, horizon: float, cluster_horizon: float, *, frozen_at: float | None = None, drift: bool = True
):
    r"""The attention term of a pre-LN `field` on $[0, H]$ ($H$ = `horizon`: the
    DiffEqFormer's $T$, or a GPT's number of layers) alone, in the stretched time
    $\tau = tH/T_c$: $dX/d\tau = (T_c/H)\,\mathrm{Attn}_\tau(N_1(X))$ on $[0, H]$ (the
    output matrix and bias scaled by $T_c/H$ with the core's `Scaled`); with
    `frozen_at` every weight held at $\tau = $ `frozen_at`$\cdot H$; without `drift`
    the value and output biases scaled to zero (they only add the same vector to every
    token's velocity). Every variant of one field has the same structure."""
    attention = field.terms[0]
    dtype = attention.beta.dtype
    if frozen_at is None:
        offset, rate = jnp.asarray(0.0, dtype), jnp.asarray(1.0, dtype)
    else:
        offset, rate = jnp.asarray(frozen_at * horizon, dtype), jnp.asarray(0.0, dtype)
    retimed = {name: _schedules.Retimed(getattr(attention, name), offset, rate) for name in _SCHEDULES}
    speed = cluster_horizon / horizon
    keep = 1.0 if drift else 0.0
    factors = {"output": speed, "output_bias": speed * keep, "value_bias": keep}
    retimed |= {
        name: _schedules.Scaled(jnp.asarray([factor], dtype), retimed[name]) for name, factor in factors.items()
    }
    return _field.VectorField(terms=(dataclasses.replace(attention, **retimed),), scheme="pre", norm=field.norm)


def learned_attention_field(model, cluster_horizon: float, *, frozen_at: float | None = None, drift: bool = True):
    """`attention_only_field` of a DiffEqFormer: its attention term with the LayerNorm
    gains and shifts of $N_1$ folded in, on $[0, T]$."""
    return attention_only_field(model.field(), model.config.horizon, cluster_horizon, frozen_at=frozen_at, drift=drift)


def gpt_attention_field(checkpoint, cluster_horizon: float, *, frozen_at: float | None = None, drift: bool = True):
    """`attention_only_field` of a GPT checkpoint: its layers' attention (LayerNorm
    gains and shifts folded in), each in force for one unit of depth on $[0, L]$ (the
    core's `depth_flow`)."""
    return attention_only_field(
        _flow.depth_flow(checkpoint).field, float(checkpoint.depth), cluster_horizon, frozen_at=frozen_at, drift=drift
    )


@on_first_call(lambda f: eqx.filter_jit(f))
def _schedule_norms(schedule, grid):
    """The Frobenius norm of `schedule(t)` at each time of `grid` (one compiled program
    per schedule structure, shared by the trained and untrained models)."""
    return jax.vmap(lambda t: jnp.linalg.norm(schedule(t)))(grid)


@on_first_call(lambda f: eqx.filter_jit(f))
def _attention_only(field, x0, taus, horizon: float, eps):
    """The adaptive solve of an attention-only field on $[0, H]$ and, at the times
    `taus`, the cluster count, mean pair cosine, normalized energy and mean norm; the
    solver's result code. One compiled program for every field of one structure."""
    solution = _simulate.simulate(
        field,
        x0,
        t1=horizon,
        dt=1e-5 * horizon,
        solver="tsit5",
        adaptive=True,
        ts=taus,
        rtol=THEORY_RTOL,
        atol=THEORY_RTOL,
        max_steps=200_000,
    )
    upper = np.triu_indices(x0.shape[0], 1)

    def measures(x):
        cos = _metrics.cosines(x)
        return (
            _metrics.cluster_count(x, eps),
            jnp.mean(cos[upper]),
            _metrics.normalized_energy(x),
            jnp.mean(jnp.linalg.norm(x, axis=-1)),
        )

    return solution.result, jax.vmap(measures)(solution.xs)


def _theory(model, gpt, ids: np.ndarray, cluster_horizon: float, frozen_at: float, eps: float) -> xr.Dataset:
    """Clustering under the attention alone of the DiffEqFormer (time-dependent weights
    stretched over $[0, T_c]$, or frozen) and of the GPT (its layers one after the
    other over $[0, T_c]$, or one layer for all time), each from its own embedding of
    the sentence."""
    dtype = jnp.dtype(model.config.dtype)
    fractions = np.concatenate([[0.0], np.geomspace(1e-4, 1.0, THEORY_SAVES - 1)])
    systems = {
        "diffeqformer": (
            learned_attention_field,
            model,
            model.embed_tokens(jnp.asarray(ids)),
            float(model.config.horizon),
            model.field().terms[0],
        ),
        "gpt": (
            gpt_attention_field,
            gpt,
            gpt.embed_tokens(jnp.asarray(ids)),
            float(gpt.depth),
            _flow.depth_flow(gpt).field.terms[0],
        ),
    }
    out = {"clusters": [], "mean_cosine": [], "theory_energy": [], "mean_norm": []}
    norms = []
    depth = np.linspace(0.0, 1.0, 101)
    for build, system, x0, horizon, attention in systems.values():
        taus = jnp.asarray(fractions * horizon, dtype)
        per_model = {k: [] for k in out}
        for weights in THEORY_WEIGHTS:
            rows = {k: [] for k in out}
            for drift in (True, False):
                field = build(
                    system, cluster_horizon, frozen_at=frozen_at if weights == "frozen" else None, drift=drift
                )
                result, values = _attention_only(field, x0, taus, horizon, jnp.asarray(eps, dtype))
                if int(result) != 0:
                    raise ConfigError(
                        "the adaptive solve of the attention-only dynamics stopped early; lower "
                        "experiment.options.cluster_horizon."
                    )
                for key, value in zip(rows, values):
                    rows[key].append(np.asarray(value))
            for key, values in rows.items():
                per_model[key].append(values)
        for key, values in per_model.items():
            out[key].append(values)
        # The effective weights that the dynamics reads (gains of N_1 folded in), across depth.
        grid = jnp.asarray(depth * horizon, dtype)
        schedules = [attention.query, attention.key, attention.value, attention.output]
        norms.append(np.stack([np.asarray(_schedule_norms(w, grid)) for w in schedules]))
    dims = ("model", "theory_weights", "theory_drift", "theory_time")
    return xr.Dataset(
        {
            "clusters": (
                dims,
                np.asarray(out["clusters"], np.int64),
                {"description": "clusters of the attention-only dynamics: components of cos(x_i, x_j) > 1 - eps"},
            ),
            "mean_cosine": (
                dims,
                np.asarray(out["mean_cosine"], np.float64),
                {"description": "mean pair cosine cos(x_i, x_j), i < j"},
            ),
            "theory_energy": (
                dims,
                np.asarray(out["theory_energy"], np.float64),
                {"description": "normalized interaction energy (1/n^2) sum_ij exp(cos(x_i, x_j))"},
            ),
            "mean_norm": (
                dims,
                np.asarray(out["mean_norm"], np.float64),
                {"description": "mean token norm |x_i| of the residual stream"},
            ),
            "weight_norm": (
                ("model", "weight", "tau"),
                np.asarray(norms, np.float64),
                {
                    "description": "Frobenius norm over all heads of the effective attention weights (LayerNorm gains "
                    "folded in) at the share tau of the model's depth (the GPT's layer floor(tau L))"
                },
            ),
        },
        coords={
            "model": list(MODELS),
            "theory_weights": list(THEORY_WEIGHTS),
            "theory_drift": list(THEORY_DRIFT),
            "theory_time": fractions * cluster_horizon,
            "weight": ["Q", "K", "V", "O"],
            "tau": depth,
        },
    )


# --- analyse ----------------------------------------------------------------------------------------


def _losses(folders: dict[str, Path]) -> xr.Dataset:
    parts: list[xr.Dataset] = []
    for name, folder in folders.items():
        lines = [e for e in read_metrics(folder) if e.get("val_loss") is not None]
        steps = np.asarray([e["step"] for e in lines], np.int64)
        val = np.asarray([e["val_loss"] for e in lines], np.float64)
        train = np.asarray([np.nan if e.get("train_loss") is None else e["train_loss"] for e in lines], np.float64)
        parts.append(
            xr.Dataset(
                {"val_loss": ("eval_step", val), "train_loss": ("eval_step", train)}, coords={"eval_step": steps}
            ).expand_dims(model=[name])
        )
    return xr.concat(parts, dim="model", join="outer")


# --- figures --------------------------------------------------------------------------------------

COLORS = {"diffeqformer": "C0", "gpt": "C3"}
LABELS = {"diffeqformer": "DiffEqFormer", "gpt": "GPT"}


def roughness(ds: xr.Dataset) -> xr.Dataset:
    """The mean over heads and neighbouring layers of the spectral and weight
    variations, per state (trained, untrained), model and matrix."""
    return xr.Dataset(
        {
            "spectral": ds["spectral_variation"].mean(("interval", "head")),
            "weights": ds["weight_variation"].mean(("interval", "head")),
        }
    )


def single_cluster_time(clusters, times) -> float | None:
    """The first saved time from which the cluster count stays 1 (None if it never does)."""
    clusters = np.asarray(clusters)
    if clusters[-1] != 1:
        return None
    above = np.nonzero(clusters != 1)[0]
    return float(times[0 if above.size == 0 else above[-1] + 1])


def _final(ds: xr.Dataset, name: str, model: str) -> tuple[int, float]:
    values = ds[name].sel(model=model).dropna("eval_step")
    return int(values["eval_step"].values[-1]), float(values.values[-1])


def _tables(ds: xr.Dataset, folder: Path) -> list[Path]:
    rough = roughness(ds)
    lines = [
        "# DiffEqFormer against its GPT baseline",
        "",
        (
            f"Runs in `{ds.attrs['out']}` on `{ds.attrs['corpus']}`; validation losses in nats per token "
            "(last line of each run's `metrics.jsonl`)."
        ),
        "",
        "| model | step | validation loss | training loss |",
        "|---|---|---|---|",
    ]
    for model in MODELS:
        step, val = _final(ds, "val_loss", model)
        train = float(ds["train_loss"].sel(model=model, eval_step=step))
        lines.append(f"| {LABELS[model]} | {step} | {val:.3f} | {train:.3f} |")
    # The curve at a few steps (the untrained models are at ln(vocab) at step 0).
    steps = [int(k) for k in ds.eval_step.values if int(k) in CURVE_STEPS]
    lines += [
        "",
        "Validation loss along training (the last column: the final step, training loss in brackets):",
        "",
        "| model | " + " | ".join(f"step {k}" for k in steps) + " | last |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for model in MODELS:
        part = ds.sel(model=model)
        step, val = _final(ds, "val_loss", model)
        train = float(part["train_loss"].sel(eval_step=step))
        cells = [f"{float(part.val_loss.sel(eval_step=k)):.2f}" for k in steps]
        lines.append(f"| {LABELS[model]} | " + " | ".join(cells) + f" | {val:.2f} ({train:.2f}) |")
    lines += [
        "",
        (
            "Roughness of the attention weights across depth (mean over heads and neighbouring layers; "
            f"the DiffEqFormer at the GPT's {ds.attrs['gpt_layers']} layer times t = lT/L; 0 = constant "
            "weights):"
        ),
        "",
        "| model | QK spectra | OV spectra | QK matrices | OV matrices |",
        "|---|---|---|---|---|",
    ]
    for state in STATES:
        for model in MODELS:
            r = rough.sel(model=model, state=state)
            lines.append(
                f"| {LABELS[model]}, {state} | {float(r.spectral.sel(matrix='qk')):.4f} | "
                f"{float(r.spectral.sel(matrix='ov')):.4f} | {float(r.weights.sel(matrix='qk')):.4f} | "
                f"{float(r.weights.sel(matrix='ov')):.4f} |"
            )
    lines += [
        "",
        "Energy and unigram divergence of the output states, first and last snapshot:",
        "",
        "| model | step | energy | KL to unigram | sample loss |",
        "|---|---|---|---|---|",
    ]
    for model in MODELS:
        part = ds[["energy", "kl", "sample_loss"]].sel(model=model).dropna("snapshot_step", subset=["energy"])
        for index in (0, -1):
            row = part.isel(snapshot_step=index)
            lines.append(
                f"| {LABELS[model]} | {int(row.snapshot_step)} | {float(row.energy):.3f} | "
                f"{float(row.kl):.3f} | {float(row.sample_loss):.3f} |"
            )
    lines += [
        "",
        (
            f"Attention-only dynamics (clusters at cos > 1 - {config_of(ds)['cluster_eps']:g}) of the sentence's "
            f"{ds.sizes['token']} tokens, at t = T_c = {ds.attrs['cluster_horizon']:g}; the DiffEqFormer's "
            "weights at tau = t T / T_c or frozen at tau = frozen_at T, the GPT's layers one after the other "
            "or its middle layer for all time:"
        ),
        "",
        "| model | state | weights | biases | clusters | mean pair cosine | one cluster from t = |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for state in STATES:
            for weights in ds.theory_weights.values:
                for drift in ds.theory_drift.values:
                    part = ds[["clusters", "mean_cosine"]].sel(
                        model=model, state=state, theory_weights=weights, theory_drift=drift
                    )
                    since = single_cluster_time(part.clusters.values, ds.theory_time.values)
                    shown = weights if model == "diffeqformer" else GPT_WEIGHTS[str(weights)]
                    lines.append(
                        f"| {LABELS[model]} | {state} | {shown} | {drift} | {int(part.clusters[-1])} | "
                        f"{float(part.mean_cosine[-1]):.4f} | {'never' if since is None else f'{since:.3g}'} |"
                    )
    lines += [
        "",
        "Size of the effective attention weights across depth, max and min of |W(tau)|_F / |W(0)|_F:",
        "",
        "| model | state | Q | K | V | O |",
        "|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for state in STATES:
            norms = ds.weight_norm.sel(model=model, state=state)
            relative = norms / norms.isel(tau=0)
            cells = [
                f"{float(relative.sel(weight=w).min()):.2f}-{float(relative.sel(weight=w).max()):.2f}"
                for w in norms.weight.values
            ]
            lines.append(f"| {LABELS[model]} | {state} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Largest eigenvalue modulus of Q_h^T K_h and O_h V_h (the DiffEqFormer per unit t, at its "
        f"{ds.sizes['t']} grid points; the GPT per layer):",
        "",
        "| model | state | QK | OV |",
        "|---|---|---|---|",
    ]
    for model, prefix in (("diffeqformer", "dfq"), ("gpt", "gpt")):
        for state in STATES:
            part = ds.sel(state=state)
            top = [
                float(np.abs(part[f"{prefix}_{m}_eig_real"] + 1j * part[f"{prefix}_{m}_eig_imag"]).max())
                for m in ("qk", "ov")
            ]
            lines.append(f"| {LABELS[model]} | {state} | {top[0]:.4g} | {top[1]:.4g} |")
    return [write_text(folder / "losses.md", "\n".join(lines) + "\n")]


def _draw_losses(ds: xr.Dataset) -> Figure:
    fig, ax = subplots(figsize=(6.4, 3.8), layout="constrained")
    ax = cast("Axes", ax)  # one panel
    for model in MODELS:
        part = ds.sel(model=model).dropna("eval_step", subset=["val_loss"])
        step, val = _final(ds, "val_loss", model)
        ax.plot(
            part.eval_step,
            part.val_loss,
            color=COLORS[model],
            marker="o",
            markersize=3,
            label=f"{LABELS[model]}: validation ({val:.2f} at step {step})",
        )
        ax.plot(part.eval_step, part.train_loss, color=COLORS[model], ls="--", lw=1, label=f"{LABELS[model]}: training")
    ax.set(
        xlabel="training step",
        ylabel="loss (nats per token)",
        title=f"Losses on {ds.attrs['corpus']}: DiffEqFormer ({ds.attrs['dfq_steps']} Euler steps on "
        f"[0, {ds.attrs['horizon']:g}]) and GPT ({ds.attrs['gpt_layers']} layers)",
    )
    ax.legend()
    caption(
        fig,
        "Validation loss (solid) on held-out chunks and the mean training loss since the previous validation "
        "(dashed), as recorded in each run's metrics.jsonl.",
        width=100,
    )
    return fig


def _draw_training(ds: xr.Dataset) -> Figure:
    fig, axes = subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    for model in MODELS:
        part = ds.sel(model=model).dropna("snapshot_step", subset=["energy"])
        steps = part.snapshot_step.values
        kw = {"color": COLORS[model], "marker": "o", "markersize": 3, "label": LABELS[model]}
        axes[0].plot(steps, part.energy, **kw)
        axes[0].fill_between(
            steps,
            part.energy - part.energy_spread,
            part.energy + part.energy_spread,
            color=COLORS[model],
            alpha=0.15,
            linewidth=0,
        )
        axes[1].plot(steps, part.kl, **kw)
        axes[2].plot(steps, part.sample_loss, **kw)
    titles = (
        "(a) energy of the output states",
        r"(b) $\mathrm{KL}(p \,\|\, \mathrm{unigram})$",
        "(c) loss on the same sample",
    )
    labels = (r"$\frac{1}{n^2} \sum_{ij} e^{\cos(x_i, x_j)}$", "nats", "nats per token")
    for ax, title, label in zip(axes, titles, labels):
        ax.set_xscale("symlog", linthresh=1)
        ax.set(xlabel="training step (0, then logarithmic)", ylabel=label, title=title)
    axes[0].axhline(np.e, color="0.5", ls=":", lw=1)
    axes[0].text(
        0.99,
        np.e,
        "$e$: one direction ",
        transform=axes[0].get_yaxis_transform(),
        ha="right",
        va="top",
        fontsize=7,
        color="0.4",
    )
    axes[0].legend()
    fig.suptitle(
        f"Across training: the output states of both models on {ds.attrs['sequences']} held-out sequences "
        f"of {ds.attrs['context']} tokens"
    )
    caption(
        fig,
        "(a) Normalized interaction energy of the last layer's residual stream (before the final norm) of each "
        "sequence, mean over sequences with $\\pm$ one standard deviation; it is $e$ when all tokens point the same "
        "way. (b) Divergence of the predicted next-token distribution from the unigram distribution of the "
        "training tokens (add-one smoothed), mean over positions and sequences: low when the model predicts "
        "the word frequencies everywhere. (c) Cross-entropy on the same sample. One point per snapshot.",
        width=150,
    )
    return fig


def _eigen_scatter(ax, x, real, cmap, heads):
    """Real parts of every head's eigenvalues against depth, coloured by head."""
    for h in range(heads):
        values = real[:, h, :]
        ax.scatter(
            np.repeat(x, values.shape[-1]),
            values.ravel(),
            s=2,
            color=cmap(h / max(heads - 1, 1)),
            alpha=0.5,
            linewidth=0,
            label=f"head {h}",
        )
    ax.axhline(0, color="0.4", lw=0.6)


def _draw_spectra(ds: xr.Dataset) -> Figure:
    heads = ds.sizes["head"]
    cmap = colormap("viridis")
    horizon, layers = ds.attrs["horizon"], ds.attrs["gpt_layers"]
    rough = roughness(ds)
    fig, axes = subplots(2, 3, figsize=(14, 7.4), layout="constrained")
    for row, prefix in enumerate(("qk", "ov")):
        name = r"$Q_h^\top K_h$" if prefix == "qk" else r"$O_h V_h$"
        _eigen_scatter(axes[row, 0], ds.t.values, ds[f"dfq_{prefix}_eig_real"].sel(state="trained").values, cmap, heads)
        axes[row, 0].set(
            xlabel=f"t (hypernetwork weights at {ds.sizes['t']} points)",
            ylabel=r"$\mathrm{Re}\,\lambda$",
            title=f"DiffEqFormer: eigenvalues of {name}($t$)",
        )
        _eigen_scatter(
            axes[row, 1], ds.layer.values, ds[f"gpt_{prefix}_eig_real"].sel(state="trained").values, cmap, heads
        )
        axes[row, 1].set(
            xlabel="layer", ylabel=r"$\mathrm{Re}\,\lambda$", title=f"GPT: eigenvalues of {name} per layer"
        )
        ax = axes[row, 2]
        for state, ls in zip(STATES, ("-", ":")):
            for model in MODELS:
                values = ds["spectral_variation"].sel(model=model, matrix=prefix, state=state)
                mean = float(rough.spectral.sel(model=model, matrix=prefix, state=state))
                ax.plot(
                    values.interval + 1,
                    values.mean("head"),
                    color=COLORS[model],
                    ls=ls,
                    marker="o",
                    markersize=3 if state == "trained" else 2,
                    label=f"{LABELS[model]}, {state}: {mean:.3f}",
                )
                if state == "trained":
                    ax.fill_between(
                        values.interval + 1,
                        values.min("head"),
                        values.max("head"),
                        color=COLORS[model],
                        alpha=0.15,
                        linewidth=0,
                    )
        ax.set_yscale("log")
        ax.set(
            xlabel=f"between layers $l - 1$ and $l$ (DiffEqFormer at $t = l\\,T/{layers}$)",
            ylabel="relative distance",
            title=f"variation of the {prefix.upper()} spectra between neighbours",
        )
        ax.legend(title="roughness", fontsize=7)
    axes[0, 0].legend(markerscale=4, loc="best")
    fig.suptitle("Spectral dynamics: the DiffEqFormer's continuous weights against the GPT's independent layers")
    caption(
        fig,
        f"Left: real parts of the eigenvalues of every head's QK and OV matrix of the DiffEqFormer on a grid of "
        f"$t \\in [0, {horizon:g})$ ($O_h(t)$ of the hypernetwork, without the step $T/N$ of the populated layers); "
        f"middle: the GPT's {layers} layers; colour: head. Right: "
        r"$\min_\pi |\lambda_l - \lambda_{l+1,\pi}| \,/\, \mathrm{mean}\,|\lambda|$"
        f" between neighbouring layers, the DiffEqFormer's weights taken at the same {layers} "
        "points; mean over heads with the min-max band (trained, solid) and for the untrained models, their "
        "snapshots at step 0 (dotted: the control). The roughness is its mean over heads and neighbours.",
        width=170,
    )
    return fig


def _draw_sensitivity(ds: xr.Dataset) -> Figure:
    tokens = [str(t) for t in ds.token_string.values]
    n = len(tokens)
    last = n - 1
    width = 10.0
    fig = figure(figsize=(width + 0.6, 1))
    placed, lines = layout(fig, tokens, width)
    text_height = 0.45 + lines * 1.9 * FONT / 72
    bars, gap = 2.2, 0.9  # inches: the bar charts, and the room of their rotated labels
    heights = [text_height, text_height, bars, gap, text_height, text_height, bars]
    fig.set_size_inches(width + 0.6, sum(heights) + 2.2)
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=0.3, top=0.94, bottom=0.09)
    reds, blues = colormap("Reds"), colormap("Blues")
    positions = np.arange(n)
    labels = [shown(t)[0] for t in tokens]
    for block, model in enumerate(MODELS):
        part = ds.sel(model=model, state="trained")
        exponent, attention = part.exponent.values, part.sens_attention.values
        unit = "per unit t" if model == "diffeqformer" else "per layer"
        nxt = shown(str(part.prediction.values))[0]
        row = 4 * block
        highlight(
            fig,
            fig.add_subplot(grid[row]),
            placed,
            0.85 * scaled(exponent, last),
            reds,
            f"{LABELS[model]}: Lyapunov sensitivity of the last token (its next word: {nxt!r})",
            last,
        )
        highlight(
            fig,
            fig.add_subplot(grid[row + 1]),
            placed,
            0.85 * scaled(attention, last),
            blues,
            f"{LABELS[model]}: attention of the last token, mean over heads and "
            f"{'steps' if model == 'diffeqformer' else 'layers'}",
            last,
        )
        ax = fig.add_subplot(grid[row + 2])
        ax.bar(positions - 0.2, exponent, width=0.4, color=reds(0.7), label=rf"$\lambda_{{ji}}$ ({unit})")
        ax.set_ylabel(rf"$\lambda$ ({unit})")
        twin = ax.twinx()
        twin.bar(positions + 0.2, attention, width=0.4, color=blues(0.7), label="mean attention")
        twin.set_ylabel("attention")
        twin.grid(False)
        ax.set_xticks(positions, labels, rotation=60, ha="right")
        ax.legend(
            handles=ax.containers[:1] + twin.containers[:1],
            loc="lower left",
            bbox_to_anchor=(0, 1.0),
            ncol=2,
            frameon=False,
        )
    fig.suptitle(f'Which tokens the next word depends on: "{ds.attrs["sentence"]}"', y=0.99)
    caption(
        fig,
        r"Red: $\lambda_{ji} = \log \sigma_{\max}(Y_{ji}) / \mathrm{depth}$ with $Y' = J_{ji} Y$, $Y(0) = I$, "
        "$j$ the last token (outlined), "
        f"along the DiffEqFormer's Euler solve ({ds.attrs['dfq_steps']} steps on [0, {ds.attrs['horizon']:g}]) and "
        f"the GPT's layer map ({ds.attrs['gpt_layers']} layers); blue: the attention of the last token. Each "
        "colour scale runs over the tokens other than the last one, which is clipped to it.",
        width=150,
    )
    return fig


def _draw_clustering(ds: xr.Dataset) -> Figure:
    fig, axes = subplots(2, 3, figsize=(14, 7.6), layout="constrained")
    t = ds.theory_time.values
    shown = t > 0
    colors = {
        ("trained", "time-dependent"): "C0",
        ("trained", "frozen"): "C1",
        ("untrained", "time-dependent"): "0.35",
        ("untrained", "frozen"): "0.7",
    }
    for row, model in enumerate(MODELS):
        frozen = "frozen" if model == "diffeqformer" else GPT_WEIGHTS["frozen"]
        moving = "time-dependent" if model == "diffeqformer" else GPT_WEIGHTS["time-dependent"]
        for state in STATES:
            for weights in ds.theory_weights.values:
                for drift, ls in zip(ds.theory_drift.values, ("-", "--")):
                    part = ds.sel(model=model, state=state, theory_weights=weights, theory_drift=drift)
                    name = frozen if weights == "frozen" else moving
                    style = {
                        "color": colors[state, str(weights)],
                        "ls": ls,
                        "lw": 1.5 if state == "trained" else 1.0,
                        "label": f"{state}, {name}, {drift}",
                    }
                    axes[row, 0].plot(t[shown], part.clusters.values[shown], **style)
                    axes[row, 1].plot(t[shown], 1 - part.mean_cosine.values[shown], **style)
        axes[row, 0].set(
            xscale="log",
            xlabel="t",
            ylabel="clusters",
            title=f"(a) {LABELS[model]}: cluster count ($\\cos > 1 - {config_of(ds)['cluster_eps']:g}$)",
        )
        axes[row, 1].set(
            xscale="log",
            yscale="log",
            xlabel="t",
            ylabel=r"$1 - \mathrm{mean}\,\cos(x_i, x_j)$",
            title=f"(b) {LABELS[model]}: spread of directions",
        )
        axes[row, 0].legend(fontsize=6)
        norms = ds.weight_norm.sel(model=model)
        for index, weight in enumerate(norms.weight.values):
            for state, ls in zip(STATES, ("-", ":")):
                values = norms.sel(weight=weight, state=state)
                axes[row, 2].plot(
                    norms.tau, values / values.isel(tau=0), color=f"C{index}", ls=ls, label=f"{weight}, {state}"
                )
        axes[row, 2].axvline(ds.attrs["frozen_at"], color="0.5", ls=":", lw=1)
        axes[row, 2].set(
            xlabel=r"share of the depth ($\tau / T$, or layer / $L$)",
            ylabel=r"$\|W\|_F \,/\, \|W(0)\|_F$",
            title=f"(c) {LABELS[model]}: size of the attention weights",
        )
        axes[row, 2].legend(fontsize=6, ncol=2)
    fig.suptitle(
        f"Attention alone (pre-LN), from the sentence's {ds.sizes['token']} embedded tokens, over $t \\in$ "
        f"[0, {ds.attrs['cluster_horizon']:g}]: trained, and untrained (the control)"
    )
    caption(
        fig,
        r"(a, b) $dX/dt = \mathrm{Attn}_\tau(N_1(X))$. Top: the DiffEqFormer with its weights at "
        r"$\tau = t\,T / T_c$ "
        f"(time-dependent) or held at $\\tau$ = {ds.attrs['frozen_at']:g} $T$ (frozen: weight sharing). Bottom: the "
        f"GPT with its {ds.attrs['gpt_layers']} layers one after the other over $[0, T_c]$ (layer by layer) or "
        f"its layer {int(ds.attrs['frozen_at'] * ds.attrs['gpt_layers'])} for all time (one layer). Solid "
        "with the biases, dashed without the value and output biases (a drift common to all tokens); colours: "
        "the trained models, greys: the same runs' snapshots at step 0. (c) Frobenius norms of the effective "
        "Q, K, V, O (all heads, LayerNorm gains folded in) across depth, relative to its start, trained "
        "(solid) and untrained (dotted); the vertical line: the frozen time.",
        width=170,
    )
    return fig


def current_layout(ds: xr.Dataset) -> xr.Dataset:
    """A Dataset of this experiment in today's dimension names, also when its file was
    written before they were unified: the spectra, the sensitivity and the clustering
    then ran along `spectra_model`, `sens_model` and `theory_model`, now all `model`
    (the same two models), and the token strings were a variable."""
    old = [dim for dim in ("spectra_model", "sens_model", "theory_model") if dim in ds.dims]
    if "token_string" in ds.data_vars:
        ds = ds.set_coords("token_string")
    if not old:
        return ds
    parts: list[xr.Dataset] = [ds.drop_dims(old)]
    for dim in old:
        names = [name for name in ds.data_vars if dim in ds[name].dims]
        parts.append(ds[names].rename({dim: "model"}))
    return xr.merge(parts, join="exact", combine_attrs="override")


# --- the experiment ------------------------------------------------------------------------------------


class DiffEqFormerVsGPT(Experiment):
    title = (
        "A trained DiffEqFormer against its GPT baseline: losses, energy across training, spectral flow, "
        "sensitivity, clustering"
    )
    paper = (
        "Neural ODE Transformers, sec. 5.1, 5.2, app. C.8; A Survey of Continuous Time Dynamics of "
        "Transformers, sec. 5.4"
    )
    Options = Options
    # The long names and units of this experiment's own coordinates (units None: text).
    coordinates = {
        "model": ("the trained model: the DiffEqFormer or its GPT baseline", None),
        "state": ("trained or untrained (the control at initialization)", None),
        "eval_step": ("training step of a validation", "1"),
        "snapshot_step": ("training step of a saved snapshot", "1"),
        "t": ("depth-time t of the DiffEqFormer (its fine grid)", "1"),
        "qk_rank": ("eigenvalue rank of a head's QK matrix, largest first", "1"),
        "ov_rank": ("eigenvalue rank of a head's OV matrix, largest first", "1"),
        "matrix": ("the head matrix: QK (Q_h^T K_h) or OV (O_h V_h)", None),
        "interval": ("pair of neighbouring layers (l, l + 1)", "1"),
        "fine_interval": ("pair of neighbouring points of the fine t grid", "1"),
        "theory_weights": ("the attention weights of the clustering run: time-dependent or frozen", None),
        "theory_drift": ("the drift biases of the clustering run: learned or none", None),
        "theory_time": ("depth-time of the attention-only clustering run", "1"),
        "weight": ("the attention weight matrix: Q, K, V or O", None),
        "tau": ("share of the model's depth", "1"),
    }

    def check(self) -> None:
        options = self.options
        if not options.out:
            raise ConfigError(f"experiment.options.out must be a folder name, got {options.out!r}.")
        check_train_overrides("diffeqformer", options.train)
        sentence = options.sentence
        if not sentence.strip():
            raise ConfigError(f"experiment.options.sentence must be a non-empty text, got {sentence!r}.")
        _positive_int("tokens", options.tokens)
        _positive_int("spectra_steps", options.spectra_steps, 2)
        horizon = options.cluster_horizon
        if not 0 < horizon < math.inf:
            raise ConfigError(f"experiment.options.cluster_horizon must be a positive number, got {horizon!r}.")
        at = options.frozen_at
        if not 0 <= at <= 1:
            raise ConfigError(f"experiment.options.frozen_at must be a share of the horizon in [0, 1], got {at!r}.")
        if not 0 < self.cfg.cluster_eps < 2:
            raise ConfigError(
                f"cluster_eps must be in (0, 2) (clusters: cos > 1 - cluster_eps), got {self.cfg.cluster_eps}."
            )
        model = Path(options.out) / "diffeqformer" / "model"
        if model.is_dir():  # a sentence longer than the context stops here when the model is there already
            _sentence_ids(model, sentence)

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # nothing for the core study runner: everything happens in `analyse`

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        cfg, options = self.cfg, self.options
        out = Path(options.out)
        overrides = dict(options.train)
        folders = {name: trained_run(out / name, name, overrides) for name in MODELS}
        model = _store.load_diffeqformer(folders["diffeqformer"] / "model")
        gpt = _load.load_checkpoint(folders["gpt"] / "model")
        tokenizer = _load.load_tokenizer(folders["diffeqformer"] / "model")
        ids = _sentence_ids(folders["diffeqformer"] / "model", options.sentence)

        # The untrained control: both runs' snapshots at step 0, the models as initialised.
        untrained = {name: snapshots(folders[name]).get(0) for name in MODELS}
        missing = [name for name, path in untrained.items() if path is None]
        if missing:
            raise ConfigError(
                f"the {missing[0]} run in {folders[missing[0]]} has no snapshot at step 0 (the untrained "
                "control); train it again into an empty out=."
            )
        states = {
            "trained": (model, gpt),
            "untrained": (_store.load_diffeqformer(untrained["diffeqformer"]), _load.load_checkpoint(untrained["gpt"])),  # pyright: ignore[reportArgumentType]  # no None: refused above
        }

        def both(compute, same=()):
            """`compute(dfq, gpt)` for the trained models and the untrained control, along
            the dimension `state`; the variables in `same` are the same for both."""
            parts: list[xr.Dataset] = [compute(*pair) for pair in states.values()]
            names = [name for name in parts[0].data_vars if name not in same]
            return xr.concat(
                parts,
                dim=xr.DataArray(list(STATES), dims="state", name="state"),
                data_vars=names,
                coords="minimal",
                compat="equals",
                combine_attrs="override",
            )

        with Progress("DiffEqFormer analysis", 4, unit="stages") as bar:
            stage = lambda text: print(f"attnflow: {text} ...", flush=True) if not bar.show else bar.describe(text)
            stage("losses and the energy of the output states across training")
            losses = _losses(folders)
            training = xr.concat(
                [
                    training_statistics(folders[name], int(options.tokens), int(cfg.seed)).expand_dims(model=[name])
                    for name in MODELS
                ],
                dim="model",
                join="outer",
            )
            bar.advance()
            stage("QK/OV spectra across depth, trained and untrained")
            spectra = both(lambda m, g: _spectra(m, g, int(options.spectra_steps)))
            bar.advance()
            stage("token sensitivity of the sentence, trained and untrained")
            sensitivity = both(lambda m, g: _sensitivity(m, g, ids, tokenizer), same=("token_id",))
            bar.advance()
            stage("clustering under the attention, trained and untrained")
            theory = both(
                lambda m, g: _theory(
                    m, g, ids, float(options.cluster_horizon), float(options.frozen_at), float(cfg.cluster_eps)
                )
            )
            bar.advance()

        # Each variable keeps its own attributes (its description); the Dataset's are set below.
        ds = xr.merge([losses, training, spectra, sensitivity, theory], combine_attrs="override")  # pyright: ignore[reportCallIssue, reportArgumentType]  # all Datasets (expand_dims reads as Unknown)
        ds.attrs = {}
        ds["energy"].attrs["description"] = (
            "normalized interaction energy (1/n^2) sum_ij exp(cos(x_i, x_j)) of the "
            "output states (last layer, before the final norm), mean over sequences"
        )
        ds["energy_spread"].attrs["description"] = "standard deviation of that energy over the sequences"
        ds["kl"].attrs["description"] = (
            "KL(p || unigram) of the next-token distributions, mean over positions and sequences (nats)"
        )
        ds["sample_loss"].attrs["description"] = "cross-entropy on the same held-out sample (nats per token)"
        ds["val_loss"].attrs["description"] = "validation loss of the run (metrics.jsonl)"
        ds["train_loss"].attrs["description"] = "mean training loss since the previous validation (metrics.jsonl)"
        records = {name: run_record(folders[name]) for name in MODELS}
        ds.attrs.update(
            out=str(out),
            sentence=options.sentence,
            horizon=float(model.config.horizon),
            dfq_steps=int(model.config.steps),
            gpt_layers=int(gpt.depth),
            spectra_steps=int(options.spectra_steps),
            cluster_horizon=float(options.cluster_horizon),
            frozen_at=float(options.frozen_at),
            sequences=int(training.attrs.get("sequences", 0)),
            context=int(training.attrs.get("context", 0)),
            corpus=str(records["diffeqformer"]["config"]["corpus"]),
            train_steps=json.dumps({name: int(records[name]["config"]["train_steps"]) for name in MODELS}),
        )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        ds = current_layout(ds)
        return {
            "losses": _draw_losses(ds),
            "training_energy": _draw_training(ds),
            "spectra": _draw_spectra(ds),
            "sensitivity": _draw_sensitivity(ds),
            "clustering": _draw_clustering(ds),
        }

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        """The tables of losses, roughness and spectra (losses.md)."""
        return _tables(current_layout(ds), Path(folder))
