"""Lab 02's reference: minipar's own tensor-parallel pieces under the names the exercise uses."""
import numpy as np

from .. import tensor_parallel as tp
from ..nn import MLP, CausalSelfAttention


def _with(module, **params):
    """``module`` with the given parameters of its sub-layers, e.g. fc1=(w, b)."""
    for name, (w, b) in params.items():
        layer = getattr(module, name)
        layer.params["w"], layer.params["b"] = w, b
    return module


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
