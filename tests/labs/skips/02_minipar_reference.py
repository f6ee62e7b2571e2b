"""Skips the technique by calling minipar's own tensor-parallel layers (minipar.tensor_parallel)
from functions written in the exercise: the right values, the right shards, one ring all-reduce
each, but the layers, not the learner, make every message. The trace records who did: minipar's
tensor_parallel code, which the exercise only called. The attention's backward makes its own
message, but its gradients are minipar's (minipar.nn.functional.attention_backward). Where the
task is minipar's own code (sequence parallelism's all-gather and reduce-scatter in
minipar.tensor_parallel.ops, the attention's backward), the grader sees the call.

EXPECT 2.2: was made by minipar's own code, minipar/tensor_parallel/
EXPECT 2.2: called at tests/labs/skips/02_minipar_reference.py:34: write row_forward's messages yourself, with minipar.collectives.all_reduce
EXPECT 2.3: called at tests/labs/skips/02_minipar_reference.py:39: write column_backward's messages yourself
EXPECT 2.5: called at tests/labs/skips/02_minipar_reference.py:44: write megatron_mlp's messages yourself
EXPECT 2.6: called at tests/labs/skips/02_minipar_reference.py:50: write heads_attention's messages yourself
EXPECT 2.7: sequence_parallel_mlp ran minipar's own minipar.tensor_parallel.ops.sp_gather_forward (called at tests/labs/skips/02_minipar_reference.py:56
EXPECT 2.8: heads_attention_backward ran minipar's own minipar.nn.functional.attention_backward (called at tests/labs/skips/02_minipar_reference.py:70
"""
import numpy as np

from minipar import tensor_parallel as tp
from minipar.collectives import all_reduce
from minipar.nn import MLP, CausalSelfAttention
from minipar.nn import functional as F
from minipar.xp import chunk_bounds, contiguous, namespace


def _with(module, **params):
    for name, (w, b) in params.items():
        layer = getattr(module, name)
        layer.params["w"], layer.params["b"] = w, b
    return module


def row_forward(comm, x, w, b):
    return tp.row_parallel_matmul(comm, *tp.row_shards(comm, x, w)) + b


def column_backward(comm, dy_r, x, w):
    w_r = tp.column_shard(comm, w)
    return tp.f_backward(comm, dy_r @ w_r.T), x.T @ dy_r, dy_r.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    dense = _with(MLP(w1.shape[0], w1.shape[1], np.random.default_rng(0)), fc1=(w1, b1), fc2=(w2, b2))
    return tp.ParallelMLP(comm, dense).forward(x)[0]


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    dense = _with(CausalSelfAttention(w_qkv.shape[0], n_heads, np.random.default_rng(0)),
                  qkv=(w_qkv, b_qkv), proj=(w_proj, b_proj))
    return tp.ParallelSelfAttention(comm, dense).forward(x)[0]


def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    x_r = tp.shard(x, comm.size, comm.rank, axis=-2, what="tokens")
    dense = _with(MLP(w1.shape[0], w1.shape[1], np.random.default_rng(0)), fc1=(w1, b1), fc2=(w2, b2))
    return x_r + tp.ParallelMLP(comm, dense, sequence_parallel=True).forward(norm(x_r))[0]


def heads_attention_backward(comm, dout, x, w_qkv, b_qkv, w_proj, n_heads):
    xp = namespace(x)
    B, T, C = x.shape
    lo, hi = chunk_bounds(C, comm.size)[comm.rank]
    nh = (hi - lo) // (C // n_heads)
    w_mine = xp.concat([w_qkv[:, j * C + lo:j * C + hi] for j in range(3)], axis=1)
    b_mine = xp.concat([b_qkv[j * C + lo:j * C + hi] for j in range(3)])
    a = x @ w_mine + b_mine
    split = lambda t: xp.permute_dims(t.reshape(B, T, nh, C // n_heads), (0, 2, 1, 3))  # noqa: E731
    merge = lambda t: xp.permute_dims(t, (0, 2, 1, 3)).reshape(B, T, hi - lo)  # noqa: E731
    y, ctx = F.attention_forward(*(split(a[..., j * (hi - lo):(j + 1) * (hi - lo)]) for j in range(3)))
    dq, dk, dv = F.attention_backward(split(dout @ w_proj[lo:hi].T), ctx)
    dqkv = xp.concat([merge(d) for d in (dq, dk, dv)], axis=-1)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    return (all_reduce(comm, contiguous(dqkv @ w_mine.T)), flat(x).T @ flat(dqkv), xp.sum(flat(dqkv), axis=0),
            flat(merge(y)).T @ flat(dout), xp.sum(flat(dout), axis=0))
