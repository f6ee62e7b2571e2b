"""Skips the technique: every rank all-gathers the whole sequence's K and V (or q, k, v) and
attends at once. The values are right; the memory per rank is the whole sequence's, and
nothing overlaps. The grader's attend sees the whole sequence arrive in one call (ring), and
the trace shows p times Ulysses' bytes (Ulysses sends each rank only the heads it will own).
The backward does the same, and sums every rank's part of each block's dK|dV with a
reduce-scatter: the grader's attend_backward sees the whole sequence's keys in one call.

EXPECT 6.2: rank 0 called attend with 6 keys at once
EXPECT 6.2: ring attention attends its queries to one block of T/p = 3 keys at a time
EXPECT 6.7: rank 0 called attend_backward with 6 keys at once
EXPECT 6.7: the backward meets the keys one block of T/p = 3 at a time
EXPECT 6.3: rank 0 sent 2304 bytes through comm; Ulysses (all-to-alls sending (p-1)/p of q, k, v and of the output) on 2 ranks sends exactly 1152
"""
from minipar.collectives import all_gather, reduce_scatter
from minipar.xp import contiguous, namespace


def _whole(comm, x):
    """(B, nh, T, hs): every rank's rows of x, gathered (axis 0 of all_gather is the rank)."""
    got = all_gather(comm, contiguous(x[None]))  # (p, B, nh, t, hs)
    return namespace(x).concat(list(got), axis=-2)


def ring_attention(comm, q, k, v, attend, causal):
    K, V = _whole(comm, k), _whole(comm, v)
    t, r, xp = q.shape[-2], comm.rank, namespace(q)
    mask = xp.arange(K.shape[-2])[None, :] <= xp.arange(r * t, (r + 1) * t)[:, None] if causal else None
    acc, _, l = attend(q, K, V, mask)
    return acc / l


def ulysses_attention(comm, q, k, v, attend, causal):
    p, r = comm.size, comm.rank
    B, nh, t, hs = q.shape
    h, T, xp = nh // p, p * t, namespace(q)
    Q, K, V = (_whole(comm, a)[:, r * h:(r + 1) * h] for a in (q, k, v))  # my heads, gathered whole
    acc, _, l = attend(Q, K, V, xp.tril(xp.ones((T, T), dtype=xp.bool)) if causal else None)
    out = xp.concat(list(all_gather(comm, contiguous((acc / l)[None]))), axis=1)  # (B, nh, T, hs)
    return contiguous(out[..., r * t:(r + 1) * t, :])


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    """The whole K and V gathered, one kernel call; each rank's dK|dV parts summed by a
    reduce-scatter (all_gather's dual): the right values."""
    K, V = _whole(comm, k), _whole(comm, v)
    p, r, t, xp = comm.size, comm.rank, q.shape[-2], namespace(q)
    delta = xp.sum(dout * out, axis=-1, keepdims=True)
    mask = xp.arange(K.shape[-2])[None, :] <= xp.arange(r * t, (r + 1) * t)[:, None] if causal else None
    dq, dK, dV = attend_backward(q, K, V, dout, lse, delta, mask)  # (B, nh, T, hs) parts of every block
    parts = xp.stack([xp.stack([dK[..., j * t:(j + 1) * t, :], dV[..., j * t:(j + 1) * t, :]]) for j in range(p)])
    dkv = reduce_scatter(comm, contiguous(parts))[0]  # my block's sum over every rank's queries
    return dq, dkv[0], dkv[1]
