"""ZeRO-3 / FSDP at scale: its traffic per step by link level, the prefetch that hides it (as far
as the compute lasts and the engine's live-parameter bound lets it start), what each engine
holds live, and Narayanan et al. 2021's ZeRO-3 rows (Table 2) with DeepSpeed's conventions."""
from __future__ import annotations

import numpy as np
import pytest

from minipar.errors import UsageError
from minipar.plan import timing
from minipar.plan import validation as V
from minipar.plan.config import Config, Configs, Problem
from minipar.plan.hardware import preset
from minipar.plan.memory import memory
from minipar.plan.models import model
from minipar.plan.search import search
from minipar.plan.timing import prefetch_share, stage_times, zero3_traffic

A100 = preset("a100-80gb")
GPT3, M530 = model("gpt3-175b"), model("megatron-530b")


def _z3(m, gpus, tp, engine, recompute="full", microbatches=1, batch=None):
    prob = Problem(m, gpus, 8, A100, batch or gpus // tp * microbatches, engine=engine)
    cfg = Configs.of([Config(tp=tp, dp=gpus // tp, zero=3, microbatches=microbatches, recompute=recompute)])
    return prob, cfg


@pytest.mark.parametrize("recompute,gathers", [("full", 3), ("selective", 2)])
def test_every_gathered_parameter_crosses_once_per_forward_backward_and_recompute(recompute, gathers):
    """Per micro-batch a GPU's parameters psi are gathered ``gathers`` times (bp bytes each) and
    their gradients reduce-scattered once (bg): DeepSpeed's flat ring sends (n-1)/n of it all across
    nodes; FSDP's two levels (k = 8 of the group per node) (k-1)/k inside and (nodes-1)/nodes / k
    across. A count without the recomputed forward's gather, or the two-level split for DeepSpeed,
    is rejected."""
    n, psi = 1536, GPT3.params()
    for engine in ("deepspeed", "fsdp"):
        prob, cfg = _z3(GPT3, n, 1, engine, recompute, microbatches=2)
        intra, inter = zero3_traffic(prob, cfg, psi, np.array(gathers))
        total = 2 * (gathers * 2 + 2) * psi  # 2 micro-batches, 16-bit weights and gradients
        if engine == "deepspeed":
            assert (intra[0], inter[0]) == (0, pytest.approx(total * (n - 1) / n))
        else:
            assert intra[0] == pytest.approx(total * 7 / 8) and inter[0] == pytest.approx(total / 8 * 191 / 192)
        wrong = 2 * ((gathers - 1) * 2 + 2) * psi * (n - 1) / n
        assert inter[0] != pytest.approx(wrong)
    st = stage_times(*_z3(GPT3, n, 1, "deepspeed", recompute))
    assert st["zero3_inter_bytes"][0] == pytest.approx((gathers * 2 + 2) * st["psi"][0] * (n - 1) / n)


def test_the_prefetch_hides_the_gathers_only_behind_the_compute(monkeypatch):
    """Per block: exposed = link - min(compute, share x link). GPT-3 at tp 1 under DeepSpeed
    (share 1: every module prefetched) at micro-batch 1 on 1536 GPUs, each rank's own link: link >
    compute, exactly the blocks' compute is hidden; without a prefetch all of the link time (3
    gathers + 1 reduce-scatter per block) is exposed. On one node (compute > link) all is hidden."""
    prob, cfg = _z3(GPT3, 1536, 1, "deepspeed")
    st = stage_times(prob, cfg)
    L, block_bytes = GPT3.layers, 2 * st["psi"] / GPT3.layers
    link = L * (3 * timing.zero3_collective(prob, cfg, block_bytes, "all_gather")
                + timing.zero3_collective(prob, cfg, block_bytes, "reduce_scatter"))
    blocks_compute = st["compute"] - (st["head_f"] + st["head_b"])  # tp = 1: no TP comm to hide behind
    assert st["zero3_gathers"][0] == pytest.approx(link[0] - blocks_compute[0])
    monkeypatch.setattr(timing, "prefetch_share", lambda prob, cfg: (np.zeros(len(cfg)), np.zeros(len(cfg))))
    assert stage_times(prob, cfg)["zero3_gathers"][0] == pytest.approx(link[0])
    monkeypatch.undo()
    assert stage_times(*_z3(GPT3, 8, 1, "deepspeed", microbatches=64))["zero3_gathers"][0] == 0


def test_deepspeeds_live_bound_limits_what_it_can_prefetch():
    """DeepSpeed prefetches the next module only while fewer than 1e9 parameters are live. GPT-3
    (h = 12288): every Linear is under 1e9 at tp 1, all prefetched. The 530B model (h = 20480):
    QKV 3h^2 and both MLP layers 4h^2 exceed it; forward, only the first MLP layer (after the
    small projection) is prefetched, 4/12 of the block; backward only QKV (after the projection),
    3/12. FSDP prefetches the next block whole."""
    f, b = prefetch_share(*_z3(GPT3, 1536, 1, "deepspeed"))
    assert (f[0], b[0]) == (1.0, 1.0)
    f, b = prefetch_share(*_z3(M530, 2240, 1, "deepspeed"))
    assert (f[0], b[0]) == (pytest.approx(4 / 12, rel=1e-3), pytest.approx(3 / 12, rel=1e-3))
    f, b = prefetch_share(*_z3(M530, 2240, 2, "deepspeed"))  # tp 2: every module under 1e9
    assert (f[0], b[0]) == (1.0, 1.0)
    assert prefetch_share(*_z3(M530, 2240, 1, "fsdp"))[0][0] == 1.0


def test_each_engine_holds_its_own_live_parameters():
    """530B, tp 1, 2240 GPUs: FSDP holds two blocks whole (2 x 12h^2 parameters, 16-bit) and one
    block's gradients; DeepSpeed the largest module it computes (4h^2, more than the 1e9 bound) and
    a gradient bucket as large: 6x less."""
    h, n = 20480, 2240
    got = {}
    for engine in ("fsdp", "deepspeed"):
        prob, cfg = _z3(M530, n, 1, engine)
        mem = memory(prob, cfg)
        psi = mem["psi_first"][0]
        got[engine] = mem["params"][0] - 2 * psi / n, mem["grads"][0] - 2 * psi / n
    block = mem["block"][0]
    assert got["fsdp"] == (pytest.approx(2 * 2 * block), pytest.approx(2 * block))
    assert got["deepspeed"] == (pytest.approx(2 * 4 * h * h), pytest.approx(2 * 4 * h * h))
    assert got["fsdp"][0] / got["deepspeed"][0] > 6


def test_megatron_has_no_zero_3():
    prob = Problem(GPT3, 64, 8, A100, 64, engine="megatron")
    assert set(search(prob, {"tp": 8, "pp": 1}).cfgs.zero.tolist()) <= {0, 1}
    with pytest.raises(UsageError, match="--zero 3 with --engine megatron"):
        search(prob, {"zero": 3})
    with pytest.raises(UsageError, match="--engine 'nccl'"):
        Problem(GPT3, 64, 8, A100, 64, engine="nccl")


ZERO3 = [i for i, r in enumerate(V.ROWS) if r[0] == "N21-T2 ZeRO-3"]


def test_narayanans_zero3_rows_with_deepspeeds_conventions():
    """The six rows were +16% to +138% off with the two-level collective and no engine; with
    DeepSpeed's conventions four are within 15% and none is beyond 20%. The same rows planned
    as FSDP (every NIC of a node used) come out far too fast at micro-batch 1."""
    errors = [V.throughput_error(V.reproduce(i)) for i in ZERO3]
    assert max(map(abs, errors)) < 0.20 and sum(abs(e) <= 0.15 for e in errors) >= 4, errors
    src, name, gpus, fixed, batch, metric, pub = V.ROWS[ZERO3[2]]  # 175B on 1536 GPUs, micro-batch 1
    res = search(Problem(model(name), gpus, 8, A100, batch, engine="fsdp"), fixed, top=1)
    assert res.ev["tflops_per_gpu"][res.ranked[0]] / pub - 1 > 0.5
