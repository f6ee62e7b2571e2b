"""Planted bug: attention's backward with a softmax backward that forgets its row-sum term

The softmax's Jacobian is diag(p) - p p^T. Its backward is p * (dp - sum(dp * p) over the row);
this one keeps only p * dp, as if each probability depended on its own score alone. The
gradients of v are right (they do not go through the softmax); those of q and k are wrong.

EXPECT_TASK: 2.8
EXPECT_MESSAGE: rank 0: dw_qkv matches a softmax backward without its row-sum term
"""
from minipar.collectives import all_reduce
from minipar.labs.lab02_solution import *  # noqa: F401,F403  everything else is right
from minipar.nn.functional import attention_forward
from minipar.xp import chunk_bounds, contiguous, namespace


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
    dS = P * (dy @ xp.matrix_transpose(v)) * scale  # BUG: the row-sum term of the softmax's backward is missing
    dqkv = xp.concat([_merge(dS @ k), _merge(xp.matrix_transpose(dS) @ q), _merge(dv)], axis=-1)
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    return (all_reduce(comm, contiguous(dqkv @ w_mine.T)), flat(x).T @ flat(dqkv), xp.sum(flat(dqkv), axis=0),
            flat(_merge(y)).T @ flat(dout), xp.sum(flat(dout), axis=0))
