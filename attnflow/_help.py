"""What `attnflow --help` says, and the docs' reference page, from one source.

Every config key of a study comes from the schema (`attnflow.schema._config.Config`, and the
initial conditions' dataclasses of `attnflow.schema.initial`, imported: they import no JAX):
its type from the field's annotation, its choices from its `Choice`, its meaning from
the field's `help` metadata (`_schema.setting`), and its default from the YAML file that
holds it (`conf/config.yaml`, `conf/init/KIND.yaml`). An initial condition's line is its
class's `title`. An experiment's line is its class's `title`, with its `paper`; its
options are its `Options` dataclass (each field's type, its choices, its default and its
meaning, `setting(default, "meaning")`), with the values of `conf/experiment/NAME.yaml`;
`attnflow train`'s settings are the fields of `TrainConfig` (types and meanings, its
`metadata["help"]`) with the values of `conf/train.yaml`; `attnflow report`'s options are
`REPORT_OPTIONS` (`report_help`), which the command line reads.

Everything read is imported: the experiments' modules load no JAX until they compute or
draw (`attnflow.experiments._lazy`), nor does `TrainConfig`'s module
(`diffeqformer._settings`); this module sits in the layer above them, with the command
line. The same rows make the terminal page (`main_help`, `experiment_help`,
`train_help`, through Hydra's help template `conf/hydra/help/attnflow.yaml`: `hydra_help`) and the
Markdown page (`reference_markdown`), and give the shell completion the names a choice
key takes (`complete`) and the words after a subcommand (`complete_command`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.metadata
import re
import shutil
import string
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import OmegaConf

from .diffeqformer._settings import TrainConfig
from .experiments._registry import EXPERIMENTS, experiment_class
from .schema import _config
from .schema._config import INITS, Config, config_source
from .schema._schema import to_container, typed

# The subcommands, each as its usage line says it (`attnflow plot` prints its own).
SUBCOMMANDS = {
    "plot": "attnflow plot DIR... [--config-dir CFG]: redraw the figures of every run in each DIR (a run, "
    "experiment run or sweep directory, or a results.nc file) from its results.nc (CFG: the config folder of "
    "an experiment of your own)",
    "report": "attnflow report DIR [--x KEY] [--colour KEY] [--metrics A,B] [--time T|final|all] [--panels KEY]: one "
    "table (report.csv, report.nc) and one figure (report.png) across the runs in DIR (a sweep, run or experiment run "
    "directory, or a results.nc file), written into DIR; attnflow help report lists the options",
    "train": "attnflow train [KEY=VALUE ...]: train a DiffEqFormer or its GPT baseline (defaults in conf/train.yaml); "
    "the same command, or out=DIR alone, resumes an interrupted run; -m KEY=A,B trains one run per combination, "
    "job N in out/N",
}

# `attnflow report`'s options: each one's name, what it takes and its meaning (its page,
# `report_help`; the command line reads them, `presentation._report.report` takes them as
# keywords of the same names).
REPORT_OPTIONS = {
    "x": (
        "KEY",
        "the swept key on the x-axis (a config key as typed in the sweep, such as d or weights.v.kind, or beta); "
        "by default the first swept key, or beta when nothing else was swept",
    ),
    "colour": (
        "KEY",
        "the swept key (or beta) whose values colour the lines (--color too): one colour per value, in the "
        "report's order; the other keys still split the lines, each with its own dash pattern and marker; by "
        "default each line has a colour of its own",
    ),
    "metrics": (
        "A,B",
        "the metrics drawn and stored in report.csv and report.nc, in this order, separated by commas (clusters, "
        "energy, log_energy, order_parameter, pair_density, ...: a column NAME_mean of report.csv); by default "
        "every recorded metric (log_energy standing for energy)",
    ),
    "time": (
        "T|final|all",
        "when the statistics over members are taken: at the saved time nearest to T in each run (T within "
        "every run's saved times), at each run's final saved time (final, the default), or at every saved "
        "time (all): the whole trajectory drawn against time, one line per run and beta, stored along a "
        "dimension time of report.nc and as one row per saved time in report.csv",
    ),
    "panels": (
        "KEY",
        "one column of panels per value of this swept key (or beta), a row of panels per metric",
    ),
}

_USAGE = (
    ("attnflow [KEY=VALUE ...]", "one study, written to outputs/DATE/TIME/ (or hydra.run.dir=DIR)"),
    ("attnflow experiment=NAME [KEY=VALUE ...]", "a figure of the literature (the experiments below)"),
    ("attnflow -m KEY=A,B [KEY=VALUE ...]", "a sweep: one job per combination (hydra.sweep.dir=DIR)"),
    *((SUBCOMMANDS[name].split(":")[0], SUBCOMMANDS[name].split(": ", 1)[1]) for name in SUBCOMMANDS),
    ("attnflow help [TOPIC]", "this page; TOPIC plot, report, train or an experiment's NAME: its own page"),
)

_FLAGS = (
    ("--help, -h", "this page; with experiment=NAME, that experiment's options"),
    ("--version", "attnflow's version"),
    ("--multirun, -m", "sweep the comma-separated values (KEY=A,B) and ranges (KEY=range(0,4))"),
    ("--cfg job", "print the composed config and stop (--resolve: with ${...} resolved)"),
    ("--shell-completion, -sc", 'tab completion of keys, groups and choices: eval "$(attnflow -sc install=bash)"'),
    ("--hydra-help", "Hydra's own flags and config groups (hydra.run.dir, hydra/launcher=...)"),
)

# What `attnflow --shell-completion` without a subcommand says.
COMPLETION_USAGE = (
    'turn on tab completion with `eval "$(attnflow -sc install=bash)"` (bash or zsh; put it in '
    "~/.bashrc to keep it), or `attnflow -sc install=fish | source` in fish."
)


def version() -> str:
    """attnflow's version, from the installed package's metadata."""
    try:
        return importlib.metadata.version("attnflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _conf_text(*parts: str) -> str:
    return config_source()[1].joinpath(*parts).read_text()


class _Loader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # pyright: ignore[reportGeneralTypeIssues] a base chosen at import time
    """YAML as OmegaConf reads it (`1e-3` is a number, a date stays a string), by libyaml."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)
_Loader.yaml_implicit_resolvers = {
    key: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in _Loader.yaml_implicit_resolvers.items()
}


@functools.cache
def _conf_values(*parts: str) -> dict:
    """A YAML file of `conf/` as plain containers, `${...}` left as written."""
    return yaml.load(_conf_text(*parts), Loader=_Loader) or {}


def _default_init() -> str:
    """The `init` option of conf/config.yaml's defaults list."""
    entries = _conf_values("config.yaml").get("defaults", [])
    return next(entry["init"] for entry in entries if isinstance(entry, Mapping) and "init" in entry)


# --- rows: one per key --------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One row of the help: a key, its type, its default (as plain containers) and its
    meaning; `choices` are the names a choice key takes; `keys` the schema's keys the
    row stands for (`weights.{q,k,v,o}.kind` stands for four)."""

    name: str
    type: str
    default: Any
    meaning: str
    choices: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


def _type(annotation: str, choices_of) -> tuple[str, tuple[str, ...]]:
    """A type in words (`int`, `float or null`, `list of choices`), and the names of a choice."""
    annotation = annotation.strip()
    optional = re.fullmatch(r"Optional\[(.*)\]", annotation) or re.fullmatch(r"(.*?)\s*\|\s*None", annotation)
    if optional:
        inner, names = _type(optional[1], choices_of)
        return f"{inner} or null", names
    listed = re.fullmatch(r"list\[(.*)\]", annotation)
    if listed:
        inner, names = _type(listed[1], choices_of)
        return ("list of choices" if names else f"list of {inner}"), names
    if annotation.startswith("dict"):
        return "mapping", ()
    if annotation in ("int", "float", "bool", "str"):
        return annotation, ()
    if annotation == "Any":
        return "any", ()
    names = choices_of(annotation)
    if names:
        return "choice", tuple(names)
    return annotation, ()


def _choices_in(namespace: Any):
    """The names of the choice type an annotation names in `namespace` (a module: the
    schema's, or an experiment's, whose `Options` name choices it defines or imports)."""

    def names(annotation: str) -> tuple[str, ...] | None:
        kind = getattr(namespace, annotation, None)
        return tuple(kind.__members__) if isinstance(kind, type) and issubclass(kind, enum.Enum) else None

    return names


_study_choices = _choices_in(_config)


def _dataclass_in(namespace: Any, annotation: str) -> type | None:
    kind = getattr(namespace, annotation, None)
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _study_type(field: dataclasses.Field) -> tuple[str, tuple[str, ...]]:
    """A study key's type in words and its choices: its annotation (a string: the schema
    postpones them), the names of its `Choice`, or of its `choices` metadata (the known
    names of an open key, such as the metrics)."""
    names = field.metadata.get("choices")
    choices = (lambda _: tuple(names.__members__)) if names is not None else _study_choices
    return _type(cast(str, field.type), choices)


def _walk(schema: type, values: Mapping, prefix: str) -> Iterator[Key]:
    """The rows of a (nested) schema dataclass of the study: `values` are the YAML's
    values at `prefix`, the meanings the fields' `help`. Sibling groups of one type (the
    four matrices Q, K, V, O) make one row per key, `weights.{q,k,v,o}.kind`."""
    fields = dataclasses.fields(schema)
    shared: dict[str, list[str]] = {}
    for field in fields:
        annotation = cast(str, field.type)  # the schema's annotations are strings (postponed)
        if _dataclass_in(_config, annotation) is not None and "kinds" not in field.metadata:
            shared.setdefault(annotation, []).append(field.name)
    done = set()
    for field in fields:
        annotation = cast(str, field.type)  # the schema's annotations are strings (postponed)
        meaning = field.metadata.get("help", "")
        if "kinds" in field.metadata:
            yield from _kind_rows(prefix + field.name, meaning, field.metadata["kinds"], values.get(field.name))
            continue
        if annotation.startswith("ExperimentConfig"):
            yield Key("experiment", "choice", None, meaning, EXPERIMENTS, ("experiment",))
            continue
        group = _dataclass_in(_config, annotation)
        if group is not None:
            if annotation in done:
                continue
            done.add(annotation)
            names = shared[annotation]
            label = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
            yield from _merged(group, {name: values.get(name) or {} for name in names}, prefix, label)
            continue
        type_, choices = _study_type(field)
        yield Key(prefix + field.name, type_, values.get(field.name), meaning, choices, (prefix + field.name,))


def _merged(group: type, values: dict[str, Mapping], prefix: str, label: str):
    """The rows of a group that several siblings share (one sibling: its own rows)."""
    names = list(values)
    rows = [list(_walk(group, values[name], f"{prefix}{name}.")) for name in names]
    for parts in zip(*rows):
        first = parts[0]
        meaning = first.meaning
        defaults = [part.default for part in parts]
        default = first.default
        if any(d != default for d in defaults):
            meaning += " (" + ", ".join(f"{n}: {show(d)}" for n, d in zip(names, defaults) if d != default) + ")"
        name = first.name.replace(f"{prefix}{names[0]}.", f"{prefix}{label}.", 1)
        yield dataclasses.replace(first, name=name, meaning=meaning, keys=tuple(k for p in parts for k in p.keys))


def _kind_rows(name: str, meaning: str, kinds: Mapping[str, type], values: Any = None) -> Iterator[Key]:
    """A group of `kinds` (the study's `init`, the source's `cross.init`): its row, a
    choice of the kinds (`init=KIND`, a config group; `cross.init.kind=KIND` inside
    another group, whose YAML `values` name its default kind), and one row per key name
    of its kinds (their defaults in conf/init/KIND.yaml)."""
    selector = f"{name}.kind" if isinstance(values, Mapping) else name
    default = values.get("kind") if isinstance(values, Mapping) else _default_init()
    yield Key(selector, "choice", default, meaning, tuple(kinds), (selector,))
    rows: dict[str, list] = {}
    for kind, cls in kinds.items():
        values = _conf_values("init", f"{kind}.yaml")
        for field in dataclasses.fields(cls):
            if field.name != "kind":
                rows.setdefault(field.name, []).append((kind, field, values.get(field.name)))
    for key, entries in rows.items():
        notes = {field.metadata.get("help", "") for _, field, _ in entries}
        if len(notes) == 1:
            text = f"{selector}={', '.join(kind for kind, *_ in entries)}: {notes.pop()}"
        else:  # the kinds say what the key is for each of them
            text = "; ".join(f"{selector}={kind}: {field.metadata.get('help', '')}" for kind, field, _ in entries)
        default = entries[0][2]
        others = [f"{kind}: {show(value)}" for kind, _, value in entries[1:] if value != default]
        type_, choices = _study_type(entries[0][1])
        yield Key(
            f"{name}.{key}",
            type_,
            default,
            text + (f" ({', '.join(others)})" if others else ""),
            choices,
            (f"{name}.{key}",),
        )


@functools.cache
def config_keys() -> tuple[Key, ...]:
    """One row per key of the study (`attnflow KEY=VALUE`), in the schema's order."""
    return tuple(_walk(Config, _conf_values("config.yaml"), ""))


def _annotation(field: dataclasses.Field) -> str:
    """A field's annotation as written (a string where its module postpones them)."""
    return field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))


def _option_rows(schema: type, values: Mapping, prefix: str = "", group: str = "") -> list[Key]:
    """The rows of an experiment's `Options` (or of a dataclass one of its fields is),
    `values` its YAML's over the dataclass's own defaults, each with its meaning (its
    `help`): a dataclass-typed field gives one row per key of its own, whose meaning ends
    with the group's (`group`)."""
    module = sys.modules[schema.__module__]
    defaults = to_container(typed(schema, {}, prefix))
    rows = []
    for field in dataclasses.fields(schema):
        name = prefix + field.name
        value = values.get(field.name, defaults[field.name]) if isinstance(values, Mapping) else defaults[field.name]
        meaning = field.metadata.get("help", "")
        nested = _dataclass_in(module, _annotation(field))
        if nested is not None:
            rows.extend(_option_rows(nested, value if isinstance(value, Mapping) else {}, f"{name}.", meaning))
            continue
        type_, choices = _type(_annotation(field), _choices_in(module))
        rows.append(Key(name, type_, value, f"{meaning} ({group})" if group else meaning, choices, (name,)))
    return rows


@functools.cache
def train_keys() -> tuple[Key, ...]:
    """One row per setting of `attnflow train`: the fields of `TrainConfig` (each one's
    type, meaning and choices) with the values of conf/train.yaml."""
    values = _conf_values("train.yaml")
    rows = []
    for field in dataclasses.fields(TrainConfig):
        choices = tuple(field.metadata["choices"].__members__) if "choices" in field.metadata else ()
        type_, _ = _type(str(field.type), lambda annotation: None)
        rows.append(
            Key(
                field.name,
                "choice" if choices else type_,
                values.get(field.name),
                field.metadata["help"],
                choices,
                (field.name,),
            )
        )
    return tuple(rows)


_TRAIN_FLAGS = (
    (
        "-m, --multirun",
        "one training per combination of the comma-separated values (KEY=A,B) and ranges "
        "(KEY=range(0,4)), one after the other, job N in out/N (out=DIR, by default runs/train/multirun/DATE/TIME); "
        "a failed job does not stop the others, and the command exits with code 2 if one failed",
    ),
    ("--cfg job", "print the composed settings (of every job, with -m) and stop"),
)


# --- experiments --------------------------------------------------------------------


@functools.cache
def experiments() -> dict[str, str]:
    """Every shipped experiment (`attnflow.experiments.EXPERIMENTS`, the names of
    conf/experiment/*.yaml) and its line (the `title` of its class)."""
    return {name: experiment_class(name).title for name in EXPERIMENTS}


@dataclass(frozen=True)
class Experiment:
    """What an experiment is: its line, the paper (and figure) it reproduces, the keys
    its YAML sets over the defaults, and its options."""

    name: str
    title: str
    paper: str
    sets: dict
    options: tuple[Key, ...]


@functools.cache
def experiment(name: str) -> Experiment:
    """Experiment `name` (one of `experiments()`)."""
    kind = experiment_class(name)
    values = dict(_conf_values("experiment", f"{name}.yaml"))
    block = values.pop("experiment", None) or {}
    values.pop("defaults", None)
    rows = _option_rows(kind.Options, block.get("options") or {}, "experiment.options.")
    return Experiment(name, kind.title, kind.paper or "", values, tuple(rows))


# --- completion ---------------------------------------------------------------------


def complete(word: str, line: Sequence[str] = ()) -> list[str] | None:
    """What the shell completes `word` to when it is `KEY=PARTIAL` for a choice or a
    boolean key of the study (`solver=r` -> `solver=ralston`, `solver=rk4`) or of the
    experiment named on the `line` (`experiment.options.methods=` after
    `experiment=adaptive_depth`), or the start of that experiment's option names
    (`experiment.options.fi` -> `experiment.options.finetune_steps=`); None for anything
    else (Hydra completes it)."""
    key, equals, partial = word.partition("=")
    bare = key.lstrip("+")
    rows: tuple[Key, ...] = config_keys()
    if bare.startswith("experiment.options."):
        named = [w.partition("=")[2] for w in line if w.lstrip("+").partition("=")[0] == "experiment"]
        if not named or named[-1] not in experiments():
            return None
        rows = experiment(named[-1]).options
        if not equals:
            plus = key[: len(key) - len(bare)]
            return [f"{plus}{row.name}=" for row in rows if row.name.startswith(bare)]
    if not equals:
        return None
    return _values(word, rows)


def _values(word: str, rows: Sequence[Key]) -> list[str] | None:
    """The completions of `KEY=PARTIAL` when KEY is a choice or a boolean of `rows`
    (a list's element by element), None otherwise."""
    key, _, partial = word.partition("=")
    bare = key.lstrip("+")
    for row in rows:
        if bare in row.keys or bare == row.name:
            names = row.choices or (("true", "false") if row.type.startswith("bool") else ())
            if not names:
                return None
            head, element = "", partial
            if row.type.startswith("list"):  # the element being typed: `[full,lo` -> `[full,lora`
                cut = max(partial.rfind("["), partial.rfind(","))
                head, element = ("[", partial) if cut < 0 else (partial[: cut + 1], partial[cut + 1 :])
            start = word[: len(word) - len(partial)] + head
            return [f"{start}{name}" for name in names if name.startswith(element)]
    return None


# What `--time` of `attnflow report` takes besides a number.
_REPORT_TIMES = ("final", "all")


def complete_command(command: str, word: str, before: Sequence[str] = ()) -> list[str]:
    """What the shell completes `word` to after the subcommand `command` (plot, report,
    train or help) and the words `before` it: `attnflow help`'s topics (plot, report,
    train, the experiments); `attnflow report`'s options (`--x`, ... not given yet) and
    the folders and results.nc files its DIR is, `final` and `all` after `--time`;
    `attnflow plot`'s `--config-dir` and folders; `attnflow train`'s flags, settings
    (`steps=`) and the names a choice or boolean setting takes. An empty list leaves the
    word to the shell (its own file names)."""
    last = before[-1] if before else ""
    if command == "help":
        topics = (*SUBCOMMANDS, *experiments())
        return [] if before else [topic for topic in topics if topic.startswith(word)]
    if command == "train":
        if last == "--cfg":
            return [name for name in ("job",) if name.startswith(word)]
        if word.startswith("-"):
            flags = ("-m", "--multirun", "--cfg", "--help")
            return [flag for flag in flags if flag.startswith(word)]
        if "=" in word:
            return _values(word, train_keys()) or []
        return [f"{row.name}=" for row in train_keys() if row.name.startswith(word)]
    if command == "report":
        options = {f"--{name}" for name in REPORT_OPTIONS} | {"--color"}
        if last == "--time":
            return [name for name in _REPORT_TIMES if name.startswith(word)]
        if last in options:
            return []  # a key or the metrics: the shell's own
        if word.startswith("-"):
            given = {"--colour" if w.partition("=")[0] == "--color" else w.partition("=")[0] for w in before}
            flags = [f"--{name}" for name in REPORT_OPTIONS if f"--{name}" not in given] + ["--help"]
            return [flag for flag in flags if flag.startswith(word)]
        return _results_paths(word)
    if word.startswith("-"):  # plot
        return [flag for flag in ("--config-dir", "--help") if flag.startswith(word)]
    return _results_paths(word)


def _results_paths(word: str) -> list[str]:
    """The folders (with a closing `/`, to go on into them) and results.nc files whose
    path starts with `word`; hidden ones only when `word`'s last part starts with a dot."""
    start = word.rpartition("/")[2]
    base = word[: len(word) - len(start)]
    try:
        entries = sorted(Path(base or ".").iterdir())
    except OSError:
        return []
    return [
        f"{base}{entry.name}{'/' if entry.is_dir() else ''}"
        for entry in entries
        if entry.name.startswith(start)
        and (start.startswith(".") or not entry.name.startswith("."))
        and (entry.is_dir() or entry.name == "results.nc")
    ]


# --- rendering ----------------------------------------------------------------------


def show(value: Any) -> str:
    """A value as typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and re.search(r"[\s,\[\]{}'\"=]", value):
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def _short(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _meaning(row: Key) -> str:
    """The row's meaning, with the names of a choice when the comment lacks them."""
    missing = [name for name in row.choices if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", row.meaning)]
    if row.choices and missing:
        listed = " | ".join(row.choices) if len(row.choices) <= 12 else " | ".join(row.choices[:12]) + " | ..."
        return f"{row.meaning} (one of {listed})" if row.meaning else f"one of {listed}"
    return row.meaning


def _width() -> int:
    return max(60, min(120, shutil.get_terminal_size((100, 24)).columns))


def _table(rows: list[tuple[str, str]], width: int, left: int = 34) -> str:
    """Two columns, the second wrapped with a hanging indent (argparse's layout: a first
    column too wide starts the second on the next line)."""
    out = []
    for first, second in rows:
        wrapped = textwrap.wrap(second, max(20, width - left - 2), break_on_hyphens=False, break_long_words=False) or [
            ""
        ]
        if len(first) + 2 > left:
            out.append(f"  {first}")
            out.extend(" " * (left + 2) + line for line in wrapped)
        else:
            out.append(f"  {first:<{left}}{wrapped[0]}")
            out.extend(" " * (left + 2) + line for line in wrapped[1:])
    return "\n".join(out)


def _key_table(rows: tuple[Key, ...], width: int, prefix: str = "") -> str:
    """One row per key: `KEY=DEFAULT (TYPE) MEANING` (`prefix` left out of the names)."""
    return _table(
        [
            (f"{row.name.removeprefix(prefix)}={_short(show(row.default), 40)}", f"({row.type}) {_meaning(row)}")
            for row in rows
        ],
        width,
    )


def header() -> str:
    return f"attnflow {version()}: self-attention dynamics as interacting particle systems, in JAX and diffrax."


def main_help(width: int | None = None) -> str:
    """The page of `attnflow --help`."""
    width = width or _width()
    inits = [(f"init={kind}", cls.title) for kind, cls in INITS.items()]
    return "\n\n".join(
        [
            "Usage:\n" + _table(list(_USAGE), width, 44),
            "Flags:\n" + _table(list(_FLAGS), width, 26),
            "Experiments (attnflow experiment=NAME; its options: attnflow experiment=NAME --help):\n"
            + _table(list(experiments().items()), width, 22),
            "Initial tokens (init=KIND, default " + _default_init() + "):\n" + _table(inits, width, 22),
            "Keys (KEY=DEFAULT (TYPE) MEANING; lists as [a,b], nothing as null; every key can be given, e.g. "
            "attnflow n=64 beta=[1,4] solver=rk4):\n" + _key_table(config_keys(), width),
        ]
    )


def experiment_help(name: str, width: int | None = None) -> str:
    """The page of `attnflow experiment=NAME --help`."""
    width = width or _width()
    found = experiment(name)
    sets = ", ".join(f"{key}={_short(show(value), 40)}" for key, value in found.sets.items())
    options = _key_table(found.options, width, "experiment.options.") if found.options else "  none"
    return "\n\n".join(
        [
            f"experiment={name}: {found.title}.",
            textwrap.fill(f"Reproduces: {found.paper}.", width),
            textwrap.fill(
                f"Sets (over the defaults; any key given on the command line wins): {sets}.",
                width,
                break_on_hyphens=False,
            ),
            f"Options (given as experiment.options.KEY=VALUE):\n{options}",
            "Every key: attnflow --help.",
        ]
    )


def train_help(width: int | None = None) -> str:
    """The page of `attnflow train --help`."""
    width = width or _width()
    return "\n\n".join(
        [
            f"usage: {SUBCOMMANDS['train']}.",
            "Flags:\n" + _table(list(_TRAIN_FLAGS), width, 26),
            "Settings (KEY=DEFAULT (TYPE) MEANING):\n" + _key_table(train_keys(), width),
        ]
    )


def report_help(width: int | None = None) -> str:
    """The page of `attnflow help report` (and `attnflow report --help`)."""
    width = width or _width()
    options = [(f"--{name} {takes}", meaning) for name, (takes, meaning) in REPORT_OPTIONS.items()]
    return "\n\n".join(
        [
            f"usage: {SUBCOMMANDS['report'].split(';')[0]}.",
            textwrap.fill(
                "report.csv holds one row per run and beta (and per failed job, with its error in note), in run "
                "order: the swept keys (the config keys whose values differ between the runs), beta, the time "
                "the statistics are taken at, and for each metric the mean over members and its 10 and 90 % "
                "percentiles. report.nc holds the same rows along a dimension row, each swept key a coordinate "
                "(a key that takes text lists its values, in the figure's order, in its attribute categories). "
                "report.png draws each metric's mean against the x-axis key, one line per value of the other "
                "keys, with the members' 10-90 % band; its title names every swept key, beta too when it takes "
                "more than one value. Numbers are drawn in ascending order, text in job order (as the values "
                "first appear among the rows).",
                width,
                break_on_hyphens=False,
            ),
            "Options (each also as --NAME=VALUE; a key is a swept key or beta):\n"
            + _table([*options, ("--help, -h", "this page")], width, 26),
            "Examples:\n"
            + _table(
                [
                    ("attnflow report sweeps/d", "every metric at the final time against the first swept key"),
                    (
                        "attnflow report sweeps/d --x beta --colour d --metrics clusters,energy --time 10",
                        "clusters and energy at t = 10 against beta, a colour per d",
                    ),
                    (
                        "attnflow report sweeps/d --time all --colour solver --panels d",
                        "the trajectories over time, a colour per solver, a column of panels per d",
                    ),
                ],
                width,
                26,
            ),
        ]
    )


def page(root: Any = None) -> str:
    """The help page for a composed config: experiment NAME's when it sets one."""
    name = OmegaConf.select(root, "experiment.name", default=None) if root is not None else None
    return experiment_help(str(name)) if name else main_help()


def hydra_help(experiment_name: str | None = None) -> str:
    """What Hydra prints for `--help` (its help template, `conf/hydra/help/attnflow.yaml`),
    for the default config or experiment `experiment_name`'s, rendered as Hydra does it
    but without composing the config: Hydra lists every config group for the template's
    `$APP_CONFIG_GROUPS` whether the template shows them or not, which takes most of its
    `--help`'s time."""
    node = OmegaConf.create(
        {
            "hydra": {"help": _conf_values("hydra", "help", "attnflow.yaml")},
            "experiment": {"name": experiment_name} if experiment_name else None,
        }
    )
    _RENDERING.append(True)
    try:
        template = node.hydra.help.template
    finally:
        _RENDERING.pop()
    return string.Template(template).substitute(FLAGS_HELP="", HYDRA_CONFIG_GROUPS="", APP_CONFIG_GROUPS="", CONFIG="")


# Set while `hydra_help` renders the template (a page asked for without Hydra's flags).
_RENDERING: list[bool] = []


# Hydra's flags that show its help template, or the composed config with it resolved.
_SHOWING = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve")


def help_asked(arguments: list[str] | None = None) -> bool:
    """Whether the command line (`sys.argv` by default) asks Hydra to show its help or its
    config: only then is the help page built (it imports every experiment, a tenth of a
    second of a run's start-up)."""
    arguments = sys.argv[1:] if arguments is None else arguments
    return any(a in _SHOWING or a.startswith(("--cfg=", "--info=")) for a in arguments)


def register_resolver() -> None:
    """`${attnflow_help:header}` and `${attnflow_help:page}`, which Hydra's help template
    (`conf/hydra/help/attnflow.yaml`) shows. Hydra reads the template as a
    `string.Template`, so each `$` of the text is doubled."""

    def resolve(part: str, *, _root_) -> str:
        if part != "header" and not (_RENDERING or help_asked()):
            return ""  # Hydra resolves the template whenever it composes a config: a run needs no page
        text = header() if part == "header" else page(_root_)
        return text.replace("$", "$$")

    OmegaConf.register_new_resolver("attnflow_help", resolve, replace=True)


# Registered with the module, as `${linspace:...}` is with the schema's: any process that
# reads a composed config (a sweep's worker, `--cfg hydra --resolve`) can resolve it.
register_resolver()


# --- the reference page -------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _code(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"``{text}``" if "`" in text else f"`{text}`"


def _markdown_keys(rows: tuple[Key, ...]) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for row in rows:
        kind = row.type + (": " + ", ".join(f"`{name}`" for name in row.choices) if row.choices else "")
        lines.append(f"| {_code(row.name)} | {kind} | {_code(_short(show(row.default), 60))} | {_cell(row.meaning)} |")
    return lines


def reference_markdown() -> str:
    """The body of the docs page of every config key (docs/reference.md, which gives its
    title and introduction), in Markdown: the usage, the flags, the experiments, the
    initial conditions, every key of a study, every setting of `attnflow train`, the
    options of `attnflow report`, and every experiment's options."""
    lines = [
        "## Usage",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    lines += [f"| {_code(command)} | {_cell(what)} |" for command, what in _USAGE]
    lines += ["", "## Flags", "", "| flag | meaning |", "|---|---|"]
    lines += [f"| {_code(flag)} | {_cell(what)} |" for flag, what in _FLAGS]
    lines += [
        "",
        "## Experiments",
        "",
        "`attnflow experiment=NAME` (its options below).",
        "",
        "| experiment | what it shows |",
        "|---|---|",
    ]
    lines += [f"| [`{name}`](#{name}) | {_cell(title)} |" for name, title in experiments().items()]
    lines += ["", "## Initial tokens", "", "| init | tokens |", "|---|---|"]
    lines += [f"| `{kind}` | {_cell(cls.title)} |" for kind, cls in INITS.items()]
    lines += ["", "## Keys of a study", "", "`attnflow KEY=VALUE ...`; the defaults are in `conf/config.yaml`.", ""]
    lines += _markdown_keys(config_keys())
    lines += [
        "",
        "## Settings of `attnflow train`",
        "",
        "`attnflow train KEY=VALUE ...`; the defaults are in `conf/train.yaml`.",
        "",
    ]
    lines += _markdown_keys(train_keys())
    lines += [
        "",
        "## Options of `attnflow report`",
        "",
        f"{_code(SUBCOMMANDS['report'].split(';')[0])}; `attnflow help report` prints the same.",
        "",
        "| option | meaning |",
        "|---|---|",
    ]
    lines += [
        f"| {_code(f'--{name} {takes}')} | {_cell(meaning)} |" for name, (takes, meaning) in REPORT_OPTIONS.items()
    ]
    lines += ["", "## The options of each experiment", ""]
    for name in experiments():
        found = experiment(name)
        sets = ", ".join(_code(f"{key}={_short(show(value), 60)}") for key, value in found.sets.items())
        lines += [
            f"### {name}",
            "",
            f"`attnflow experiment={name}`",
            "",
            f"{_cell(found.title)}. Reproduces: {_cell(found.paper)}.",
            "",
            f"Sets: {sets}.",
            "",
        ]
        lines += _markdown_keys(found.options) if found.options else ["No options."]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
