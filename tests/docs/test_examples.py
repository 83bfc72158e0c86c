"""Every code block of README.md and docs/**/*.md runs, as a reader would run it: one
test item per block, named by its page and line (`test_block[README.md:548]`).

The blocks of a page run in order, in this process, in a temporary folder of their
own (the page's working folder, which `cd` changes): its Python blocks share one
namespace, so a later block sees the names of an earlier one, and its `attnflow ...`
lines run `attnflow.cli.main` in this process (so a page's runs share the compiled
programs). The conventions a page follows (`# test:` reductions, `<!-- not run: REASON
-->`, which shell lines run) are those of `markdown_blocks.py`, and `test_parser`
below holds them. A block selected alone (`-k`) first runs the blocks before it on its
page; after a failed block, the later blocks of its page are skipped, naming it.

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
import signal
import sys
import traceback
from pathlib import Path

import jax
import pytest
from markdown_blocks import Block, Command, DocsError, parse_page, python_source, shell_commands

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
        # The page as the tests run it (`# test:` lines replaced), for tracebacks.
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        for block in self.blocks:
            if block.kind == "python":
                run = python_source(block).splitlines(keepends=True)
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
                commands = shell_commands(block)
            except DocsError as error:
                pytest.fail(str(error), pytrace=False)
            for command in commands:
                if isinstance(command, Command):
                    self._command(block, command, monkeypatch, capsys)
            return any(isinstance(command, Command) for command in commands)

    def _python(self, block: Block) -> None:
        linecache.cache[self.filename] = (sum(map(len, self.source)), None, self.source, self.filename)
        code = compile(python_source(block), self.filename, "exec")
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
    `attnflow` commands, as the reader types it (full size, no `# test:` overrides),
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
