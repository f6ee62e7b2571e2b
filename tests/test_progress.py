"""Long commands show a progress bar (on a terminal, or when asked), and write only where they are told."""
import functools
import os
import pathlib
import sys

import pytest

from minipar.cli.common import PROGRESS_ENV, progress
from minipar.course import lesson
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
    planning = lesson("planning").figures
    assert out.stdout.splitlines()[0] == f"minipar figures: regenerates {len(planning)} figures of 1 lesson, into figures-out/"
    assert [p.name for p in tmp_path.iterdir()] == ["figures-out"]
    assert sorted(p.name for p in (tmp_path / "figures-out").iterdir()) == sorted(planning)
    assert f"wrote {os.path.join('figures-out', 'plan_here.png')}" in out.stdout
    assert committed_figures() == before


def test_every_file_a_figure_module_writes_says_where():
    """Figures write through ``figures.save`` (PNG) and side files through ``records.write_json``; both
    print ``wrote PATH``. A bare ``json.dump``, ``open(..., "w")`` or ``savefig`` would write silently."""
    import ast

    silent = []
    for path in sorted((ROOT / "minipar" / "figures").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            mode = [a.value for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
                    if isinstance(a, ast.Constant)]
            if name in ("dump", "savefig", "write_text", "write_bytes") or (name == "open" and any("w" in m for m in mode)):
                silent.append(f"{path.name}:{node.lineno} {name}")
    assert silent == ["__init__.py:25 savefig"], silent  # save() itself, which returns the path the CLI prints


def test_write_json_says_where(tmp_path, capsys):
    from minipar.records import write_json

    path = write_json(str(tmp_path / "numbers.json"), {"x": float("nan")}, "  wrote", allow_nan=True)
    assert capsys.readouterr().out == f"  wrote {path}\n" and '"x": NaN' in (tmp_path / "numbers.json").read_text()


MEASURED = {"matmul_flops": {"float64": 1e9, "float32": 2e9}, "memory_bandwidth": 5e9, "alpha": 1e-5, "beta": 1e-9,
            "cores": 2, "memory_bytes": 8e9, "load_average": 1.0, "oversubscribed": {}}


def test_bench_machine_leaves_the_committed_record_alone_unless_told(tmp_path, monkeypatch, capsys):
    """``minipar bench machine`` writes this machine's record outside the repository, says where, and
    the planner reads it from there; replacing the committed one takes ``--out`` naming it."""
    import json
    import subprocess

    import minipar.plan.machine as M
    from minipar.cli import main

    monkeypatch.setenv("MINIPAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MINIPAR_MACHINE", raising=False)
    status = lambda: subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout  # noqa: E731
    before, committed = status(), pathlib.Path(M.MACHINE_FILE).read_bytes()
    asked = []

    def measure(n, path=None, ops=None, progress=None):  # the ranks' measurement, without the ranks; writes only under tmp_path
        asked.append(path)
        if str(path).startswith(str(tmp_path)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pathlib.Path(path).write_text(json.dumps(MEASURED))
        return MEASURED

    monkeypatch.setattr(M, "measure_machine", measure)
    assert M.machine_file() == M.MACHINE_FILE  # nothing measured here yet: the committed record
    assert main(["bench", "machine", "-n", "2"]) == 0
    mine = str(tmp_path / "cache" / "this_machine.json")
    assert asked == [mine] and f"wrote {mine} (the planner's this-machine preset reads it)" in capsys.readouterr().out
    assert M.machine_file() == mine and M.load()["alpha"] == 1e-5  # the planner reads this machine's own now
    assert pathlib.Path(M.MACHINE_FILE).read_bytes() == committed and status() == before
