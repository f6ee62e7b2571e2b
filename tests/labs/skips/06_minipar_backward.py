"""Skips the technique of the backward passes by calling minipar's own: ring attention's backward
(minipar.context_parallel) and the expert-parallel layer's backward (minipar.experts). The right
values, the right blocks through the grader's kernel, the right traffic; but minipar wrote every
message, and the grader sees the call (on 1 rank, where the ring sends nothing) and the trace.

EXPECT 6.7: ring_attention_backward ran minipar's own minipar.context_parallel.ring.ring_attention_backward
EXPECT 6.7: write ring_attention_backward yourself
EXPECT 6.8: was made by minipar's own code, minipar/experts/moe.py:
EXPECT 6.8: write moe_backward's messages yourself
"""
import numpy as np

from minipar.context_parallel import SeqLayout, ring_attention_backward as minipar_ring_backward
from minipar.experts import ExpertParallelMoE, MoE


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return minipar_ring_backward(comm, dout, (q, k, v, out, lse, lay, causal, None), attend_backward=attend_backward)


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    N, C = x.shape
    dense = MoE(C, experts[0][0].shape[1], len(experts), np.random.default_rng(0), k, capacity_factor,
                aux_weight=aux_weight)
    dense.router.params["w"] = w_router
    for e, (w1, b1, w2, b2) in enumerate(experts):
        mlp = getattr(dense, f"expert{e}")
        mlp.fc1.params.update(w=w1, b=b1)
        mlp.fc2.params.update(w=w2, b=b2)
    layer = ExpertParallelMoE(comm, dense).to(x)
    layer.aux_scale = 1.0 / comm.size
    y, ctx = layer.forward(x)
    dx = layer.backward(dy, ctx)
    grads = dict(layer.named_grads())
    mine = [tuple(grads[f"expert{e}.{n}"] for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")) for e in sorted(layer.experts())]
    return y, ctx["aux"], dx, grads["router.w"], mine
