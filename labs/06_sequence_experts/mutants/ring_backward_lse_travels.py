"""Planted bug: the log-sum-exp travels with the K/V block, and the arriving one is used

lse is each query's softmax denominator: it belongs to the rank's queries. Sent around with K
and V, the rank computes its queries against block j with the lse of rank j's queries: the
probabilities it recomputes are another row's.

EXPECT_TASK: 6.7
EXPECT_MESSAGE: rank 0 passed attend_backward the log-sum-exp of rank 1's queries (positions 3:6)
EXPECT_MESSAGE: it belongs to the queries and stays on their rank
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import empty, namespace, zeros


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    p, r = comm.size, comm.rank
    t, xp = q.shape[-2], namespace(q)
    right, left = (r + 1) % p, (r - 1) % p
    delta = xp.sum(dout * out, axis=-1, keepdims=True)
    kv, held_lse = xp.stack([k, v]), lse
    nxt, nxt_lse, carry = empty(kv.shape, like=kv), empty(lse.shape, like=lse), empty(kv.shape, like=kv)
    dq, own = zeros(q.shape, like=q), None
    for s in range(p):
        j = (r - s) % p
        if s < p - 1:
            reqs = [comm.irecv(nxt, left, tag=1), comm.isend(kv, right, tag=1),
                    comm.irecv(nxt_lse, left, tag=3), comm.isend(held_lse, right, tag=3)]
        part = zeros(kv.shape, like=kv)
        if not (causal and j > r):
            mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
            dq_j, dk_j, dv_j = attend_backward(q, kv[0], kv[1], dout, held_lse, delta, mask)  # BUG: rank j's lse
            dq = dq + dq_j
            part = xp.stack([dk_j, dv_j])
        if s == 0:
            own = part
        else:
            total = part if s == 1 else carry + part
            comm.sendrecv(total, right, carry, left, sendtag=2, recvtag=2)
        if s < p - 1:
            for req in reqs:
                req.wait()
            kv, nxt, held_lse, nxt_lse = nxt, kv, nxt_lse, held_lse
    dkv = own if p == 1 else own + carry
    return dq, dkv[0], dkv[1]
