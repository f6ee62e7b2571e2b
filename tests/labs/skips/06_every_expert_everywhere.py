"""Skips the technique: no expert parallelism. Every rank runs every expert on its own tokens
(no dispatch, no combine), or gathers every rank's tokens and picks its experts' rows itself.
The grader hands a rank only its own experts' weights (the others are NaN) and counts the
bytes: the dispatch sends each kept row once, to its expert's rank.

EXPECT 6.5: a dispatch (one all-to-all of the (2, 2) int64 counts, one all-to-all-v of the kept rows) on 2 ranks sends exactly
EXPECT 6.6: rank 0: the MoE output of your tokens is NaN at element 0
EXPECT 6.6: rank 0 computed with data it does not own (it holds only experts 0:2
"""
import math

import numpy as np

from minipar.collectives import all_gather
from minipar.nn.functional import gelu_forward, softmax_forward
from minipar.xp import namespace, to_numpy, zeros


def _route(probs, k, capacity_factor):
    probs = to_numpy(probs)
    N, E = probs.shape
    cap = math.ceil(capacity_factor * k * N / E)
    choice = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    keep, used = np.zeros((N, k), bool), np.zeros(E, int)
    for c in range(k):
        for n in range(N):
            keep[n, c] = used[choice[n, c]] < cap
            used[choice[n, c]] += keep[n, c]
    return choice, keep


def dispatch(comm, x, choice, keep, n_experts):
    p, r, per = comm.size, comm.rank, n_experts // comm.size
    N, k = choice.shape
    xs = all_gather(comm, x)  # every rank's tokens, here
    cs, ks = (to_numpy(all_gather(comm, comm.asarray(a.astype(np.int64)))) for a in (choice, keep))
    rows, counts = [], np.zeros((p, per), np.int64)
    for e in range(per):
        for i in range(p):
            sel = [n for c in range(k) for n in range(N) if ks[i * N + n, c] and cs[i * N + n, c] == r * per + e]
            rows.append(xs[[i * N + n for n in sel]].reshape(len(sel), x.shape[1]))
            counts[i, e] = len(sel)
    return namespace(x).concat(rows, axis=0), counts


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    probs = softmax_forward(x @ w_router)[0]
    choice, keep = _route(probs, k, capacity_factor)
    y = zeros(x.shape, like=x)
    for n, c in zip(*np.nonzero(keep)):
        w1, b1, w2, b2 = experts[choice[n, c]]  # every expert, here
        y[n] += probs[n, choice[n, c]] * (gelu_forward(x[n] @ w1 + b1)[0] @ w2 + b2)
    return y
