"""Ring attention: the sequence split over cp ranks, K/V blocks passed around the ring.

    mpiexec -n 4 python -m mpi4py -m minipar.lessons.context_parallel      # checks vs dense attention

Rank r holds the queries, keys and values of its positions (``SeqLayout``). In step s it holds
the K/V block of rank r-s: it attends its queries to that block (online softmax, ``blocks``)
while the block moves on to rank r+1 and the block of rank r-s-1 arrives from rank r-1. After
cp steps every query has met every key, and no rank ever held more than two K/V blocks.

The ring is minipar's one ring (``collectives.ring_steps``), the very loop the all-gather and
the reduce-scatter run, with two changes:

* the blocks land in *slots*, not in a buffer with room for all p of them: two slots for
  K/V (the block being used and passed on, and the one arriving), so memory stays 1/cp;
* the attention of step s runs *between* posting step s (``next(ring)``: an irecv from the
  left and an isend to the right) and waiting for it, so the transfer hides behind the compute.

forward, per rank: the all-gather of K|V, one block at a time   sends (cp-1) * 2 * |K_local|
backward: the same all-gather of K|V, and dK|dV travel back as a reduce-scatter: the partial
    gradient of block j starts at rank j+1, every rank on the way adds its queries' part, and
    rank j adds its own last                                    sends (cp-1) * 4 * |K_local|
(|K_local| = B * nh * T/cp * hs elements; see ``traffic``). The dense reference beside it is
``minipar.nn.functional.attention_forward/backward`` on the whole sequence.

Dropout on the probabilities (``drop``): a block's keep mask is drawn where the block is used
(my queries against it, once per step), at the *global* (row, head, query, key) of its
elements, the keys' positions those of the rank the block came from (``layout.positions(j)``),
so the ring drops exactly one process's probabilities, normalised by the undropped sum
(``blocks``). Nothing more is sent, and no mask is kept: the backward draws each block's mask
again (flash attention's way, from its saved Philox state), at the same index, so it is the
forward's.
"""
from __future__ import annotations

import math

import numpy as np

from ..collectives import drain, ring_steps
from ..errors import UsageError
from ..xp import empty, namespace, size, zeros
from .blocks import allowed, block_attention, block_attention_backward, finish, merge, row_delta

TAG_KV, TAG_DKV = 2100, 2101


def _slots(n, slot_of, p):
    """ring_steps bounds that put block j in slot ``slot_of(j)`` of a buffer of n-element slots."""
    return [(slot_of(j) * n, (slot_of(j) + 1) * n) for j in range(p)]


def _kv_slot(r, p):
    """Where rank r keeps block j of K|V: its own in slot 0, then alternately 1, 0, 1, ... as the
    blocks pass (block r-s arrives in step s-1 and leaves in step s)."""
    return lambda j: (r - j) % p % 2


def _grad_slot(r, p):
    """Where rank r keeps block j's partial dK|dV: its own in slot 0 (it is added last), the
    others alternately in slots 2, 1, 2, ... while they pass through."""
    return lambda j: 0 if j == r else 1 + (r - j) % p % 2


def _pack(*arrays):
    """One flat array holding each array's elements in turn (K|V, or dK|dV)."""
    xp = namespace(arrays[0])
    return xp.concat([xp.reshape(a, (-1,)) for a in arrays])


def _unpack(flat, shape):
    """The two (B, nh, t, hs) arrays packed by ``_pack`` (views, no copy)."""
    xp, n = namespace(flat), math.prod(shape)
    return xp.reshape(flat[:n], shape), xp.reshape(flat[n:2 * n], shape)


def _check(comm, q, k, v, layout):
    if layout.cp != comm.size:
        raise UsageError(f"layout has cp={layout.cp} but the communicator has {comm.size} ranks")
    if not (q.shape == k.shape == v.shape) or q.ndim != 4 or q.shape[-2] != layout.local:
        raise UsageError(f"q, k, v must be (B, nh, {layout.local}, hs), this rank's rows of {layout}; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _pairs(layout, rank_q, rank_k, causal):
    """The chunk pairs of one step that have anything to compute: (q rows, k rows, mask).

    Rows are local slices (chunk i of a rank is its rows i*c ... (i+1)*c); fully masked pairs
    (keys all in the future of the queries, or all padding) are skipped: that is the causal
    saving, and what the zigzag split shares out evenly.
    """
    c = layout.chunk
    for qi, (qa, qb) in enumerate(layout.chunks(rank_q)):
        for kj, (ka, kb) in enumerate(layout.chunks(rank_k)):
            mask = allowed(np.arange(qa, qb), np.arange(ka, kb), layout.T, causal)
            if mask is not False:
                yield slice(qi * c, (qi + 1) * c), slice(kj * c, (kj + 1) * c), mask


def _keep(drop, like, q_pos, k_pos, heads=None):
    """The dropout keep mask (B, nh, tq, tk) of queries at global positions ``q_pos`` against
    keys at ``k_pos`` (``drop``: an ``nn.dropout.AttentionDropout``), or None without dropout."""
    return None if drop is None else drop.keep(like, q_pos, k_pos, heads)


def _attend(attend, q, k, v, mask, keep, drop):
    """``attend``'s partial state of one block; its dropout's mask and rate passed only with one
    (an instrumented kernel that knows no dropout still runs without)."""
    return attend(q, k, v, mask) if keep is None else attend(q, k, v, mask, keep=keep, rate=drop.rate)


def ring_attention_forward(comm, q, k, v, layout, causal=True, attend=block_attention, drop=None):
    """(out, ctx) for this rank's queries; q, k, v, out: (B, nh, T/cp, hs), rows per ``layout``.

    ``attend(q, k, v, mask) -> (acc, m, l)`` is the kernel of one block (``blocks.block_attention``;
    lab 06's grader passes an instrumented one, to see which block is computed when).
    ``drop``: dropout on the probabilities (``nn.dropout.AttentionDropout``; None: none).

    Saved for backward: ctx = (q, k, v, out, lse, layout, causal, drop): 1/cp of the sequence,
    and never a score matrix or a dropout mask (the backward recomputes each block's scores from
    lse, and draws its mask again).
    """
    _check(comm, q, k, v, layout)
    xp, p, r = namespace(q), comm.size, comm.rank
    n, slot = 2 * size(k), _kv_slot(r, p)  # n: elements of one K|V block
    mine = layout.positions(r)  # the global position of each of my rows
    buf = empty((2 * n,), like=q)  # two slots: the block in use, the block arriving
    buf[:n] = _pack(k, v)
    ring = ring_steps(comm, buf, _slots(n, slot, p), TAG_KV, ("all-gather",), name="ring_attention:forward K|V")
    states = {}  # first row of a query chunk -> its (acc, m, l)
    for s in range(p):
        next(ring, None)  # wait for step s-1, post step s: pass my block on, receive the next
        j = (r - s) % p  # whose K/V I hold now
        kj, vj = _unpack(buf[slot(j) * n:(slot(j) + 1) * n], k.shape)  # (B, nh, T/cp, hs)
        with comm.region(f"ring_attention:forward step {s} kv{j}"):
            keep = _keep(drop, q, mine, layout.positions(j))  # (B, nh, T/cp, T/cp): my queries, rank j's keys
            for qs, ks, mask in _pairs(layout, r, j, causal):
                part = _attend(attend, q[..., qs, :], kj[..., ks, :], vj[..., ks, :], mask,
                               None if keep is None else keep[..., qs, ks], drop)  # one c x c block
                states[qs.start] = merge(states[qs.start], part) if qs.start in states else part
    done = [finish(states[a]) for a in sorted(states)]  # every query chunk saw at least key 0
    out, lse = (xp.concat([d[i] for d in done], axis=-2) for i in (0, 1))  # (B, nh, T/cp, hs), (.., 1)
    return out, (q, k, v, out, lse, layout, causal, drop)


def ring_attention_backward(comm, dout, ctx, attend_backward=block_attention_backward):
    """(dq, dk, dv) for this rank's rows. K|V go around the ring once more (as in the forward);
    each rank adds its queries' part to the travelling dK|dV of every block, which end at their
    owners (the reduce-scatter of ``ring_steps``, 3 slots: my own block's, one leaving, one
    arriving). dout of padded rows must be 0. With dropout each block's mask is drawn again.

    ``attend_backward(q, k, v, dout, lse, delta, mask) -> (dq, dk, dv)`` is the kernel of one block
    (``blocks.block_attention_backward``; lab 06's grader passes an instrumented one)."""
    q, k, v, out, lse, layout, causal, drop = ctx
    p, r = comm.size, comm.rank
    mine, rate = layout.positions(r), 0.0 if drop is None else drop.rate
    n, slot, gslot = 2 * size(k), _kv_slot(r, p), _grad_slot(r, p)
    delta = row_delta(dout, out)  # (B, nh, T/cp, 1)
    buf = empty((2 * n,), like=q)
    buf[:n] = _pack(k, v)
    ring = ring_steps(comm, buf, _slots(n, slot, p), TAG_KV, ("all-gather",), name="ring_attention:backward K|V")
    dbuf = empty((3 * n,), like=q)  # slot 0: my block's dK|dV; slots 1, 2: blocks passing through
    grads = ring_steps(comm, dbuf, _slots(n, gslot, p), TAG_DKV, ("reduce-scatter",),
                       name="ring_attention:backward dK|dV")
    dq = zeros(q.shape, like=q)
    for s in range(p):
        next(ring, None)
        j = (r - s) % p
        kj, vj = _unpack(buf[slot(j) * n:(slot(j) + 1) * n], k.shape)
        dkj, dvj = zeros(k.shape, like=q), zeros(k.shape, like=q)  # my queries' part of block j's grads
        with comm.region(f"ring_attention:backward step {s} kv{j}"):
            keep = _keep(drop, q, mine, layout.positions(j))  # the forward's, drawn again
            for qs, ks, mask in _pairs(layout, r, j, causal):
                args = (q[..., qs, :], kj[..., ks, :], vj[..., ks, :], dout[..., qs, :], lse[..., qs, :],
                        delta[..., qs, :], mask)
                g = attend_backward(*args) if keep is None else attend_backward(*args, keep=keep[..., qs, ks], rate=rate)
                dq[..., qs, :] += g[0]
                dkj[..., ks, :] += g[1]
                dvj[..., ks, :] += g[2]
        dbuf[gslot(j) * n:(gslot(j) + 1) * n] = _pack(dkj, dvj)
        if s >= 1:
            next(grads, None)  # wait for step s-2 (the others' sum for block j, added in), post s-1 (send it on)
    drain(grads)  # the last step brings the other ranks' sum for my own block
    dk, dv = _unpack(dbuf[:n], k.shape)
    return dq, dk, dv


def traffic(layout, B, nh, hs, itemsize):
    """Bytes each rank sends per attention layer: {"forward": ..., "backward": ...}.

    forward (cp-1) K|V blocks; backward (cp-1) K|V blocks and (cp-1) dK|dV blocks.
    A block is B * nh * T/cp * hs elements (T padded, see ``SeqLayout``).
    """
    block = B * nh * layout.local * hs * itemsize
    return {"forward": (layout.cp - 1) * 2 * block, "backward": (layout.cp - 1) * 4 * block}
