"""A flow-matching surrogate of the attention flow.

The attention flow carries an ensemble of token configurations, drawn from a law
$\\mu$, to its image $\\nu$ at time $T$; the field that moves a token depends on all
the others. Section 5.3 of "A Survey of Continuous Time Dynamics of Transformers"
(figures 7 and 8) asks how well a field $v(s, x)$ of time and of the token alone,
learned by flow matching, does the same transport. Here the core study solves the
attention flow (Q = K = V = I on the sphere, `save_states`); the members are split
into training and held-out ones; `attnflow.analysis.surrogate` fits $v$ on the (token, image)
pairs of the training members with optax and carries the held-out members' tokens
with the core's `simulate`. The Sinkhorn distance (ott-jax) between the surrogate's
end ensemble and the attention flow's, pooled over the held-out tokens, is set against
the distance the attention flow itself moved the ensemble (initial against final).

The surrogate's paths are nearly straight chords through the ball, where the
attention flow's stay on the sphere: the two ensembles agree at the end, not on the
way (`surrogate_distance` over time). Tokens are compared pooled (a token-level law,
what a field that does not see the other tokens can reproduce) and, as a stricter
measure, whole configurations (each member a point of $\\mathbb{R}^{nd}$).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..running._progress import Progress
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, check_member_option, colormap, config_of, figure, wireframe_sphere
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy

if TYPE_CHECKING:
    import jax
    import jax.numpy as jnp
    import xarray as xr
    from matplotlib.figure import Figure

    from ..running import _build
else:
    jax = lazy("jax")
    jnp = lazy("jax.numpy")
    xr = lazy("xarray")
    _build = lazy("attnflow.running._build")


@dataclass
class Options:
    test_fraction: float = setting(0.25, "the share of the members held out from training (the last ones)")
    width: int = setting(64, "hidden units per layer of v(s, x)")
    depth: int = setting(2, "hidden layers")
    train_steps: int = setting(2000, "Adam steps")
    batch_size: int = setting(256, "(token, image) pairs per step")
    learning_rate: float = setting(3e-3, "cosine-decayed to 5% of it")
    surrogate_steps: int = setting(40, "rk4 steps of the surrogate flow over s in [0, 1]")
    epsilon: float = setting(0.01, "Sinkhorn regularization (squared-distance units)")
    distance_times: int = setting(11, "saved times at which the two ensembles are compared")
    member: int = setting(0, "the held-out member whose paths are drawn")


def _split(members: int, fraction: float) -> int:
    """How many members (the last ones) are held out."""
    return round(members * fraction)


@functools.lru_cache(maxsize=8)
def _compare(eps: float):
    """The Sinkhorn distances of pairs of ensembles `(a[k], b[k])`, one pair after the
    other (`lax.map`): each Sinkhorn loop stops when it converges. One jitted function
    per `eps`, so that its compiled programs are reused by later runs in a process."""
    from ..analysis.surrogate import sinkhorn_distance

    return jax.jit(lambda a, b: jax.lax.map(lambda ab: sinkhorn_distance(*ab, epsilon=eps), (a, b)))


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Running mean over `window` steps (the minibatch loss is noisy)."""
    window = max(1, min(window, len(values)))
    return np.convolve(values, np.ones(window) / window, mode="valid")


class FlowMatching(Experiment):
    title = "Flow-matching surrogate of the attention flow"
    paper = "A Survey of Continuous Time Dynamics of Transformers, section 5.3 (figures 7 and 8)"
    Options = Options
    coordinates = {
        "test_member": ("held-out member (not trained on)", "1"),
        "distance_time": ("depth-time of a distance between ensembles", "1"),
        "step": ("training step of the surrogate", "1"),
    }

    def check(self) -> None:
        cfg, options = self.cfg, self.options
        fraction = options.test_fraction
        if not 0 < fraction < 1:
            raise ConfigError(f"experiment.options.test_fraction must be a fraction in (0, 1), got {fraction!r}.")
        held_out = _split(cfg.members, fraction)
        if not 1 <= held_out < cfg.members:
            raise ConfigError(
                f"experiment.options.test_fraction={fraction} of members={cfg.members} leaves "
                f"{held_out} held-out and {cfg.members - held_out} training members; both need at least "
                "one."
            )
        for key, value in (
            ("width", options.width),
            ("depth", options.depth),
            ("train_steps", options.train_steps),
            ("batch_size", options.batch_size),
            ("surrogate_steps", options.surrogate_steps),
        ):
            if value < 1:
                raise ConfigError(f"experiment.options.{key} must be a positive whole number, got {value!r}.")
        for key, value in (("learning_rate", options.learning_rate), ("epsilon", options.epsilon)):
            if not value > 0:
                raise ConfigError(f"experiment.options.{key} must be a positive number, got {value!r}.")
        if options.distance_times < 2:
            raise ConfigError(
                f"experiment.options.distance_times must be a whole number >= 2, got {options.distance_times!r}."
            )
        check_member_option(options, held_out, what="a held-out member (whose paths are drawn)")
        if not cfg.save_states:
            raise ConfigError("experiment flow_matching trains on the tokens' states: keep save_states=true.")
        if not (isinstance(cfg.beta, (int, float)) and not isinstance(cfg.beta, bool)):
            raise ConfigError(
                f"experiment flow_matching fits one attention flow: give beta as one number, got {cfg.beta!r}."
            )
        # The distances are taken at distance_times of the saved times, evenly spread: more than there are would
        # repeat some, merged silently.
        saved = len(_build.resolve_study(dataclasses.replace(cfg, experiment=None)).grid.times)
        if options.distance_times > saved:
            raise ConfigError(
                f"experiment.options.distance_times={options.distance_times} asks for more times than "
                f"the {saved} saved; take at most {saved} (or raise saves)."
            )

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        # lazy: start-up (the surrogate's optax and ott: fitting only, never `attnflow plot`)
        from ..analysis.surrogate import FlowMatchingField, fit_flow_matching, push_forward

        cfg, options = self.cfg, self.options
        ds = results["main"].copy()
        ds.attrs = {}
        x = jnp.asarray(ds["x"].values)  # (member, time, token, dim)
        members, saves, _, d = x.shape
        held_out = _split(members, options.test_fraction)
        train, test = x[:-held_out], x[-held_out:]
        tokens = lambda a: a.reshape(-1, d)  # every member's tokens, pooled

        # One stream of randomness for the surrogate, apart from the members' own.
        k_init, k_fit = jax.random.split(jax.random.fold_in(jax.random.key(cfg.seed), 1))
        field = FlowMatchingField(d, width=options.width, depth=options.depth, key=k_init, dtype=x.dtype)
        # Each stage is one compiled call: the line counts stages (the training's steps run
        # inside its call).
        with Progress("flow matching", 3, unit="stages") as bar:
            bar.describe(f"flow matching: {options.train_steps} training steps")
            field, train_loss, test_loss = jax.block_until_ready(
                fit_flow_matching(
                    field,
                    tokens(train[:, 0]),
                    tokens(train[:, -1]),
                    key=k_fit,
                    steps=options.train_steps,
                    batch_size=options.batch_size,
                    learning_rate=options.learning_rate,
                    test=(tokens(test[:, 0]), tokens(test[:, -1])),
                )
            )
            bar.advance()

            bar.describe("flow matching: the held-out members carried by the surrogate")
            time = ds["time"].values
            s = (time - time[0]) / (time[-1] - time[0])
            pushed = jax.block_until_ready(push_forward(field, test[:, 0], s, steps=options.surrogate_steps))
            bar.advance()  # pushed: (test member, time, token, dim)

            bar.describe("flow matching: transport distances")
            eps = float(options.epsilon)
            compare = _compare(eps)
            at = np.unique(np.round(np.linspace(0, saves - 1, options.distance_times)).astype(int))
            first = jnp.broadcast_to(test[:, :1], test[:, at].shape)
            pooled = lambda a: a.swapaxes(0, 1).reshape(a.shape[1], -1, d)  # (time, tokens of every member, dim)
            # Surrogate against attention at matched times, and attention against its start.
            distances = compare(
                pooled(jnp.concatenate([pushed[:, at], first], 1)),
                pooled(jnp.concatenate([test[:, at], test[:, at]], 1)),
            )
            surrogate_distance, attention_distance = np.asarray(distances).reshape(2, -1)
            # Whole configurations: each held-out member one point of R^(n d).
            joint, joint_reference = np.asarray(
                compare(
                    jnp.stack([pushed[:, -1], test[:, 0]]).reshape(2, held_out, -1),
                    jnp.stack([test[:, -1], test[:, -1]]).reshape(2, held_out, -1),
                )
            )
            bar.advance()

        test_members = ds["member"].values[-held_out:]
        described = lambda dims, value, text: (dims, np.asarray(value), {"description": text})
        derived = xr.Dataset(
            {
                "surrogate_x": described(
                    ("test_member", "time", "token", "dim"),
                    pushed,
                    "held-out tokens carried by the surrogate flow, at s = (t - t0)/(t1 - t0)",
                ),
                "train_loss": described(("step",), train_loss, "flow-matching loss on each step's minibatch"),
                "test_loss": described(("step",), test_loss, "flow-matching loss on held-out pairs (times fixed)"),
                "surrogate_distance": described(
                    ("distance_time",),
                    surrogate_distance,
                    "Sinkhorn distance between the surrogate's and the attention flow's held-out tokens",
                ),
                "attention_distance": described(
                    ("distance_time",),
                    attention_distance,
                    "Sinkhorn distance between the attention flow's held-out tokens and their initial positions",
                ),
                "end_distance": described(
                    (), surrogate_distance[-1], "Sinkhorn distance between the two end ensembles of held-out tokens"
                ),
                "reference_distance": described(
                    (), attention_distance[-1], "Sinkhorn distance between the initial and final attention ensembles"
                ),
                "distance_ratio": described(
                    (), surrogate_distance[-1] / attention_distance[-1], "end_distance / reference_distance"
                ),
                "configuration_end_distance": described(
                    (), joint, "Sinkhorn distance between the end configurations (each member a point of R^(n d))"
                ),
                "configuration_reference_distance": described(
                    (), joint_reference, "Sinkhorn distance between the initial and final attention configurations"
                ),
                "surrogate_min_norm": described(
                    (),
                    jnp.min(jnp.linalg.norm(pushed, axis=-1)),
                    "smallest |x| along the surrogate's paths (1 on the sphere)",
                ),
            },
            coords={"test_member": test_members, "distance_time": time[at], "step": np.arange(1, len(train_loss) + 1)},
        )
        merged = xr.merge([ds, derived], combine_attrs="override")  # each variable keeps its description
        merged.attrs = {}
        return merged

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        cfg = config_of(ds)
        options = cfg["experiment"]["options"]
        test_members = ds["test_member"].values
        attention = ds["x"].sel(member=test_members).values  # (test member, time, token, dim)
        surrogate = ds["surrogate_x"].values
        n = attention.shape[2]
        k = int(cfg["init"].get("k") or 1)
        colours = colormap("tab10")(np.arange(n) % k % 10)
        token_colours = np.broadcast_to(colours, attention.shape[:1] + colours.shape).reshape(-1, 4)
        t1 = float(ds["time"].values[-1])

        fig = figure(figsize=(12, 7.2))
        ensembles = [
            ("(a) initial tokens (held out)", attention[:, 0]),
            (f"(b) attention flow at t = {t1:g}", attention[:, -1]),
            ("(c) surrogate flow at s = 1", surrogate[:, -1]),
        ]
        for i, (title, points) in enumerate(ensembles):
            ax = fig.add_subplot(2, 3, i + 1, projection="3d")
            wireframe_sphere(ax, unit_limits=True)
            ax.view_init(elev=20, azim=-60)
            ax.scatter(*points.reshape(-1, 3).T, c=token_colours, s=4, alpha=0.6, depthshade=False)
            ax.set_title(title)

        member = int(options["member"])
        ax = fig.add_subplot(2, 3, 4)
        circle = np.linspace(0, 2 * np.pi, 200)
        ax.plot(np.cos(circle), np.sin(circle), color="0.8", linewidth=0.8)
        for i in range(n):
            ax.plot(*attention[member, :, i, :2].T, color=colours[i], linewidth=1.5)
            ax.plot(*surrogate[member, :, i, :2].T, color=colours[i], linewidth=1.2, linestyle="--")
            ax.plot(*attention[member, 0, i, :2], color=colours[i], marker="o", markersize=4)
            ax.plot(*attention[member, -1, i, :2], color=colours[i], marker="x", markersize=5)
        ax.plot([], [], color="0.3", linewidth=1.5, label="attention (on the sphere)")
        ax.plot([], [], color="0.3", linewidth=1.2, linestyle="--", label="surrogate (nearly straight)")
        ax.plot([], [], color="0.8", linewidth=0.8, label="equator")
        ax.plot([], [], color="0.3", marker="o", linestyle="none", markersize=4, label="start")
        ax.plot([], [], color="0.3", marker="x", linestyle="none", markersize=5, label=f"attention at t = {t1:g}")
        ax.set_aspect("equal")
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.legend(loc="center", frameon=False)  # inside the circle, where no path goes
        ax.set_title(f"(d) paths of held-out member {int(test_members[member])}, top view")

        ax = fig.add_subplot(2, 3, 5)
        steps = ds["step"].values
        window = max(1, len(steps) // 50)
        ax.plot(steps, ds["train_loss"].values, color="C0", linewidth=0.4, alpha=0.35)
        ax.plot(steps[window - 1 :], _smooth(ds["train_loss"].values, window), color="C0", label="training minibatch")
        ax.plot(steps, ds["test_loss"].values, color="C3", label="held-out pairs")
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(r"$|v(s, x_s) - (x_1 - x_0)|^2$")
        ax.set_title("(e) flow-matching loss")
        ax.legend(loc="upper right")

        ax = fig.add_subplot(2, 3, 6)
        t = ds["distance_time"].values
        ax.plot(
            t,
            ds["attention_distance"].values,
            "o-",
            color="0.4",
            markersize=3,
            label="attention at t vs initial tokens",
        )
        ax.plot(
            t,
            ds["surrogate_distance"].values,
            "o-",
            color="C3",
            markersize=3,
            label=r"surrogate at $s = t/T$ vs attention at t",
        )
        ax.set_xlabel("attention time t (surrogate time s = t / T)")
        ax.set_ylabel(rf"Sinkhorn distance $\sqrt{{S_\epsilon}}$, $\epsilon$ = {float(options['epsilon']):g}")
        top = max(ds["attention_distance"].values.max(), ds["surrogate_distance"].values.max())
        ax.set_ylim(0, 1.4 * top)
        ax.set_title("(f) transport distance between ensembles")
        ax.legend(loc="upper left")
        fig.tight_layout()

        held_out, members = len(test_members), ds.sizes["member"]
        clustered = ""
        if "clusters" in ds:
            counts = ds["clusters"].sel(member=test_members).isel(time=-1).values
            common = int(np.bincount(counts.astype(int)).argmax())
            clustered = (
                f" At t = {t1:g}, {int((counts == common).sum())} of {held_out} held-out members have "
                f"{common} cluster{'s' if common != 1 else ''} ($\\cos > 1 - {cfg['cluster_eps']:g}$)."
            )
        caption(
            fig,
            (
                f"Q = K = V = I softmax attention on $S^{{{cfg['d'] - 1}}}$, n = {n} tokens per member ({k} caps of "
                f"radius {cfg['init'].get('radius')}, token colour = cap), $\\beta$ = {cfg['beta']}, T = {t1:g}, "
                f"{cfg['solver']} with dt = {cfg['dt']}.{clustered} Surrogate v(s, x): MLP of one token and s "
                f"({options['depth']} x {options['width']} SiLU), trained by flow matching on straight paths $x_s = (1 "
                f"- s)\\, x_0 + s\\, x_1$ for {options['train_steps']} Adam steps on the {members - held_out} training "
                f"members' tokens, integrated with rk4 ({options['surrogate_steps']} steps). Held-out members: "
                f"{held_out} ({held_out * n} tokens). End distance surrogate vs attention "
                f"{float(ds['end_distance']):.3f} against {float(ds['reference_distance']):.3f} from initial to final "
                f"attention ensemble (ratio {float(ds['distance_ratio']):.3f}); whole configurations (each member a "
                f"point of $R^{{{n * cfg['d']}}}$): {float(ds['configuration_end_distance']):.3f} against "
                f"{float(ds['configuration_reference_distance']):.3f}. The surrogate's chords dip to |x| = "
                f"{float(ds['surrogate_min_norm']):.2f} inside the ball; the attention paths stay on the sphere. The "
                "loss stays above zero: a token's image depends on the other tokens, which v does not see."
            ),
            width=150,
        )
        return {"flow_matching": fig}
