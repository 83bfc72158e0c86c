"""Every code block of README.md and docs/**/*.md runs, as a reader would run it: one
test item per block, named by its page and line (`test_block[README.md:548]`).

The blocks of a page run in order, in this process, in a temporary folder of their
own (the page's working folder, which `cd` changes): its Python blocks share one
namespace, so a later block sees the names of an earlier one, and its `attnflow ...`
lines run `attnflow.cli.main` in this process (so a page's runs share the compiled
programs). The conventions a page follows (`<!-- not run: REASON -->`, which shell
lines run) are those of `markdown_blocks.py`, and `test_parser` holds them. A block
selected alone (`-k`) first runs the blocks before it on its page; after a failed block,
the later blocks of its page are skipped, naming it.

The pages show the reader's commands at the reader's sizes; the smaller sizes the tests
run them at are in `reductions.py`, keyed by the page and the command (or Python line)
as written, never in the pages (`test_no_page_carries_notes_for_the_tests`). An
`attnflow` command that runs something and has no entry there fails its block rather than
run at its full size, and an entry that matches no command of its page fails
`test_every_reduction_matches_a_command_of_its_page` (a command edited on its page does
both: its reduction is looked at again).

The blocks run as a user's process would: on the CPU, JAX's float32 default (a config's
`dtype: float64` switches float64 on, as it does for the user) and JAX's standard dtype
and rank promotion, not the suite's strict ones. The JAX settings a block changes, the
process's working folder, Hydra's global state and matplotlib's figures are restored
after each block.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import signal
import sys
import traceback
from pathlib import Path

import jax
import pytest
from markdown_blocks import (Block, Command, DocsError, line_key, parse_page, python_source, runs_something,
                             shell_commands)
from reductions import COMMANDS, PYTHON_LINES

from attnflow.schema._errors import did_you_mean

ROOT = Path(__file__).resolve().parents[2]
# The JAX settings a block may change (attnflow's run switches float64 and the
# compilation cache on for the process), restored after each block.
_JAX_SETTINGS = ("jax_enable_x64", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                 "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
                 "jax_persistent_cache_min_entry_size_bytes", "jax_default_matmul_precision")
# A user's JAX: float32, standard promotion (the suite's conftest makes both strict).
_USER_JAX = {"jax_enable_x64": False, "jax_numpy_dtype_promotion": "standard", "jax_numpy_rank_promotion": "allow"}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _parsed_pages() -> list[tuple[str, list[Block] | DocsError]]:
    """Every page's name and its blocks (or the error that its text breaks a convention)."""
    parsed = []
    for path in pages():
        name = path.relative_to(ROOT).as_posix()
        try:
            parsed.append((name, parse_page(path.read_text(encoding="utf-8"), name)))
        except DocsError as error:
            parsed.append((name, error))
    return parsed


def _parameters() -> list:
    params = []
    for name, blocks in _parsed_pages():
        if isinstance(blocks, DocsError):
            params.append(pytest.param(name, -1, str(blocks), id=name))
            continue
        params += [pytest.param(name, index, None, id=block.where,
                                marks=[pytest.mark.slow] if block.slow is not None else [])
                   for index, block in enumerate(blocks) if block.kind != "other"]
    return params


class Page:
    """The state of one page's run: its blocks, namespace, working folder, progress."""

    def __init__(self, name: str, folder: Path):
        self.name = name
        self.path = ROOT / name
        self.blocks = parse_page(self.path.read_text(encoding="utf-8"), name)
        self.namespace: dict = {"__name__": "__main__"}
        self.cwd = folder
        self.done = 0  # blocks[:done] have run (or were skipped)
        self.slow = False  # whether this run selects the pages' slow blocks
        self.failed: str | None = None  # the block that failed
        # The page as the tests run it (its reduced Python lines replaced), for tracebacks.
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        for block in self.blocks:
            if block.kind == "python":
                run = python_source(block, PYTHON_LINES.get(name)).splitlines(keepends=True)
                lines[block.line:block.line + len(block.lines)] = run[block.line:]
        self.filename = str(self.path)
        self.source = lines

    def run_through(self, index: int, monkeypatch, capsys) -> bool:
        """Run the blocks up to `index` that have not run yet (the earlier ones of a
        block selected alone), then block `index`; False when block `index` holds
        nothing that runs (install lines only)."""
        ran = False
        while self.done <= index:
            block = self.blocks[self.done]
            self.done += 1
            # an earlier `slow` block runs only in a run that selected slow blocks
            if not block.runs or (block.slow is not None and self.done - 1 < index and not self.slow):
                continue
            try:
                ran = self._run(block, monkeypatch, capsys)
            except BaseException:
                self.failed = block.where
                raise
        return ran

    def _run(self, block: Block, monkeypatch, capsys) -> bool:
        with _as_a_user(self, monkeypatch):
            if block.kind == "file":
                path = self.cwd / block.file
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
                return True
            if block.kind == "python":
                self._python(block)
                return True
            try:
                commands = [reduced(self.name, command) for command in shell_commands(block)]
            except DocsError as error:
                commands = str(error)
            if isinstance(commands, str):  # failed outside the `except`: its message alone
                pytest.fail(commands, pytrace=False)
            for command in commands:
                if isinstance(command, Command):
                    self._command(block, command, monkeypatch, capsys)
            return any(isinstance(command, Command) for command in commands)

    def _python(self, block: Block) -> None:
        linecache.cache[self.filename] = (sum(map(len, self.source)), None, self.source, self.filename)
        code = compile(python_source(block, PYTHON_LINES.get(self.name)), self.filename, "exec")
        try:
            exec(code, self.namespace)
        except Exception as error:
            frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == self.filename]
            line = frames[-1].lineno if frames else block.line
            shown = self.source[line - 1].strip() if line <= len(self.source) else ""
            details = "".join(traceback.format_exception(error)[-12:])
            pytest.fail(f"{self.name}:{line} (the python block at {block.where}) failed:\n    {shown}\n"
                        f"{type(error).__name__}: {error}\n\n{details}", pytrace=False)
        finally:
            self.cwd = Path.cwd()

    def _command(self, block: Block, command: Command, monkeypatch, capsys) -> None:
        where = f"{self.name}:{command.line}"
        if command.argv[0] == "cd":
            folder = (self.cwd / command.argv[1]).resolve()
            if not folder.is_dir():
                pytest.fail(f"{where}: `{command.text}`: no folder {command.argv[1]} here "
                            f"(the page's folder holds only what its earlier blocks wrote)", pytrace=False)
            self.cwd = folder
            monkeypatch.chdir(folder)
            return
        code, err = _attnflow(command, monkeypatch, capsys)
        if code != 0:
            tail = "\n".join(err.splitlines()[-15:])
            pytest.fail(f"{where} (the shell block at {block.where}): `{' '.join(command.argv)}` "
                        f"exited with code {code}\n    {command.text}\n{tail}", pytrace=False)


def reduced(page: str, command: Command | str) -> Command | str:
    """The command as the test runs it: with the overrides of its entry in
    `reductions.COMMANDS` (a DocsError naming the line when one that runs something has
    none)."""
    if not isinstance(command, Command) or command.argv[0] != "attnflow":
        return command
    overrides = COMMANDS.get(page, {}).get(command.key)
    if overrides is None:
        if not runs_something(command):
            return command
        known = [key for key in COMMANDS.get(page, {}) if key not in _page_keys(page)[0]]
        raise DocsError(
            f"{page}:{command.line}: `{command.key}` has no entry in tests/docs/reductions.py, so the test "
            f"would run it at its full size: add {command.key!r}: \"KEY=VALUE ...\" (the smaller sizes the test "
            f"runs it at) to COMMANDS[{page!r}], or AS_WRITTEN to run it as written"
            + did_you_mean(f"`{command.key}`", [f"`{key}`" for key in known], "its stale entry "))
    try:
        return command.reduced(overrides)
    except DocsError as error:
        raise DocsError(f"{page}:{command.line}: {error} (tests/docs/reductions.py)") from None


def _page_keys(page: str) -> tuple[set[str], set[str]]:
    """The keys of a page's `attnflow` commands and of its Python lines, in the blocks that
    run (those of `pytest -m slow` included)."""
    commands, lines = set(), set()
    path = ROOT / page
    for block in parse_page(path.read_text(encoding="utf-8"), page) if path.is_file() else []:
        if not block.runs:
            continue
        if block.kind == "shell":
            commands |= {c.key for c in shell_commands(block) if isinstance(c, Command) and c.argv[0] == "attnflow"}
        elif block.kind == "python":
            lines |= {line_key(line) for line in block.lines}
    return commands, lines


def _attnflow(command: Command, monkeypatch, capsys) -> tuple[int, str]:
    """`attnflow ARGS` in this process, as the console script runs it: its exit code and
    its stderr (also left in the test's captured output)."""
    from hydra.core.global_hydra import GlobalHydra

    from attnflow import cli

    with monkeypatch.context() as patch:
        patch.setattr(sys, "argv", list(command.argv))
        patch.setenv("HYDRA_FULL_ERROR", "0")  # main sets it; restored afterwards
        for name, value in command.env:
            patch.setenv(name, value)
            if name == "PYTHONPATH":  # what a new process would put on its import path
                for entry in reversed(value.split(os.pathsep)):
                    patch.syspath_prepend(str(Path(entry or ".").resolve()))
        for name, empty in (("_FAILED", []), ("_JOBS", []), ("_CURRENT", {})):
            patch.setattr(cli, name, empty)
        previous = signal.getsignal(signal.SIGTERM)
        GlobalHydra.instance().clear()
        try:
            cli.main()
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        finally:
            signal.signal(signal.SIGTERM, previous)
            GlobalHydra.instance().clear()
    out, err = capsys.readouterr()
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code, err


@contextlib.contextmanager
def _as_a_user(page: Page, monkeypatch):
    """JAX as a user's process has it, in the page's folder; every setting restored."""
    saved = {name: getattr(jax.config, name) for name in _JAX_SETTINGS}
    monkeypatch.chdir(page.cwd)
    monkeypatch.syspath_prepend(str(page.cwd))  # `python` started in the page's folder imports from it
    try:
        for name, value in _USER_JAX.items():
            jax.config.update(name, value)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, getattr(value, "value", value))
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")


_PAGES: dict[str, Page] = {}


@pytest.mark.parametrize(("name", "index", "error"), _parameters())
def test_block(name, index, error, tmp_path_factory, monkeypatch, capsys):
    if error is not None:
        pytest.fail(error, pytrace=False)
    if name not in _PAGES:
        _PAGES[name] = Page(name, tmp_path_factory.mktemp(name.replace("/", "-")))
    page = _PAGES[name]
    block = page.blocks[index]
    page.slow = page.slow or block.slow is not None
    if block.skip is not None:
        pytest.skip(f"not run: {block.skip}")
    if page.failed is not None and page.done <= index:
        pytest.skip(f"not run: the block at {page.failed} failed before it")
    if page.done > index:
        return  # it ran before this item (the page was run up to a later block)
    if not page.run_through(index, monkeypatch, capsys):
        pytest.skip("not run: install lines only (CI runs them)")


def _slow_commands() -> list:
    """The `attnflow` commands of the blocks kept for `pytest -m slow`."""
    params = []
    for name, blocks in _parsed_pages():
        if isinstance(blocks, DocsError):
            continue  # test_block reports the page
        for block in blocks:
            if block.slow is not None and block.kind == "shell":
                params += [pytest.param(command, id=f"{name}:{command.line}")
                           for command in shell_commands(block) if isinstance(command, Command)]
    return params


@pytest.mark.parametrize("command", _slow_commands())
def test_slow_blocks_compose_as_written(command):
    """A block kept for `pytest -m slow` is still checked in the default run: each of its
    `attnflow` commands, as the reader types it (full size, not reduced by reductions.py),
    composes and passes the schema's checks (an unknown or misspelt key, a bad value or
    a wrong experiment option fails here)."""
    import shlex

    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    from markdown_blocks import _comment_start
    from omegaconf import OmegaConf

    from attnflow.schema._config import compose, hydra_context, register_schema
    from attnflow.diffeqformer import train_config
    from attnflow.experiments import experiment_options

    cut = _comment_start(command.text)
    words = shlex.split(command.text[:cut] if cut is not None else command.text)
    assert words[0] == "attnflow", command.text
    args = [word for word in words[1:] if word not in ("-m", "--multirun")]
    if args[:1] == ["train"]:
        if "--help" not in args:
            from attnflow.diffeqformer._command import _hydra_flags, _jobs

            # as `attnflow train` reads them (`--cfg job` aside): each job of a sweep (-m)
            given, _, multirun = _hydra_flags(words[2:])
            for job in [job for job, _ in _jobs(given)[1]] if multirun else [given]:
                train_config(job)
        return
    assert not args or args[0] not in ("plot", "report", "help"), command.text
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with hydra_context():
            composed = hydra_compose("config", overrides=[a for a in args if not a.startswith("hydra.")])
    finally:
        GlobalHydra.instance().clear()
    container = OmegaConf.to_container(composed, resolve=True, enum_to_str=True)
    container.pop("hydra", None)
    config = compose(container)
    if config.experiment is not None:  # its options typed by its schema, as the run would
        experiment_options(config.experiment.name, config.experiment.options)


def test_no_page_carries_notes_for_the_tests():
    """The pages hold the reader's commands alone: no `# test:` comment (the sizes the
    tests run them at are in reductions.py)."""
    notes = [f"{path.relative_to(ROOT).as_posix()}:{number}: {line.strip()}"
             for path in pages() for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"#\s*test:", line)]
    if notes:
        pytest.fail("a page carries a note for the tests (the sizes the tests run a command at belong in "
                    "tests/docs/reductions.py):\n" + "\n".join(notes), pytrace=False)


def test_every_command_that_runs_has_its_reduction():
    """Every `attnflow` command of the pages' blocks that runs a study, an experiment or a
    training has its entry in reductions.COMMANDS (those of `pytest -m slow` included),
    so none runs at its full size because its entry was forgotten or went stale."""
    missing = []
    for name, blocks in _parsed_pages():
        for block in blocks if not isinstance(blocks, DocsError) else []:
            if block.runs and block.kind == "shell":
                for command in shell_commands(block):
                    try:
                        reduced(name, command)
                    except DocsError as error:
                        missing.append(str(error))
    if missing:
        pytest.fail("\n".join(missing), pytrace=False)


def test_every_reduction_matches_a_command_of_its_page():
    """An entry of reductions.py whose command (or Python line) is on no block that runs
    of its page is stale: the command was edited, moved or marked not run."""
    stale = []
    for page in sorted(set(COMMANDS) | set(PYTHON_LINES)):
        if not (ROOT / page).is_file():
            stale.append(f"{page}: no such page, but reductions.py has entries for it")
            continue
        commands, lines = _page_keys(page)
        for table, name, what, keys in ((COMMANDS, "COMMANDS", "command", commands),
                                         (PYTHON_LINES, "PYTHON_LINES", "line", lines)):
            for key in table.get(page, {}):
                if key not in keys:
                    near = did_you_mean(f"`{key}`", [f"`{k}`" for k in keys], f"the {what} ")
                    stale.append(f"{page}: {name}[{page!r}][{key!r}] matches no {what} of the page's blocks "
                                 f"that run{near}")
    if stale:
        pytest.fail("stale entries in tests/docs/reductions.py:\n" + "\n".join(stale), pytrace=False)
