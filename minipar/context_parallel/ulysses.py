"""Ulysses (DeepSpeed-Ulysses): trade the sequence split for a heads split, attend, trade back.

    forward:  q, k, v (B, nh, T/cp, hs)  --all-to-all-->  (B, nh/cp, T, hs)   my heads, every position
              attention over the whole sequence for nh/cp heads (no communication)
              out (B, nh/cp, T, hs)      --all-to-all-->  (B, nh, T/cp, hs)   my positions, every head
    backward: the same two all-to-alls in reverse order: dout to heads, dq|dk|dv back to positions.

The all-to-all is ``collectives.all_to_all`` (pairwise sendrecv): rank r sends head group j of
its rows to rank j. Constraint: cp must divide n_heads (each rank takes whole heads), so cp is
at most n_heads; the ring has no such limit. Each rank sends (cp-1)/cp of what it passes in:

    forward 4 * (cp-1)/cp * |K_local|, backward the same   (q|k|v and out; dout and dq|dk|dv)

against the ring's 2 (cp-1) |K_local| forward and 4 (cp-1) |K_local| backward: Ulysses moves
about cp/2 times fewer bytes forward and cp times fewer backward, and its per-rank volume
*falls* as cp grows (|K_local| = |K| / cp) while the ring's stays near 2 |K|. The price: the
score matrix of a head is the whole T x T (for nh/cp heads), not a T/cp block, and the sequence
rows arrive in layout order, which the position-based mask (``blocks.allowed``) takes care of.
Dropout on the probabilities draws its mask by the same positions (and each head's global
index: rank c holds heads c nh/cp ... of its TP rank's), so the re-layout changes nothing.
"""
from __future__ import annotations

import numpy as np

from ..collectives import all_to_all
from ..errors import UsageError
from ..xp import namespace
from .blocks import allowed, block_attention, block_attention_backward, finish, row_delta
from . import ring
from .ring import _check


def _seq_to_heads(comm, x):
    """(G, B, nh, T/cp, hs) -> (G, B, nh/cp, T, hs): head group j of my rows goes to rank j; the
    rows that come back are every rank's positions for my heads, in rank order."""
    xp, p = namespace(x), comm.size
    G, B, nh, t, hs = x.shape
    send = xp.permute_dims(xp.reshape(x, (G, B, p, nh // p, t, hs)), (2, 0, 1, 3, 4, 5))  # (p, G, B, nh/p, t, hs)
    got = all_to_all(comm, xp.reshape(send, (p, -1)))  # (p, ...): row i came from rank i
    got = xp.permute_dims(xp.reshape(got, (p, G, B, nh // p, t, hs)), (1, 2, 3, 0, 4, 5))  # (G, B, nh/p, p, t, hs)
    return xp.reshape(got, (G, B, nh // p, p * t, hs))


def _heads_to_seq(comm, x):
    """(G, B, nh/cp, T, hs) -> (G, B, nh, T/cp, hs): the inverse of ``_seq_to_heads``."""
    xp, p = namespace(x), comm.size
    G, B, h, T, hs = x.shape
    send = xp.permute_dims(xp.reshape(x, (G, B, h, p, T // p, hs)), (3, 0, 1, 2, 4, 5))  # (p, G, B, h, T/p, hs)
    got = all_to_all(comm, xp.reshape(send, (p, -1)))  # row i: head group i of my positions
    got = xp.permute_dims(xp.reshape(got, (p, G, B, h, T // p, hs)), (1, 2, 0, 3, 4, 5))  # (G, B, p, h, T/p, hs)
    return xp.reshape(got, (G, B, p * h, T // p, hs))


def _order(layout):
    """The global position of each row the all-to-all delivers: every rank's, in rank order."""
    return np.concatenate([layout.positions(j) for j in range(layout.cp)])


def _mask(layout, causal):
    """The (T, T) mask of the whole sequence in the order the all-to-all delivers it."""
    pos = _order(layout)
    return allowed(pos, pos, layout.T, causal)


def _keep(comm, drop, like, layout):
    """The dropout keep mask (B, nh/cp, T, T) of my heads (group ``comm.rank`` of the heads I
    was given) over the whole sequence in delivery order; None without dropout."""
    h = like.shape[1]  # nh/cp
    return ring._keep(drop, like, _order(layout), _order(layout), slice(comm.rank * h, (comm.rank + 1) * h))


def ulysses_attention_forward(comm, q, k, v, layout, causal=True, attend=block_attention, drop=None):
    """(out, ctx); q, k, v, out: (B, nh, T/cp, hs), this rank's rows per ``layout``; ``attend``:
    the attention kernel (q, k, v, mask) -> (acc, m, l), as in ``ring_attention_forward``;
    ``drop``: dropout on the probabilities (``nn.dropout.AttentionDropout``; None: none).

    Saved for backward: ctx = (q, k, v, out, lse) of my heads over the whole sequence (as many
    elements as my rows of every head: 1/cp), plus layout, causal and drop (no mask: the
    backward draws it again). Raises UsageError unless cp divides n_heads.
    """
    _check(comm, q, k, v, layout)
    if q.shape[1] % comm.size:
        raise UsageError(f"n_heads={q.shape[1]} is not divisible by cp={comm.size}: Ulysses gives each "
                         f"rank whole heads (use cp dividing {q.shape[1]}, or ring attention)")
    xp = namespace(q)
    qh, kh, vh = _seq_to_heads(comm, xp.stack([q, k, v]))  # (B, nh/cp, T, hs) each
    with comm.region("ulysses:attention forward"):
        keep = _keep(comm, drop, qh, layout)  # (B, nh/cp, T, T) or None
        oh, lse = finish(ring._attend(attend, qh, kh, vh, _mask(layout, causal), keep, drop))  # (B, nh/cp, T, hs)
    out = _heads_to_seq(comm, oh[None])[0]  # (B, nh, T/cp, hs)
    return out, (qh, kh, vh, oh, lse, layout, causal, drop)


def ulysses_attention_backward(comm, dout, ctx):
    """(dq, dk, dv) of this rank's rows: dout to heads, attention backward, dq|dk|dv to rows."""
    qh, kh, vh, oh, lse, layout, causal, drop = ctx
    doh = _seq_to_heads(comm, dout[None])[0]  # (B, nh/cp, T, hs)
    with comm.region("ulysses:attention backward"):
        keep, rate = _keep(comm, drop, qh, layout), 0.0 if drop is None else drop.rate  # the forward's mask again
        grads = block_attention_backward(qh, kh, vh, doh, lse, row_delta(doh, oh), _mask(layout, causal),
                                         keep=keep, rate=rate)
    dq, dk, dv = _heads_to_seq(comm, namespace(doh).stack(grads))  # (B, nh, T/cp, hs) each
    return dq, dk, dv


def traffic(layout, B, nh, hs, itemsize):
    """Bytes each rank sends per attention layer: {"forward": ..., "backward": ...}: every
    all-to-all keeps 1/cp of its input and sends the rest; four tensors of |K_local| each way."""
    block = B * nh * layout.local * hs * itemsize
    moved = block * (layout.cp - 1) // layout.cp
    return {"forward": 4 * moved, "backward": 4 * moved}
