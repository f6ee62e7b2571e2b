"""Skips the technique, subtly: all-gather K|V around minipar's ring first, then attend to the
blocks one by one. Every byte and message is what ring attention sends (the all-gather IS the
ring), and every call of attend gets one block: only the trace's timing shows that nothing
was in flight while the blocks were computed, and every rank held all p blocks at once.

EXPECT 6.2: rank 0 attended to block 0 (step 0) with no transfer in flight
"""
from minipar.collectives import all_gather
from minipar.xp import namespace


def _merge(a, b):
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    xp = namespace(acc_a)
    m = xp.maximum(m_a, m_b)
    fm = xp.where(xp.isinf(m), xp.zeros_like(m), m)
    ca, cb = xp.exp(m_a - fm), xp.exp(m_b - fm)
    return acc_a * ca + acc_b * cb, m, l_a * ca + l_b * cb


def ring_attention(comm, q, k, v, attend, causal):
    p, r, t, xp = comm.size, comm.rank, q.shape[-2], namespace(q)
    blocks = all_gather(comm, xp.stack([k, v])[None])  # (p, 2, B, nh, t, hs): the same bytes as the ring
    state = None
    for s in range(p):
        j = (r - s) % p
        if causal and j > r:
            continue
        mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
        part = attend(q, blocks[j, 0], blocks[j, 1], mask)
        state = part if state is None else _merge(state, part)
    acc, _, l = state
    return acc / l
