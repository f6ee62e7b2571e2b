"""Planted bug: the combine sends the experts' outputs back in expert-major order

The experts' outputs sit expert by expert; the combine's all-to-all-v sends the first
counts[0].sum() rows to rank 0, the next to rank 1 ... so the rows must first be put back in
source-rank order. Without that, rows go back to the wrong rank or to the wrong token.

EXPECT_TASK: 6.6
EXPECT_MESSAGE: the combine sent rows back to the wrong rank or position
"""
from minipar.collectives import all_to_all_v
from minipar.experts.routing import kept_order
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.nn.functional import gelu_forward, softmax_forward
from minipar.xp import namespace, zeros


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    p, r, E = comm.size, comm.rank, len(experts)
    per = E // p
    probs = softmax_forward(x @ w_router)[0]
    choice, keep = route(comm, probs, k, capacity_factor)  # noqa: F405
    rows, counts = dispatch(comm, x, choice, keep, E)  # noqa: F405
    outs, a = [], 0
    for e in range(per):
        n = int(counts[:, e].sum())
        w1, b1, w2, b2 = experts[r * per + e]
        outs.append(gelu_forward(rows[a:a + n] @ w1 + b1)[0] @ w2 + b2)
        a += n
    returned, _ = all_to_all_v(comm, namespace(x).concat(outs, axis=0), counts.sum(axis=1))  # BUG: still expert-major
    order = kept_order(choice, keep)
    y = zeros(x.shape, like=x)
    for f, row in zip(order, returned):
        n, c = divmod(f, k)
        y[n] += probs[n, choice[n, c]] * row
    return y
