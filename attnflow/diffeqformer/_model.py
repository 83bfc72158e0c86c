"""The DiffEqFormer: a transformer whose depth is the time of one ODE with
time-dependent weights, and the discrete-layer models made from it.

The residual stream of $n$ tokens evolves on $t \\in [0, T]$ (the `horizon`, 1 by
default) under

$$\\dot x_i = \\mathrm{Attn}_t(N_1(X))_i + \\mathrm{MLP}_t(N_2(x_i)),$$

(Neural ODE Transformers, eq. 2-5), with softmax attention over the earlier tokens
$\\sum_h O_h(t) \\sum_{j \\le i} a^h_{ij} V_h(t) x_j + b^O(t)$, logits
$\\langle Q_h(t) x_i, K_h(t) x_j\\rangle / \\sqrt{d_k}$, the GELU MLP
$W_2(t)\\,\\mathrm{gelu}(W_1(t) x + b_1(t)) + b_2(t)$, and pre-normalizations
$N_k(x) = \\gamma_k(t) \\odot \\mathrm{LN}(x) + s_k(t)$. Every weight, gain and shift
is a hypernetwork of time, $W(t) = \\mathrm{Proj}(\\mathrm{MLP}(\\mathrm{Sinusoidal}(t)))$
(eq. 6, appendix A). The vector field is built from the core's terms
(`SelfAttention`, `MLP`, `TokenNorm`, `VectorField` with the `pre` scheme), and the
model is solved by the core's `simulate`: Euler with $N$ steps is the paper's
parallel block, any other fixed-step solver solves the same ODE more accurately.

`populate(model, N)` reads the weights at $t_k = kT/N$ into the canonical form of a
trained transformer (a `Checkpoint` with parallel blocks), on which every analysis of
trained checkpoints runs; `gpt(key, config)` is the GPT baseline in the same form.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, ScalarLike

from ..checkpoints._canonical import Attention, Blocks, Checkpoint, FeedForward, rows_of, stack_layers
from ..checkpoints._flow import forward
from ..numerics._field import VectorField
from ..numerics._schedules import AbstractSchedule
from ..numerics._simulate import simulate
from ..numerics._solvers import SOLVERS
from ..numerics._terms import MLP, SelfAttention, TokenNorm
from ..schema._errors import ConfigError
from ._settings import DTYPES

INIT_STD = 0.02  # GPT-2's initial standard deviation of weights and embeddings
BIAS_STD = 1e-4  # initial size of the time-dependent biases (the paper's code draws them at this scale)
TIME_SCALE = 1000.0  # the paper's code multiplies t by 1000 before the sines and cosines


@dataclasses.dataclass(frozen=True)
class DiffEqFormerConfig:
    """The sizes of a DiffEqFormer (and of its GPT baseline, which reads `vocab`, `dim`,
    `heads`, `hidden`, `context`, `steps` as its number of layers, `eps` and `dtype`).

    - `vocab`: tokens; `dim`: width $d$ of the residual stream; `heads`: attention
      heads of $d_k = d / \\text{heads}$ each; `hidden`: MLP width; `context`: the
      longest sequence (learned positions);
    - `d_emb`: width of each hypernetwork's MLP; `frequencies`: $F$, the number of
      sines (and cosines) of the time embedding; `time_scale`: $s$, the factor on $t$
      inside the sines and cosines (1000 in the paper's code; a model folder written
      before this setting existed holds none and is read with $s = 1$);
    - `steps`: the number of solver steps on $[0, T]$ (layers of the populated model);
      `horizon`: $T$, the end of time;
    - `eps`: the LayerNorm epsilon; `dtype`: of every array.
    """

    vocab: int
    dim: int = 64
    heads: int = 4
    hidden: int = 256
    context: int = 64
    d_emb: int = 32
    frequencies: int = 64
    time_scale: float = TIME_SCALE
    steps: int = 18
    horizon: float = 1.0
    eps: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab", "dim", "heads", "hidden", "context", "d_emb", "frequencies", "steps"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
        if self.dim % self.heads:
            raise ConfigError(f"dim={self.dim} must be a multiple of heads={self.heads}.")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}.")
        if not self.eps > 0:
            raise ConfigError(f"eps must be positive, got {self.eps!r}.")
        if not (self.horizon > 0 and math.isfinite(self.horizon)):
            raise ConfigError(f"horizon must be a positive number, got {self.horizon!r}.")
        if isinstance(self.time_scale, bool) or not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"time_scale must be a positive number, got {self.time_scale!r}.")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DiffEqFormerConfig:
        """The config of `to_json`; unknown or missing settings raise ConfigError. A
        record without `time_scale` was written before that setting existed, when the
        embedding read $t$ unscaled: it is read with `time_scale` 1."""
        data = {"time_scale": 1.0, **data}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown DiffEqFormer setting {unknown[0]!r}; known ones are {', '.join(sorted(names))}."
            )
        if "vocab" not in data:
            raise ConfigError("a DiffEqFormer config needs its vocab size.")
        return cls(**data)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


class Sinusoidal(eqx.Module):
    """The time embedding $t \\mapsto (t, \\sin(w s t), \\cos(w s t))$ with frequencies
    $w_i = \\exp(-\\ln(10^4)\\, i / F)$, $i = 0, \\dots, F - 1$ (appendix A) and the time
    scale $s$ (`scale`): a vector of length $2F + 1$, without parameters.

    The paper's appendix writes $\\sin(w t)$; its published code multiplies $t$ by
    $s = 1000$ first and keeps the raw $t$ as the first entry. On $t \\in [0, 1]$ with
    $s = 1$ every frequency is at most 1, so the embedding is nearly a polynomial of low
    degree in $t$ (numerical rank 3 at relative tolerance $10^{-3}$ for $F = 64$) and
    every weight $W(t)$ nearly affine in $t$; with $s = 1000$ the periods range from
    $2\\pi/1000$ to about 55, and the rank is near 60."""

    frequencies: int = eqx.field(static=True)
    scale: float = eqx.field(static=True, default=TIME_SCALE)

    def __call__(self, t: ScalarLike) -> Float[Array, " embedding"]:
        t = jnp.asarray(t)
        w = jnp.exp(-math.log(1e4) * jnp.arange(self.frequencies, dtype=t.dtype) / self.frequencies)
        phase = w * (self.scale * t)
        return jnp.concatenate([t[None], jnp.sin(phase), jnp.cos(phase)])

    @property
    def size(self) -> int:
        return 2 * self.frequencies + 1


class TimeWeight(AbstractSchedule):
    r"""A weight that is a function of time, $W(t) = \mathrm{Proj}(\mathrm{MLP}(\mathrm{Sinusoidal}(t)))$
    (eq. 6): the time embedding $e(t)$, a two-layer MLP
    $z = A_2\,\mathrm{silu}(A_1 e + a_1) + a_2$ of width $d_{emb}$, and the linear
    projection $W(t) = P z + C$ reshaped to `shape`.

    Initialised as the paper's code does: the MLP's layers LeCun-normal with zero
    biases, and the whole weight in the time-dependent part. For a matrix the constant
    $C$ is zero and $P$ is drawn so that $W(0) = P z(0)$ has independent
    $N(0, \sigma^2)$ entries, $\sigma$ = `std` (GPT-2's initial law); as $z(t)$ moves
    with $t$, so does $W(t)$, by as much as its own size. For a LayerNorm gain or shift
    (`std` 0) $C$ is 1 or 0 and $P = 0$, as the paper's time-dependent LayerNorm starts.
    A schedule of the core: the attention and MLP terms read it directly.
    """

    sinusoidal: Sinusoidal
    mlp_in_weight: Float[Array, "d_emb embedding"]
    mlp_in_bias: Float[Array, " d_emb"]
    mlp_out_weight: Float[Array, "d_emb d_emb"]
    mlp_out_bias: Float[Array, " d_emb"]
    proj_weight: Float[Array, "... d_emb"]
    proj_bias: Array

    def __init__(
        self,
        center: Array,
        d_emb: int,
        frequencies: int,
        *,
        std: float,
        time_scale: float = TIME_SCALE,
        key: PRNGKeyArray | None = None,
        noise: Array | None = None,
    ):
        """`center`: the constant $C$ (its shape is the schedule's); `std`: the standard
        deviation of the entries of $P z(0)$; `time_scale`: the embedding's factor on
        $t$. The standard normal numbers come from `key`, or are given as `noise`
        (`noise_size(...)` of them)."""
        center = jnp.asarray(center)
        self.sinusoidal = Sinusoidal(frequencies, float(time_scale))
        e = self.sinusoidal.size
        shapes = [(d_emb, e), (d_emb, d_emb), center.shape + (d_emb,)]
        if noise is None:
            assert key is not None  # without noise, the key is needed (jax.random.normal refuses None)
            noise = jax.random.normal(key, (TimeWeight.noise_size(center.shape, d_emb, frequencies),), center.dtype)
        a1, a2, p = _cut(noise, shapes)
        self.mlp_in_weight = a1 / math.sqrt(e)
        self.mlp_in_bias = jnp.zeros(d_emb, center.dtype)
        self.mlp_out_weight = a2 / math.sqrt(d_emb)
        self.mlp_out_bias = jnp.zeros(d_emb, center.dtype)
        self.proj_bias = center
        # p has N(0, 1) entries, so p z / |z| has N(0, 1) entries for any fixed z: scaled
        # by std / |z(0)|, the weight at t = 0 has exactly the law asked for.
        size = jnp.linalg.norm(self.embedding(0.0)) if std else 1.0
        self.proj_weight = std / size * p

    @staticmethod
    def noise_size(shape: tuple[int, ...], d_emb: int, frequencies: int) -> int:
        """How many standard normal numbers the initialisation of a weight of `shape` takes."""
        return d_emb * (2 * frequencies + 1) + d_emb * d_emb + math.prod(shape) * d_emb

    def embedding(self, t: ScalarLike) -> Float[Array, " d_emb"]:
        """$z(t) = \\mathrm{MLP}(\\mathrm{Sinusoidal}(t))$."""
        e = self.sinusoidal(jnp.asarray(t, self.mlp_in_weight.dtype))
        hidden = jax.nn.silu(self.mlp_in_weight @ e + self.mlp_in_bias)
        return self.mlp_out_weight @ hidden + self.mlp_out_bias

    def __call__(self, t, at=None):
        return self.proj_bias + self.proj_weight @ self.embedding(t)

    @property
    def shape(self):
        return tuple(self.proj_bias.shape)


class ScaledColumns(AbstractSchedule):
    """$W(t) \\operatorname{diag} \\gamma(t)$: a matrix (`(..., rows, d)`) that reads a
    normalized token with gains $\\gamma$, $W (\\gamma \\odot n) = (W \\operatorname{diag}\\gamma)\\, n$."""

    weight: AbstractSchedule
    gain: AbstractSchedule

    def __call__(self, t, at=None):
        weight = self.weight(t, at)
        return weight * jax.lax.broadcast_to_rank(self.gain(t, at), weight.ndim)

    @property
    def shape(self):
        return self.weight.shape


class ShiftedBias(AbstractSchedule):
    """$W(t)\\, s(t) + b(t)$: the bias that the shift $s$ of a normalization makes after
    the matrix $W$ (`(..., rows, d)`), plus the matrix's own bias $b$ when it has one."""

    weight: AbstractSchedule
    shift: AbstractSchedule
    bias: AbstractSchedule | None = None

    def __call__(self, t, at=None):
        out = jnp.einsum("...rd,d->...r", self.weight(t, at), self.shift(t, at))
        return out if self.bias is None else out + self.bias(t, at)

    @property
    def shape(self):
        return self.weight.shape[:-1]


def _cut(flat: Array, shapes) -> list[Array]:
    """Consecutive pieces of `flat` reshaped to `shapes`."""
    sizes = [math.prod(s) for s in shapes]
    starts = np.cumsum([0] + sizes)
    return [flat[a:b].reshape(s) for a, b, s in zip(starts[:-1], starts[1:], shapes)]


def _normals(key, shapes_and_stds, dtype) -> list[Array]:
    r"""Independent $N(0, \sigma^2)$ arrays of the given shapes, from one draw."""
    shapes = [s for s, _ in shapes_and_stds]
    flat = jax.random.normal(key, (sum(math.prod(s) for s in shapes),), dtype)
    return [std * a for a, (_, std) in zip(_cut(flat, shapes), shapes_and_stds)]


def _residual_std(config: DiffEqFormerConfig) -> float:
    """GPT-2's smaller initial scale for the matrices that write into the residual
    stream (attention output, MLP W2): $0.02 / \\sqrt{2 L}$ with $L$ = `steps`."""
    return INIT_STD / math.sqrt(2 * config.steps)


class DiffEqFormer(eqx.Module):
    """The DiffEqFormer language model: token embedding and learned positions, the
    vector field on $[0, T]$ with hypernetwork weights, a final LayerNorm and the
    unembedding tied to the embedding.

    Hypernetworks (`TimeWeight`s): `query`, `key`, `value` `(heads, d_k, d)`, `output`
    `(heads, d, d_k)`, `output_bias` `(d,)`, `w1` `(hidden, d)`, `b1` `(hidden,)`,
    `w2` `(d, hidden)`, `b2` `(d,)`, and the gains and shifts of the attention's
    (`attn_gain`, `attn_shift`) and the MLP's (`mlp_gain`, `mlp_shift`) LayerNorms.
    """

    embed: Float[Array, "vocab d"]
    positions: Float[Array, "context d"]
    query: TimeWeight
    key: TimeWeight
    value: TimeWeight
    output: TimeWeight
    output_bias: TimeWeight
    w1: TimeWeight
    b1: TimeWeight
    w2: TimeWeight
    b2: TimeWeight
    attn_gain: TimeWeight
    attn_shift: TimeWeight
    mlp_gain: TimeWeight
    mlp_shift: TimeWeight
    final_norm: TokenNorm
    config: DiffEqFormerConfig = eqx.field(static=True)

    def __init__(self, config: DiffEqFormerConfig, *, key: PRNGKeyArray):
        c, dtype = config, jnp.dtype(config.dtype)
        H, k, d = c.heads, c.head_dim, c.dim
        residual = _residual_std(c)
        # name: (shape, constant part C, standard deviation of the time-dependent part at
        # t = 0). Matrices are all time-dependent with GPT-2's initial law; biases are
        # time-dependent and tiny; LayerNorm gains and shifts start constant (1 and 0).
        weights = {
            "query": ((H, k, d), 0.0, INIT_STD),
            "key": ((H, k, d), 0.0, INIT_STD),
            "value": ((H, k, d), 0.0, INIT_STD),
            "output": ((H, d, k), 0.0, residual),
            "output_bias": ((d,), 0.0, BIAS_STD),
            "w1": ((c.hidden, d), 0.0, INIT_STD),
            "b1": ((c.hidden,), 0.0, BIAS_STD),
            "w2": ((d, c.hidden), 0.0, residual),
            "b2": ((d,), 0.0, BIAS_STD),
            "attn_gain": ((d,), 1.0, 0.0),
            "attn_shift": ((d,), 0.0, 0.0),
            "mlp_gain": ((d,), 1.0, 0.0),
            "mlp_shift": ((d,), 0.0, 0.0),
        }
        # Every random number of the initialisation from one draw: one random-number
        # program to compile (seconds each on a small CPU) instead of one per array.
        pieces = [((c.vocab, d), INIT_STD), ((c.context, d), INIT_STD)]
        pieces += [((TimeWeight.noise_size(shape, c.d_emb, c.frequencies),), 1.0) for shape, _, _ in weights.values()]
        draws = iter(_normals(key, pieces, dtype))
        self.config = c
        self.embed, self.positions = next(draws), next(draws)
        for name, (shape, constant, std) in weights.items():
            setattr(
                self,
                name,
                TimeWeight(
                    jnp.full(shape, constant, dtype),
                    c.d_emb,
                    c.frequencies,
                    std=std,
                    time_scale=c.time_scale,
                    noise=next(draws),
                ),
            )
        self.final_norm = TokenNorm("layer", jnp.ones(d, dtype), jnp.zeros(d, dtype), eps=c.eps)

    def with_steps(self, steps: int) -> DiffEqFormer:
        """The same model solved by default with `steps` steps (fine-tuning at another
        depth, section 6.2): its weights unchanged, only its config's `steps`."""
        config = dataclasses.replace(self.config, steps=int(steps))
        # A static field, so not reachable by eqx.tree_at: rebuild the frozen dataclass
        # field by field, as equinox's own unflattening does.
        new = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(new, field.name, config if field.name == "config" else getattr(self, field.name))
        return new

    def field(self) -> VectorField:
        """$\\dot X = \\mathrm{Attn}_t(N_1(X)) + \\mathrm{MLP}_t(N_2(X))$ as a core
        `VectorField` (`pre` scheme): its norm is the gain-free LayerNorm, and the gains
        and shifts of $N_1$, $N_2$ are folded into the matrices that read them,
        $W(\\gamma \\odot n + s) + b = (W \\operatorname{diag}\\gamma)\\, n + (W s + b)$."""
        c = self.config
        attention = SelfAttention(
            query=ScaledColumns(self.query, self.attn_gain),
            key=ScaledColumns(self.key, self.attn_gain),
            value=ScaledColumns(self.value, self.attn_gain),
            output=self.output,
            beta=jnp.asarray(1 / math.sqrt(c.head_dim), c.dtype),
            alibi=None,
            heads=c.heads,
            causal=True,
            query_bias=ShiftedBias(self.query, self.attn_shift),
            key_bias=ShiftedBias(self.key, self.attn_shift),
            value_bias=ShiftedBias(self.value, self.attn_shift),
            output_bias=self.output_bias,
        )
        mlp = MLP(
            w1=ScaledColumns(self.w1, self.mlp_gain),
            w2=self.w2,
            b1=ShiftedBias(self.w1, self.mlp_shift, self.b1),
            b2=self.b2,
            activation="gelu",
        )
        return VectorField(terms=(attention, mlp), scheme="pre", norm=TokenNorm("layer", eps=c.eps))

    def embed_tokens(self, ids: Int[ArrayLike, " n"]) -> Float[Array, "n d"]:
        """$X(0)$: token embeddings plus learned positions; an id the embedding has no
        row for, or more ids than positions, is refused (`rows_of`)."""
        _check_ids(ids, self.config.context)
        ids = rows_of(ids, self.config.vocab, "the DiffEqFormer's embedding")
        return self.embed[ids] + self.positions[: ids.shape[0]]

    def states(
        self, ids: Int[ArrayLike, " n"], steps: int | None = None, solver: str = "euler", save_steps=None
    ) -> Float[Array, "saved n d"]:
        """The residual stream $X(t_k)$ at the grid steps `save_steps` (default: every
        step $k = 0, \\dots, N$) of a fixed-step solve with $N$ = `steps` (default
        the config's) steps of size $T/N$."""
        steps = self.config.steps if steps is None else int(steps)
        _check_solve(ids, steps, solver, self.config.context)
        if save_steps is None:
            save_steps = np.arange(steps + 1)
        x0 = self.embed_tokens(jnp.asarray(ids))
        horizon = self.config.horizon
        solution = simulate(
            self.field(), x0, t1=horizon, dt=horizon / steps, num_steps=steps, solver=solver, save_steps=save_steps
        )
        return solution.xs

    def __call__(
        self, ids: Int[ArrayLike, " n"], steps: int | None = None, solver: str = "euler"
    ) -> Float[Array, "n vocab"]:
        """Next-token logits: $X(T)$ by `steps` solver steps, the final LayerNorm, the
        tied unembedding. One sequence; batches by `jax.vmap`."""
        steps = self.config.steps if steps is None else int(steps)
        final = self.states(ids, steps, solver, save_steps=[steps])[-1]
        return self.final_norm(final) @ self.embed.T


def _check_solve(ids, steps: int, solver: str, context: int) -> None:
    if steps < 1:
        raise ConfigError(f"steps must be a positive integer, got {steps}.")
    if solver not in SOLVERS:
        raise ConfigError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}.")
    _check_ids(ids, context)


def _check_ids(ids, context: int) -> None:
    if jnp.ndim(ids) != 1 or jnp.shape(ids)[0] == 0:
        raise ConfigError(f"token ids must be a non-empty 1-D sequence, got shape {tuple(jnp.shape(ids))}.")
    if jnp.shape(ids)[0] > context:
        raise ConfigError(f"{jnp.shape(ids)[0]} tokens exceed the model's context of {context}.")


def populate(model: DiffEqFormer, steps: int | None = None) -> Checkpoint:
    """The discrete-layer transformer of `model` at `steps` Euler steps (section 6.2):
    layer $k$ holds the weights at $t_k = kT/N$, with the step $T/N$ folded into what
    writes into the residual stream ($O$, $b^O$, $W_2$, $b_2$), and the gains and shifts
    in its two LayerNorms. A `Checkpoint` with parallel blocks, so that
    `forward(populate(model, N), ids)` is the model's Euler solve, layer by layer."""
    steps = model.config.steps if steps is None else int(steps)
    if steps < 1:
        raise ConfigError(f"steps must be a positive integer, got {steps}.")
    return _populated(model, steps)


@eqx.filter_jit
def _populated(model: DiffEqFormer, steps: int) -> Checkpoint:
    # One compiled program per model shape and step count (a snapshot of a training run
    # is populated as each one is saved), not one dispatch per operation.
    c = model.config
    dtype = jnp.dtype(c.dtype)
    h = jnp.asarray(c.horizon, dtype) / steps
    times = jnp.asarray(0.0, dtype) + jnp.arange(steps, dtype=dtype) * h  # the times `simulate` steps from

    def at(weight: TimeWeight) -> Array:
        return jax.vmap(weight)(times)

    attention = Attention(
        query=at(model.query),
        key=at(model.key),
        value=at(model.value),
        output=h * at(model.output),
        output_bias=h * at(model.output_bias),
        kv_heads=c.heads,
    )
    mlp = FeedForward(w1=at(model.w1), w2=h * at(model.w2), b1=at(model.b1), b2=h * at(model.b2), activation="gelu")
    norms = lambda gain, shift: jax.vmap(lambda t: TokenNorm("layer", gain(t), shift(t), eps=c.eps))(times)
    blocks = Blocks(
        attention=attention,
        mlp=mlp,
        attn_norm=norms(model.attn_gain, model.attn_shift),
        mlp_norm=norms(model.mlp_gain, model.mlp_shift),
    )
    return Checkpoint(
        family="diffeqformer",
        arrangement="parallel",
        causal=True,
        blocks=blocks,
        embed=model.embed,
        positions=model.positions,
        final_norm=model.final_norm,
        unembed=model.embed,
        name=f"diffeqformer-{steps}",
    )


def gpt(key: PRNGKeyArray, config: DiffEqFormerConfig) -> Checkpoint:
    """The GPT baseline with the DiffEqFormer's sizes, freshly initialised: `steps`
    pre-LN sequential blocks (GPT-2: biases everywhere, GELU, learned positions, a final
    LayerNorm, the unembedding tied to the embedding), initial weights $N(0, 0.02^2)$
    with the residual-writing matrices scaled by $1/\\sqrt{2L}$."""
    c, dtype = config, jnp.dtype(config.dtype)
    L, H, k, d = c.steps, c.heads, c.head_dim, c.dim
    residual = _residual_std(c)
    zeros = lambda *shape: jnp.zeros(shape, dtype)
    ones = lambda *shape: jnp.ones(shape, dtype)
    shapes = [((L, H, k, d), INIT_STD)] * 3 + [
        ((L, H, d, k), residual),
        ((L, c.hidden, d), INIT_STD),
        ((L, d, c.hidden), residual),
        ((c.vocab, d), INIT_STD),
        ((c.context, d), INIT_STD),
    ]
    query, key_, value, output, w1, w2, embed, positions = _normals(key, shapes, dtype)
    attention = Attention(
        query=query,
        key=key_,
        value=value,
        output=output,
        query_bias=zeros(L, H, k),
        key_bias=zeros(L, H, k),
        value_bias=zeros(L, H, k),
        output_bias=zeros(L, d),
        kv_heads=H,
    )
    mlp = FeedForward(w1=w1, b1=zeros(L, c.hidden), w2=w2, b2=zeros(L, d), activation="gelu")
    norm = lambda: cast(TokenNorm, stack_layers([TokenNorm("layer", ones(d), zeros(d), eps=c.eps)] * L))
    return Checkpoint(
        family="gpt2",
        arrangement="sequential",
        causal=True,
        blocks=Blocks(attention=attention, mlp=mlp, attn_norm=norm(), mlp_norm=norm()),
        embed=embed,
        positions=positions,
        final_norm=TokenNorm("layer", ones(d), zeros(d), eps=c.eps),
        unembed=embed,
        name="gpt",
    )


def checkpoint_logits(checkpoint: Checkpoint, ids: Int[ArrayLike, " n"]) -> Float[Array, "n vocab"]:
    """Next-token logits of a canonical checkpoint by the core's layer map
    (`attnflow.checkpoints.forward`, differentiable), the unembedding tied to the
    embedding when the checkpoint holds none (a GPT baseline during training)."""
    unembed = checkpoint.embed if checkpoint.unembed is None else checkpoint.unembed
    # forward passes ids to Checkpoint.embed_tokens, which takes any ArrayLike; its own annotation is narrower
    return forward(checkpoint, ids).final @ unembed.T  # pyright: ignore[reportArgumentType]


class Adapter(eqx.Module):
    """A low-rank update $\\Delta W_l = A_l B_l$ of one matrix of every layer: `a`
    `(L, rows, r)`, `b` `(L, r, columns)` (LoRA, with $B = 0$ at the start)."""

    a: Float[Array, "L rows r"]
    b: Float[Array, "L r columns"]

    def delta(self) -> Float[Array, "L rows columns"]:
        return jnp.einsum("lmr,lrc->lmc", self.a, self.b)


class LoRA(eqx.Module):
    """A canonical checkpoint with low-rank updates of its attention matrices (each
    head stack $Q, K, V$ as one `(heads * d_k, d)` matrix, $O$ as one `(d, heads * d_k)`
    matrix) and MLP matrices $W_1, W_2$, layer by layer (Hu et al., LoRA). Fine-tuning
    trains `adapters` only; `base` is frozen."""

    base: Checkpoint
    adapters: dict[str, Adapter]

    def merged(self) -> Checkpoint:
        """The checkpoint with every $W_l + A_l B_l$."""
        att, ff = self.base.blocks.attention, self.base.blocks.mlp
        L, H, k, d = att.query.shape
        new = {}
        for name in ("query", "key", "value"):
            new[name] = getattr(att, name) + self.adapters[name].delta().reshape(L, H, k, d)
        new["output"] = att.output + self.adapters["output"].delta().reshape(L, d, H, k).transpose(0, 2, 1, 3)
        attention = dataclasses.replace(att, **new)
        mlp = dataclasses.replace(ff, w1=ff.w1 + self.adapters["w1"].delta(), w2=ff.w2 + self.adapters["w2"].delta())
        blocks = dataclasses.replace(self.base.blocks, attention=attention, mlp=mlp)
        return dataclasses.replace(self.base, blocks=blocks)

    def trainable(self):
        """The filter of the trainable leaves (the adapters) for `equinox.partition`."""
        spec = jax.tree.map(lambda _: False, self)
        return eqx.tree_at(lambda m: m.adapters, spec, jax.tree.map(eqx.is_inexact_array, self.adapters))


def lora(checkpoint: Checkpoint, rank: int, *, key: PRNGKeyArray) -> LoRA:
    """Rank-`rank` adapters for every attention and MLP matrix of `checkpoint`, with
    $A \\sim N(0, 1/r)$ and $B = 0$, so that the adapted model starts as `checkpoint`."""
    if int(rank) < 1:
        raise ConfigError(f"the LoRA rank must be a positive integer, got {rank}.")
    att, ff = checkpoint.blocks.attention, checkpoint.blocks.mlp
    L, H, k, d = att.query.shape
    shapes = {
        "query": (H * k, d),
        "key": (H * k, d),
        "value": (H * k, d),
        "output": (d, H * k),
        "w1": ff.w1.shape[1:],
        "w2": ff.w2.shape[1:],
    }
    dtype = att.query.dtype
    draws = _normals(key, [((L, rows, rank), 1 / math.sqrt(rank)) for rows, _ in shapes.values()], dtype)
    adapters = {
        name: Adapter(a=a, b=jnp.zeros((L, rank, cols), dtype)) for a, (name, (_, cols)) in zip(draws, shapes.items())
    }
    return LoRA(base=checkpoint, adapters=adapters)
