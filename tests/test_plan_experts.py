"""Expert parallelism in the planner: the all-to-all bytes against lesson 06's layer counted on
real ranks (to the byte), the experts' memory divided over ep, the placement inside a node first,
and ep searched for a model with experts.

Functions without a ``test_`` prefix run on the ranks.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.experts import ExpertParallelMoE
from minipar.lessons.common import traced
from minipar.lessons.experts import make_moe
from minipar.plan.config import Config, Configs, Problem
from minipar.plan.hardware import preset
from minipar.plan.models import model
from minipar.plan.predict import predict
from minipar.plan.search import search
from minipar.plan.timing import expert_alltoall_bytes, expert_alltoall_time
from minipar.trace import bytes_sent

E, K, N = 8, 2, 16  # experts, top-k, tokens per rank (a multiple of E: every expert gets 2N/E rows)


def count_alltoall(comm, seed=0):
    """One forward and backward of ``ExpertParallelMoE`` with a router that sends token n to
    experts n % E and n + 1 % E (no drops at capacity factor 1): the bytes this rank sent."""
    p, rng = comm.size, np.random.default_rng(seed)
    dense = make_moe(rng, E, p, K, capacity_factor=1.0, d_model=E)
    dense.router.params["w"][...] = 5 * np.eye(E)  # (C = E, E): a token's features are its logits
    n = np.arange(p * N)
    x = np.zeros((p * N, E))
    x[n, n % E], x[n, (n + 1) % E] = 2.0, 1.0
    layer = ExpertParallelMoE(comm, dense)
    mine = slice(comm.rank * N, (comm.rank + 1) * N)
    (y, ctx), fwd = traced(comm, layer.forward, x[mine])
    _, bwd = traced(comm, layer.backward, rng.standard_normal(y.shape), ctx)
    me = comm.world_rank(comm.rank)
    return {"forward": bytes_sent([e for e in fwd if e.kind == "sendrecv"], me),
            "backward": bytes_sent([e for e in bwd if e.kind == "sendrecv"], me),
            "dropped": ctx["routing"].dropped}


@pytest.mark.timeout(180)
def test_the_planners_alltoall_bytes_are_lesson_06s_counted_bytes():
    """Per layer and micro-batch the planner sends 2 all-to-alls forward (dispatch, combine) and 2
    backward, each ``expert_alltoall_bytes``; lesson 06's layer, counted on 4 ranks, sends exactly
    that plus its counts (two all_to_all_v's (p-1) int64 each, and in the forward the (p-1) x E/p
    plan). A formula that counted the rows a rank keeps, or the dispatch only, is rejected."""
    p = 4
    counted = launch(p, "tests.test_plan_experts:count_alltoall", quiet=True).results
    one = expert_alltoall_bytes(N, E, K, p, 8)  # float64 rows of C = E values
    assert one == K * N * 3 / 4 * E * 8 == 1536
    counts_f, counts_b = 8 * (2 * (p - 1) + (p - 1) * E // p), 8 * 2 * (p - 1)
    for r in counted:
        assert r["dropped"] == 0
        assert r["forward"] == 2 * one + counts_f and r["backward"] == 2 * one + counts_b, r
        for wrong in (2 * K * N * E * 8, one):  # the rows kept counted too; the dispatch only
            assert r["forward"] != wrong + counts_f


MIXTRAL = model("mixtral-8x7b")
H100 = preset("h100-80gb")


def test_the_experts_are_divided_over_ep_and_nothing_else_is():
    """Weights, gradients and optimizer of a rank shrink by the routed experts' (1 - 1/ep), to the
    byte; the attention, norms, router and embeddings stay whole."""
    prob = Problem(MIXTRAL, 64, 8, H100, 64)
    one, four = (predict(prob, Config(tp=2, pp=4, dp=8, ep=ep, microbatches=8)) for ep in (1, 4))
    e_split, e_rep = MIXTRAL.expert_params()
    experts = MIXTRAL.layers // 4 * (e_split / 2 + e_rep)  # one pipeline rank's experts after tp
    assert one.memory_bytes["params"] - four.memory_bytes["params"] == pytest.approx(2 * experts * 3 / 4, rel=1e-12)
    assert one.memory_bytes["optimizer"] - four.memory_bytes["optimizer"] == pytest.approx(12 * experts * 3 / 4, rel=1e-12)
    assert one.memory_bytes["activations"] == four.memory_bytes["activations"]
    z1 = predict(prob, Config(tp=2, pp=4, dp=8, ep=4, zero=1, microbatches=8))  # experts' optimizer over dp/ep
    dense = four.memory_bytes["optimizer"] / 12 - experts / 4
    assert z1.memory_bytes["optimizer"] == pytest.approx(12 * (dense / 8 + experts / 4 / 2), rel=1e-12)


def test_the_alltoall_stays_inside_a_node_first():
    """ep x tp x cp <= GPUs per node: the intra-node link alone; beyond, the share of the peers on
    other nodes crosses each GPU's inter-node link, concurrently with the rest."""
    prob = Problem(MIXTRAL, 64, 8, H100, 64)
    f, n = H100.link_fraction, 1e8
    cfg = Configs.of([Config(tp=2, dp=32, ep=4), Config(tp=4, dp=16, ep=4), Config(tp=1, dp=64, ep=1)])
    inside, across, none = expert_alltoall_time(prob, cfg, n)
    assert inside == pytest.approx(3 * H100.intra.alpha + n / (H100.intra.bandwidth * f))
    assert across == pytest.approx(max(H100.intra.alpha + n / 3 / (H100.intra.bandwidth * f),
                                       2 * H100.inter.alpha + 2 * n / 3 / (H100.inter.bandwidth * f)))
    assert none == 0 and across > 5 * inside


def test_ep_is_searched_for_a_model_with_experts_and_refused_without():
    """Without tp, pp or ZeRO-3, Mixtral's 46.7e9 parameters fit 80 GB only with the experts split: the
    search finds ep, and pays its all-to-all."""
    res = search(Problem(replace(MIXTRAL, seq=4096), 64, 8, H100, 64), {"tp": 1, "pp": 1, "cp": 1, "zero": 1}, top=3)
    assert set(res.cfgs.ep.tolist()) == {1, 2, 4, 8}  # ep divides dp = 64 and the 8 experts
    ep1 = res.cfgs.ep == 1
    assert not res.ev["mem"]["fits"][ep1].any() and res.best.ep > 1
    assert res.ev["parts"]["ep_alltoall"][res.ranked[0]] > 0
    assert set(search(Problem(model("llama3-8b"), 16, 8, H100, 16), {"tp": 8}).cfgs.ep.tolist()) == {1}
    for fixed, needle in (({"ep": 3}, "--ep 3 must divide the 8 experts"), ({"ep": 4, "dp": 2, "tp": 8, "pp": 4},
                          "--ep 4 must divide --dp 2")):
        with pytest.raises(UsageError, match=needle):
            search(Problem(MIXTRAL, 64, 8, H100, 64), fixed)
    with pytest.raises(UsageError, match="has no experts"):
        search(Problem(model("llama3-8b"), 16, 8, H100, 16), {"ep": 2})
