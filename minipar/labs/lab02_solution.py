"""Lab 02's reference: minipar's own tensor-parallel pieces under the names the exercise uses."""
import numpy as np

from .. import tensor_parallel as tp
from ..nn import MLP, CausalSelfAttention, Linear
from ..nn import functional as F
from ..xp import namespace


def _with(module, **params):
    """``module`` with the given parameters of its sub-layers, e.g. fc1=(w, b)."""
    for name, (w, b) in params.items():
        layer = getattr(module, name)
        layer.params["w"], layer.params["b"] = w, b
    return module


def _linear(w, b):
    """A dense Linear holding ``w`` (d_in, d_out) and ``b``."""
    lin = Linear(w.shape[0], w.shape[1], np.random.default_rng(0))
    lin.params["w"], lin.params["b"] = w, b
    return lin


def column_forward(comm, x, w, b):
    return tp.column_parallel_matmul(comm, x, tp.column_shard(comm, w), gather_output=False) + tp.column_shard(comm, b)


def row_forward(comm, x, w, b):
    return tp.row_parallel_matmul(comm, *tp.row_shards(comm, x, w)) + b  # bias once, after the all-reduce


def column_backward(comm, dy_r, x, w):
    w_r = tp.column_shard(comm, w)  # (d_in, d_out/p)
    return tp.f_backward(comm, dy_r @ w_r.T), x.T @ dy_r, dy_r.sum(axis=0)


def row_backward(comm, dy, x, w):
    x_r, w_r = tp.row_shards(comm, x, w)  # (N, d_in/p), (d_in/p, d_out)
    dy = tp.g_backward(comm, dy)  # the identity
    return dy @ w_r.T, x_r.T @ dy, dy.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    dense = _with(MLP(w1.shape[0], w1.shape[1], np.random.default_rng(0)), fc1=(w1, b1), fc2=(w2, b2))
    return tp.ParallelMLP(comm, dense).forward(x)[0]


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    dense = _with(CausalSelfAttention(w_qkv.shape[0], n_heads, np.random.default_rng(0)),
                  qkv=(w_qkv, b_qkv), proj=(w_proj, b_proj))
    return tp.ParallelSelfAttention(comm, dense).forward(x)[0]


def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    x_r = tp.shard(x, comm.size, comm.rank, axis=-2, what="tokens")  # (B, T/p, C): my tokens
    dense = _with(MLP(w1.shape[0], w1.shape[1], np.random.default_rng(0)), fc1=(w1, b1), fc2=(w2, b2))
    mlp = tp.ParallelMLP(comm, dense, sequence_parallel=True)  # all-gather in fc1, reduce-scatter in fc2
    return x_r + mlp.forward(norm(x_r))[0]  # the LayerNorm and the residual on my T/p tokens only


def _heads(a, n):  # (B, T, n * hs) -> (B, n, T, hs)
    xp = namespace(a)
    B, T, c = a.shape
    return xp.permute_dims(xp.reshape(a, (B, T, n, c // n)), (0, 2, 1, 3))


def _merged(a):  # (B, n, T, hs) -> (B, T, n * hs)
    xp = namespace(a)
    B, n, T, hs = a.shape
    return xp.reshape(xp.permute_dims(a, (0, 2, 1, 3)), (B, T, n * hs))


def heads_attention_backward(comm, dout, x, w_qkv, b_qkv, w_proj, n_heads):
    xp = namespace(x)
    nh = tp.check_divisible(n_heads, comm.size, "n_heads")  # heads on this rank
    qkv = tp.ColumnParallelLinear(comm, _linear(w_qkv, b_qkv), blocks=3)  # my heads' columns of Wq | Wk | Wv
    w_r = tp.shard(w_proj, comm.size, comm.rank, axis=0, what="d_in")  # (C/p, C): my heads' rows of w_proj
    # the forward of my heads again: no message up to the projection
    a, ctx_qkv = F.linear_forward(x, qkv.params["w"], qkv.params["b"])  # (B, T, 3C/p)
    c = a.shape[-1] // 3
    y, ctx_att = F.attention_forward(*(_heads(a[..., j * c:(j + 1) * c], nh) for j in range(3)))  # (B, nh/p, T, hs)
    y = _merged(y)  # (B, T, C/p)
    # the projection, a row split: g's backward is the identity
    dy = F.linear_backward_input(dout, (y, w_r, False))  # (B, T, C/p)
    dw_proj, _ = F.linear_backward_weight(dout, (y, w_r, False))  # (C/p, C)
    db_proj = xp.sum(xp.reshape(dout, (-1, dout.shape[-1])), axis=0)  # (C,)
    dq, dk, dv = F.attention_backward(_heads(dy, nh), ctx_att)
    dqkv = xp.concat([_merged(d) for d in (dq, dk, dv)], axis=-1)  # (B, T, 3C/p)
    dw_qkv, db_qkv = F.linear_backward_weight(dqkv, ctx_qkv)
    dx = tp.f_backward(comm, F.linear_backward_input(dqkv, ctx_qkv))  # my heads' share of dx, summed: one all-reduce
    return dx, dw_qkv, db_qkv, dw_proj, db_proj
