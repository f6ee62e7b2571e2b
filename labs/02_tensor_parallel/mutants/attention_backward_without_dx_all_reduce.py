"""Planted bug: attention's backward under the head split forgets the all-reduce of dx

Every rank returns dx computed from its own heads' q, k and v only. Each head's projections
read all of x, so the input gradient is the sum of every rank's share: the column split's
backward (f's) is an all-reduce, and it is missing.

EXPECT_TASK: 2.8
EXPECT_MESSAGE: rank 0: dx is only this rank's heads' share of the input gradient
EXPECT_MESSAGE: (the column split's backward: one all-reduce)
"""
from minipar.labs.lab02_solution import *  # noqa: F401,F403  everything else is right
from minipar.nn.functional import attention_forward
from minipar.xp import chunk_bounds, namespace


def _split(a, n):
    B, T, c = a.shape
    return namespace(a).permute_dims(a.reshape(B, T, n, c // n), (0, 2, 1, 3))


def _merge(a):
    B, n, T, hs = a.shape
    return namespace(a).permute_dims(a, (0, 2, 1, 3)).reshape(B, T, n * hs)


def heads_attention_backward(comm, dout, x, w_qkv, b_qkv, w_proj, n_heads):
    B, T, C = x.shape
    xp = namespace(x)
    lo, hi = chunk_bounds(C, comm.size)[comm.rank]
    nh = (hi - lo) // (C // n_heads)
    w_mine = xp.concat([w_qkv[:, j * C + lo:j * C + hi] for j in range(3)], axis=1)
    b_mine = xp.concat([b_qkv[j * C + lo:j * C + hi] for j in range(3)])
    a, c = x @ w_mine + b_mine, hi - lo
    q, k, v = [_split(a[..., j * c:(j + 1) * c], nh) for j in range(3)]
    y, (_, _, _, P, scale, _, _) = attention_forward(q, k, v)
    dy = _split(dout @ w_proj[lo:hi].T, nh)
    dv = xp.matrix_transpose(P) @ dy
    dP = dy @ xp.matrix_transpose(v)
    dS = P * (dP - xp.sum(dP * P, axis=-1, keepdims=True)) * scale
    dqkv = xp.concat([_merge(dS @ k), _merge(xp.matrix_transpose(dS) @ q), _merge(dv)], axis=-1)
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    dx = dqkv @ w_mine.T  # BUG: only my heads' share; the all-reduce is missing
    return (dx, flat(x).T @ flat(dqkv), xp.sum(flat(dqkv), axis=0), flat(_merge(y)).T @ flat(dout),
            xp.sum(flat(dout), axis=0))
