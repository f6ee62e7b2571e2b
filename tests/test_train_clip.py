"""Lesson 05 with ``--clip``: the global gradient norm counts every parameter once on every grid.

The one-process reference clips as torch's ``clip_grad_norm_``; every grid must give its losses,
parameters and per-step norms (1e-12), on grids that hold each kind of parameter the sum over ranks
could count twice: whole on every TP rank (LayerNorms, row-parallel biases), the tied embedding on
two stages, DDP replicas, ZeRO-1, 2 and 3 shards, cp ranks, experts over dp. Each planted bug of
the norm must fail those checks: replicated parameters counted tp times, the tied weight twice, a
DDP replica's average dp times, the pp sum missing, clipping before the DP average, ZeRO shards
not summed over dp, one rank stepping unclipped.
"""
import math

import numpy as np
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, SHORT, label, make_config
from minipar.optim import clip_grad_norm
from minipar.train.config import check_shapes
from minipar.train.reference import train_reference

CLIP = 0.5  # the reference's norms are 1.3 to 2.1 on these steps: every step clips
# --clip-norm-type inf: the largest |element| over every rank, 0.15 to 0.23 on these steps
INF = dict(clip=0.1, clip_norm_type=math.inf)
GRIDS = [
    dict(model=SHORT, dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2),  # tp, and the tied embedding on 2 stages
    dict(model=SHORT, dp=2, pp=1, tp=2),  # DDP replicas x TP
    dict(model=SHORT, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2, zero=1),  # ZeRO-1 shards, pp
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, sequence_parallel=True),  # cp replicas, SP LayerNorms
    dict(model=MOE, dp=2, pp=1, tp=2),  # 4 experts over dp 2, replicated over tp
    dict(model=MOE, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2, zero=1),  # experts, ZeRO-1, tied
    dict(model=SHORT, dp=2, pp=1, tp=2, zero=3),  # FSDP x TP: gradient shards summed over dp, TP shards over tp
    dict(model=SHORT, dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, **INF),  # the max over tp and pp
]
# each planted bug of the norm, a grid where it matters, and the checks it must fail
MUTANTS = [
    ("clip_replicated_per_tp", dict(model=SHORT, dp=1, pp=1, tp=2), ("gradient norm", "losses of", "parameters")),
    ("clip_tied_twice", dict(model=SHORT, dp=1, pp=2, tp=1), ("gradient norm", "losses of", "parameters")),
    ("clip_every_replica", dict(model=SHORT, dp=2, pp=1, tp=1), ("gradient norm", "losses of", "parameters")),
    ("clip_skipped_on_one_rank", dict(model=SHORT, dp=2, pp=1, tp=1), ("losses of", "parameters", "replicas")),
    ("clip_pp_sum_missing", dict(model=SHORT, dp=1, pp=2, tp=1, schedule="1f1b", microbatches=2),
     ("gradient norm", "losses of", "parameters")),
    ("clip_before_dp_average", dict(model=SHORT, dp=2, pp=1, tp=1), ("gradient norm", "losses of", "parameters")),
    ("clip_zero_shards_not_summed", dict(model=SHORT, dp=2, pp=1, tp=2, zero=3), ("gradient norm", "losses of", "parameters")),
    ("clip_inf_summed", dict(model=SHORT, dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, **INF),
     ("gradient norm", "losses of", "parameters")),
]


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_clip_grad_norm_is_torchs(norm_type):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    for max_norm in (0.3, 100.0):  # clips; does not
        grads = [rng.standard_normal(s) for s in ((3, 4), (7,), (2, 2, 5))]
        tensors = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
        for t, g in zip(tensors, grads):
            t.grad = torch.from_numpy(g.copy())
        want = float(torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type=norm_type))
        got = clip_grad_norm(grads, max_norm, norm_type)
        assert got == pytest.approx(want, rel=1e-15)
        for t, g in zip(tensors, grads):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-15, atol=0)


def test_the_reference_clips_and_reports_the_norm():
    norms = []
    clipped, _ = train_reference(make_config(model=SHORT, steps=3, clip=CLIP), norms=norms)
    free, _ = train_reference(make_config(model=SHORT, steps=3))
    assert len(norms) == 3 and min(norms) > CLIP
    assert clipped[0] == free[0] and clipped[1:] != free[1:]  # the first loss is before any step


@pytest.mark.parametrize("clip", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_a_clip_that_is_not_a_positive_number_is_refused(clip):
    with pytest.raises(UsageError, match="--clip"):
        check_shapes(make_config(model=SHORT, clip=clip), 1)


@pytest.mark.parametrize("norm_type", [1.0, 3.0, -math.inf, float("nan"), True])
def test_a_clip_norm_other_than_2_or_inf_is_refused(norm_type):
    with pytest.raises(UsageError, match="--clip-norm-type") as err:
        check_shapes(make_config(model=SHORT, clip=1.0, clip_norm_type=norm_type), 1)
    assert "\n" not in str(err.value)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_every_grid_clips_like_one_process():
    configs = [dict(dict(clip=CLIP), **c) for c in GRIDS]
    out = launch(4, "minipar.lessons.train:check_grids", quiet=True, job_timeout=110, configs=configs, steps=3)
    rows = merge_rows(out.results)
    for c in configs:  # every grid compared its norms and clipped
        mine = [r["what"] for r in rows if r["what"].startswith(label(make_config(**c)) + ":")]
        assert any("gradient norm of every step" in w for w in mine) and any("first step clipped" in w for w in mine), c
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_each_planted_bug_of_the_norm_breaks_the_equality():
    cases = [(m, "grids", dict(dict(clip=CLIP), **cfg), 3) for m, cfg, _ in MUTANTS]
    out = launch(4, "minipar.lessons.train:check_mutants", quiet=True, job_timeout=110, cases=cases)
    rows = merge_rows(out.results)
    for mutant, _, checks in MUTANTS:
        for check in checks:
            named = [r for r in rows if r["what"].startswith(mutant + ":") and check in r["what"]]
            assert named and not any(r["ok"] for r in named), (mutant, check, named)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_the_notebooks_clip_run_equals_one_process_and_names_each_bug():
    """Notebook 05's clipping section (``figures.train_features.clip_runs``): the grid's norms are one
    process's, each bug of the count gives another norm; a "bug" that leaves the norm alone
    (dropout's, without dropout) fails its "caught" row."""
    bugs = ("clip_replicated_per_tp", "clip_every_replica", "dropout_shared_in_tp")
    out = launch(4, "minipar.figures.train_features:clip_runs", quiet=True, job_timeout=110, steps=1,
                 grid=(2, 1, 2, "1f1b", False), bugs=bugs)
    rows = merge_rows([r["rows"] for r in out.results])
    assert len(rows) == 4, rows
    by = {b: [r for r in rows if b in r["what"]] for b in bugs}
    assert rows[0]["ok"] and "= one process's" in rows[0]["what"], rows
    assert by["clip_replicated_per_tp"][0]["ok"] and by["clip_every_replica"][0]["ok"], rows
    assert not by["dropout_shared_in_tp"][0]["ok"], rows
    norms = out.results[0]["norms"]
    assert norms["the grid"] == pytest.approx(norms["one process"], rel=1e-12)
