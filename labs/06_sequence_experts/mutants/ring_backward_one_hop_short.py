"""Planted bug: each block's gradient travels with the block and stops one rank short of home

K, V and the dK, dV summed so far travel together to the right, every rank adding its queries'
part. After p - 1 hops the sum of block j holds every rank's part, but it sits on the rank
before j (the last rank of its way round the ring), and that is what the rank returns: the
gradient of its neighbour's keys, not of its own. The bytes are exactly the ring's.

EXPECT_TASK: 6.7
EXPECT_MESSAGE: rank 0: dk is the whole gradient of block 1 (keys 3:6), not of rank 0's own keys
EXPECT_MESSAGE: stopped on the last rank of its way round the ring, one step short of home
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import empty, namespace, zeros


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    p, r = comm.size, comm.rank
    t, xp = q.shape[-2], namespace(q)
    delta = xp.sum(dout * out, axis=-1, keepdims=True)
    z = zeros(k.shape, like=k)
    held = xp.stack([k, v, z, z])  # K, V and the dK, dV summed so far, travelling together
    nxt = empty(held.shape, like=held)
    dq = zeros(q.shape, like=q)
    for s in range(p):
        j = (r - s) % p
        if not (causal and j > r):
            mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
            dq_j, dk_j, dv_j = attend_backward(q, held[0], held[1], dout, lse, delta, mask)
            dq = dq + dq_j
            held = xp.stack([held[0], held[1], held[2] + dk_j, held[3] + dv_j])
        if s < p - 1:
            comm.sendrecv(held, (r + 1) % p, nxt, (r - 1) % p)
            held, nxt = nxt, held
    return dq, held[2], held[3]  # BUG: block r+1's whole gradient; it needed one more hop, home
