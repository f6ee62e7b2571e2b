"""Lesson 05's features x the representative grids, on 8 ranks, against one process.

Every feature of ``minipar train`` (bf16, ``--clip``, ``--dropout``, ZeRO-2, ZeRO-3; fp16 on a
subset, NumPy's float16 loops being slow) runs on every dp x pp x tp = 8 factorization with
1f1b, on dp2 pp2 tp2 with every schedule, on one cp2 grid and on one grid of experts: each
(grid, feature) its own run, every row named by its feature (``minipar.lessons.train_matrix``).
One launch trains them all (the short model, 2 steps); a test per feature reads its rows. A
second, 4-rank launch plants one bug per feature and requires the feature's named check to fail.

bf16 experts run on pp1: past a pipeline boundary their routing is not one process's (docs/train.md,
"16-bit experts"); with float64 features the experts grid is pipelined.
"""
import pytest

from minipar import launch
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, SHORT, label, make_config
from minipar.lessons.train_matrix import FEATURES

ALL = ("bf16", "clip", "dropout", "zero2", "zero3")
FACTORIZATIONS = [  # every dp x pp x tp = 8, 1f1b where pipelined
    dict(dp=8, pp=1, tp=1), dict(dp=4, pp=2, tp=1), dict(dp=4, pp=1, tp=2), dict(dp=2, pp=4, tp=1),
    dict(dp=2, pp=2, tp=2), dict(dp=2, pp=1, tp=4), dict(dp=1, pp=8, tp=1), dict(dp=1, pp=4, tp=2),
    dict(dp=1, pp=2, tp=4), dict(dp=1, pp=1, tp=8)]
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
FP16 = {(2, 2, 2), (1, 4, 2)}  # and the cp grid (not dp8: see docs/train.md, "fp16 and dp")
ZERO0 = {(2, 2, 2)}  # and the cp grid: ZeRO-0 beside ZeRO-2 and 3 (test_train_grids: ZeRO-0 = one process on each)


def grid(model=SHORT, schedule="1f1b", **kw):
    """A grid with as few layers as its pipeline allows (2; pp; interleaved 2 chunks a stage: 2 pp),
    m = 2 micro-batches when pipelined."""
    pp = kw.get("pp", 1)
    layers = max(2, pp) * (2 if schedule == "interleaved" else 1)
    return dict(kw, model=dict(model, n_layers=layers), **(dict(schedule=schedule, microbatches=2) if pp > 1 else {}))


def features(g):
    key = (g["dp"], g["pp"], g["tp"])  # ZeRO-0 first: the ZeRO runs compare with it
    return (("fp64",) if key in ZERO0 else ()) + ALL + (("fp16",) if key in FP16 else ())


CASES = (
    [(grid(**g), features(g)) for g in FACTORIZATIONS]
    + [(grid(dp=2, pp=2, tp=2, schedule=s), ALL) for s in SCHEDULES if s != "1f1b"]
    + [(grid(dp=2, pp=1, cp=2, tp=2), ("fp64",) + ALL + ("fp16",))]
    + [(grid(model=MOE, dp=2, pp=2, tp=2), tuple(f for f in ALL if f != "bf16")),
       (grid(model=MOE, dp=4, pp=1, tp=2, microbatches=2), ("bf16",))])


def grids_of(feature, cases=CASES):
    return [g for g, features in cases if feature in features]


def test_the_matrix_covers_every_factorization_schedule_cp_and_experts_for_every_feature():
    eight = sorted((d, p, t) for d in (1, 2, 4, 8) for p in (1, 2, 4, 8) for t in (1, 2, 4, 8) if d * p * t == 8)
    for f in ALL:
        mine = grids_of(f)
        plain = [g for g in mine if g.get("cp", 1) == 1 and not g["model"].get("n_experts")]
        assert sorted((g["dp"], g["pp"], g["tp"]) for g in plain if g.get("schedule", "1f1b") == "1f1b") == eight, f
        assert {g["schedule"] for g in plain if (g["dp"], g["pp"], g["tp"]) == (2, 2, 2)} == set(SCHEDULES), f
        assert sum(1 for g in mine if g["model"].get("n_experts")) == 1, f
        assert sum(1 for g in mine if g.get("cp", 1) == 2) == 1, f
        assert all(g["dp"] * g["pp"] * g.get("cp", 1) * g["tp"] == 8 for g in mine), f
    assert len(grids_of("fp16")) == len(FP16) + 1 and len(grids_of("fp64")) == len(ZERO0) + 1


@pytest.fixture(scope="module")
def matrix():
    out = launch(8, "minipar.lessons.train_matrix:check_matrix", quiet=True, job_timeout=400, cases=CASES, steps=2)
    return merge_rows(out.results)


@pytest.mark.mpi
@pytest.mark.timeout(420)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_every_grid_trains_like_one_process_with(matrix, feature):
    rows = [r for r in matrix if r["feature"] == feature]
    wanted = {"clip": ["gradient norm of every step"], "dropout": ["masks drawn"], "zero2": ["dp bytes per step"],
              "zero3": ["dp bytes per step", "all-gathers per step"], "bf16": ["vs one float64 process", "bytes per "],
              "fp16": ["every rank skipped", "bytes per "]}.get(feature, [])
    for g, features in CASES:  # each run answered its feature's checks
        if feature in features:
            what = f"{feature}: {label(make_config(**dict(g, steps=2, **FEATURES[feature])))}: "
            mine = [r["what"][len(what):] for r in rows if r["what"].startswith(what)]
            zero0 = ["losses = ZeRO-0's"] if "fp64" in features and feature.startswith("zero") else []
            for check in ["losses of 2 steps", "parameters after", "= zero_bytes"] + wanted + zero0:
                assert any(check in m for m in mine), (what, check, mine)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


# one planted bug per feature (minipar.train.mutants), planted only in that feature's runs, and the check it fails
MUTANTS = {
    "bf16": ("main_grad_16_bit", "bytes per parameter"),
    "fp16": ("main_grad_16_bit", "bytes per parameter"),
    "clip": ("clip_replicated_per_tp", "gradient norm of every step"),
    "dropout": ("dropout_shared_in_tp", "losses of 2 steps"),
    "zero2": ("zero_reduce_per_microbatch", "dp bytes per step"),
    "zero3": ("zero_reduce_per_microbatch", "dp bytes per step"),
}


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_planted_bug_of_each_feature_fails_its_named_check():
    cheap = dict(model=SHORT, dp=2, pp=1, tp=2, microbatches=2)  # tp for the norm and the masks, dp x m for ZeRO
    out = launch(4, "minipar.lessons.train_matrix:check_matrix", quiet=True, job_timeout=170, steps=2,
                 cases=[(cheap, tuple(MUTANTS))], mutants={f: m for f, (m, _) in MUTANTS.items()})
    rows = merge_rows(out.results)
    for feature, (_, check) in MUTANTS.items():
        named = [r for r in rows if r["feature"] == feature and check in r["what"]]
        assert named and not any(r["ok"] for r in named), (feature, named)
