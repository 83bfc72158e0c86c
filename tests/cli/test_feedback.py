"""What the command tells a researcher while and after it runs (issue 20): a status line
until the bar starts and while figures are drawn, a header per sweep job, the override
that resumes an interrupted run, no folder left by a refused run, and `plot` and
`report` that take the same folders and speak for themselves. Off a terminal (issue 37):
lines of progress every so often, and the run's log in its folder; and the refusals that
keep Hydra's hint or suggest a name.

All in this process (the `command` fixture): no Python or JAX start-up is paid here.
"""

from __future__ import annotations

import re
import sys

import pytest

import attnflow as af
from attnflow.running import _progress
from attnflow import cli, write_results
from attnflow.running._ensemble import EnsemblePlan
from commands import command  # noqa: F401 (a fixture)

# 8 members, 2 per piece: 4 pieces.
TINY = ["n=4", "d=3", "beta=1", "members=8", "chunk_size=2", "t1=0.5", "dt=0.1", "saves=2", "plot=false"]


# --- a refused run leaves no folder -----------------------------------------------------------


def test_a_refused_run_leaves_no_folder(command, tmp_path):
    # Hydra's default folder (outputs/DATE/TIME under the working directory) and a
    # given one under new parents: both go, with the parents Hydra made for them, also
    # when Hydra wrote its record there (hydra.output_subdir).
    for args in (["n=0"], ["dt=-0.1", "hydra.output_subdir=.hydra"], ["betta=1"]):
        code, lines = command(*args)
        assert code == 2 and len(lines) == 1, lines
        assert not (tmp_path / "outputs").exists(), args
    code, lines = command("n=0", f"hydra.run.dir={tmp_path}/a/b/run")
    assert code == 2 and not (tmp_path / "a").exists(), lines
    # A folder that was there before is left as it was: empty, or holding a run's files.
    empty, used = tmp_path / "empty", tmp_path / "used"
    empty.mkdir()
    (used / ".hydra").mkdir(parents=True)
    (used / "notes.txt").write_text("mine")
    for folder in (empty, used):
        code, lines = command("n=0", f"hydra.run.dir={folder}")
        assert code == 2 and folder.is_dir(), lines
    assert (used / "notes.txt").read_text() == "mine" and (used / ".hydra").is_dir()
    # A new folder under one that exists: only the new one goes.
    code, _ = command("n=0", f"hydra.run.dir={empty}/run")
    assert code == 2 and empty.is_dir() and not (empty / "run").exists()


# --- Ctrl-C names the override that resumes ---------------------------------------------------


@pytest.fixture
def ctrl_c_after(monkeypatch):
    """`ctrl_c_after(k)`: the next run is interrupted when it starts its piece k + 1;
    the exit (os._exit in the command) raises SystemExit here."""

    def exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", exit)

    def arm(solved: int):
        real, count = EnsemblePlan.solve, [0]

        def solve(self, i):
            if count[0] >= solved:
                raise KeyboardInterrupt
            count[0] += 1
            return real(self, i)

        monkeypatch.setattr(EnsemblePlan, "solve", solve)
        return lambda: monkeypatch.setattr(EnsemblePlan, "solve", real)

    return arm


def test_ctrl_c_names_the_run_dir_that_resumes_and_it_does(command, ctrl_c_after, tmp_path):
    # No hydra.run.dir given: the same command alone would start over in a new
    # timestamped folder, so the line names the interrupted run's.
    disarm = ctrl_c_after(2)
    code, lines = command(*TINY)
    disarm()
    assert code == 130 and len(lines) == 1, lines
    [run] = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    expected = (f"attnflow: interrupted; 2 finished pieces are kept in {run / '.attnflow-pieces'}; the same command "
                f"with hydra.run.dir={run} resumes from there.")
    assert lines[0] == expected, lines[0]
    code, lines = command(*TINY, f"hydra.run.dir={run}")
    assert code == 0, lines
    assert "resuming from 2 of 4 finished pieces" in command.stdout and (run / "results.nc").is_file()


def test_ctrl_c_before_anything_is_computed_leaves_no_folder(command, ctrl_c_after, monkeypatch, tmp_path):
    from attnflow.experiments import _runner

    def interrupted(study):
        raise KeyboardInterrupt

    ctrl_c_after(0)
    monkeypatch.setattr(_runner, "plan_study", interrupted)  # while the run's one panel is planned
    code, lines = command(*TINY)
    assert code == 130 and lines == ["attnflow: interrupted; no results were written."], lines
    assert not (tmp_path / "outputs").exists()


def test_ctrl_c_in_a_sweep_names_the_sweep_dir(monkeypatch, capsys, tmp_path):
    sweep, job = tmp_path / "my sweep", tmp_path / "my sweep" / "1"
    (job / ".attnflow-pieces").mkdir(parents=True)
    (job / ".attnflow-pieces" / "piece-00000.npz").write_bytes(b"")
    monkeypatch.setattr(cli, "_CURRENT", {"dir": job, "sweep": sweep})

    def exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", exit)
    with pytest.raises(SystemExit):
        cli._interrupted()
    err = capsys.readouterr().err
    assert f"1 finished piece is kept in {job / '.attnflow-pieces'}" in err, err
    assert f"the same command with hydra.sweep.dir='{sweep}' resumes" in err, err  # quoted for the shell
    monkeypatch.setattr(cli, "_CURRENT", {"sweep": sweep})  # between jobs
    with pytest.raises(SystemExit):
        cli._interrupted()
    err = capsys.readouterr().err
    assert f"kept in {sweep}; the same command with hydra.sweep.dir='{sweep}' resumes" in err, err


# --- a header per sweep job ---------------------------------------------------------------


def test_each_sweep_job_starts_with_a_line_naming_its_overrides(command, tmp_path):
    code, lines = command("-m", "n=0,-1", "d=3", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 2, lines
    headers = [line for line in command.stdout.splitlines() if line.startswith("attnflow: job")]
    assert headers == ["attnflow: job 0 (n=0, d=3)", "attnflow: job 1 (n=-1, d=3)"], command.stdout


# --- status lines ---------------------------------------------------------------------------


def test_status_lines_say_what_happens_before_the_bar_and_while_drawing(command, monkeypatch, tmp_path):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # stderr (captured) as a terminal
    monkeypatch.setenv("TERM", "xterm")
    # A run refused while it is planned: the lines before it said what was going on.
    code, lines = command("dt=0.7", f"hydra.run.dir={tmp_path / 'refused'}")
    screen = "\n".join(lines)
    # The status line is erased (ESC [2K), then the error is the last line.
    assert code == 2 and lines[-1].split("\x1b[2K")[-1].startswith("attnflow: error: dt=0.7 does not"), screen
    assert "composing the config" in screen and "checking and planning the run" in screen, screen
    assert screen.index("composing the config") < screen.index("checking and planning the run")
    # A run: the first piece compiles under the bar; the figure is drawn under a status.
    # (TINY's program: compiled once for this module's runs)
    code, lines = command(*TINY[:-1], "plot=true", f"hydra.run.dir={tmp_path / 'run'}")
    screen = "\n".join(lines)
    assert code == 0, screen
    for said in ("first piece: compiling, then solving", "4/4 pieces", "drawing the figures"):
        assert said in screen, (said, screen)
    assert not _progress.Progress._drawn


# --- off a terminal: lines of progress, and the run's log ----------------------------------------


def test_off_a_terminal_a_count_says_a_line_every_30_s_or_10_percent_whichever_is_rarer(monkeypatch):
    # (and at least one every 5 minutes in which a unit was done)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    clock = [0.0]
    monkeypatch.setattr(_progress, "_now", lambda: clock[0])

    def count(pieces: int, seconds: float) -> list[str]:
        said = []
        clock[0] = 0.0
        monkeypatch.setattr(_progress.Progress, "lines", said.append)
        with _progress.Progress("phase_diagram", pieces, show=False) as bar:
            for _ in range(pieces):
                clock[0] += seconds
                bar.advance()
        return said

    # Fast pieces: every 30 s (240 pieces), not every 10% (100 pieces, 12.5 s).
    fast = count(1000, 0.125)
    assert [line.split(",")[0] for line in fast] == [f"phase_diagram: {k}/1000 pieces" for k in (240, 480, 720, 960)]
    assert fast[0] == "phase_diagram: 240/1000 pieces, 0.125 s/piece, 0:00:30 spent, about 0:01:35 left"
    # Slow pieces: every 10% (10 pieces, 50 s), not every 30 s.
    slow = count(100, 5.0)
    assert [line.split(",")[0] for line in slow] == [f"phase_diagram: {k}/100 pieces" for k in range(10, 101, 10)]
    assert slow[0] == "phase_diagram: 10/100 pieces, 5 s/piece, 0:00:50 spent, about 0:07:30 left"
    # Very slow pieces: a piece done 5 minutes or more after the last line says so, even
    # within a tenth of the total (20 pieces of 400 s: a line for every one).
    slower = count(20, 400.0)
    assert [line.split(",")[0] for line in slower] == [f"phase_diagram: {k}/20 pieces" for k in range(1, 21)]
    # On a terminal (stdout shown as it comes), none: the bar says it.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert count(100, 5.0) == []


def test_off_a_terminal_a_run_prints_its_progress_and_logs_what_it_printed(command, monkeypatch, tmp_path):
    monkeypatch.setattr(_progress, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(_progress, "LINE_EVERY_FRACTION", 0.5)  # a line every 2 of the 4 pieces
    out = tmp_path / "run"
    # A run whose note goes to stderr after its results are written (stdout).
    code, lines = command(*TINY, "noise.sigma=0.5", "noise.switch_times=[5]", "noise.factors=[1,0]",
                          f"hydra.run.dir={out}")
    printed = command.stdout.splitlines()
    assert code == 0 and len(lines) == 1 and lines[0].startswith("attnflow: note: noise.switch_times"), lines
    assert [line.split(",")[0] for line in printed[:2]] == ["attnflow: 2/4 pieces", "attnflow: 4/4 pieces"]
    assert re.fullmatch(r"attnflow: 4/4 pieces, [\d.]+ s/piece, 0:00:\d\d spent, about 0:00:00 left", printed[1])
    assert printed[2:] == [f"attnflow: wrote {out / 'results.nc'}"]
    log = (out / "attnflow.log").read_text().splitlines()
    assert log[0].startswith("# ") and log[0].endswith(f"attnflow {' '.join(TINY)} noise.sigma=0.5 "
                                                       f"'noise.switch_times=[5]' 'noise.factors=[1,0]' "
                                                       f"hydra.run.dir={out}"), log[0]
    assert log[1:] == printed + lines
    assert _progress.Progress.lines is None  # set while a run works, for every count of it
    # The same command skips the finished run: nothing added to its log.
    code, lines = command(*TINY, "noise.sigma=0.5", "noise.switch_times=[5]", "noise.factors=[1,0]",
                          f"hydra.run.dir={out}")
    assert code == 0 and "skipping it" in command.stdout
    assert (out / "attnflow.log").read_text().splitlines() == log
    # A run that fails after it started: its error is in its log, after what it printed.
    failed = tmp_path / "failed"
    tiny = [arg for arg in TINY if not arg.startswith("beta=")]
    code, lines = command(*tiny, "attention_kind=usa", "beta=200", "dtype=float32", f"hydra.run.dir={failed}")
    assert code == 2 and lines[-1].startswith("attnflow: error: ") and "incomplete.nc" in lines[-1], lines
    assert (failed / "attnflow.log").read_text().splitlines()[1:] == command.stdout.splitlines() + lines


def test_a_log_is_appended_to_never_through_a_link(tmp_path):
    target, link = tmp_path / "elsewhere.txt", tmp_path / "attnflow.log"
    target.write_text("kept\n")
    link.symlink_to(target)
    cli._append(link, "attnflow: a line\n")
    assert target.read_text() == "kept\n"
    cli._append(tmp_path / "own.log", "attnflow: one\n")
    cli._append(tmp_path / "own.log", "attnflow: two\n")
    assert (tmp_path / "own.log").read_text() == "attnflow: one\nattnflow: two\n"


# --- refusals that say what to write instead --------------------------------------------------


def test_a_sweep_without_m_keeps_hydras_hint(command, tmp_path):
    code, lines = command("beta=0.5,1", "members=4", f"hydra.run.dir={tmp_path / 'run'}")
    assert (code, lines) == (2, [
        "attnflow: error: beta=0.5,1 is a sweep (one job per value), which takes -m (--multirun). For one run, "
        "write a list, beta=[0.5,1], or a string in quotes that reach attnflow, \"beta='0.5,1'\"."])
    assert not (tmp_path / "run").exists()
    code, lines = command("t1=range(1,3)")
    assert (code, lines) == (2, ["attnflow: error: t1=range(1,3) is a sweep (one job per value), which takes -m "
                                 "(--multirun)."])
    # With -m it is a sweep (each job refused here for its own reason).
    code, lines = command("-m", "beta=0.5,1", "n=0", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 2 and lines[-1].startswith("attnflow: error: 2 of 2 jobs failed"), lines


def test_a_misspelt_experiment_is_given_the_nearest_name(command):
    code, lines = command("experiment=metastabilty")
    names = ", ".join(cli._shipped("experiment"))
    assert (code, lines) == (2, [f"attnflow: error: unknown experiment 'metastabilty' (did you mean metastability?); "
                                 f"choose one of {names}."])


# --- plot and report take the same folders ---------------------------------------------------


@pytest.fixture(scope="module")
def results():
    # TINY's config: the program the runs above compiled
    return af.run({"n": 4, "d": 3, "beta": 1.0, "members": 8, "chunk_size": 2, "t1": 0.5, "dt": 0.1, "saves": 2})


def test_plot_and_report_take_a_sweep_a_run_and_a_results_file(command, results, tmp_path):
    # A sweep of two jobs, one of which failed.
    sweep = tmp_path / "sweep"
    write_results(results, sweep / "0" / "results.nc")
    (sweep / "1").mkdir()
    (sweep / "1" / "error.txt").write_text("a failed job")
    code, lines = command("plot", str(sweep))
    assert code == 0 and (sweep / "0" / "summary.png").is_file(), lines
    assert f"attnflow: wrote {sweep / '0' / 'summary.png'}" in command.stdout
    code, lines = command("report", str(sweep / "0"))  # a run directory
    assert code == 0 and (sweep / "0" / "report.csv").is_file(), lines
    (sweep / "0" / "report.csv").unlink()
    code, lines = command("report", str(sweep / "0" / "results.nc"))  # a results file: beside it
    assert code == 0 and (sweep / "0" / "report.csv").is_file(), lines
    # (a sweep folder's report: tests/cli/test_report.py)


@pytest.mark.parametrize("name, other", [("plot", "report"), ("report", "plot")])
def test_nothing_to_plot_or_report_is_one_sentence_in_the_commands_words(command, tmp_path, name, other):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "incomplete.nc").write_bytes(b"")  # a failed job's file is not a result
    code, lines = command(name, str(tmp_path))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"attnflow: error: {tmp_path} holds no results.nc (looked in it and in its folders at any "
                        f"depth, hidden ones aside); nothing to {name}."), lines[0]
    code, lines = command(name, str(tmp_path / "missing"))
    assert code == 2 and len(lines) == 1 and lines[0].endswith(f"or a results.nc file, to {name}."), lines
    for line in lines:
        line = line.replace(str(tmp_path), "DIR")
        assert other not in line and "hydra.sweep.dir" not in line, line
    assert not list(tmp_path.glob("report.*")) and not list(tmp_path.rglob("*.png"))
