"""The learner's own code, measured: ``bench collectives --file``, ``bench tp --file`` and
``check --trace``, on the solved exercises (tests/labs/solved/) and on planted copies of them.

Small sizes and one or two repetitions: these check what is measured and labelled, not how fast
this machine is. The one timing claim (a ring that sleeps 50 ms a step is slower than minipar's)
holds by a margin of ten or more even with 2 ranks waiting on a busy 2-core machine.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from .conftest import minipar

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOLVED01 = ROOT / "tests" / "labs" / "solved" / "01_collectives.py"
SOLVED02 = ROOT / "tests" / "labs" / "solved" / "02_tensor_parallel.py"
SLEEP = 0.05  # seconds the planted ring waits at each of its 2(p-1) steps

SLOW_RING = f'''

import time as _time

_solved_all_reduce = ring_all_reduce


def ring_all_reduce(comm, x):
    """The solved ring, with a pause at each of its 2(p-1) steps."""
    for _ in range(2 * (comm.size - 1)):
        _time.sleep({SLEEP})
    return _solved_all_reduce(comm, x)
'''


def planted(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def records(path, collective="all_reduce"):
    return [r for r in json.loads(path.read_text()) if r.get("collective", "all_reduce") == collective]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_bench_collectives_shows_a_slow_ring_slower_than_minipars(tmp_path):
    slow = planted(tmp_path, "slow.py", SOLVED01.read_text() + SLOW_RING)
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "4K", "--algorithms", "ring", "builtin",
                  "--budget", "0.02", "--file", str(slow), "--json", str(tmp_path / "b.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "yours: ring_all_reduce, ring_reduce_scatter, ring_all_gather, tree_broadcast of" in out.stdout
    by = {(r["algorithm"], r["bytes"]): r for r in records(tmp_path / "b.json")}
    assert {a for a, _ in by} == {"ring", "builtin", "yours"}
    for size in (8, 4096):
        yours, ring = by[("yours", size)], by[("ring", size)]
        assert yours["time_s"] >= 2 * SLEEP, yours  # its sleeps are in what was timed
        assert yours["busbw_gbs"] < ring["busbw_gbs"] / 4, (yours, ring)
    # the other lab 01 functions (not slowed) each have their table: yours, minipar's and the builtin
    for collective, mine in (("reduce_scatter", "ring"), ("all_gather", "ring"), ("broadcast", "tree")):
        assert {(r["algorithm"], r["bytes"]) for r in records(tmp_path / "b.json", collective)} == \
            {(a, b) for a in ("yours", mine, "builtin") for b in (8, 4096)}, collective
    assert "busbw yours/minipar's ring (all-reduce): 8 B: " in out.stdout


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_bench_collectives_leaves_out_what_is_not_yours_to_measure(tmp_path):
    skeleton = ROOT / "labs" / "01_collectives" / "exercise.py"
    wrong = planted(tmp_path, "wrong.py", SOLVED01.read_text() + "\n\ndef tree_broadcast(comm, x, root=0):\n"
                                                                  "    return x  # sends nothing, receives nothing\n")
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "--algorithms", "builtin", "--budget", "0.01",
                  "--file", str(skeleton))
    assert out.returncode == 0, out.stdout + out.stderr
    for name, task in (("ring_all_reduce", "1.5"), ("ring_reduce_scatter", "1.3"), ("ring_all_gather", "1.4"),
                       ("tree_broadcast", "1.2")):
        said = [ln for ln in out.stdout.splitlines() if ln.startswith(f"yours: {name} ")]
        assert said == [f"yours: {name} (task {task}) is not implemented yet (it raises "
                        f"NotImplementedError('lab {task}')): not measured"], out.stdout
    assert "yours: nothing in" in out.stdout and "Traceback" not in out.stdout + out.stderr
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "--algorithms", "builtin", "--budget", "0.01",
                  "--file", str(wrong))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "yours: tree_broadcast (task 1.2) differs from the builtin at 8 B on rank 1: element 0 is nan" in out.stdout
    assert "yours: ring_all_reduce, ring_reduce_scatter, ring_all_gather of" in out.stdout, out.stdout


def test_a_file_that_does_not_import_is_one_line(tmp_path):
    broken = planted(tmp_path, "broken.py", "import numpy as np\n\ndef ring_all_reduce(comm, x):\n    return x +\n")
    missing = planted(tmp_path, "missing.py", "from minipar.xp import no_such_name\n")
    for verb, path, said in ((["collectives"], broken, "(line 4): SyntaxError: invalid syntax"),
                             (["tp"], missing, "(line 1): ImportError: cannot import name 'no_such_name'")):
        out = minipar("bench", *verb, "-n", "2", "--file", str(path))
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert out.stderr.count("\n") == 1 and f"{path} does not import {said}" in out.stderr, out.stderr


@pytest.mark.mpi
@pytest.mark.torch
@pytest.mark.timeout(120)
def test_bench_collectives_file_on_torch(tmp_path):
    pytest.importorskip("torch")
    out = minipar("bench", "collectives", "-n", "2", "--backend", "torch", "--sizes", "8", "--algorithms", "ring",
                  "--budget", "0.01", "--file", str(SOLVED01), "--json", str(tmp_path / "b.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(torch)" in out.stdout and "not measured" not in out.stdout, out.stdout
    assert {r["algorithm"] for r in records(tmp_path / "b.json")} == {"ring", "yours"}


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_check_trace_holds_the_learners_messages_by_task(tmp_path):
    mine = planted(tmp_path, "mine.py", SOLVED01.read_text())
    out = minipar("check", "01", "--file", str(mine), "--trace", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trace: " in out.stdout and "of tasks 1.1, 1.2, 1.3, 1.4, 1.5, 1.7," in out.stdout, out.stdout
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    for key, function, kinds in (("1.1", "ring_pass", {"sendrecv"}), ("1.2", "tree_broadcast", {"send", "recv"}),
                                 ("1.3", "ring_reduce_scatter", {"sendrecv"}), ("1.4", "ring_all_gather", {"sendrecv"}),
                                 ("1.5", "ring_all_reduce", {"sendrecv"}), ("1.7", "hierarchical_all_reduce", {"sendrecv"})):
        sent = [e for e in events if e["cat"] in kinds and f", task {key}, mine.py:" in e["name"]]
        assert {e["pid"] for e in sent} == {0, 1, 2, 3}, (key, sent[:3])  # the 4-rank run, every rank of it
        assert all(0 <= e["args"]["peer"] < 4 for e in sent)
        calls = [e for e in events if e["cat"] == "collective" and e["name"].startswith(f"task {key} on 4 ranks: {function}, graded call ")]
        assert {e["pid"] for e in calls} == {0, 1, 2, 3}, key
        assert all(any(c["ts"] <= e["ts"] and c["pid"] == e["pid"] for c in calls) for e in sent), key
    assert not [e for e in events if e["pid"] > 3]


def test_check_trace_is_refused_before_grading(tmp_path):
    out = minipar("check", "01", "--solution", "--trace", str(tmp_path / "no" / "t.json"))
    assert out.returncode == 2 and "lab 01" not in out.stdout, out.stdout
    assert "argument --trace" in out.stderr and "does not exist" in out.stderr


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_bench_tp_file_measures_the_learners_mlp(tmp_path):
    out = minipar("bench", "tp", "-n", "2", "--sizes", "8", "48", "--tokens", "16", "--reps", "2", "--budget", "0.01",
                  "--file", str(SOLVED02), "--json", str(tmp_path / "tp.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    recs = json.loads((tmp_path / "tp.json").read_text())
    yours = {(r["p"], r["hidden"]): r for r in recs if r.get("code") == "yours"}
    mine = {(r["p"], r["hidden"]): r for r in recs if r.get("code") != "yours"}
    assert set(yours) == set(mine) == {(p, d) for p in (1, 2) for d in (8, 48)}
    for d in (8, 48):
        whole = 4 * (d * 4 * d + 4 * d + 4 * d * d + d)  # fc1 (d, 4d) + b, fc2 (4d, d) + b, float32
        assert yours[(2, d)]["weight_bytes"] == whole  # the lab's functions: every rank holds the whole layer
        assert mine[(2, d)]["weight_bytes"] == whole // 2 + 4 * d // 2  # minipar's: half, and fc2's bias whole
        assert yours[(2, d)]["pairs"] == mine[(2, d)]["pairs"] >= 2 and yours[(2, d)]["time_vs_minipar"] > 0
        assert 0 < yours[(2, d)]["comm_s"] < yours[(2, d)]["time_s"]  # its all-reduces were timed
    assert "yours (column_forward, row_forward, row_backward, column_backward of" in out.stdout
    assert "yours: your TP = 2 step over minipar's (median of the pairs): d = 8: " in out.stdout
