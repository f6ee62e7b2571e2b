"""Skips the technique by calling minipar's own context- and expert-parallel code from functions
written in the exercise: the right values, the right blocks through the grader's kernel, the
right traffic; but minipar.context_parallel and minipar.experts make every message, and the trace
records it.

EXPECT 6.2: was made by minipar's own code, minipar/context_parallel/ring.py:
EXPECT 6.2: called at tests/labs/skips/06_minipar_reference.py:26: write ring_attention's messages yourself, with comm.isend
EXPECT 6.3: was made by minipar's own code, minipar/context_parallel/
EXPECT 6.3: write ulysses_attention's messages yourself, with minipar.collectives.all_to_all
EXPECT 6.5: was made by minipar's own code, minipar/experts/moe.py:
EXPECT 6.5: write dispatch's messages yourself
EXPECT 6.6: was made by minipar's own code, minipar/experts/
EXPECT 6.6: write moe_forward's messages yourself
"""
import numpy as np

from minipar.collectives import all_to_all_v
from minipar.context_parallel import SeqLayout, ring_attention_forward, ulysses_attention_forward
from minipar.experts import ExpertParallelMoE, MoE
from minipar.experts.moe import plan
from minipar.experts.routing import kept_order


def ring_attention(comm, q, k, v, attend, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return ring_attention_forward(comm, q, k, v, lay, causal, attend=attend)[0]


def ulysses_attention(comm, q, k, v, attend, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return ulysses_attention_forward(comm, q, k, v, lay, causal, attend=attend)[0]


def dispatch(comm, x, choice, keep, n_experts):
    order = kept_order(choice, keep)
    counts = np.bincount(choice.reshape(-1)[order], minlength=n_experts)
    send_counts, got, perm = plan(comm, counts, n_experts // comm.size)
    received, _ = all_to_all_v(comm, x[order // choice.shape[1]], send_counts)
    return received[perm], got


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    N, C = x.shape
    dense = MoE(C, experts[0][0].shape[1], len(experts), np.random.default_rng(0), k, capacity_factor,
                aux_weight=0.0)
    dense.router.params["w"] = w_router
    for e, (w1, b1, w2, b2) in enumerate(experts):
        mlp = getattr(dense, f"expert{e}")
        mlp.fc1.params.update(w=w1, b=b1)
        mlp.fc2.params.update(w=w2, b=b2)
    return ExpertParallelMoE(comm, dense).forward(x)[0]
