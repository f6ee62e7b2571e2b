"""Attention one block at a time: the online softmax, the exact merge, and the block backward.

Ring attention never sees all keys at once: a rank's queries meet the keys block by block as
K/V travel around the ring. Softmax over keys that arrive in pieces works because a partial
result can be kept as three numbers per query and merged exactly later:

    acc = sum_j exp(s_j - m) v_j      (hs values)   the unnormalised output
    m   = max_j s_j                   (1 value)     the running max (keeps exp() from overflowing)
    l   = sum_j exp(s_j - m)          (1 value)     the running sum

    state = empty_state(q)
    for each key block:  state = merge(state, block_attention(q, k_blk, v_blk, allowed, scale))
    out, lse = finish(state)          # out = acc / l, lse = m + log(l)

The backward recomputes each block's probabilities from ``lse`` (the log of the softmax's
denominator), so nothing larger than one block's scores is ever kept (flash attention's trick):

    p = exp(s - lse);  dv += p^T dout;  ds = p * (dout v^T - delta) * scale;  dq += ds k;  dk += ds^T q

with delta = rowsum(dout * out), the same for every block.

Dropout on the probabilities (``keep``, a block's keep mask, and ``rate``): the kept terms are
scaled and the dropped ones left out of the sum, but not of the normaliser, which is the
softmax's own (one process drops the *normalised* probabilities):

    acc = sum_j drop(exp(s_j - m)) v_j,   l = sum_j exp(s_j - m),   out = acc / l = sum_j drop(p_j) v_j

and the backward takes the same mask again: dv += drop(p)^T dout, ds = p * (drop(dout v^T) -
delta) * scale. delta is still rowsum(dout * out): sum_j p_j drop(dout v_j^T) = dout . out.

Shapes: (B, nh, tq, hs) queries, (B, nh, tk, hs) keys and values; ``allowed`` is a (tq, tk)
boolean mask or None (all allowed). Masks come from *positions* (:func:`allowed`), so one kernel
serves the causal mask, padding and any order the sequence was split in.
"""
from __future__ import annotations

import math

import numpy as np

from ..nn.functional import dropped, kept, matmul
from ..xp import device, namespace


def allowed(q_pos, k_pos, valid, causal):
    """Which (query, key) pairs may attend: key inside the real sequence (``k < valid``; the
    rest is padding) and, if causal, not in the query's future (``k <= q``).

    q_pos, k_pos: NumPy int arrays of global positions. Returns None when every pair is allowed,
    False when none is (the block is skipped), else the (tq, tk) boolean NumPy mask.
    """
    ok = np.broadcast_to(k_pos[None, :] < valid, (len(q_pos), len(k_pos)))
    if causal:
        ok = ok & (k_pos[None, :] <= q_pos[:, None])
    return None if ok.all() else (False if not ok.any() else ok)


def _scores(q, k, mask, scale):
    """s = q k^T * scale, masked entries -inf: (B, nh, tq, tk), the one score block alive."""
    xp = namespace(q)
    s = kept(matmul(q, xp.matrix_transpose(k)) * scale, q)  # (B, nh, tq, tk); 16 bits: q's dtype
    if mask is not None:
        s = kept(xp.where(xp.asarray(mask, device=device(q)), s, -xp.inf), q)
    return s


def _finite(m):
    """m with -inf (a row that saw no key yet) replaced by 0, so exp(x - m) stays 0, not NaN."""
    xp = namespace(m)
    return xp.where(m == -xp.inf, xp.zeros_like(m), m)


def block_attention(q, k, v, mask=None, scale=None, keep=None, rate=0.0):
    """One block of queries against one block of keys: the partial state (acc, m, l).

    acc: (B, nh, tq, hs); m, l: (B, nh, tq, 1). A query row whose keys are all masked gets
    m = -inf, l = 0, acc = 0: it merges as "nothing seen yet". ``keep``: the block's dropout
    keep mask (B, nh, tq, tk) bools (None: no dropout), ``rate`` its p; l counts every term.
    """
    xp = namespace(q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, mask, scale)  # (B, nh, tq, tk)
    m = xp.max(s, axis=-1, keepdims=True)  # (B, nh, tq, 1)
    p = xp.exp(s - _finite(m))  # (B, nh, tq, tk), unnormalised
    return matmul(dropped(p, keep, rate), v), m, xp.sum(p, axis=-1, keepdims=True)


def merge(a, b):
    """The exact merge of two partial results over disjoint sets of keys.

    Both are rescaled to the larger running max m = max(m_a, m_b):

        acc = acc_a exp(m_a - m) + acc_b exp(m_b - m),   l = l_a exp(m_a - m) + l_b exp(m_b - m)

    which is exactly what one softmax over the union of the keys would have summed (only the
    rounding differs). Order does not matter: merge(a, b) == merge(b, a).
    """
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    xp = namespace(acc_a)
    m = xp.maximum(m_a, m_b)  # (B, nh, tq, 1)
    ca, cb = xp.exp(m_a - _finite(m)), xp.exp(m_b - _finite(m))  # each <= 1
    return acc_a * ca + acc_b * cb, m, l_a * ca + l_b * cb


def empty_state(q):
    """The state of a query block that has seen no key: acc = 0, m = -inf, l = 0."""
    xp = namespace(q)
    B, nh, tq, hs = q.shape
    zeros = lambda n: xp.zeros((B, nh, tq, n), dtype=q.dtype, device=device(q))  # noqa: E731
    return zeros(hs), zeros(1) - xp.inf, zeros(1)


def finish(state):
    """(out, lse): out = acc / l (the attention output), lse = m + log(l) (kept for backward)."""
    acc, m, l = state
    xp = namespace(acc)
    return acc / l, m + xp.log(l)


def row_delta(dout, out):
    """delta = rowsum(dout * out), (B, nh, tq, 1): the softmax backward's sum(dp * p) term."""
    return namespace(dout).sum(dout * out, axis=-1, keepdims=True)


def block_attention_backward(q, k, v, dout, lse, delta, mask=None, scale=None, keep=None, rate=0.0):
    """(dq, dk, dv) of one block: what this query block adds to its own dq and to this key
    block's dk, dv. The probabilities are recomputed from ``lse``, so they are the final ones
    (normalised over every key), not this block's; ``keep``, ``rate``: the forward's dropout."""
    xp = namespace(q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = xp.exp(_scores(q, k, mask, scale) - lse)  # (B, nh, tq, tk), 0 where masked
    dv = matmul(xp.matrix_transpose(dropped(p, keep, rate)), dout)  # (B, nh, tk, hs)
    ds = kept(p * (dropped(matmul(dout, xp.matrix_transpose(v)), keep, rate) - delta) * scale, q)  # (B, nh, tq, tk)
    return matmul(ds, k), matmul(xp.matrix_transpose(ds), q), dv  # dq (B, nh, tq, hs), dk, dv (B, nh, tk, hs)
