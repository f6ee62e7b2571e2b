"""Automatic parallelization on real ranks (MPI): every placement pair, strategies end to end,
bytes and memory counted; planted bugs that each check must catch; ``minipar search``."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

from minipar import launch
from minipar.lessons.auto_parallel import summarize

ROOT = pathlib.Path(__file__).resolve().parents[1]


def failing(rows):
    return [f"{r['what']}: {r['error']:.2e} > {r['tolerance']:.0e}" for r in rows if not r["ok"]]


# --------------------------------------------------------------------------- rank side: planted bugs


def _patched(obj, name, value, fn):
    """fn() with obj.name (or obj[name], for a dict) replaced by value."""
    with (mock.patch.dict(obj, {name: value}) if isinstance(obj, dict) else mock.patch.object(obj, name, value)):
        return fn()


def planted(comm):
    """Each planted bug or shortcut, with the checks it must fail (rows per case)."""
    from minipar.autoparallel import execute, graph, simulate, transitions as rd
    from minipar.autoparallel.sharding import Replicate, Shard
    from minipar.lessons.auto_parallel import check_executor, check_redistribute
    from minipar.lessons.common import Checks

    p, out = comm.size, {}

    def redist(mesh_shape, shape):
        ch = Checks(comm, "float64")
        check_redistribute(ch, comm, mesh_shape, [shape])
        return ch.rows

    def execu(mesh_shape, model="block"):
        ch = Checks(comm, "float64")
        check_executor(ch, comm, mesh_shape, model, dict(B=4, T=6, C=8, n_heads=4, H=20) if model == "block"
                       else dict(B=4, T=5, C=6, H=10, V=13), n_random=2)
        return ch.rows

    def reversed_all_to_all(c, x, step, level, coord):  # pieces to the wrong ranks
        y = rd.all_to_all(c, x, step, level, coord)
        d = step.dst.dim
        return np.flip(y, axis=d).copy() if y.shape[d] > 1 else y + 1.0

    def engine_all_gather(c, x, step, level, coord):  # the engine's transport: right values, no trace
        return np.concatenate(c.builtin.allgather_object(x), axis=step.src.dim)

    def no_partial_grads(self, placements):  # the gradient of a replicated input taken as replicated
        return tuple(pl if isinstance(pl, Shard) else Replicate() for pl in placements)

    def miscounted(step, shape, mesh_shape, coords, item):  # all-gather counted as a reduce-scatter
        if step.kind == "all_gather":
            m, pieces, total = rd._group_sizes(step, shape, mesh_shape, coords)
            return (total - pieces[coords[step.axis]]) * item
        return rd.step_bytes(step, shape, mesh_shape, coords, item)

    init = execute.Executor.__init__

    def full_weights(self, mesh, g, strategy, params, inputs, like):  # every rank keeps all of every weight
        init(self, mesh, g, strategy, params, inputs, like)
        self.params = {k: self.A(v) for k, v in params.items()}

    two_d = (2, p // 2)
    out["all-to-all to the wrong ranks"] = _patched(rd.TRANSITIONS, "all_to_all", reversed_all_to_all,
                                                     lambda: redist((p,), (p + 1, 2 * p - 1, 2)))
    out["all-gather by the engine"] = _patched(rd.TRANSITIONS, "all_gather", engine_all_gather,
                                               lambda: redist((p,), (p + 1, 2 * p - 1, 2)))
    out["all-to-all to the wrong ranks, 2-D"] = _patched(rd.TRANSITIONS, "all_to_all", reversed_all_to_all,
                                                         lambda: redist(two_d, (3, 5)))
    out["replicated gradients never partial"] = _patched(graph.Layout, "grad", no_partial_grads,
                                                         lambda: execu((p,)))
    out["simulator miscounts all-gathers"] = _patched(simulate, "step_bytes", miscounted, lambda: execu((p,), "vocab"))
    out["full weights on every rank"] = _patched(execute.Executor, "__init__", full_weights, lambda: execu((p,)))
    return out


def verify_and_planted(comm):
    from minipar.lessons.auto_parallel import verify

    return verify(comm), planted(comm)


# --------------------------------------------------------------------------- tests


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_four_ranks_pass_every_check_and_each_planted_bug_fails_its_own():
    out = launch(4, "tests.test_autoparallel_ranks:verify_and_planted", quiet=True, watchdog=120)
    rows = summarize([r[0] for r in out.results])
    assert not failing(rows), "\n".join(failing(rows))
    whats = " | ".join(r["what"] for r in rows)
    for piece in ("256 pairs, mesh 2x2, shape (3, 5)", "25 pairs, mesh 4, shape (5, 7, 1)", "executor, block, mesh 2x2",
                  "data parallel", "Megatron TP", "sequence split", "DP x TP", "operators on single ranks", "random 2"):
        assert piece in whats, piece
    must_fail = {  # case -> the checks (row prefixes) that must catch it
        "all-to-all to the wrong ranks": ["redistribute, 25 pairs, mesh 4, shape (5, 7, 2): data moves bitwise"],
        "all-gather by the engine": ["redistribute, 25 pairs, mesh 4, shape (5, 7, 2): bytes sent = formula"],
        "all-to-all to the wrong ranks, 2-D": ["redistribute, 256 pairs, mesh 2x2, shape (3, 5): data moves bitwise"],
        "replicated gradients never partial": ["executor, block, mesh 4, Megatron TP: loss and 12 gradients"],
        "simulator miscounts all-gathers": ["executor, vocab, mesh 4: bytes sent = simulator's count"],
        "full weights on every rank": ["executor, block, mesh 4: parameter elements held = layout"],
    }
    for case, prefixes in must_fail.items():
        got = summarize([r[1][case] for r in out.results])
        bad = [r["what"] for r in got if not r["ok"]]
        for prefix in prefixes:
            assert any(b.startswith(prefix) for b in bad), f"{case}: no failing row starts with {prefix!r}; failed: {bad}"
    # the shortcuts that keep values right fail only their counting check
    engine = summarize([r[1]["all-gather by the engine"] for r in out.results])
    assert [r["what"] for r in engine if not r["ok"]] == [r["what"] for r in engine if "bytes sent" in r["what"]]


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_three_ranks_uneven_everywhere():
    out = launch(3, "minipar.lessons.auto_parallel:verify", quiet=True, quick=True, n_random=4)
    rows = summarize(out.results)
    assert not failing(rows), "\n".join(failing(rows))
    assert any("mesh 3, shape (4, 5, 1)" in r["what"] for r in rows)


def minipar_cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "minipar", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,needle", [
    (["--ranks", "4", "--mesh", "3x2"], "--mesh 3x2 has 3x2 = 6 ranks, but --ranks is 4"),
    (["--model", "gpt"], "--model 'gpt'"),
    (["--budget", "0"], "argument --budget: expected a number > 0, got '0'"),
    (["--n-heads", "5"], "n_heads=5"),
    (["--mesh", "2x"], "--mesh '2x'"),
    (["--ranks", "0"], "argument --ranks/-n: expected a number of ranks >= 1, got '0'"),
])
def test_search_refuses_bad_input_in_one_line_before_launching(args, needle, capsys, monkeypatch):
    import minipar.launcher
    from minipar.cli import main

    monkeypatch.setattr(minipar.launcher, "launch", lambda *a, **k: pytest.fail("launched ranks"))
    try:
        code = main(["search", *args])
    except SystemExit as exit_:  # refused by the argument's type, as argparse refuses
        code = exit_.code
    assert code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and needle in out.err and "Traceback" not in out.err


@pytest.mark.parametrize("verb", [["search"], ["run", "auto_parallel"]])
def test_verbs_have_help_with_an_example(verb, capsys):
    from minipar.cli import main

    with pytest.raises(SystemExit) as done:
        main([*verb, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "example:\n  minipar " in out


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_search_command_runs_end_to_end_and_caches_where_told(tmp_path):
    cache, js = tmp_path / "cache", tmp_path / "report.json"
    before = set(os.listdir(ROOT))
    out = minipar_cli("search", "--model", "vocab", "--ranks", "2", "--budget", "1", "--reps", "1",
                      "--B", "4", "--T", "8", "--C", "16", "--H", "16", "--V", "256", "--json", str(js),
                      env={"MINIPAR_CACHE_DIR": str(cache), "MINIPAR_PROGRESS": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    # the bar over its phases: calibrate, then the search and each strategy measured (3 hand-written + the found one)
    assert "search: calibrate:" in out.stderr and "search: search, then measure:" in out.stderr, out.stderr
    assert "0/5 [" in out.stderr and max(map(int, re.findall(r"(\d)/5 \[", out.stderr))) >= 3, out.stderr
    for piece in ("strategy found (predicted", "head", "data parallel", "Megatron TP", "found by search", "alpha-beta fit"):
        assert piece in out.stdout, piece
    report = json.loads(js.read_text())
    names = [r["strategy"] for r in report["rows"]]
    assert names[-1] == "found by search" and {"data parallel", "Megatron TP", "sequence split"} <= set(names)
    found = report["rows"][-1]["predicted_s"]
    assert found <= min(r["predicted_s"] for r in report["rows"][:-1]) + 1e-12  # beats or matches, predicted
    assert all(r["measured_s"] > 0 for r in report["rows"])
    cached = json.loads((cache / "autoparallel.json").read_text())
    (entry,) = cached.values()
    assert entry["alpha"] >= 0 and entry["beta"] > 0 and len(entry["ops"]) > 5
    assert set(os.listdir(ROOT)) == before  # nothing left in the repository
