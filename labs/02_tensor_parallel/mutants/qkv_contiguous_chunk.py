"""Planted bug: the heads-split attention takes chunk r of w_qkv as a whole

w_qkv is [Wq | Wk | Wv] side by side. Chunk r of all 3C columns is not "q, k and v of my
heads": on 2 ranks rank 0 gets all of Wq and half of Wk, and uses them as its q, k and v.
The grader hands rank 0 only its own heads' columns of Wq, Wk and Wv (the rest is NaN).

EXPECT_TASK: 2.6
EXPECT_MESSAGE: rank 0: the attention output is NaN at element 0
EXPECT_MESSAGE: rank 0 computed with data it does not own (it holds only heads 0:6: columns 0:12 of each of Wq, Wk, Wv
"""
from minipar.collectives import all_reduce
from minipar.labs.lab02_solution import *  # noqa: F401,F403  everything else is right
from minipar.nn.functional import attention_forward
from minipar.xp import chunk_bounds, namespace


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    B, T, C = x.shape
    lo, hi = chunk_bounds(C, comm.size)[comm.rank]
    nh, hs = n_heads // comm.size, C // n_heads
    xp = namespace(x)
    heads = []
    for k in range(3):  # q, k, v
        cols = slice(3 * lo + k * (hi - lo), 3 * lo + (k + 1) * (hi - lo))  # BUG: chunk r of all 3C columns
        a = x @ w_qkv[:, cols] + b_qkv[cols]  # (B, T, C/p)
        heads.append(xp.permute_dims(a.reshape(B, T, nh, hs), (0, 2, 1, 3)))  # (B, nh/p, T, hs)
    y = xp.permute_dims(attention_forward(*heads)[0], (0, 2, 1, 3)).reshape(B, T, hi - lo)  # (B, T, C/p)
    return all_reduce(comm, y @ w_proj[lo:hi]) + b_proj
