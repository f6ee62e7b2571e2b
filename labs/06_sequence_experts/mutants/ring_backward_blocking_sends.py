"""Planted bug: every rank of the ring sends before it receives, with blocking calls

comm.send is synchronous (MPI_Ssend under MPI; under torch.distributed gloo's send too waits
for the receiver): it returns only once the receiver has started receiving. When every rank
first sends to its right neighbour and only then receives from its left one, every rank waits
in its send for a receive no one will post: a deadlock, from 2 ranks on, on both backends.
EXPECT_TASK: 6.7
EXPECT_MESSAGE: hangs on 2 ranks (deadlock or a send without its recv)
EXPECT_MESSAGE: rank 0: blocked in send to rank 1
"""
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import empty, namespace, zeros


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    p, r = comm.size, comm.rank
    t, xp = q.shape[-2], namespace(q)
    right, left = (r + 1) % p, (r - 1) % p
    delta = xp.sum(dout * out, axis=-1, keepdims=True)
    kv = xp.stack([k, v])
    nxt, carry = empty(kv.shape, like=kv), empty(kv.shape, like=kv)
    dq, own = zeros(q.shape, like=q), None
    for s in range(p):
        j = (r - s) % p
        part = zeros(kv.shape, like=kv)
        if not (causal and j > r):
            mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
            dq_j, dk_j, dv_j = attend_backward(q, kv[0], kv[1], dout, lse, delta, mask)
            dq = dq + dq_j
            part = xp.stack([dk_j, dv_j])
        if s == 0:
            own = part
        else:
            comm.send(part if s == 1 else carry + part, right, tag=2)  # BUG: everyone sends first
            comm.recv(carry, left, tag=2)
        if s < p - 1:
            comm.send(kv, right, tag=1)  # BUG: the same here
            comm.recv(nxt, left, tag=1)
            kv, nxt = nxt, kv
    dkv = own if p == 1 else own + carry
    return dq, dkv[0], dkv[1]
