"""The conventions of the documentation's code blocks (markdown_blocks.py), on a small
page: which blocks run, the reduced Python lines and overrides (reductions.py's entries,
keyed by the line as written), `not run` markers, install lines, continuations, and the
errors that name a page's line."""

from __future__ import annotations

import pytest
from markdown_blocks import (Command, DocsError, apply_overrides, line_key, parse_page, python_source, runs_something,
                             shell_commands)

PAGE = '''# A page

Some text.

```python
import math
n = 4   # four tokens
x = math.sqrt(n)
```

```bash
# a comment line
python3 -m venv .venv && . .venv/bin/activate && pip install . && attnflow
attnflow n=32 members=256 \\
         d=3 +experiment.options.train.lr=1   # the main run
cd runs && attnflow plot circle
attnflow report sweeps/d
ATTNFLOW_CACHE_DIR=/tmp/c attnflow -m "text=a b" 'beta=[1,4]'
```

<!-- not run: needs SLURM -->

```bash
attnflow -m hydra/launcher=submitit_slurm
```

```text
attnflow: error: not a command
```

    ```python
    y = x + 1
    ```

~~~yaml
a: 1
~~~
'''


def test_blocks_languages_lines_and_markers():
    blocks = parse_page(PAGE, "page.md")
    assert [(b.line, b.language, b.kind, b.runs, b.skip) for b in blocks] == [
        (5, "python", "python", True, None),
        (11, "bash", "shell", True, None),
        (23, "bash", "shell", False, "needs SLURM"),  # a blank line between the marker and the fence
        (27, "text", "other", False, None),
        (31, "python", "python", True, None),  # indented (in a list or an admonition)
        (35, "yaml", "other", False, None),
    ]
    assert blocks[4].lines == ("y = x + 1",)
    assert blocks[0].where == "page.md:5"


def test_reduced_python_lines_are_replaced_and_keep_the_page_lines():
    block = parse_page(PAGE, "page.md")[0]
    assert line_key(block.lines[1]) == "n = 4"  # its comment is not part of the key
    source = python_source(block, {"n = 4": "n = 2"}).splitlines()
    assert source[5:8] == ["import math", "n = 2", "x = math.sqrt(n)"]  # line 6 of the page is source[5]
    assert python_source(block).splitlines()[6] == "n = 4   # four tokens"  # no entries: as written
    namespace: dict = {}
    exec(compile(python_source(block, {"n = 4": "n = 2"}), "page.md", "exec"), namespace)
    assert namespace["x"] == 2 ** 0.5
    # indentation kept, a quoted `#` is part of the key, an empty replacement is `pass`
    indented = parse_page('```python\nif True:\n    a = 1  # one\nb = "# no"  # x\nc = 1\n```\n', "p.md")[0]
    assert line_key(indented.lines[2]) == 'b = "# no"'
    replaced = {"a = 1": "a = 3", 'b = "# no"': 'b = "yes"', "c = 1": ""}
    assert python_source(indented, replaced).splitlines()[2:5] == ["    a = 3", 'b = "yes"', "pass"]


def test_shell_commands_overrides_installs_and_continuations():
    commands = shell_commands(parse_page(PAGE, "page.md")[1])
    assert commands[0] == "install"  # the whole line, `&& attnflow` included
    main = commands[1]
    assert isinstance(main, Command) and main.line == 14  # where the command starts
    assert main.argv == ("attnflow", "n=32", "members=256", "d=3", "+experiment.options.train.lr=1")  # as written
    # the key of its entry in reductions.py: continuation joined, comment and spaces dropped
    assert main.key == "attnflow n=32 members=256 d=3 +experiment.options.train.lr=1"
    assert main.reduced("members=4 experiment.options.train.lr=2 t1=1").argv == (
        "attnflow", "n=32", "members=4", "d=3", "+experiment.options.train.lr=2", "t1=1")
    assert [c.argv for c in commands[2:5]] == [("cd", "runs"), ("attnflow", "plot", "circle"),
                                               ("attnflow", "report", "sweeps/d")]
    assert commands[5].argv == ("attnflow", "-m", "text=a b", "beta=[1,4]")
    assert commands[5].env == (("ATTNFLOW_CACHE_DIR", "/tmp/c"),)
    assert len(commands) == 6
    # plot and report run nothing that a size changes: they need no entry
    assert [runs_something(c) for c in commands[1:] if isinstance(c, Command)] == [True, False, False, False, True]
    assert not runs_something(Command(1, "", ("attnflow", "train", "--cfg", "job")))
    with pytest.raises(DocsError, match="takes KEY=VALUE overrides"):
        main.reduced("--cfg")


def test_apply_overrides():
    assert apply_overrides(["-m", "d=2,3,8", "++x=1"], ["d=2", "x=5", "+new=1"]) == ["-m", "d=2", "++x=5", "+new=1"]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_overrides(["n=1"], ["--help"])


@pytest.mark.parametrize(("page", "message"), [
    ("<!-- not run -->\n```bash\nattnflow\n```\n", "page.md:1: `<!-- not run -->` needs a reason"),
    ("<!-- not run: slow -->\n\ntext\n```bash\nattnflow\n```\n", "page.md:1: a `not run` marker with no code block"),
    ("text\n<!-- not run: slow -->\n", "page.md:2: a `not run` marker with no code block"),
    ("```python\nx = 1\n", "page.md:1: a code block that is never closed"),
], ids=["reason", "marker-then-text", "marker-at-end", "unclosed"])
def test_page_errors_name_the_line(page, message):
    with pytest.raises(DocsError, match=message.replace("`", ".").replace("(", ".").replace(")", ".")):
        parse_page(page, "page.md")


@pytest.mark.parametrize(("line", "message"), [
    ("python benchmarks/sweep.py", "page.md:2: `python` is not a command the tests run"),
    ("attnflow report sweeps/d | tee log", "page.md:2: `|` .pipes, redirections, subshells. is not run"),
    ("attnflow > log.txt", "page.md:2: `>`"),
    ("attnflow n=1 \\", "page.md:2: the last line ends in a backslash"),
    ("attnflow && pip install .", "page.md:2: an install command after another command"),
], ids=["other-command", "pipe", "redirection", "backslash", "install-after"])
def test_shell_errors_name_the_line(line, message):
    block = parse_page(f"```bash\n{line}\n```\n", "page.md")[0]
    with pytest.raises(DocsError, match=message.replace("`", ".")):
        shell_commands(block)


def test_a_slow_marker_keeps_the_block_for_pytest_m_slow():
    blocks = parse_page("<!-- slow: tests/x.py makes the same call -->\n```bash\nattnflow train\n```\n"
                        "```bash\nattnflow\n```\n", "p.md")
    assert [(b.runs, b.skip, b.slow) for b in blocks] == [(True, None, "tests/x.py makes the same call"),
                                                          (True, None, None)]
    with pytest.raises(DocsError, match="needs a reason"):
        parse_page("<!-- slow -->\n```bash\nattnflow\n```\n", "p.md")
