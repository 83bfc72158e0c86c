"""The code blocks of the documentation pages (README.md, docs/**/*.md), and what the
tests run of each: the parser of `test_examples.py`, with the conventions a page's
writer follows.

- A fenced block (```LANG ... ```, or ~~~) whose language is `python` (or `py`) runs as
  Python; `bash` (or `sh`, `shell`) runs as the commands below. Blocks of any other
  language (`text`, `yaml`, `console`, `mermaid`, none) are not run.
- A block with a title, ```LANG title="PATH"``` (mkdocs-material shows PATH above it),
  is a file the reader writes: its content is written to PATH in the page's folder
  (folders made as needed) when its turn comes, whatever its language, and nothing of
  it runs. The page's later commands find it there (`PYTHONPATH=. attnflow ...` imports
  a module written so; Python blocks run with the page's folder on the import path, as
  `python` started in that folder has).
- `<!-- not run: REASON -->` on the last non-blank line before a block's fence keeps the
  block out of the run; the test reports it as a skip with REASON. The reason is
  required, and a marker with no block after it is an error.
- The pages show the reader's commands alone: the smaller sizes the tests run them at
  are in `reductions.py` (`COMMANDS` for `attnflow` lines, `PYTHON_LINES` for Python
  lines), keyed by the page and the command or line as written (`Command.key`,
  `line_key`). A line of a Python block with an entry is the entry's code in the test run
  (its indentation kept).
- Shell: one command a line; a line ending in a backslash goes on on the next line, and
  `&&` or `;` chain commands on one line. Blank lines and `# ...` comments are skipped.
  What runs:
    * `attnflow ARGS` (also `attnflow plot DIR`, `attnflow report DIR`, `attnflow train
      ...`), in the test's process; `KEY=VALUE attnflow ...` sets an environment variable
      for that command. Its entry in `reductions.COMMANDS` gives the overrides the test
      run uses (`apply_overrides`): each replaces the argument with the same key (its
      `+`/`++` prefix kept), or is added at the end when there is none. A command that
      runs something (`runs_something`) must have an entry (`AS_WRITTEN` when it runs at
      the page's size).
    * `cd DIR`: the following commands (and Python blocks) of the page run in DIR.
    * Install lines, i.e. lines whose first command is one of `python3 -m venv`, `pip install`,
      `python -m pip install`, `. .venv/bin/activate`, `source .venv/bin/activate`,
      `git clone`, `mkdocs serve|build|gh-deploy` or `pytest`, are not run, with
      everything chained after them on the line (CI runs them).
    * Any other command, a pipe or a redirection is an error that names the line: run
      it some other way, or mark the block `<!-- not run: REASON -->`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
_NOT_RUN = re.compile(r"^\s*<!--\s*(?P<kind>not run|slow)\b\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_TITLE = re.compile(r"""\btitle=["'](?P<path>[^"']+)["']""")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# (first words of a command) that make an install line: not run.
_INSTALL = (("python3", "-m", "venv"), ("python", "-m", "venv"), ("pip", "install"), ("pip3", "install"),
            ("python", "-m", "pip", "install"), ("python3", "-m", "pip", "install"),
            (".", ".venv/bin/activate"), ("source", ".venv/bin/activate"), ("git", "clone"),
            ("mkdocs", "serve"), ("mkdocs", "build"), ("mkdocs", "gh-deploy"), ("pytest",))


class DocsError(ValueError):
    """A page or a block that breaks the conventions (the message names file:line)."""


@dataclass(frozen=True)
class Block:
    """One fenced code block: `line` is the line of its opening fence (1-based), `lines`
    its content, `skip` the reason of its `<!-- not run: -->` marker (None: it runs),
    `slow` the reason of its `<!-- slow: -->` marker: it runs with `pytest -m slow` only,
    where a faster test of the default run (named in the reason) makes the same call."""

    path: str
    line: int
    language: str
    lines: tuple[str, ...]
    skip: str | None = None
    slow: str | None = None
    file: str | None = None  # the path a titled block is written to

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.skip is None and (self.file is not None or self.language in PYTHON + SHELL)

    @property
    def kind(self) -> str:
        if self.file is not None:
            return "file"
        return "python" if self.language in PYTHON else "shell" if self.language in SHELL else "other"


@dataclass(frozen=True)
class Command:
    """One command of a shell block: `line` the page line it starts on, `text` the line
    as written (continuations joined), `argv` the words as written, `env` the `KEY=VALUE`
    words before it."""

    line: int
    text: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def key(self) -> str:
        """The line as written without its `# ...` comment, spaces collapsed: the key of
        its entry in `reductions.COMMANDS` (a comment or the layout may change, not the
        command)."""
        comment = _comment_start(self.text)
        return " ".join((self.text if comment is None else self.text[:comment]).split())

    def reduced(self, overrides: str) -> Command:
        """The command with `overrides` (`KEY=VALUE ...`, as a shell line writes them)
        applied to its arguments (`apply_overrides`)."""
        try:
            argv = (self.argv[0], *apply_overrides(list(self.argv[1:]), _words(overrides)))
        except ValueError as error:
            raise DocsError(f"the overrides of `{self.key}` {error}") from None
        return Command(self.line, self.text, argv, self.env)


# What makes an `attnflow` command run nothing that a size changes: a report, a plot, help
# or the composed settings printed.
_RUNS_NOTHING = ("-h", "--help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion", "--hydra-help")


def runs_something(command: Command) -> bool:
    """Whether an `attnflow` command runs a study, an experiment or a training (and so
    needs its entry in `reductions.COMMANDS`), rather than `plot`, `report`, `help`,
    `--help`, `--version` or `--cfg`."""
    args = command.argv[1:]
    return (command.argv[0] == "attnflow" and args[:1] not in (("plot",), ("report",), ("help",))
            and not any(arg in _RUNS_NOTHING for arg in args))


def parse_page(text: str, path: str) -> list[Block]:
    """Every fenced block of a Markdown page, in order (a fence left open is an error)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    marker: tuple[int, str, str] | None = None  # (line, reason, kind) of a pending marker
    i = 0
    while i < len(lines):
        line = lines[i]
        not_run = _NOT_RUN.match(line)
        if not_run:
            if marker is not None:
                raise DocsError(f"{path}:{marker[0]}: a `not run` marker with no code block after it")
            reason, kind = (not_run.group("reason") or "").strip(), not_run.group("kind")
            if not reason:
                raise DocsError(f"{path}:{i + 1}: `<!-- {kind} -->` needs a reason: `<!-- {kind}: REASON -->`")
            marker = (i + 1, reason, kind)
            i += 1
            continue
        opening = _FENCE.match(line)
        if not opening:
            if marker is not None and line.strip():
                raise DocsError(f"{path}:{marker[0]}: a `not run` marker with no code block after it")
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        info = opening.group("info").strip().lstrip("{").lstrip(".")
        language = re.split(r"[\s{}]", info, maxsplit=1)[0].lower() if info else ""
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if end == len(lines):
            raise DocsError(f"{path}:{i + 1}: a code block that is never closed")
        content = tuple(_dedent(body, indent) for body in lines[i + 1:end])
        skip = marker[1] if marker and marker[2] == "not run" else None
        slow = marker[1] if marker and marker[2] == "slow" else None
        title = _TITLE.search(info)
        blocks.append(Block(path, i + 1, language, content, skip, slow, title.group("path") if title else None))
        marker = None
        i = end + 1
    if marker is not None:
        raise DocsError(f"{path}:{marker[0]}: a `not run` marker with no code block after it")
    return blocks


def _dedent(line: str, indent: str) -> str:
    return line[len(indent):] if line.startswith(indent) else line.lstrip(" \t")


def python_source(block: Block, replaced: Mapping[str, str] | None = None) -> str:
    """The block's Python as the test runs it: each line whose `line_key` is in `replaced`
    replaced by its code there (indentation kept), and blank lines before it so that line
    numbers in a traceback are the page's."""
    out = []
    for body in block.lines:
        code = (replaced or {}).get(line_key(body))
        if code is not None:
            indent = body[:len(body) - len(body.lstrip())]
            body = indent + (code.strip() or "pass")
        out.append(body)
    return "\n" * block.line + "\n".join(out) + "\n"


def line_key(line: str) -> str:
    """A Python line without its `# ...` comment, spaces collapsed: the key of its entry in
    `reductions.PYTHON_LINES` ("" for a blank or comment line)."""
    comment = _comment_start(line, shell=False)
    return " ".join((line if comment is None else line[:comment]).split())


def _comment_start(line: str, shell: bool = True) -> int | None:
    """Where a `#` comment starts (outside quotes; in a shell, at the start of a word), or None."""
    quote = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (not shell or i == 0 or line[i - 1].isspace()):
            return i
    return None


def shell_commands(block: Block) -> list[Command | str]:
    """The commands of a shell block that the test runs, in order. An install line gives
    the string "install" in its place (not run; kept so the report can say so)."""
    commands: list[Command | str] = []
    logical: list[tuple[int, str]] = []
    pending, start = "", None
    for number, body in enumerate(block.lines, start=block.line + 1):
        if start is None:
            start = number
        stripped = body.rstrip()
        if stripped.endswith("\\") and _comment_start(stripped) is None:
            pending += stripped[:-1] + " "
            continue
        logical.append((start, pending + body))
        pending, start = "", None
    if pending:
        raise DocsError(f"{block.path}:{start}: the last line ends in a backslash")
    for number, text in logical:
        where = f"{block.path}:{number}"
        comment = _comment_start(text)
        code = text if comment is None else text[:comment]
        if not code.strip():
            continue
        try:
            words = _words(code)
        except ValueError as error:
            raise DocsError(f"{where}: {error}: {text.strip()}") from None
        chain: list[list[str]] = [[]]
        for word in words:
            if word in ("&&", ";"):
                chain.append([])
            elif word in ("|", "||", "&", ">", ">>", "<", "(", ")", "<<", "2>", "&>", ">&"):
                raise DocsError(f"{where}: `{word}` (pipes, redirections, subshells) is not run by the tests: "
                                f"write the command alone, or mark the block `<!-- not run: REASON -->`: "
                                f"{text.strip()}")
            else:
                chain[-1].append(word)
        chain = [part for part in chain if part]
        if _is_install(chain[0]):
            commands.append("install")
            continue
        for part in chain:
            env = []
            while part and _ENV.match(part[0]):
                name, _, value = part.pop(0).partition("=")
                env.append((name, value))
            if not part:
                raise DocsError(f"{where}: setting a variable alone is not run by the tests: {text.strip()}")
            if _is_install(part):
                raise DocsError(f"{where}: an install command after another command: put it first on its line")
            if part[0] == "attnflow":
                commands.append(Command(number, text.strip(), tuple(part), tuple(env)))
            elif part[0] == "cd":
                if len(part) != 2 or env:
                    raise DocsError(f"{where}: `cd` takes one folder: {text.strip()}")
                commands.append(Command(number, text.strip(), tuple(part)))
            else:
                raise DocsError(f"{where}: `{part[0]}` is not a command the tests run (they run `attnflow ...` "
                                f"and `cd`; install lines are skipped): mark the block "
                                f"`<!-- not run: REASON -->` before its fence: {text.strip()}")
    return commands


def _words(code: str) -> list[str]:
    lexer = shlex.shlex(code, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def _is_install(words: list[str]) -> bool:
    return any(tuple(words[:len(prefix)]) == prefix for prefix in _INSTALL)


def _key(word: str) -> str | None:
    """The key of a `key=value` override (without `+`, `++`, `~`), None for other words."""
    if word.startswith("-") or "=" not in word:
        return None
    return word.split("=", 1)[0].lstrip("+~")


def apply_overrides(args: list[str], overrides: list[str]) -> list[str]:
    """`args` with each `KEY=VALUE` of `overrides` in place of the argument of the same
    key (keeping its `+` or `++`), or appended."""
    out = list(args)
    for override in overrides:
        key = _key(override)
        if key is None:
            raise ValueError(f"takes KEY=VALUE overrides, got {override!r}")
        for i, arg in enumerate(out):
            if _key(arg) == key:
                prefix = arg[:len(arg) - len(arg.lstrip("+~"))] if not override.startswith(("+", "~")) else ""
                out[i] = prefix + override
                break
        else:
            out.append(override)
    return out
