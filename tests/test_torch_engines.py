"""minipar.torch: DDP, ShardedOptimizer, FSDP and the TP plan on torch modules, over minipar's rings.

Each engine against one process, against torch's own, and by the bytes the trace saw, on a small
GPT and on a model with every awkward part (minipar/lessons/torch_fixtures.py), at world sizes 2
and 3: one launch per world size runs lesson 09's checks (minipar/lessons/torch_*.py, through
tests/torch_engines_ranks.py), the tests read its rows.
Planted bugs each fail a named check; bad input fails in one line before any step.
"""
from __future__ import annotations

import pickle
import socket
import types

import pytest

from minipar import launch
from minipar.errors import UsageError

torch = pytest.importorskip("torch")

from minipar.lessons.torch_fixtures import GPT, Block, Gate, make  # noqa: E402

pytestmark = [pytest.mark.torch]

_RUNS: dict = {}


def battery(n):
    """Every check at world size n, launched once per pytest run: ({check: row}, facts, seconds, bugs)."""
    if n not in _RUNS:
        out = launch(n, "tests.torch_engines_ranks:battery", backend="torch", quiet=True, watchdog=120,
                     bugs=(n == 2))
        _RUNS[n] = out.results[0]
    return _RUNS[n]


def assert_rows(n, prefix, least):
    rows = {k: r for k, r in battery(n)[0].items() if k.startswith(prefix)}
    bad = [f"{k}: error {r['error']:.3g} > {r['tolerance']:g}" for k, r in rows.items() if not r["ok"]]
    assert not bad, "\n".join(bad)
    assert len(rows) >= least, sorted(rows)
    return rows


# --------------------------------------------------------------------------- the engines, on ranks


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_one_process_torch_ddp_and_its_bytes(n):
    rows = assert_rows(n, "DDP ", 16)
    assert rows["DDP gpt: == torch DistributedDataParallel"]["tolerance"] == (0.0 if n == 2 else 1e-12)
    facts = battery(n)[1]
    assert facts["unused"] == 0.0 and facts["frozen_none"] and facts["slots"] == facts["trainable"]


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_sharded_optimizer_matches_one_process_zero_redundancy_optimizer_and_its_bytes(n):
    rows = assert_rows(n, "ShardedOptimizer ", 20)
    assert rows["ShardedOptimizer gpt zero=1: Adam == DDP + Adam on every parameter"]["tolerance"] == 0.0  # bitwise


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_fsdp_matches_one_process_fsdp2_its_bytes_and_the_zero3_ledger(n):
    rows = assert_rows(n, "FSDP ", 27)
    assert any("bf16" in k and "FSDP2" in k for k in rows)


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_parallelize_matches_one_process_dtensor_and_its_bytes(n):
    assert_rows(n, "TP ", 8)


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2])
def test_a_world_of_one_is_a_no_op_said_once(n):
    assert_rows(n, "world of 1", 2)


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_each_planted_bug_fails_a_named_check():
    """Each planted bug (a subclass of the engine, or a patched function: tests/torch_engines_ranks.py)
    fails the checks named here, and those checks pass on the engines themselves."""
    caught = battery(2)[3]
    expected = {
        "tied weight all-reduced twice": "DDP gpt buckets=per parameter: traffic == formula, each parameter once",
        "bucket flushed before its last gradient": "DDP gpt buckets=0.004 MiB: every bucket flushed after its last gradient",
        "FSDP unit freed before its backward": "FSDP gpt: == one process",
        "gradient left in fp16": "FSDP gpt bf16: traffic == formula (gathers bf16, reduce-scatter fp32)",
        "rowwise layer without its all-reduce": "TP gpt: logits == one process",
    }
    rows = battery(2)[0]
    for bug, check in expected.items():
        assert check in caught[bug], f"{bug}: {check!r} did not fail (failed: {caught[bug]})"
        assert rows[check]["ok"], f"{check} fails without the bug"


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_the_overlap_benchmark_writes_one_record_per_engine():
    from minipar.bench.torch_engines import table

    records = battery(2)[1]["bench"]
    assert [r["engine"] for r in records] == ["minipar", "torch"]
    for r in records:
        assert 0 <= r["done"] <= r["started"] <= 1 and r["step_s"] > 0 and r["exposed_s"] >= 0, r
    assert table(records).splitlines()[1].startswith("minipar")


def _user_group(rank, world, port, path):
    from tests.torch_engines_ranks import user_group

    user_group(rank, world, port, path)


@pytest.mark.timeout(240)
def test_inside_a_process_group_the_script_made(tmp_path):
    """torch.multiprocessing + dist.init_process_group("gloo"), no minipar.init: every engine with
    comm=None. ``start_processes(start_method="fork")`` is ``mp.spawn`` whose children inherit this
    process's imports instead of importing torch again (about 15 s less on 2 loaded cores)."""
    mp = pytest.importorskip("torch.multiprocessing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_user_group, args=(2, port, str(tmp_path / "rows")), nprocs=2, start_method="fork")
    for rank in range(2):
        rows = pickle.loads((tmp_path / f"rows.{rank}").read_bytes())
        bad = [f"rank {rank} {r['what']}: {r['error']:.3g}" for r in rows if not r["ok"]]
        assert len(rows) == 4 and not bad, bad


# --------------------------------------------------------------------------- bad input, in this process


def _one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_bad_input_fails_in_one_line_before_any_step():
    from minipar.torch import DistributedDataParallel, FullyShardedDataParallel, ShardedOptimizer

    with pytest.raises(UsageError) as e:
        DistributedDataParallel(torch.nn.ReLU())
    _one_line(e, "no parameters")
    with pytest.raises(UsageError) as e:
        FullyShardedDataParallel(make("gpt"), units=(torch.nn.Conv2d,))
    _one_line(e, "matches no submodule")
    with pytest.raises(UsageError) as e:
        FullyShardedDataParallel(make("gpt"), units=(Block,), compute_dtype=torch.int8)
    _one_line(e, "not a floating-point")
    for bad in ("adam", torch.nn.Linear, torch.optim.Adam(make("awkward").parameters())):
        with pytest.raises(UsageError) as e:
            ShardedOptimizer(make("awkward").parameters(), bad, lr=1e-3)
        _one_line(e, "not a torch.optim.Optimizer class")


def test_no_process_group_fails_in_one_line():
    import torch.distributed as dist

    from minipar.torch import DistributedDataParallel, ShardedOptimizer, parallelize

    if dist.is_initialized():
        pytest.skip("this pytest process has a process group")
    for make_engine in (lambda m: DistributedDataParallel(m), lambda m: ShardedOptimizer(m.parameters(), torch.optim.SGD, lr=1),
                        lambda m: parallelize(m, {"blocks.0.mlp.fc": "colwise"})):
        with pytest.raises(UsageError) as e:
            make_engine(make("gpt"))
        _one_line(e, "not initialised", "init_process_group")


def test_a_plan_that_does_not_fit_fails_in_one_line():
    from minipar.torch import parallelize

    two = types.SimpleNamespace(backend="torch", size=2, rank=0)  # checked before any message
    cases = [({"blocks.0.attn": "colwise"}, "not an nn.Linear"), ({"nothing.here": "rowwise"}, "not a submodule"),
             ({"blocks.0.mlp.fc": "diagonal"}, "choose one of"), ({}, "at least one")]
    for plan, words in cases:
        with pytest.raises(UsageError) as e:
            parallelize(make("gpt"), plan, two)
        _one_line(e, words)
    with pytest.raises(UsageError) as e:
        parallelize(make("awkward"), {"inp": "colwise"}, two)  # out_features 7
    _one_line(e, "not divisible")


# --------------------------------------------------------------------------- pure parts


def test_owners_follow_torch_largest_first_to_the_least_loaded():
    from minipar.torch.optim import owners

    assert owners([10, 30, 20, 30], 2) == [1, 0, 0, 1]  # 30 -> 0, 30 -> 1, 20 -> 0, 10 -> 1
    assert owners([5], 3) == [0]
    sizes = [p.numel() for p in GPT().parameters()]
    loads = [sum(s for s, o in zip(sizes, owners(sizes, 3)) if o == r) for r in range(3)]
    assert max(loads) - min(loads) <= max(sizes)


def test_ring_bytes_is_what_the_ring_sends():
    from minipar.torch.group import ring_bytes
    from minipar.xp import chunk_bounds

    for n, p in [(10, 3), (7, 2), (2, 3), (12, 4)]:
        sizes = [b - a for a, b in chunk_bounds(n, p)]
        for r in range(p):
            sent_rs = sum(sizes[(r - s - 1) % p] for s in range(p - 1))  # ring_steps' reduce-scatter sends
            sent_ag = sum(sizes[(r - s) % p] for s in range(p - 1))  # and its all-gather
            assert ring_bytes(n, p, r, 8) == 8 * (sent_rs + sent_ag)
            assert ring_bytes(n, p, r, 4, ("all-gather",)) == 4 * sent_ag
    assert ring_bytes(100, 1, 0, 8) == 0


def test_units_outermost_match_by_class_or_predicate():
    from minipar.torch.fsdp import compute_dtype_of, find_units

    model = make("awkward")
    assert [n for n, _ in find_units(model, (Gate,))] == ["gate1", "gate2"]
    assert [n for n, _ in find_units(model, lambda m: isinstance(m, (Gate, torch.nn.Linear)))] == \
        ["inp", "frozen", "gate1", "gate2", "tied_a", "tied_b", "out"]
    assert [n for n, _ in find_units(make("gpt"), (Block, torch.nn.Linear))] == ["blocks.0", "blocks.1", "head"]
    assert compute_dtype_of("bfloat16") is torch.bfloat16 and compute_dtype_of(None) is None
