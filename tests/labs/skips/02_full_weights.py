"""Skips the technique: every rank computes the whole dense layer with the full weights (no
split, no all-reduce) and keeps what its shard would have given. The grader hands each rank
the other ranks' parts as NaN and watches what it multiplies.

BACKENDS: mpi torch  (torch's own-data rule reads a watched tensor, NumPy's a watched array)

EXPECT 2.1: rank 0 computed with 288 elements of w at once inside column_forward; it owns columns 0:12 (144 elements)
EXPECT 2.2: rank 0: Y = sum_r X_r @ A_r + b is NaN at element 0 (60 of 60 elements NaN): rank 0 computed with data it does not own
EXPECT 2.4: rank 0 computed with 120 elements of x at once inside row_backward; it owns columns 0:12 (60 elements)
EXPECT 2.5: rank 0: Y = GeLU(x @ w1 + b1) @ w2 + b2 is NaN at element 0
EXPECT 2.6: rank 0: the attention output is NaN at element 0
"""

from minipar.nn.functional import attention_forward, gelu_forward
from minipar.xp import chunk_bounds, namespace


def column_forward(comm, x, w, b):
    lo, hi = chunk_bounds(w.shape[1], comm.size)[comm.rank]
    return (x @ w + b)[:, lo:hi]  # the whole product, then my columns: right values, p times the work


def row_forward(comm, x, w, b):
    return x @ w + b


def row_backward(comm, dy, x, w):
    lo, hi = chunk_bounds(w.shape[0], comm.size)[comm.rank]
    return (dy @ w.T)[:, lo:hi], (x.T @ dy)[lo:hi], dy.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    return gelu_forward(x @ w1 + b1)[0] @ w2 + b2


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    B, T, C = x.shape
    xp = namespace(x)
    q, k, v = [xp.permute_dims((x @ w_qkv[:, j * C:(j + 1) * C] + b_qkv[j * C:(j + 1) * C])
                               .reshape(B, T, n_heads, C // n_heads), (0, 2, 1, 3)) for j in range(3)]
    y = xp.permute_dims(attention_forward(q, k, v)[0], (0, 2, 1, 3)).reshape(B, T, C)
    return y @ w_proj + b_proj
