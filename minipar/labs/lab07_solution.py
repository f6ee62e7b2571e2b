"""Lab 07's reference: the planner's own pieces under the names the exercise uses."""
import numpy as np

from ..lessons.planning import hierarchical_time
from ..pipeline.schedules import inflight_profile
from ..plan import ModelSpec, Problem, preset
from ..plan.inference import token_seconds
from ..plan.memory import stored_activations
from ..plan.search import divisors


def activation_bytes(s, b, h, a, t=1, sp=False, recompute="none"):
    """``plan.memory.stored_activations`` for a Megatron GPT block: 16-bit activations, dropout, MLP 4h."""
    prob = Problem(ModelSpec(1, h, a, s, 0), 1, 1, preset("a100-80gb"), 1)
    return float(stored_activations(prob, b, t, 1, np.array(sp), np.array(recompute)))


def peak_inflight(actions):
    """The most (stage, micro-batch) activations each rank holds: ``inflight_profile``, what the
    validator checks the generators' ``inflight_limit`` against (and the planner reads)."""
    return [max(inflight_profile(ops), default=0) for ops in actions]


def dp_all_reduce_time(nbytes, n, per_node, intra, inter):
    """``plan.timing.dp_collective``'s hierarchical all-reduce, on links given as (alpha, beta)."""
    return hierarchical_time(nbytes, n, per_node, intra, inter)


def choose_config(job, predict):
    """Every configuration the planner's rules allow, through ``predict``; the fastest that fits
    (ties to the smaller memory)."""
    best = None
    for tp in divisors(job["gpus_per_node"]):
        if job["gpus"] % tp or job["heads"] % tp or job["ffn"] % tp:
            continue
        for pp in divisors(job["gpus"] // tp):
            dp = job["gpus"] // (tp * pp)
            if job["layers"] % pp or job["batch"] % dp:
                continue
            for mb in divisors(job["batch"] // dp):
                for rec in ("none", "selective", "full"):
                    est = predict(tp, pp, dp, mb, rec)
                    key = (est.step_s, est.memory_bytes)
                    if est.memory_bytes <= job["capacity_bytes"] and (best is None or key < best[0]):
                        best = (key, dict(tp=tp, pp=pp, dp=dp, microbatch=mb, recompute=rec))
    return best[1] if best else None


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    """``plan.inference.token_seconds``: the roofline of one rank's 1/t of the weights, plus 2 ring
    all-reduces per layer of the (batch x hidden) activation."""
    return token_seconds(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes)


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    """``plan.models.ModelSpec.params`` for the shape: rotary positions, biases on every Linear or none."""
    return ModelSpec(layers, hidden, heads, 1, vocab, ffn=ffn, kv_heads=kv_heads, mlp=mlp, norm=norm, bias=bias,
                     qkv_bias=bias, tied=tied, positions="rope").params()
