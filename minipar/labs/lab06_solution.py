"""Lab 06's reference: minipar's own context- and expert-parallel pieces under the exercise's names."""
import numpy as np

from ..collectives import all_to_all_v
from ..context_parallel import SeqLayout, ring_attention_forward, ulysses_attention_forward
from ..context_parallel import ring_attention_backward as ring_backward
from ..context_parallel.blocks import merge  # noqa: F401  (6.1: exactly minipar's)
from ..experts import ExpertParallelMoE, MoE
from ..experts.moe import plan
from ..experts.routing import capacity, kept_order
from ..experts.routing import route as route_tokens
from ..xp import to_numpy


def ring_attention(comm, q, k, v, attend, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return ring_attention_forward(comm, q, k, v, lay, causal, attend=attend)[0]


def ulysses_attention(comm, q, k, v, attend, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return ulysses_attention_forward(comm, q, k, v, lay, causal, attend=attend)[0]


def route(comm, probs, k, capacity_factor):
    N, E = probs.shape
    r = route_tokens(to_numpy(probs), k, capacity(N, E, k, capacity_factor))
    return r.choice, r.keep


def dispatch(comm, x, choice, keep, n_experts):
    order = kept_order(choice, keep)  # kept assignments n*k + c, by expert, then priority
    counts = np.bincount(choice.reshape(-1)[order], minlength=n_experts)  # (E,)
    send_counts, got, perm = plan(comm, counts, n_experts // comm.size)
    received, _ = all_to_all_v(comm, x[order // choice.shape[1]], send_counts)  # by source rank
    return received[perm], got


def _layer(comm, x, w_router, experts, k, capacity_factor, aux_weight):
    """minipar's expert-parallel layer holding the given router and this rank's experts."""
    N, C = x.shape
    dense = MoE(C, experts[0][0].shape[1], len(experts), np.random.default_rng(0), k, capacity_factor,
                aux_weight=aux_weight)
    dense.router.params["w"] = w_router
    for e, (w1, b1, w2, b2) in enumerate(experts):  # the others' experts are NaN: ExpertParallelMoE keeps mine only
        mlp = getattr(dense, f"expert{e}")
        mlp.fc1.params.update(w=w1, b=b1)
        mlp.fc2.params.update(w=w2, b=b2)
    return ExpertParallelMoE(comm, dense)


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    return _layer(comm, x, w_router, experts, k, capacity_factor, 0.0).forward(x)[0]  # no balancing loss: no all-reduce


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    lay = SeqLayout(q.shape[-2] * comm.size, comm.size, "contiguous")
    return ring_backward(comm, dout, (q, k, v, out, lse, lay, causal, None), attend_backward=attend_backward)


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    layer = _layer(comm, x, w_router, experts, k, capacity_factor, aux_weight).to(x)  # gradients of x's kind
    layer.aux_scale = 1.0 / comm.size  # one balancing loss for every rank's tokens: d aux / d P_e / (p N) a token
    y, ctx = layer.forward(x)
    dx = layer.backward(dy, ctx)
    grads = dict(layer.named_grads())
    mine = sorted(layer.experts())
    return y, ctx["aux"], dx, grads["router.w"], [tuple(grads[f"expert{e}.{n}"] for n in ("fc1.w", "fc1.b", "fc2.w",
                                                                                         "fc2.b")) for e in mine]
