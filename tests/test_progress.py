"""Long commands show a progress bar (on a terminal, or when asked), and write only where they are told."""
import functools
import os
import pathlib
import sys

import pytest

from minipar.cli.common import PROGRESS_ENV, progress
from .conftest import minipar

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_progress_is_off_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.delenv("MINIPAR_IN_JOB", raising=False)
    assert list(progress(range(3), desc="work")) == [0, 1, 2]
    out, err = capsys.readouterr()
    assert out == "" and err == ""  # pytest's captured stderr is no terminal: no bar


def test_progress_on_when_asked_and_stdout_goes_above_the_bar(monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    monkeypatch.delenv("MINIPAR_IN_JOB", raising=False)
    stdout = sys.stdout
    for i in progress(range(3), desc="work", unit="lesson"):
        print(f"line {i}")
    assert sys.stdout is stdout  # given back when the bar closes
    out, err = capsys.readouterr()
    assert out == "line 0\nline 1\nline 2\n"  # the results, untouched by the bar
    assert "work:" in err and "/3" in err and "lesson" in err  # the bar, on stderr


@pytest.mark.parametrize("env", [{PROGRESS_ENV: "0"}, {PROGRESS_ENV: "1", "MINIPAR_IN_JOB": "1"}])
def test_progress_never_on_a_rank_nor_when_turned_off(env, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bar = progress(total=2, desc="work")
    bar.update(2)
    bar.close()
    assert bar.disable and capsys.readouterr().err == ""


minipar = functools.partial(minipar, timeout=170)  # this file's jobs' limit


def committed_figures():
    return {p.name: p.stat().st_mtime_ns for p in (ROOT / "figures").iterdir()}


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_bench_collectives_writes_nothing_unless_asked(tmp_path):
    before = committed_figures()
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "--algorithms", "ring", "builtin",
                  "--budget", "0.01", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == [], "bench collectives wrote a file it was not asked for"
    assert committed_figures() == before and "wrote" not in out.stdout


@pytest.mark.timeout(180)
def test_figures_go_to_figures_out_unless_told(tmp_path):
    before = committed_figures()
    out = minipar("figures", "--only", "planning", "--quick", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == "minipar figures: regenerates 3 figures of 1 lesson, into figures-out/"
    assert [p.name for p in tmp_path.iterdir()] == ["figures-out"]
    assert sorted(p.name for p in (tmp_path / "figures-out").iterdir()) == ["plan_heatmap.png", "plan_here.png",
                                                                            "plan_memory.png"]
    assert f"wrote {os.path.join('figures-out', 'plan_here.png')}" in out.stdout
    assert committed_figures() == before
