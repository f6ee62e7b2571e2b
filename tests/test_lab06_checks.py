"""Lab 06's pinpointing messages on their own (one process, no ranks): each hint the grader gives
fires on the mistake it names, and stays silent on the right answer. The planted-bug mutants
and the skipping solutions (tests/test_labs.py) then show the checks on real ranks."""
import math

import numpy as np

from minipar.context_parallel.blocks import merge as right_merge
from minipar.experts.routing import capacity, route
from minipar.labs import lab06, lab06_experts as moe
from minipar.trace import Event


class FakeComm:
    def __init__(self, rank=0, size=2):
        self.rank, self.size = rank, size

    def asarray(self, a):  # the NumPy backend's: what a check hands the learner
        return np.ascontiguousarray(a)


def test_merge_check_names_each_usual_mistake():
    comm = FakeComm(0, 1)
    assert lab06.check_merge(comm, right_merge) == []

    def no_rescale(a, b):
        return a[0] + b[0], np.maximum(a[1], b[1]), a[2] + b[2]

    def unguarded(a, b):
        m = np.maximum(a[1], b[1])
        with np.errstate(invalid="ignore"):
            ca, cb = np.exp(a[1] - m), np.exp(b[1] - m)  # -inf - (-inf): NaN
        return a[0] * ca + b[0] * cb, m, a[2] * ca + b[2] * cb

    def raw_exp(a, b):  # exp(m_a) / exp(m): right on paper, inf / inf at scores of thousands
        m = np.maximum(a[1], b[1])
        with np.errstate(all="ignore"):
            ca, cb = np.exp(a[1]) / np.exp(m), np.exp(b[1]) / np.exp(m)
        return a[0] * ca + b[0] * cb, m, a[2] * ca + b[2] * cb

    def wrong_way(a, b):
        m = np.maximum(a[1], b[1])
        ca, cb = np.exp(m - a[1]), np.exp(m - b[1])
        return a[0] * ca + b[0] * cb, m, a[2] * ca + b[2] * cb

    def min_not_max(a, b):
        acc, _, l = right_merge(a, b)
        return acc, np.minimum(a[1], b[1]), l

    for wrong, message in ((no_rescale, "acc and l were added without rescaling"),
                           (wrong_way, "rescaled the wrong way"),
                           (min_not_max, "m must be the larger running max"),
                           (raw_exp, "acc or l overflowed"),
                           (unguarded, "NaN for a query row that saw no key in either block")):
        fails = lab06.check_merge(comm, wrong)
        assert len(fails) == 1 and message in fails[0], (wrong.__name__, fails)
    assert "must return the state (acc, m, l)" in lab06.check_merge(comm, lambda a, b: a[0])[0]


def call(block, t=3, mask=None, t0=1.0, t1=2.0, keys=None):
    k = np.zeros((1, 1, keys or t, 1))
    return lab06.Call(t0, t1, k, k, k, np.ones((t, keys or t), bool) if mask is None else mask, block)


def test_ring_blocks_names_block_size_identity_order_and_masks():
    comm, t, tril = FakeComm(1, 3), 3, np.tril(np.ones((3, 3), bool))
    good_causal = [call(1, mask=tril), call(0)]
    assert lab06.ring_blocks(comm, good_causal, t, True, "c") == []
    assert lab06.ring_blocks(comm, [call(1), call(0), call(2)], t, False, "c") == []
    cases = [([], False, "never called attend"),
             ([call(1, keys=9)], False, "called attend with 9 keys at once"),
             ([call(None)], False, "is no rank's K and V"),
             ([call(1, mask=tril), call(0), call(2)], True, "attended to block 2 (keys 6:9), in the future"),
             ([call(1), call(1), call(0)], False, "attended to block 1 2 times"),
             ([call(1), call(0)], False, "never attended to block 2"),
             ([call(1), call(0)], True, "attended to its own block without the causal mask"),
             ([call(1, mask=tril), call(0, mask=tril)], True, "earlier blocks are all in the past"),
             ([call(1, mask=tril), call(0), call(2)], False, "every query sees every key")]
    for calls, causal, message in cases:
        fails = lab06.ring_blocks(comm, calls, t, causal, "c")
        assert len(fails) == 1 and message in fails[0], (message, fails)


def test_ring_overlap_needs_an_irecv_open_around_every_block_but_the_last():
    comm = FakeComm(1, 3)  # rank 1 holds block 1 in step 0, block 0 in step 1, block 2 in step 2 (no transfer)
    calls = [call(1, t0=1.0, t1=2.0), call(0, t0=4.0, t1=5.0), call(2, t0=7.0, t1=8.0)]
    irecv = lambda a, b: Event(1, "irecv", "world", a, b, 8, 0)  # noqa: E731
    assert lab06.ring_overlap(comm, [irecv(0.5, 2.5), irecv(3.5, 5.5)], calls, "c") == []
    waited_first = [irecv(0.5, 0.9), irecv(3.5, 3.9)]  # each transfer done before its block is computed
    assert "attended to block 1 (step 0) with no transfer in flight" in lab06.ring_overlap(comm, waited_first, calls, "c")[0]
    assert "block 0 (step 1)" in lab06.ring_overlap(comm, [irecv(0.5, 2.5)], calls, "c")[0]
    assert lab06.ring_overlap(comm, [], calls[2:], "c") == []  # the last block: nothing left to receive


def test_heads_layout_traces_a_wrong_element_to_where_it_came_from():
    comm, h = FakeComm(1, 2), 2
    q, k, v = (np.random.default_rng(i).standard_normal((1, 4, 6, 2)) for i in range(3))
    own = [a[:, 2:4] for a in (q, k, v)]
    ok = lab06.Call(0, 1, *own, np.ones((6, 6), bool))
    assert lab06.heads_layout(comm, [ok], (q, k, v), h, False, "c") == []
    assert "called attend 2 times" in lab06.heads_layout(comm, [ok, ok], (q, k, v), h, False, "c")[0]
    rows = lab06.Call(0, 1, *[a[..., 3:6, :] for a in (q, k, v)], np.ones((3, 3), bool))
    assert "attend got q of shape (1, 4, 3, 2)" in lab06.heads_layout(comm, [rows], (q, k, v), h, False, "c")[0]
    swapped = own[0].copy()
    swapped[0, 0, 1], swapped[0, 0, 4] = own[0][0, 0, 4], own[0][0, 0, 1]  # positions 1 and 4 exchanged
    bad = lab06.Call(0, 1, swapped, own[1], own[2], np.ones((6, 6), bool))
    msg = lab06.heads_layout(comm, [bad], (q, k, v), h, False, "c")[0]
    assert "attend's q[0, 0, 1, 0] (batch 0, head 2, position 1) holds q's batch 0, head 2, position 4" in msg, msg
    assert "in position order" in msg
    unmasked = lab06.heads_layout(comm, [ok], (q, k, v), h, True, "c")[0]
    assert "np.tril(np.ones((T, T), dtype=bool))" in unmasked


def test_route_mistake_names_global_capacity_token_priority_and_floor():
    N, E, k, f = 10, 4, 2, 0.75  # capacity ceil(3.75) = 4, floor 3; over 2 ranks ceil(7.5) = 8
    probs = moe.probabilities(0, N, E)
    want = route(probs, k, capacity(N, E, k, f))
    comm = FakeComm(0, 2)
    cases = [(route(probs, k, capacity(2 * N, E, k, f)).keep, "computed over all 2 ranks' tokens"),
             (moe.keep_by(want.choice, 4, E, token_major=True), "keeps choices token by token"),
             (route(probs, k, math.floor(f * k * N / E)).keep, "floor(0.75 * 2 * 10 / 4) = 3: round up")]
    for keep, message in cases:
        assert not np.array_equal(keep, want.keep), message  # the case shows the mistake
        fails = moe.route_mistake(comm, keep, probs, want, k, f, "c")
        assert len(fails) == 1 and message in fails[0], (message, fails)
    flipped = want.keep.copy()
    flipped[0, 0] = not flipped[0, 0]
    assert "token 0's choice 0" in moe.route_mistake(comm, flipped, probs, want, k, f, "c")[0]
    assert np.array_equal(moe.keep_by(want.choice, 4, E), want.keep)  # the hint's rule is the library's


def test_dispatch_mistake_names_transposed_counts_and_source_order():
    p, E, k = 2, 4, 2
    data = [moe.tokens(i, 8, E, 3, k) for i in range(p)]
    comm = FakeComm(0, p)
    rows, counts = moe.expected_dispatch(data, 0, E, k)
    own = np.bincount(moe.sent_rows(data[0][1], data[0][2], E)[1], minlength=E).reshape(p, E // p)
    assert not np.array_equal(own, counts)
    assert moe.dispatch_mistake(comm, rows, counts, rows, counts, own, "c") == []
    assert "the counts are transposed" in moe.dispatch_mistake(comm, rows, own, rows, counts, own, "c")[0]
    assert "counts has shape (2,)" in moe.dispatch_mistake(comm, rows, counts.sum(1), rows, counts, own, "c")[0]
    off = counts.copy()
    off[1, 0] += 1
    assert "counts[1, 0]" in moe.dispatch_mistake(comm, rows, off, rows, counts, own, "c")[0]
    blocks = moe._blocks(counts)
    by_source = np.concatenate([rows[blocks[e][i]] for i in range(p) for e in range(E // p)])
    assert "in the order they arrived (by source rank)" in moe.dispatch_mistake(comm, by_source, counts, rows, counts,
                                                                                 own, "c")[0]
