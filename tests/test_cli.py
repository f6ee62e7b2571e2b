"""The command line: every verb has help; run and bench do what they print."""
import json
import subprocess
import sys

import pytest


def minipar(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "minipar", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_verbs():
    out = minipar("--help")
    assert out.returncode == 0
    for verb in ("tour", "lessons", "run", "check", "bench", "figures", "schedule", "memory"):
        assert verb in out.stdout


@pytest.mark.parametrize("verb", [["tour"], ["run"], ["check"], ["bench"], ["figures"], ["lessons"], ["schedule"], ["memory"],
                                  ["bench", "collectives"], ["bench", "tp"], ["run", "collectives"], ["run", "pipeline"],
                                  ["run", "tensor_parallel"], ["run", "data_parallel"]])
def test_every_verb_has_help_with_an_example(verb):
    out = minipar(*verb, "--help")
    assert out.returncode == 0 and "example" in out.stdout.lower()
    assert "\n  minipar " in out.stdout or "\n  mpiexec " in out.stdout  # an example command line


def test_lessons():
    out = minipar("lessons")
    assert out.returncode == 0 and "collectives" in out.stdout and "labs/01_collectives" in out.stdout


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_run_collectives_with_trace(tmp_path):
    out = minipar("run", "-n", "3", "collectives", "--trace", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and "all_reduce:rabenseifner" in out.stdout
    assert json.load(open(tmp_path / "t.json"))["traceEvents"]


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_bench_collectives_json(tmp_path):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "65536", "--budget", "0.01",
                  "--json", str(js), "--plot", str(png))
    assert out.returncode == 0, out.stdout + out.stderr
    recs = json.load(open(js))
    assert {r["algorithm"] for r in recs} == {"naive", "tree", "recursive_doubling", "ring", "rabenseifner", "builtin"}
    assert {r["bytes"] for r in recs} == {8, 65536}
    for r in recs:
        assert {"algorithm", "bytes", "ranks", "time_s", "algbw_gbs", "busbw_gbs"} <= set(r)
        assert r["ranks"] == 2 and r["time_s"] > 0
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * (2 - 1) / 2)
    assert png.stat().st_size > 10_000


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("lesson", ["tensor_parallel", "data_parallel"])
def test_run_lesson_honours_n_before_the_lesson_name(lesson, tmp_path):
    js, tr = tmp_path / "rows.json", tmp_path / "trace.json"
    out = minipar("run", "-n", "2", lesson, "--json", str(js), "--trace", str(tr))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 2 ranks" in out.stdout
    rows = json.load(open(js))
    assert rows and all(r["ok"] for r in rows)
    ranks = {e["pid"] for e in json.load(open(tr))["traceEvents"] if e["ph"] == "X"}
    assert ranks == {0, 1}
