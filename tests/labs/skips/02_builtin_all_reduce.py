"""Skips the technique: the splits are right, but the sums go through the engine's own
all-reduce (comm.builtin) instead of minipar.collectives.

EXPECT 2.2: rank 0 called comm.builtin.all_reduce inside row_forward: comm.builtin is the engine's own collective
EXPECT 2.3: rank 0 called comm.builtin.all_reduce inside column_backward
EXPECT 2.5: rank 0 called comm.builtin.all_reduce inside megatron_mlp
EXPECT 2.6: rank 0 called comm.builtin.all_reduce inside heads_attention
"""
from minipar.nn.functional import attention_forward, gelu_forward
from minipar.xp import chunk_bounds, namespace


def _mine(comm, n):
    return chunk_bounds(n, comm.size)[comm.rank]


def row_forward(comm, x, w, b):
    lo, hi = _mine(comm, w.shape[0])
    return comm.builtin.all_reduce(x[:, lo:hi] @ w[lo:hi]) + b


def column_backward(comm, dy_r, x, w):
    lo, hi = _mine(comm, w.shape[1])
    return comm.builtin.all_reduce(dy_r @ w[:, lo:hi].T), x.T @ dy_r, dy_r.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    lo, hi = _mine(comm, w1.shape[1])
    return comm.builtin.all_reduce(gelu_forward(x @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]) + b2


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    B, T, C = x.shape
    lo, hi = _mine(comm, C)
    hs, xp = C // n_heads, namespace(x)
    q, k, v = [xp.permute_dims((x @ w_qkv[:, j * C + lo:j * C + hi] + b_qkv[j * C + lo:j * C + hi])
                               .reshape(B, T, (hi - lo) // hs, hs), (0, 2, 1, 3)) for j in range(3)]
    y = xp.permute_dims(attention_forward(q, k, v)[0], (0, 2, 1, 3)).reshape(B, T, hi - lo)
    return comm.builtin.all_reduce(y @ w_proj[lo:hi]) + b_proj
