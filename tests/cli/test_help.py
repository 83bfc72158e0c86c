"""A command line that explains itself: `attnflow --help` (attnflow's page, through
Hydra's help template), `attnflow experiment=NAME --help`, `attnflow help [TOPIC]`,
`attnflow train --help`, `--version`, and the shell completion of choice keys.

Every key of the schema must be on the help page with a meaning (the `help` of its
field's metadata, for the study, `attnflow train` and the experiments' options alike):
a key added without one fails here. The help imports the experiments' modules and reads
their classes; importing them loads no JAX (`test_importing_an_experiment_loads_no_jax`).
All but two tests run the command in this process (the `command` fixture); one runs the
console script, to see that `--help` imports no JAX.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import subprocess
import sys
import typing

from commands import ATTNFLOW, command  # noqa: F401 (command: a fixture)

from attnflow import _help
from attnflow.schema._config import INITS, Config, ExperimentConfig, InitConfig
from attnflow.schema._methods import SOLVERS
from attnflow.schema._schema import to_container, typed


def _flat(text: str) -> str:
    """The text with every run of whitespace one space (the help wraps long lines)."""
    return re.sub(r"\s+", " ", text)


def _schema_keys(schema: type, prefix: str = "") -> set[str]:
    """Every key of a study, from the schema alone: nested groups' keys dotted, `init`
    (`cross.init.kind` inside a group) and the keys of each of its kinds, `experiment`."""
    keys = set()
    for name, kind in typing.get_type_hints(schema).items():
        inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        if kind is InitConfig:
            group = f"{prefix}{name}"
            keys.add(f"{group}.kind" if prefix else group)
            keys |= {f"{group}.{f.name}" for cls in INITS.values() for f in dataclasses.fields(cls) if f.name != "kind"}
        elif inner[0] is ExperimentConfig:
            keys.add("experiment")
        elif dataclasses.is_dataclass(inner[0]):
            keys |= _schema_keys(inner[0], f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def test_help_shows_the_subcommands_the_experiments_and_every_key_with_its_type_default_and_meaning(command):
    code, err = command("--help")
    assert code == 0 and err == []
    out = command.out
    assert out.startswith(f"attnflow {importlib.metadata.version('attnflow')}: ")  # the header, not Hydra's
    assert "powered by Hydra" not in out
    flat = _flat(out)
    for usage in ("attnflow plot DIR...", "attnflow report DIR", "attnflow train [KEY=VALUE ...]",
                  "attnflow help [TOPIC]", "--version", "--shell-completion"):
        assert usage in out, usage
    for name, title in _help.experiments().items():
        assert title and f"{name} {title}" in flat, name
    rows = _help.config_keys()
    # Every key of the schema is on a row, and every row has a meaning (a field of Config,
    # of its groups or of an initial condition declared without its `help` fails here).
    assert {key for row in rows for key in row.keys} == _schema_keys(Config)
    assert [row.name for row in rows if not row.meaning] == []
    for row in rows:  # the meaning is the schema's (the one a row of several keys shares)
        if row.name.startswith(("init", "cross.init.")) or row.name == "experiment":
            continue  # the kinds' keys: below
        path = row.keys[0].split(".")
        schema: typing.Any = Config
        for part in path[:-1]:
            schema = typing.get_type_hints(schema)[part]
        field = {f.name: f for f in dataclasses.fields(schema)}[path[-1]]
        assert row.meaning.startswith(field.metadata["help"]), row.name
    for kind, cls in INITS.items():  # each kind's line and own keys, in its own class
        assert cls.title and f"init={kind} {cls.title}" in flat, kind
        assert [f.name for f in dataclasses.fields(cls) if f.name != "kind" and not f.metadata.get("help")] == [], kind
        for f in dataclasses.fields(cls):
            if f.name != "kind":
                row = next(row for row in rows if row.name == f"init.{f.name}")
                assert f"init={kind}" in row.meaning and f.metadata["help"] in row.meaning, (kind, f.name)
                row = next(row for row in rows if row.name == f"cross.init.{f.name}")  # the source's, by its kind key
                assert f"cross.init.kind={kind}" in row.meaning and f.metadata["help"] in row.meaning, (kind, f.name)
    for row in rows:
        assert re.search(rf"^  {re.escape(row.name)}=", out, re.M), row.name
        assert f"({row.type}) {_flat(row.meaning)}" in flat, row.name
    solver = next(row for row in rows if row.name == "solver")
    assert (solver.type, solver.default) == ("choice", "euler_renorm") and "rk4" in solver.choices
    assert "  weights.{q,k,v,o}.kind=identity " in out  # the four matrices' keys on one row each
    assert "  n=32 " in out and "(int) tokens" in out
    # The page is Hydra's help template (conf/hydra/help/attnflow.yaml), which Hydra
    # itself renders when other overrides come with --help (it composes them first).
    assert command("n=32", "--help") == (0, []) and command.out == out


def test_help_of_an_experiment_shows_its_line_its_paper_and_its_options_with_their_meaning(command):
    code, _ = command("experiment=causal", "--help")
    assert code == 0
    out = command.out
    found = _help.experiment("causal")
    flat = _flat(out)
    assert f"experiment=causal: {found.title}." in out and found.paper in flat
    assert "n=8" in out and "solver=rk4" in out  # the keys it sets over the defaults
    assert [row.name for row in found.options] == [f"experiment.options.{name}"
                                                   for name in ("member", "fit_from", "tolerance")]
    for row in found.options:
        assert row.meaning and f"{row.name.removeprefix('experiment.options.')}={_help.show(row.default)}" in out
        assert _flat(row.meaning) in flat
    assert "Keys (" not in out  # the experiment's page, not the whole one
    assert command("help", "causal") == (0, []) and command.out == out
    assert command("experiment=causal", "seed=0", "--help") == (0, []) and command.out == out  # through Hydra
    code, err = command("experiment=nonsense", "--help")
    assert code == 2 and err[0].startswith("attnflow: error: unknown experiment 'nonsense'; choose one of")


def test_what_the_help_shows_is_what_the_experiments_classes_say():
    """The experiments' `title`, `paper` and `Options` (their order, each option's
    meaning, its default as the experiment's YAML gives it, typed by its schema, and the
    names of a choice) as the help shows them. `attnflow train`'s rows are
    `TrainConfig`'s fields (imported, without JAX), each with its meaning and the
    default `train_config()` gives."""
    from attnflow.diffeqformer import TrainConfig, train_config
    from attnflow.experiments import EXPERIMENTS
    from attnflow.experiments._runner import experiment_class, option_schema

    assert tuple(_help.experiments()) == EXPERIMENTS
    for name in EXPERIMENTS:
        found = _help.experiment(name)
        kind = experiment_class(name)
        assert (found.title, found.paper) == (kind.title, kind.paper), name
        assert found.title and found.paper, name
        schema = option_schema(kind)
        given = _help._conf_values("experiment", f"{name}.yaml")["experiment"].get("options") or {}
        options = to_container(typed(schema, given, "experiment.options."))
        rows = {row.name.removeprefix("experiment.options."): row for row in found.options}
        heads = list(dict.fromkeys(key.split(".")[0] for key in rows))  # a group: one row per key of its own
        assert heads == [field.name for field in dataclasses.fields(schema)], name
        for key, row in rows.items():
            assert row.meaning, (name, key)
            assert row.keys == (row.name,), (name, key)
            head, _, rest = key.partition(".")
            assert row.default == (options[head][rest] if rest else options[head]), (name, key)
            kind = typing.get_type_hints(schema).get(head)
            inner = (typing.get_args(kind) or (kind,))[0]
            if isinstance(inner, type) and issubclass(inner, str) and hasattr(inner, "__members__"):
                assert row.choices == tuple(inner.__members__), (name, key)
    train = _help.train_keys()
    assert [row.name for row in train] == [f.name for f in dataclasses.fields(TrainConfig)]
    assert [row.name for row in train if not row.meaning] == []
    defaults = train_config()
    assert [row.default for row in train] == [getattr(defaults, row.name) for row in train]
    assert {row.name: row.choices for row in train if row.choices} == {
        "model": ("diffeqformer", "gpt"), "solver": tuple(SOLVERS), "dtype": ("float32", "float64"),
        "corpus": ("reference", "reference-a", "reference-b", "induction")}
    for row in train:  # each choice shown is one the settings' check takes
        for choice in row.choices:
            assert getattr(train_config({row.name: choice}), row.name) == choice


def test_help_subcommand_and_train_help(command):
    assert command("--help")[0] == 0
    page = command.out
    assert command("help") == (0, []) and command.out == page  # not an override error
    code, err = command("train", "--help")
    assert code == 0 and err == []
    train = command.out
    flat = _flat(train)
    assert train.startswith("usage: attnflow train")
    for row in _help.train_keys():
        assert re.search(rf"^  {re.escape(row.name)}=", train, re.M) and _flat(row.meaning) in flat, row.name
    assert command("help", "train") == (0, []) and command.out == train
    code, err = command("help", "plot")
    assert code == 0 and err == [f"attnflow: usage: {_help.SUBCOMMANDS['plot']}."]
    code, err = command("help", "nonsense")
    assert code == 2 and len(err) == 1 and err[0].startswith("attnflow: error: attnflow help takes plot, report")


def test_version_is_attnflows(command):
    assert command("--version") == (0, [])
    assert command.out == f"attnflow {importlib.metadata.version('attnflow')}\n"


def test_shell_completion_says_how_to_turn_it_on_and_completes_the_choices_of_a_key(command, monkeypatch):
    code, err = command("--shell-completion")
    assert code == 2 and len(err) == 1 and "attnflow -sc install=bash" in err[0]

    def query(line: str, shell: str = "bash") -> list[str]:
        monkeypatch.setenv("COMP_LINE", line)
        assert command("-sc", f"query={shell}") == (0, [])
        return command.out.split()

    assert query("attnflow solver=r") == ["solver=ralston", "solver=rk4"]
    assert query("attnflow n=8 attention_kind=") == ["attention_kind=sa", "attention_kind=usa", "attention_kind=sinkhorn", "attention_kind=hardmax"]
    assert query("attnflow weights.v.kind=t") == ["weights.v.kind=tied"]
    assert query("attnflow causal=") == ["causal=true", "causal=false"]
    assert query("attnflow scheme=", "fish") == ["scheme=none", "scheme=sphere", "scheme=pre", "scheme=peri"]
    assert command.out.count("\n") == 4  # fish: one per line
    # An experiment's options: their names, their choices (a list's element by element).
    line = "attnflow experiment=adaptive_depth "
    assert query(line + "experiment.options.fi") == ["experiment.options.finetune_steps="]
    assert query(line + "+experiment.options.l") == ["+experiment.options.lora_rank="]
    assert query(line + "experiment.options.methods=") == ["experiment.options.methods=[full",
                                                           "experiment.options.methods=[lora"]
    assert query(line + "experiment.options.methods=[full,l") == ["experiment.options.methods=[full,lora"]
    assert query("attnflow experiment=checkpoint experiment.options.interpolation=c") == [
        "experiment.options.interpolation=constant", "experiment.options.interpolation=cubic"]
    assert query("attnflow experiment=checkpoint experiment.options.probes=f") == ["experiment.options.probes=false"]
    # Hydra's own completion: a group's options and the keys.
    assert query("attnflow experiment=ca") == ["experiment=causal"]
    assert "causal=" in query("attnflow caus")
    # The first word is also a subcommand, given before the keys that start as it does.
    first = query("attnflow ")
    assert first[:4] == ["plot", "report", "train", "help"] and {"n=", "init=", "experiment="} <= set(first), first
    assert query("attnflow p") == ["plot", "plot=", "plotly_js="]
    assert query("attnflow r", "fish") == ["report", "rank_rtol=", "rtol="]
    assert query("attnflow tr") == ["train", "trust_pickle="]
    assert "plot" not in query("attnflow n=8 p") and "train" not in query("attnflow n=8 ")


def test_shell_completion_after_a_subcommand_offers_its_own_words(command, monkeypatch, tmp_path):
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "b").mkdir()
    (tmp_path / "runs" / "a" / "results.nc").touch()
    (tmp_path / "runs" / "a" / "notes.txt").touch()
    (tmp_path / ".hidden").mkdir()
    monkeypatch.chdir(tmp_path)

    def query(line: str) -> list[str]:
        monkeypatch.setenv("COMP_LINE", line)
        assert command("-sc", "query=bash") == (0, [])
        return command.out.split()

    # report: its options (those not given yet) and the folders and results.nc files, not config keys.
    assert query("attnflow report ") == ["runs/"]
    assert query("attnflow report runs/") == ["runs/a/", "runs/b/"]
    assert query("attnflow report runs/a/") == ["runs/a/results.nc"]
    assert query("attnflow report .") == [".hidden/"]
    assert query("attnflow report --") == ["--x", "--colour", "--metrics", "--time", "--panels", "--help"]
    assert query("attnflow report runs --color d --x=beta --") == ["--metrics", "--time", "--panels", "--help"]
    assert query("attnflow report runs --time ") == ["final", "all"]
    assert query("attnflow report runs --x ") == []  # a key: left to the shell
    # plot: its folders and --config-dir.
    assert query("attnflow plot ") == ["runs/"]
    assert query("attnflow plot runs/a runs/") == ["runs/a/", "runs/b/"]
    assert query("attnflow plot -") == ["--config-dir", "--help"]
    # help: the topics, once.
    topics = query("attnflow help ")
    assert topics[:3] == ["plot", "report", "train"] and "single_cluster" in topics and "n=" not in topics
    assert query("attnflow help si") == ["single_cluster"]
    assert query("attnflow help plot ") == []
    # train: its flags and settings (not the study's keys), and a choice setting's names.
    settings = query("attnflow train ")
    assert "steps=" in settings and "lr=" in settings and "n=" not in settings and "runs/" not in settings
    assert query("attnflow train sol") == ["solver="]
    assert "solver=tsit5" in query("attnflow train solver=")
    assert query("attnflow train --") == ["--multirun", "--cfg", "--help"]
    assert query("attnflow train --cfg ") == ["job"]


def test_importing_an_experiment_loads_no_jax():
    """Every shipped experiment's module (and the registry that finds its class) imports
    in a fresh process without JAX, xarray, matplotlib, scipy, optax or ott: the help,
    the completion and the reference page read their classes at once."""
    heavy = ("jax", "jaxlib", "equinox", "diffrax", "xarray", "matplotlib", "scipy", "optax", "ott")
    code = (
        "import importlib, sys\n"
        "from attnflow.experiments._registry import EXPERIMENTS, experiment_class\n"
        "for name in EXPERIMENTS: experiment_class(name)\n"
        f"print(sorted(name for name in {heavy!r} if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_reference_markdown_has_every_key_every_setting_and_every_experiments_options():
    page = _help.reference_markdown()
    # The body of docs/reference.md, whose one title and introduction are the page's own.
    assert page.startswith("## Usage\n") and not re.search(r"^# ", page, re.M)
    rows = [*_help.config_keys(), *_help.train_keys()]
    rows += [row for name in _help.experiments() for row in _help.experiment(name).options]
    for row in rows:
        assert re.search(rf"^\| `{re.escape(row.name)}` \| .+ \| .+ \| .+ \|$", page, re.M), row.name
    for name in _help.experiments():
        assert f"\n### {name}\n" in page and f"(#{name})" in page
    for line in page.splitlines():
        if line.startswith("| `"):
            assert len(re.findall(r"(?<!\\)\|", line)) in (3, 5), line  # escaped | inside the cells


def test_the_console_script_help_loads_no_jax():
    """`attnflow --help` as a user runs it: exit 0, attnflow's page, and none of JAX,
    xarray or matplotlib imported (what makes a command slow to start)."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(ATTNFLOW), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("attnflow ") and "init=caps" in done.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    heavy = {"jax", "xarray", "matplotlib", "diffrax", "scipy", "optax", "ott"}
    assert imported and "attnflow" in imported and not imported & heavy, imported & heavy


def test_a_run_builds_no_help_page(monkeypatch):
    """Hydra resolves its help template whenever it composes a config; the page (which
    imports every experiment) is built only when the command line asks to see it."""
    from omegaconf import OmegaConf

    from attnflow import _help

    built = []
    monkeypatch.setattr(_help, "page", lambda root: built.append(root) or "the page")
    template = OmegaConf.create({"page": "${attnflow_help:page}"})
    for arguments, shown in ((["n=4", "d=3"], ""), (["--help"], "the page"), (["experiment=circle", "-h"], "the page"),
                             (["--cfg", "hydra", "--resolve"], "the page")):
        monkeypatch.setattr(sys, "argv", ["attnflow", *arguments])
        assert template.page == shown
    assert len(built) == 3
