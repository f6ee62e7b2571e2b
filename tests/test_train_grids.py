"""Lesson 05 on real ranks: every grid trains with one process's losses, and the accounting holds.

Covering design, one 8-rank job: every factorization dp x pp x tp = 8, every schedule on a
pipelined grid (pp = 2, 4 and 8: interleaved needs layers % (2 pp), so not pp = 8), sequence
parallelism on and off, each recompute mode and ZeRO-1 each appear; then 1, 2, 3, 4 and 6 ranks
with odd shapes (6 layers over 3 stages, 6 heads over 3 TP ranks, a ZeRO shard with padding).

Context parallelism (cp = 2, 3, 4) with pp and tp on 4, 6 and 8 ranks, ring and Ulysses, each
recompute mode, SP, ZeRO-1, each schedule; experts over dp = 2, 3, 4 with pp, tp, drops
(capacity factor 0.5), full recomputation and ZeRO-1. They ride in the launches above.
"""
import pytest

from minipar import launch
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, ODD, SHORT

GRIDS_8 = [
    dict(dp=8, pp=1, tp=1, microbatches=2, zero=1),
    dict(dp=1, pp=8, tp=1, schedule="1f1b", microbatches=2),
    dict(dp=1, pp=1, tp=8, sequence_parallel=True, recompute="full"),
    dict(dp=4, pp=2, tp=1, schedule="gpipe", microbatches=2, recompute="selective"),
    dict(dp=4, pp=1, tp=2, sequence_parallel=True, recompute="selective", zero=1),
    dict(dp=2, pp=4, tp=1, schedule="zb-h1", microbatches=2, recompute="full"),
    dict(dp=1, pp=4, tp=2, schedule="interleaved", microbatches=4, sequence_parallel=True),
    dict(dp=2, pp=1, tp=4, recompute="full"),
    dict(dp=1, pp=2, tp=4, schedule="interleaved", microbatches=2, sequence_parallel=True, recompute="selective"),
    dict(dp=2, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True, recompute="full", zero=1),
]
MORE_SCHEDULES = [  # so that every schedule runs on pp = 2, 4 and 8 (interleaved: 2 and 4)
    dict(dp=2, pp=2, tp=2, schedule="1f1b", microbatches=4),
    dict(dp=1, pp=8, tp=1, schedule="zb-h1", microbatches=2, recompute="selective"),
    dict(dp=1, pp=8, tp=1, schedule="gpipe", microbatches=1, zero=1),
    dict(dp=1, pp=4, tp=2, schedule="gpipe", microbatches=2),
    dict(dp=2, pp=4, tp=1, schedule="1f1b", microbatches=2, sequence_parallel=False),
]
ODD_SIZES = [
    dict(dp=1, pp=1, tp=1, microbatches=4, recompute="selective"),
    dict(dp=1, pp=2, tp=1, schedule="interleaved", microbatches=2),
    dict(model=ODD, batch=12, dp=1, pp=3, tp=1, schedule="1f1b", microbatches=3),
    dict(model=ODD, batch=12, dp=3, pp=1, tp=1, zero=1),
    dict(model=ODD, batch=12, dp=1, pp=1, tp=3, sequence_parallel=True, recompute="full"),
    dict(dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=4, sequence_parallel=True),
    dict(model=ODD, batch=12, dp=2, pp=3, tp=1, schedule="zb-h1", microbatches=2, zero=1),
    dict(model=ODD, batch=12, dp=1, pp=2, tp=3, schedule="1f1b", microbatches=2, recompute="selective"),
]

ODD2 = dict(ODD, n_layers=2)
CP_GRIDS = [  # the sequence split over cp, with the other axes
    dict(model=SHORT, dp=1, pp=2, cp=2, tp=2, schedule="1f1b", microbatches=2, sequence_parallel=True),
    dict(model=SHORT, dp=2, pp=1, cp=2, tp=2, cp_attention="ulysses", recompute="selective"),
    dict(model=SHORT, dp=1, pp=2, cp=4, tp=1, schedule="zb-h1", microbatches=2, recompute="full", zero=1),
    dict(model=SHORT, dp=2, pp=2, cp=2, tp=1, schedule="interleaved", microbatches=2),
    dict(model=SHORT, dp=1, pp=2, cp=2, tp=1, schedule="gpipe", microbatches=2, cp_attention="ulysses"),
    dict(model=ODD2, batch=12, dp=1, pp=1, cp=3, tp=2, cp_attention="ulysses", sequence_parallel=True),
]
EP_GRIDS = [  # every MLP a mixture of experts, sharded over dp
    dict(model=dict(MOE, capacity_factor=0.5), dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2, zero=1),
    dict(model=dict(MOE, n_experts=8, top_k=1, capacity_factor=1.0), dp=4, pp=2, tp=1, schedule="interleaved",
         microbatches=2, recompute="full"),
    dict(model=dict(ODD2, n_experts=6, top_k=2), batch=12, dp=3, pp=1, tp=1),
]


def test_cp_and_ep_grids_cover_their_combinations():
    assert {c["cp"] for c in CP_GRIDS} == {2, 3, 4} and {c["dp"] for c in EP_GRIDS} == {2, 3, 4}
    assert {c["cp"] * c["dp"] * c["pp"] * c["tp"] for c in CP_GRIDS} == {4, 6, 8}
    assert any(c["pp"] > 1 and c["tp"] > 1 for c in CP_GRIDS) and any(c["pp"] > 1 and c["tp"] > 1 for c in EP_GRIDS)
    assert {c.get("cp_attention", "ring") for c in CP_GRIDS} == {"ring", "ulysses"}
    assert {c.get("recompute", "none") for c in CP_GRIDS} == {"none", "selective", "full"}
    assert {c.get("schedule") for c in CP_GRIDS if c["pp"] > 1} == {"gpipe", "1f1b", "interleaved", "zb-h1"}
    assert any(c.get("sequence_parallel") for c in CP_GRIDS) and any(c.get("zero") for c in CP_GRIDS + EP_GRIDS)


def _failures(rows):
    return [r for r in rows if not r["ok"]]


def _check(configs):
    out = launch(8, "minipar.lessons.train:check_grids", quiet=True, job_timeout=900, configs=configs, steps=5)
    rows = merge_rows(out.results)
    assert len(rows) >= 3 * len(configs)
    assert not _failures(rows), _failures(rows)


@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_every_8_rank_factorization_trains_like_one_process():
    assert sorted((c["dp"], c["pp"], c["tp"]) for c in GRIDS_8) == sorted(
        (d, p, t) for d in (1, 2, 4, 8) for p in (1, 2, 4, 8) for t in (1, 2, 4, 8) if d * p * t == 8)
    _check(GRIDS_8 + CP_GRIDS[:4])  # and context parallelism on 8 ranks


@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_every_schedule_on_every_pipeline_depth():
    pipelined = GRIDS_8 + MORE_SCHEDULES
    for pp in (2, 4, 8):
        want = {"gpipe", "1f1b", "zb-h1"} | ({"interleaved"} if pp < 8 else set())
        assert {c["schedule"] for c in pipelined if c["pp"] == pp} == want
    _check(MORE_SCHEDULES + EP_GRIDS[:2])  # and experts over dp on 8 ranks


@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_1_2_3_4_and_6_ranks_with_odd_shapes():
    assert {c["dp"] * c["pp"] * c["tp"] for c in ODD_SIZES} == {1, 2, 3, 4, 6}
    _check(ODD_SIZES + CP_GRIDS[4:] + EP_GRIDS[2:])  # and cp on 4 and 6 ranks (cp = 3), experts on 3


ACCOUNTED = [
    dict(dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2),
    dict(dp=1, pp=2, tp=4, schedule="zb-h1", microbatches=2, sequence_parallel=True),
    dict(dp=2, pp=4, tp=1, schedule="interleaved", microbatches=4, recompute="selective"),
    dict(dp=1, pp=4, tp=2, schedule="zb-h1", microbatches=4, recompute="full", zero=1),
    dict(dp=1, pp=2, tp=4, schedule="gpipe", microbatches=2, sequence_parallel=True, recompute="full"),
    dict(dp=1, pp=2, tp=4, schedule="1f1b", microbatches=4, sequence_parallel=True, recompute="selective"),
    dict(dp=4, pp=1, tp=2, microbatches=2, zero=1),
    CP_GRIDS[0],  # the ring's K/V bytes per layer per micro-batch, with SP and pp
    CP_GRIDS[2],  # full recomputation runs the ring forward twice; zb-h1 keeps the gradients for W
    dict(CP_GRIDS[1], microbatches=2),  # Ulysses' all-to-alls
]
# the same formulas in 16 bits (2 bytes an element; float32 for the cross-entropy's all-reduces and
# the dp and emb sums of main_grad): every schedule, SP on and off, each recompute mode, ZeRO-1, 2
# and 3, the ring's K/V, bf16 and fp16
ACCOUNTED_16 = [
    dict(ACCOUNTED[0], precision="bf16", zero=3),
    dict(ACCOUNTED[1], precision="fp16"),
    dict(ACCOUNTED[2], precision="bf16", zero=2),
    dict(ACCOUNTED[4], precision="fp16", zero=1),
    dict(ACCOUNTED[7], precision="bf16"),
]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_activation_memory_and_traffic_equal_the_formulas():
    assert {c["precision"] for c in ACCOUNTED_16} == {"bf16", "fp16"} and {c.get("zero") for c in ACCOUNTED_16} >= {1, 2, 3}
    assert {c.get("schedule") for c in ACCOUNTED_16} >= {"gpipe", "1f1b", "interleaved", "zb-h1"}
    assert {c.get("recompute", "none") for c in ACCOUNTED_16} == {"none", "selective", "full"}
    configs = ACCOUNTED + ACCOUNTED_16
    out = launch(8, "minipar.lessons.train:check_accounting", quiet=True, job_timeout=600, configs=configs)
    rows = merge_rows(out.results)
    assert len(rows) == 5 * len(configs) + sum(1 for c in configs if c.get("cp", 1) > 1)  # + the cp bytes
    assert not _failures(rows), _failures(rows)


# each planted bug, and the named check that must catch it
MUTANTS = [
    ("tied_not_summed", "grids", dict(dp=1, pp=2, tp=1, microbatches=2), "tied embedding bitwise equal"),
    ("dp_sync_per_microbatch", "accounting", dict(dp=2, pp=2, tp=1, microbatches=2), "dp bytes per step"),
    ("local_max", "grids", dict(dp=1, pp=1, tp=2), "losses of"),
    ("dp_wrong_axis", "grids", dict(dp=2, pp=1, tp=2), "losses of"),
    ("selective_keeps_probs", "accounting", dict(dp=1, pp=2, tp=2, microbatches=2, recompute="selective"),
     "activation bytes at the peak"),
    # context and expert parallelism (2 steps: enough for a wrong gradient to show)
    ("cp_grads_not_summed", "grids", dict(model=SHORT, dp=1, pp=1, cp=2, tp=1), "replicas bitwise equal", 2),
    ("cp_position_offset", "grids", dict(model=SHORT, dp=1, pp=1, cp=2, tp=1), "losses of", 2),
    ("cp_gathered_kv", "accounting", dict(model=SHORT, dp=1, pp=1, cp=2, tp=2), "cp bytes per step"),
    ("cp_gathered_kv", "accounting", dict(model=SHORT, dp=1, pp=1, cp=2, tp=2), "activation bytes at the peak"),
    ("experts_averaged", "grids", dict(model=MOE, dp=2, pp=1, tp=1), "parameters after the last step", 2),
    ("experts_everywhere", "grids", dict(model=MOE, dp=2, pp=1, tp=1), "holds E/dp", 2),
    ("recompute_counted", "grids", dict(model=MOE, dp=2, pp=1, tp=1, microbatches=2, recompute="full"),
     "tokens per expert", 2),
    # 16 bits: a tensor kept in float32, a reduction in 16 bits where the formula says float32
    ("activation_in_float32", "accounting", dict(dp=1, pp=2, tp=2, microbatches=2, precision="bf16"),
     "activation bytes at the peak"),
    ("loss_in_compute_dtype", "accounting", dict(dp=1, pp=2, tp=2, microbatches=2, precision="fp16"),
     "tp bytes per step"),
]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_each_planted_bug_is_caught_by_its_check():
    cases = {(m, kind, str(cfg)): (m, kind, cfg, *steps) for m, kind, cfg, _, *steps in MUTANTS}  # each run once
    out = launch(4, "minipar.lessons.train:check_mutants", quiet=True, job_timeout=600, cases=list(cases.values()))
    rows = merge_rows(out.results)
    for mutant, _, _, check, *_ in MUTANTS:
        named = [r for r in rows if r["what"].startswith(mutant + ":") and check in r["what"]]
        assert named and not any(r["ok"] for r in named), (mutant, named)
