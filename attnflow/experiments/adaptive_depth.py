r"""Adaptive depth: one pretrained DiffEqFormer run at other numbers of steps, before and
after fine-tuning on another corpus ("Neural ODE Transformers", section 6.2, fig. 6).

The DiffEqFormer is an ODE on $[0, T]$, so the model trained with $N$ Euler steps
(`pretrained`, 18 by default) can be solved with any other number of steps $N'$:
its weights $W(t)$ are read at $t_k = kT/N'$ (`populate`). For every $N'$ in `steps`
the experiment stores

- **zero-shot**: the validation loss of the pretrained model solved with $N'$ steps,
  unchanged, on the fine-tuning corpus (`corpus`, reference-b by default) and on its
  own pretraining corpus (reference-a);
- **fine-tuned** (`methods`): the validation loss on `corpus` after `finetune_steps`
  optimizer steps of `attnflow train init=PRETRAINED steps=N' corpus=...`: `full`
  trains every hypernetwork parameter (the model stays an ODE, now solved with
  $N'$ steps); `lora` freezes the populated $N'$-layer model and trains rank
  `lora_rank` adapters of its Q, K, V, O, W1, W2.

The GPT baseline (`baseline`, whose depth is fixed) is evaluated and fine-tuned the same
way at its own number of layers, for the same budget: the horizontal reference lines.

Every fine-tuning run is an ordinary `attnflow train` run folder under `out` (default:
`finetune/` beside the pretrained run), named after the corpus, the budget, the settings
given in `train`, the model, the steps and the method; a finished one is read, an interrupted one resumed, so the
experiment can be stopped and started again. The losses are the runs' own validations
(`eval_batches` held-out batches drawn from the key of the run's seed, as during
training); the zero-shot losses use the same batches: those of the fine-tuning
settings on `corpus` (equal to the fine-tuning runs' own loss at step 0), and those of
the pretraining run on its own corpus (equal, at $N' = N$, to its last validation).
A pretrained run that is missing is trained first (`attnflow train` with the settings
of option `pretrain` on top of conf/train.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..diffeqformer._settings import corpus_name, train_config
from ..running._progress import Progress
from ..schema._config import choice
from ..schema._errors import ConfigError
from ..schema._schema import setting
from ._common import caption, colormap, subplots, whole_number
from ._experiment import Counter, Experiment, Keeper
from ._lazy import lazy
from ._text import write_text
from ._trained import check_train_overrides, read_metrics, run_record, trained_run

if TYPE_CHECKING:
    import equinox as eqx
    import jax
    import xarray as xr
    from matplotlib.figure import Figure

    from ..checkpoints import _load
    from ..diffeqformer import _data, _store, _train
else:
    eqx = lazy("equinox")
    jax = lazy("jax")
    xr = lazy("xarray")
    _load = lazy("attnflow.checkpoints._load")
    _data = lazy("attnflow.diffeqformer._data")
    _store = lazy("attnflow.diffeqformer._store")
    _train = lazy("attnflow.diffeqformer._train")

METHODS = ("full", "lora")
Method = choice("Method", METHODS)


@dataclass
class Options:
    pretrained: str = setting("runs/diffeqformer/diffeqformer", "the pretrained DiffEqFormer run (attnflow train)")
    baseline: str = setting("runs/diffeqformer/gpt", "the GPT baseline run")
    steps: list[int] = setting([9, 12, 18, 24], "numbers of Euler steps N' to solve and fine-tune at")
    methods: list[Method] = setting(  # pyright: ignore[reportInvalidTypeForm]  # a Choice made at run time
        [Method.full, Method.lora],  # pyright: ignore[reportAttributeAccessIssue]  # a Choice's members are made at run time
        "full: every hypernetwork parameter; lora: adapters of the populated layers ([]: zero-shot only)",
    )
    lora_rank: int = setting(4, "rank of the LoRA adapters (methods=[lora])")
    finetune_steps: int = setting(200, "optimizer steps of every fine-tuning run")
    corpus: str = setting("reference-b", "the fine-tuning corpus")
    out: str | None = setting(None, "fine-tuning runs; null: finetune/ beside the pretrained run")
    train: dict[str, Any] = setting(
        {}, "attnflow train settings of the fine-tuning runs: +experiment.options.train.lr=0.001"
    )
    pretrain: dict[str, Any] = setting(
        {}, "attnflow train settings for a pretrained run that must be trained first (+...)"
    )


EVALUATION = ("seed", "batch", "eval_batches", "solver")  # the settings that choose the held-out batches
FINETUNE_CHOSEN = ("steps", "corpus", "train_steps")  # set per fine-tuning run by the experiment


def finetune_folder(options: Options) -> Path:
    """Where the fine-tuning runs live: `out`, or `finetune/<corpus>-<budget>steps`
    beside the pretrained run, followed by each setting given in `train`
    (`reference-b-200steps-lr0.001`), so that runs with other settings get their own
    folders instead of being refused as another run's."""
    base = Path(options.out) if options.out is not None else Path(options.pretrained).parent / "finetune"
    given = options.train if isinstance(options.train, dict) else {}
    tail = "".join(f"-{key}{str(value).replace('/', '_').replace(' ', '')}" for key, value in sorted(given.items()))
    return base / f"{corpus_name(options.corpus)}-{options.finetune_steps}steps{tail}"


def zero_shot(module, corpus, settings) -> float:
    """The validation loss of `module` (a DiffEqFormer at its steps, or a checkpoint)
    on `corpus` with the held-out batches of a run with `settings` (seed, batch,
    context, eval_batches, solver): those of `attnflow train`'s own validation."""
    evaluate = _train.validation_loss(
        int(settings["batch"]), int(settings["context"]), str(settings["solver"]), int(settings["eval_batches"])
    )
    params, static = eqx.partition(module, eqx.is_inexact_array)
    key = jax.random.fold_in(jax.random.key(int(settings["seed"])), 2)
    return float(evaluate(params, static, corpus, key))


def _sizes(module) -> tuple[int, int]:
    """`(vocab, context)` of a DiffEqFormer or of a GPT checkpoint."""
    if hasattr(module, "config"):
        return module.config.vocab, module.config.context
    return int(module.embed.shape[0]), int(module.positions.shape[0])


def _corpus(name: str, folder: Path, vocab: int, context: int):
    corpus, _, _ = _data.load_corpus(
        name, vocab=vocab, context=context, tokenizer_json=_store.tokenizer_text(folder / "model")
    )
    return corpus


def _finetune(folder: Path, model: str, init: Path, steps: int, method: str, options: Options) -> list[dict]:
    """The metric lines of one fine-tuning run (trained, resumed or read)."""
    settings = {
        **dict(options.train),
        "model": model,
        "init": str(init),
        "steps": int(steps),
        "corpus": options.corpus,
        "train_steps": int(options.finetune_steps),
        "lora_rank": int(options.lora_rank) if method == "lora" else 0,
        "out": str(folder),
    }
    print(f"attnflow: fine-tuning {model} at {steps} steps ({method}) in {folder} ...", flush=True)
    _train.train(train_config(settings))
    return read_metrics(folder)


def _run_label(model: str, steps: int, method: str, rank: int) -> str:
    return f"{model}-s{steps}-{'full' if method == 'full' else f'lora{rank}'}"


# --- figures -------------------------------------------------------------------------------------

STYLE = {"full": ("C0", "-", "o"), "lora": ("C2", "-", "s")}


def _table(ds: xr.Dataset, folder: Path) -> Path:
    target, source = ds.attrs["corpus"], ds.attrs["pretraining_corpus"]
    methods = [str(m) for m in ds.tuning.values]
    head = ["steps", f"zero-shot on {target}", f"zero-shot on {source}"]
    rank = ds.attrs["lora_rank"]
    head += [f"{'full' if m == 'full' else f'LoRA r={rank}'} fine-tuned on {target}" for m in methods]
    lines = [
        f"# Adaptive depth: the DiffEqFormer pretrained at {ds.attrs['pretrained_steps']} steps",
        "",
        (
            f"Validation losses (nats per token). Pretrained run `{ds.attrs['pretrained']}` (its last validation "
            f"on {source}: {ds.attrs['pretrained_val_loss']:.3f}); fine-tuning for {ds.attrs['finetune_steps']} "
            f"steps on {target}, runs in `{ds.attrs['finetune_out']}`."
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for n in ds.steps.values:
        zero = ds.zero_shot.sel(steps=n)
        row = [
            str(int(n)),
            f"{float(zero.sel(eval_corpus='finetune')):.3f}",
            f"{float(zero.sel(eval_corpus='pretraining')):.3f}",
        ]
        row += [f"{float(ds.finetuned.sel(tuning=m, steps=n)):.3f}" for m in methods]
        lines.append("| " + " | ".join(row) + " |")
    row = [
        f"GPT ({ds.attrs['gpt_layers']} layers)",
        f"{float(ds.gpt_zero_shot.sel(eval_corpus='finetune')):.3f}",
        f"{float(ds.gpt_zero_shot.sel(eval_corpus='pretraining')):.3f}",
    ]
    row += [f"{float(ds.gpt_finetuned.sel(tuning=m)):.3f}" for m in methods]
    lines.append("| " + " | ".join(row) + " |")
    if methods:
        lines += [
            "",
            "Training time of the fine-tuning runs (seconds):",
            "",
            "| steps | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods),
        ]
        for n in ds.steps.values:
            lines.append(
                f"| {int(n)} | "
                + " | ".join(f"{float(ds.finetune_seconds.sel(tuning=m, steps=n)):.0f}" for m in methods)
                + " |"
            )
        lines.append(
            "| GPT | " + " | ".join(f"{float(ds.gpt_finetune_seconds.sel(tuning=m)):.0f}" for m in methods) + " |"
        )
    return write_text(folder / "adaptive_depth.md", "\n".join(lines) + "\n")


class AdaptiveDepth(Experiment):
    title = "Adaptive depth: a DiffEqFormer pretrained at 18 steps, solved and fine-tuned at 9 to 24 steps"
    paper = "Neural ODE Transformers, sec. 6.2, fig. 6"
    Options = Options
    # The long names and units of this experiment's own coordinates (units None: text).
    coordinates = {
        "steps": ("Euler steps of the DiffEqFormer (its layers when populated)", "1"),
        "tuning": ("fine-tuning method: full or lora", None),
        "eval_corpus": ("the corpus of a validation: the fine-tuning corpus or the pretraining one", None),
        "run_steps": ("the fine-tuned run: the DiffEqFormer at this many steps, or gpt", None),
        "finetune_step": ("training step of a validation during fine-tuning", "1"),
    }

    def check(self) -> None:
        options = self.options
        for name in ("pretrained", "baseline"):
            if not getattr(options, name):
                raise ConfigError(f"experiment.options.{name} must be a run folder, got {getattr(options, name)!r}.")
        if options.out == "":
            raise ConfigError("experiment.options.out must be a folder or null, got ''.")
        steps = options.steps
        if not steps or not all(whole_number(s) for s in steps) or len(set(steps)) != len(steps):
            raise ConfigError(
                f"experiment.options.steps must be a list of different positive whole numbers of "
                f"solver steps, got {steps!r}."
            )
        methods = [str(method) for method in options.methods]
        if len(set(methods)) != len(methods):
            raise ConfigError(
                f"experiment.options.methods must be a list of fine-tuning methods from "
                f"{', '.join(METHODS)} (or [] for zero-shot only), got {methods!r}."
            )
        for name in ("lora_rank", "finetune_steps"):
            if not whole_number(getattr(options, name)):
                raise ConfigError(
                    f"experiment.options.{name} must be a positive whole number, got {getattr(options, name)!r}."
                )
        # Settings of fine-tuning runs that no run reads would still be stored with the results.
        if "lora" not in methods and options.lora_rank != Options.lora_rank:
            raise ConfigError(
                f"experiment.options.lora_rank={options.lora_rank} does not apply with "
                f"experiment.options.methods={methods} (it sets the rank of the lora runs); remove it "
                "or add lora."
            )
        if not methods and options.out is not None:
            raise ConfigError(
                f"experiment.options.out={options.out} does not apply with "
                "experiment.options.methods=[] (the folder of the fine-tuning runs, and there are "
                "none); remove it or give a method."
            )
        try:
            corpus_name(options.corpus)
        except ConfigError as error:
            raise ConfigError(f"experiment.options.corpus: {error}") from None
        given = options.train
        if isinstance(given, dict):
            chosen = sorted(set(given) & set(FINETUNE_CHOSEN))
            if chosen:
                raise ConfigError(
                    f"experiment adaptive_depth sets {chosen[0]} of each fine-tuning run itself "
                    "(options steps, corpus, finetune_steps); leave it out of experiment.options.train."
                )
        check_train_overrides("adaptive_depth", given)
        check_train_overrides("adaptive_depth", options.pretrain, "pretrain")
        pretrained = Path(options.pretrained) / "model"
        if pretrained.is_dir() and not (pretrained / "diffeqformer.json").is_file():
            raise ConfigError(
                f"experiment.options.pretrained={options.pretrained} holds no DiffEqFormer run; give "
                "the folder of an attnflow train run of model=diffeqformer."
            )

    def panels(self, base: dict) -> dict[str, dict]:
        return {}  # nothing for the core study runner: everything happens in `analyse`

    def analyse(self, results: dict[str, xr.Dataset], *, on_piece: Counter, keep: Keeper) -> xr.Dataset:
        options = self.options
        pretrained = trained_run(options.pretrained, "diffeqformer", options.pretrain)
        baseline = trained_run(options.baseline, "gpt", options.pretrain)
        model = _store.load_diffeqformer(pretrained / "model")
        gpt = _load.load_checkpoint(baseline / "model")
        # The methods as their names: the coordinate `tuning` holds text.
        steps, methods = [int(s) for s in options.steps], [str(method) for method in options.methods]
        target = corpus_name(options.corpus)
        own = {name: run_record(folder)["config"] for name, folder in (("diffeqformer", pretrained), ("gpt", baseline))}
        source = corpus_name(own["diffeqformer"]["corpus"])
        fine = train_config({**dict(options.train), "corpus": target})

        print("attnflow: zero-shot validation losses at every number of steps ...", flush=True)
        fine_settings = {
            "seed": fine.seed,
            "batch": fine.batch,
            "eval_batches": fine.eval_batches,
            "solver": fine.solver,
        }
        corpora, evaluated = {}, {}

        def loss(label: str, module, folder: Path, corpus: str, settings: dict) -> float:
            """`zero_shot`, each corpus loaded and each evaluation done once."""
            vocab, context = _sizes(module)
            key = (label, corpus, *(settings[k] for k in EVALUATION))
            if (folder, corpus) not in corpora:
                corpora[(folder, corpus)] = _corpus(corpus, folder, vocab, context)
            if key not in evaluated:
                evaluated[key] = zero_shot(module, corpora[(folder, corpus)], {**settings, "context": context})
            return evaluated[key]

        zero = np.zeros((2, len(steps)))
        with Progress("zero-shot losses", len(steps) + 1, unit="models") as bar:
            for j, n in enumerate(steps):
                solved = model.with_steps(n)
                zero[0, j] = loss(f"s{n}", solved, pretrained, target, fine_settings)
                zero[1, j] = loss(f"s{n}", solved, pretrained, source, own["diffeqformer"])
                bar.advance()
            gpt_zero = [
                loss("gpt", gpt, baseline, target, {**fine_settings, "solver": "euler"}),
                loss("gpt", gpt, baseline, corpus_name(own["gpt"]["corpus"]), own["gpt"]),
            ]
            bar.advance()

        out = finetune_folder(options)
        rank = int(options.lora_rank)
        final = np.full((len(methods), len(steps)), np.nan)
        start, seconds = np.full_like(final, np.nan), np.full_like(final, np.nan)
        curves = {}
        gpt_final, gpt_start, gpt_seconds = (np.full(len(methods), np.nan) for _ in range(3))
        # Each fine-tuning run (read back when finished, trained otherwise) draws its own
        # line of steps under this one.
        with Progress("fine-tuning runs", len(methods) * (len(steps) + 1), unit="runs") as bar:
            for i, method in enumerate(methods):
                for j, n in enumerate(steps):
                    lines = _finetune(
                        out / _run_label("diffeqformer", n, method, rank),
                        "diffeqformer",
                        pretrained,
                        n,
                        method,
                        options,
                    )
                    final[i, j], start[i, j], seconds[i, j] = (
                        lines[-1]["val_loss"],
                        lines[0]["val_loss"],
                        lines[-1]["time"],
                    )
                    curves[(method, n)] = lines
                    bar.advance()
            for i, method in enumerate(methods):
                lines = _finetune(
                    out / _run_label("gpt", gpt.depth, method, rank), "gpt", baseline, gpt.depth, method, options
                )
                gpt_final[i], gpt_start[i], gpt_seconds[i] = (
                    lines[-1]["val_loss"],
                    lines[0]["val_loss"],
                    lines[-1]["time"],
                )
                curves[(method, "gpt")] = lines
                bar.advance()

        eval_steps = sorted({e["step"] for lines in curves.values() for e in lines})
        curve = np.full((len(methods), len(steps) + 1, len(eval_steps)), np.nan)
        for i, method in enumerate(methods):
            for j, n in enumerate([*steps, "gpt"]):
                for e in curves[(method, n)]:
                    curve[i, j, eval_steps.index(e["step"])] = e["val_loss"]
        ds = xr.Dataset(
            {
                "zero_shot": (
                    ("eval_corpus", "steps"),
                    zero,
                    {
                        "description": "validation loss of the pretrained DiffEqFormer solved with `steps` Euler "
                        "steps, not fine-tuned, on the fine-tuning corpus and on its pretraining corpus"
                    },
                ),
                "finetuned": (
                    ("tuning", "steps"),
                    final,
                    {"description": f"validation loss on {target} after fine-tuning at `steps` steps"},
                ),
                "finetune_start": (
                    ("tuning", "steps"),
                    start,
                    {"description": "validation loss of the fine-tuning run at its step 0 (before any update)"},
                ),
                "finetune_seconds": (
                    ("tuning", "steps"),
                    seconds,
                    {"description": "training time of the fine-tuning run", "units": "s"},
                ),
                "gpt_zero_shot": (
                    ("eval_corpus",),
                    gpt_zero,
                    {
                        "description": "validation loss of the GPT baseline on the fine-tuning and on its pretraining "
                        "corpus"
                    },
                ),
                "gpt_finetuned": (
                    ("tuning",),
                    gpt_final,
                    {"description": f"validation loss of the GPT baseline on {target} after fine-tuning"},
                ),
                "gpt_finetune_start": (
                    ("tuning",),
                    gpt_start,
                    {"description": "the GPT fine-tuning run's loss at step 0"},
                ),
                "gpt_finetune_seconds": (
                    ("tuning",),
                    gpt_seconds,
                    {"description": "training time of the GPT run", "units": "s"},
                ),
                "curve": (
                    ("tuning", "run_steps", "finetune_step"),
                    curve,
                    {"description": "validation loss during fine-tuning (run_steps: the DiffEqFormer's steps, or gpt)"},
                ),
            },
            coords={
                "steps": steps,
                "tuning": methods,
                "eval_corpus": ["finetune", "pretraining"],
                "run_steps": [str(n) for n in steps] + ["gpt"],
                "finetune_step": np.asarray(eval_steps, np.int64),
            },
            attrs={
                "pretrained": str(pretrained),
                "baseline": str(baseline),
                "finetune_out": str(out),
                "corpus": target,
                "pretraining_corpus": source,
                "pretrained_steps": int(model.config.steps),
                "horizon": float(model.config.horizon),
                "gpt_layers": int(gpt.depth),
                "lora_rank": rank,
                "finetune_steps": int(options.finetune_steps),
                "pretrained_val_loss": float(
                    [e for e in read_metrics(pretrained) if e.get("val_loss") is not None][-1]["val_loss"]
                ),
            },
        )
        return ds

    @staticmethod
    def draw(ds: xr.Dataset) -> dict[str, Figure]:
        target, source = ds.attrs["corpus"], ds.attrs["pretraining_corpus"]
        steps = ds.steps.values
        methods = [str(m) for m in ds.tuning.values]
        rank = ds.attrs["lora_rank"]
        name = {"full": "full fine-tuning", "lora": f"LoRA r = {rank}"}
        fig, axes = subplots(1, 2, figsize=(12.5, 4.4), layout="constrained", gridspec_kw={"width_ratios": [1.25, 1]})
        ax = axes[0]
        ax.plot(
            steps, ds.zero_shot.sel(eval_corpus="finetune"), color="0.25", marker="^", label=f"zero-shot on {target}"
        )
        if source != target:
            ax.plot(
                steps,
                ds.zero_shot.sel(eval_corpus="pretraining"),
                color="0.6",
                marker="v",
                ls=":",
                label=f"zero-shot on {source} (pretraining corpus)",
            )
        for method in methods:
            color, ls, marker = STYLE[method]
            ax.plot(
                steps,
                ds.finetuned.sel(tuning=method),
                color=color,
                ls=ls,
                marker=marker,
                label=f"{name[method]} on {target}",
            )
        ax.axhline(
            float(ds.gpt_zero_shot.sel(eval_corpus="finetune")),
            color="0.25",
            ls="--",
            lw=1,
            label=f"GPT ({ds.attrs['gpt_layers']} layers): zero-shot on {target}",
        )
        for method in methods:
            ax.axhline(
                float(ds.gpt_finetuned.sel(tuning=method)),
                color=STYLE[method][0],
                ls="--",
                lw=1,
                label=f"GPT: {name[method]}",
            )
        ax.axvline(ds.attrs["pretrained_steps"], color="0.8", lw=3, zorder=0)
        ax.set_xticks(steps)
        ax.set(
            xlabel="Euler steps N' (layers of the populated model)",
            ylabel="validation loss (nats per token)",
            title=f"(a) pretrained at N = {ds.attrs['pretrained_steps']} steps, solved at N'",
        )
        # Between the DiffEqFormer's curves and the GPT's lines, where the plot is empty.
        ax.legend(fontsize=7, ncol=2, loc="center", bbox_to_anchor=(0.5, 0.54))
        ax = axes[1]
        cmap = colormap("viridis")
        for i, n in enumerate(ds.run_steps.values):
            for method in methods:
                values = ds.curve.sel(tuning=method, run_steps=n)
                keep = np.isfinite(values.values)
                if not keep.any():
                    continue
                gpt = str(n) == "gpt"
                color = "C3" if gpt else cmap(i / max(len(steps) - 1, 1))
                label = f"{'GPT' if gpt else f'N = {n}'}, {method}"
                ax.plot(
                    ds.finetune_step.values[keep],
                    values.values[keep],
                    color=color,
                    ls="-" if method == "full" else "--",
                    marker="o",
                    markersize=3,
                    label=label,
                )
        ax.set(xlabel="fine-tuning step", ylabel=f"validation loss on {target}", title="(b) during fine-tuning")
        if methods:
            ax.legend(fontsize=7, ncol=2)
        fig.suptitle(
            f"Adaptive depth (section 6.2): {source} -> {target}, {ds.attrs['finetune_steps']} fine-tuning steps"
        )
        caption(
            fig,
            f"(a) The pretrained DiffEqFormer solved with N' Euler steps on [0, {ds.attrs['horizon']:g}] "
            f"without fine-tuning (grey: on the fine-tuning corpus {target} and on its pretraining corpus "
            f"{source}), and after fine-tuning at N' steps on {target}: all hypernetwork parameters (full) or "
            f"rank-{rank} adapters of the populated N'-layer model (LoRA). Dashed horizontal lines: the GPT "
            f"baseline at its {ds.attrs['gpt_layers']} layers, zero-shot and fine-tuned for the same "
            "number of steps. The grey band marks the pretrained number of steps. (b) Validation loss during "
            "each fine-tuning run (solid: full, dashed: LoRA).",
            width=150,
        )
        return {"adaptive_depth": fig}

    @staticmethod
    def write_files(ds: xr.Dataset, folder: Path, plotly_js: str = "embed") -> list[Path]:
        return [_table(ds, Path(folder))]
