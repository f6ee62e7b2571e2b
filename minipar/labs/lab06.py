"""Lab 06 (long sequences and many experts): the tasks, and the checks of the attention tasks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs or which rule was broken. Tasks 6.4-6.6
(mixture of experts) are checked in ``minipar.labs.lab06_experts``, the core tasks 6.7 and 6.8
(ring attention's backward, the MoE's backward with its balancing loss) in
``minipar.labs.lab06_backward``. The rules:

* 6.1 ``merge`` is a pure function, checked in one process on cases where the typical mistakes
  show (blocks whose scores are hundreds apart, query rows that saw no key), each mistake with
  its own message;
* ring and Ulysses attention compute through ``attend``, the grader's block kernel (minipar's
  ``block_attention``), which records every call: which rank's K/V block it got, how many keys,
  which mask, and when. So the checks see what no output shows: a ring that attends to the
  whole gathered sequence at once, a block attended twice or in the queries' future, the own
  block without its causal mask, the heads layout Ulysses hands to attention (a wrong
  element is traced back to the head and position it came from);
* overlap: every block but the last is attended to while an ``irecv`` posted before the call is
  still open (the trace's irecv spans post to wait); waiting first, or gathering every block
  first (the same bytes as the ring!), fails;
* traffic: exactly p-1 K|V messages to the right neighbour (ring), exactly (p-1)/p of q, k, v
  and of the output (Ulysses); a builtin sends 0 bytes through comm, ``comm.builtin`` is refused;
  every message is the learner's own (sent by their code, through minipar.collectives at most),
  not made by minipar's context-parallel attention called from the exercise.

Sizes are small (t = 2 or 3 positions per rank) and every world size runs both masks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..context_parallel.blocks import block_attention
from ..nn.functional import attention_forward
from ..xp import to_numpy
from .checks import COLLECTIVES, compare, expect_traffic, graded, no_builtin, ranks, sent_by_learner, stop
from .grader import Task
from .lab06_backward import BACKWARD_HINTS

TITLE = ("long sequences and many experts: online softmax, ring attention, Ulysses, MoE routing and dispatch, "
         "and the backward passes")
HERE = "minipar.labs.lab06"
MOE = "minipar.labs.lab06_experts"
BACKWARD = "minipar.labs.lab06_backward"
INSTEAD = "comm.isend / comm.irecv (the ring) or minipar.collectives.all_to_all"

TASKS = [
    Task("6.1", "online-softmax merge", "merge", f"{HERE}:check_merge", sizes=(1,)),
    Task("6.2", "ring attention", "ring_attention", f"{HERE}:check_ring_attention", sizes=(1, 2, 3)),
    Task("6.3", "Ulysses all-to-all", "ulysses_attention", f"{HERE}:check_ulysses", sizes=(1, 2, 3)),
    Task("6.4", "top-k routing, capacity", "route", f"{MOE}:check_route", sizes=(2, 3)),
    Task("6.5", "dispatch counts and rows", "dispatch", f"{MOE}:check_dispatch", sizes=(2, 3)),
    Task("6.6", "expert-parallel MoE", "moe_forward", f"{MOE}:check_moe_forward", sizes=(2, 3)),
    Task("6.7", "ring attention backward", "ring_attention_backward", f"{BACKWARD}:check_ring_backward",
         sizes=(1, 2, 3), reference=("minipar.context_parallel.ring:ring_attention_backward",), tier="core"),
    Task("6.8", "MoE backward, aux loss", "moe_backward", f"{BACKWARD}:check_moe_backward", sizes=(2, 3),
         reference=("minipar.experts.moe:MoE.backward_input", "minipar.experts.moe:plan",
                    "minipar.experts.routing:aux_loss"), tier="core"),
]

# Hints, stage by stage (`minipar check 06 --hint 6.2`): a nudge naming the idea and what to read,
# the shape of the loop, then near-pseudocode. The answer: `minipar lab solution 06 --task 6.2`.
HINTS = {
    "6.1": (
        """The online softmax: a block's acc and l are sums of exp(score - m_block), each relative to
        its own max. To add two blocks, rescale both to the common max m = xp.maximum(m_a, m_b) (xp =
        minipar.xp.namespace(acc_a)): by exp(m_a - m) and exp(m_b - m). The README's Background says why
        the result is exact.""",
        """Where m = -inf (the row saw no key in either block), m_a - m is -inf - (-inf) = NaN:
        subtract a finite stand-in there instead, xp.where(xp.isinf(m), xp.zeros_like(m), m), and both
        factors are exp(-inf) = 0.""",
        """
        xp = namespace(acc_a); m = xp.maximum(m_a, m_b); finite = xp.where(xp.isinf(m), xp.zeros_like(m), m)
        ca, cb = xp.exp(m_a - finite), xp.exp(m_b - finite)
        return acc_a * ca + acc_b * cb, m, l_a * ca + l_b * cb
        """,
    ),
    "6.2": (
        """Your queries stay home; the keys and values travel. At every step you hold one rank's K/V
        block: start passing it on to your right neighbour (and receiving the next one from your
        left) before you attend to it, merge its partial state into yours (6.1), and only then wait
        for the transfer: it was in flight while you computed. Which block you hold at a step follows
        from how far the blocks have travelled.""",
        """kv = xp.stack([k, v]); nxt = empty(kv.shape, like=kv); state = None. For s in range(p): you
        hold the block of rank j = (r - s) % p; unless s == p - 1, reqs = [comm.irecv(nxt, (r - 1) % p),
        comm.isend(kv, (r + 1) % p)]. Causal: skip j > r (the future), mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) when
        j == r, None when j < r. Then wait both requests and swap kv, nxt. Return acc / l.""",
        """
        for s in range(p):
            j = (r - s) % p
            if s < p - 1: reqs = [comm.irecv(nxt, (r - 1) % p), comm.isend(kv, (r + 1) % p)]
            if not (causal and j > r):
                part = attend(q, kv[0], kv[1], tril mask if causal and j == r else None)
                state = part if state is None else merge(state, part)
            if s < p - 1: wait every req; kv, nxt = nxt, kv
        acc, _, l = state; return acc / l
        """,
    ),
    "6.3": (
        """Ulysses trades the sequence split for a heads split: one all_to_all gives each rank h = nh/p
        heads of all T positions, it attends once with no more messages, and one all_to_all goes
        back. all_to_all(comm, x) sends x[j] to rank j and returns row i from rank i: put the
        destination rank on axis 0.""",
        """Stack q, k, v: (3, B, nh, t, hs); reshape to (3, B, p, h, t, hs) and move the p axis first,
        (p, 3, B, h, t, hs) (xp.permute_dims, then contiguous). After the all_to_all row i holds rank
        i's positions: permute to (3, B, h, p, t, hs) and reshape to (3, B, h, T, hs). attend with a
        (T, T) xp.tril mask when causal; out = acc / l.""",
        """
        send = xp.permute_dims(xp.reshape(xp.stack([q, k, v]), (3, B, p, h, t, hs)), (2, 0, 1, 3, 4, 5))
        got = all_to_all(comm, contiguous(send))                               # (p, 3, B, h, t, hs)
        qh, kh, vh = xp.reshape(xp.permute_dims(got, (1, 2, 3, 0, 4, 5)), (3, B, h, p * t, hs))
        acc, _, l = attend(qh, kh, vh, mask)
        out = xp.permute_dims(xp.reshape(acc / l, (B, h, p, t, hs)), (2, 0, 1, 3, 4))  # (p, B, h, t, hs)
        back = all_to_all(comm, contiguous(out))                               # (p, B, h, t, hs)
        return xp.reshape(xp.permute_dims(back, (1, 0, 2, 3, 4)), (B, nh, t, hs))
        """,
    ),
    "6.4": (
        """Routing is local: each token's k best experts (a tie goes to the lower expert index), then a
        capacity per expert, ceil(capacity_factor * k * N / E) assignments, granted in priority order.
        The decisions are integers, made on the host, in NumPy on to_numpy(probs) (minipar.xp).""",
        """np.argsort(-probs, axis=1, kind="stable")[:, :k]: a stable sort keeps the lower expert first on
        ties. Priority: every first choice (token by token), then every second choice, and so on:
        for c in range(k): for n in range(N): e = choice[n, c]; keep it if used[e] < capacity,
        and count it in used[e].""",
        """
        probs = to_numpy(probs); cap = math.ceil(capacity_factor * k * N / E)
        choice = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        keep, used = np.zeros((N, k), bool), np.zeros(E, int)
        for c in range(k):
            for n in range(N):
                if used[choice[n, c]] < cap: keep[n, c] = True; used[choice[n, c]] += 1
        return choice, keep
        """,
    ),
    "6.5": (
        """Dispatch is two all-to-alls: first the counts (how many rows each rank sends to each of my
        experts), then the rows, all_to_all_v(comm, rows, send_counts) with one count per destination
        rank. Rank j owns experts j*E/p .. (j+1)*E/p - 1, so rows sorted by expert are grouped by
        destination. Both are in minipar.collectives.""",
        """kept = (token n, expert e) of every kept assignment, ordered by e, then choice c, then n.
        mine = np.bincount(the kept experts, minlength=E).reshape(p, E // p).astype(np.int64);
        counts = to_numpy(all_to_all(comm, comm.asarray(mine))) (counts[i, e]: rows rank i sends to
        my local expert e); got, _ = all_to_all_v(comm, x[the kept tokens], mine.sum(axis=1)).""",
        """
        got arrives by source rank, each source's block ordered by my local expert: block (i, e)
        starts at the running sum of counts in (i, e) order, i.e. np.cumsum of counts.reshape(-1).
        Return the blocks expert-major (e = 0 .. E/p - 1, then i = 0 .. p-1), joined with xp.concat
        (xp = namespace(x)), and counts.
        """,
    ),
    "6.6": (
        """The whole layer: probs = softmax(x @ w_router) (minipar.nn.functional.softmax_forward(...)[0]);
        route (6.4); dispatch (6.5); your experts on their rows (gelu_forward); then the combine,
        dispatch in reverse: one all_to_all_v sends every output row back to its source rank.""",
        """Your rows arrive expert-major: local expert e's block has counts[:, e].sum() rows; run
        experts[r * E/p + e] on it. To send back, reorder the outputs source-major (for each source
        rank i, its blocks for e = 0 .. E/p - 1) and all_to_all_v(comm, back, counts.sum(axis=1)):
        your own rows come back in the order you sent them.""",
        """
        y = zeros(x.shape, like=x)             # minipar.xp: x's kind, dtype and device
        for (n, e), row in zip(kept assignments in dispatch's order, returned rows):
            y[n] += probs[n, e] * row          # a token with every choice dropped stays 0
        return y
        """,
    ),
    **BACKWARD_HINTS,
}


def same(*shape, seed=0):
    """The same draw on every rank."""
    return np.random.default_rng([6, seed, *shape]).standard_normal(shape)


def mine(a, j, t):
    """Rank j's rows (positions j*t ... (j+1)*t) of a (B, nh, T, hs): the contiguous split."""
    return np.ascontiguousarray(a[..., j * t:(j + 1) * t, :])


# --------------------------------------------------------------------------- 6.1 merge

def merge_cases():
    """(name, a, b, want): two partial states over disjoint keys and the state over their union."""
    rng = np.random.default_rng(61)
    q, k, v = (rng.standard_normal((2, 2, 4, 3)) for _ in range(3))
    k, v = (np.concatenate([a, rng.standard_normal((2, 2, 3, 3))], axis=-2) for a in (k, v))  # 7 keys
    late, early = slice(3, 7), slice(0, 3)
    causal = np.arange(7)[None, :] <= np.arange(4)[:, None] + 1  # query i sees keys 0 .. i+1
    blind = causal.copy()
    blind[0] = False  # query 0 sees no key at all
    out = []
    for name, qq, mask in (("two blocks of 3 and 4 keys", q, None),
                           ("scores thousands apart (exp of a raw score overflows)", 3000 * q, None),
                           ("a causal split: queries 0 and 1 see no key of block a", q, causal),
                           ("query 0 sees no key in either block", q, blind)):
        part = lambda s: block_attention(qq, k[..., s, :], v[..., s, :], None if mask is None else mask[:, s])  # noqa: E731
        out.append((name, part(late), part(early), block_attention(qq, k, v, mask)))
    return out


def merge_mistake(got, a, b):
    """A message for the usual ways of getting the merge wrong, or None."""
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    acc, m, l = (to_numpy(x) for x in got)
    m_ab = np.maximum(m_a, m_b)
    close = lambda x, y: x.shape == y.shape and np.allclose(x, y, rtol=1e-12, atol=1e-300, equal_nan=True)  # noqa: E731
    nan = np.isnan(acc).any(axis=-1, keepdims=True) | np.isnan(l) | np.isnan(m)  # (B, nh, tq, 1)
    if (nan & np.isneginf(m_a) & np.isneginf(m_b)).any():
        return ("NaN for a query row that saw no key in either block (m_a = m_b = -inf, l = 0): exp(m_a - m) = "
                "exp(-inf - (-inf)) is NaN; such a row must stay 'nothing seen' (acc = 0, m = -inf, l = 0): "
                "subtract m only where it is finite (use 0 where m = -inf)")
    if not (np.isfinite(acc).all() and np.isfinite(l).all()):
        return ("acc or l overflowed (inf, or NaN from inf / inf): keep every exponent <= 0 by rescaling both "
                "blocks to the larger max m = max(m_a, m_b): exp(m_a - m) and exp(m_b - m), never exp of a max "
                "or a score by itself")
    if close(acc, acc_a + acc_b) and close(l, l_a + l_b):
        return ("acc and l were added without rescaling: each block's sums are relative to its own max (m_a, "
                "m_b); multiply them by exp(m_a - m) and exp(m_b - m), m = max(m_a, m_b), before adding")
    if not close(m, m_ab):
        return "m must be the larger running max, m = max(m_a, m_b) (the max over the union of the keys)"
    with np.errstate(all="ignore"):
        up_a, up_b = np.exp(m_ab - m_a), np.exp(m_ab - m_b)
        if close(acc, np.where(np.isfinite(up_a), acc_a * up_a, 0) + np.where(np.isfinite(up_b), acc_b * up_b, 0)):
            return "rescaled the wrong way: multiply by exp(m_a - m) <= 1, not exp(m - m_a)"
    return None


def check_merge(comm, fn):
    for name, a, b, want in merge_cases():
        got = fn(tuple(comm.asarray(x.copy()) for x in a), tuple(comm.asarray(x.copy()) for x in b))
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            return [f"merge must return the state (acc, m, l), got {type(got).__name__} ({name})"]
        hint = merge_mistake(got, a, b)
        if hint and any(compare(comm, g, w, "", name) for g, w in zip(got, want)):
            return [f"merge(a, b), case '{name}': {hint}"]
        for what, g, w in zip(("acc", "m", "l"), got, want):
            fails = compare(comm, g, w, f"the merged {what}", name)
            if fails:
                return fails
    return []


# --------------------------------------------------------------------------- the instrumented kernel

@dataclass
class Call:
    t0: float
    t1: float
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray  # (tq, tk) bool: which pairs the call allowed
    block: int | None = None  # the rank whose K/V block this was (ring), None if no rank's


class Attend:
    """The kernel handed to the learner: ``attend(q, k, v, mask=None) -> (acc, m, l)``, minipar's
    ``block_attention``, with every call recorded (``blocks``: each rank's (k, v), to name them).
    q, k, v are the backend's arrays (NumPy or torch); the mask may be either kind (or None).
    The record keeps NumPy copies."""

    def __init__(self, blocks=()):
        self.blocks, self.calls = list(blocks), []

    def __call__(self, q, k, v, mask=None):
        t0 = time.perf_counter()
        tq, tk = q.shape[-2], k.shape[-2]
        full = np.ones((tq, tk), bool) if mask is None else np.asarray(to_numpy(mask), bool).reshape(-1, tq, tk)[0]
        out = block_attention(q, k, v, mask)
        q, k, v = (np.array(to_numpy(a)) for a in (q, k, v))
        block = next((j for j, (kj, vj) in enumerate(self.blocks)
                      if kj.shape == k.shape and np.array_equal(kj, k) and np.array_equal(vj, v)), None)
        self.calls.append(Call(t0, time.perf_counter(), q, k, v, full, block))
        return out


# --------------------------------------------------------------------------- 6.2 ring attention

def ring_blocks(comm, calls, t, causal, case):
    """Which blocks were attended to, how big, with which mask."""
    r, p = comm.rank, comm.size
    if not calls:
        return [f"rank {r}: ring_attention never called attend ({case}): compute each block with "
                f"attend(q, k_block, v_block, mask)"]
    for c in calls:
        if c.k.shape[-2] != t:
            return [f"rank {r} called attend with {c.k.shape[-2]} keys at once ({case}); ring attention attends its "
                    f"queries to one block of T/p = {t} keys at a time: the whole sequence's K and V never sit on "
                    f"one rank"]
    seen = [c.block for c in calls]
    if None in seen:
        return [f"rank {r}: attend got a K/V block that is no rank's K and V ({case}): pass on the block you hold "
                f"unchanged, K and V together (kv = np.stack([k, v])), and attend to it as it arrives"]
    for j in seen:
        if causal and j > r:
            return [f"rank {r} attended to block {j} (keys {j * t}:{(j + 1) * t}), in the future of all its queries "
                    f"({r * t}:{(r + 1) * t}) ({case}): with a causal mask it adds nothing; skip it"]
    twice = sorted({j for j in seen if seen.count(j) > 1})
    if twice:
        return [f"rank {r} attended to block {twice[0]} {seen.count(twice[0])} times ({case}): every block once"]
    missing = sorted(set(range(r + 1 if causal else p)) - set(seen))
    if missing:
        return [f"rank {r} never attended to block {missing[0]} (keys {missing[0] * t}:{(missing[0] + 1) * t}) "
                f"({case}): after p steps every block of K/V has passed through every rank"]
    for c in calls:
        own = causal and c.block == r
        want = np.tril(np.ones((t, t), bool)) if own else np.ones((t, t), bool)
        if own and c.mask.all():
            return [f"rank {r} attended to its own block without the causal mask ({case}): query i may see key j "
                    f"only if j <= i: mask = np.tril(np.ones((t, t), dtype=bool))"]
        if not np.array_equal(c.mask, want):
            return [f"rank {r} attended to block {c.block} with a mask that hides {int((want & ~c.mask).sum())} and "
                    f"allows {int((c.mask & ~want).sum())} pairs wrongly ({case}): "
                    + ("only the own block needs the causal mask; earlier blocks are all in the past (mask=None)"
                       if causal else "without a causal mask every query sees every key (mask=None)")]
    return []


def ring_overlap(comm, events, calls, case):
    """Every block but the last one attended to while an irecv posted before it is still open."""
    r, p = comm.rank, comm.size
    recvs = [e for e in events if e.kind == "irecv"]
    for c in calls:
        s = (r - c.block) % p
        if s < p - 1 and not any(e.t_start <= c.t0 and e.t_end >= c.t1 for e in recvs):
            return [f"rank {r} attended to block {c.block} (step {s}) with no transfer in flight ({case}): the next "
                    f"block's irecv was not posted before attend, or was waited for before it; post the step's "
                    f"irecv and isend, attend to the block you hold, then wait: the transfer hides behind the compute"]
    return []


def check_ring_attention(comm, fn):
    p, r = comm.size, comm.rank
    B, nh, t, hs = 1, 2, 3, 4
    fails = []
    for causal in (False, True):
        q, k, v = (same(B, nh, p * t, hs, seed=s) for s in (1, 2, 3))
        want = mine(attention_forward(q, k, v, causal=causal)[0], r, t)
        attend = Attend([(mine(k, j, t), mine(v, j, t)) for j in range(p)])
        handed = [comm.asarray(mine(a, r, t)) for a in (q, k, v)]  # this rank's rows, the backend's kind
        g = graded(comm, lambda: fn(comm, *handed, attend, causal))
        case = f"T={p * t}, {t} positions per rank, {'causal' if causal else 'no mask'}, on {ranks(p)}"
        block = 2 * B * nh * t * hs  # doubles in one K|V message
        fails = (no_builtin(comm, g, "ring_attention", INSTEAD)
                 or ring_blocks(comm, attend.calls, t, causal, case)
                 or compare(comm, g.out, want, f"the attention output of positions {r * t}:{(r + 1) * t}", case)
                 or expect_traffic(comm, g, f"ring attention ({p - 1} K|V blocks of {block} doubles, one message per "
                                            f"step, to the right)", (p - 1) * block * 8, p - 1, [(r + 1) % p],
                                   hint="p-1 steps, each passing the K|V block you hold to the right as one message "
                                        "(np.stack([k, v])); the last block stays where it is")
                 or ring_overlap(comm, g.events, attend.calls, case)
                 or sent_by_learner(comm, g, fn, "ring_attention", INSTEAD, COLLECTIVES))
        if stop(comm, fails):
            break
    return fails


# --------------------------------------------------------------------------- 6.3 Ulysses

def heads_layout(comm, calls, arrays, h, causal, case):
    """One attend call, on this rank's h heads of every position, in position order."""
    r = comm.rank
    if len(calls) != 1:
        return [f"rank {r} called attend {len(calls)} times ({case}); Ulysses attends once, to its nh/p = {h} heads "
                f"over the whole sequence"]
    c = calls[0]
    for name, got, full in zip("qkv", (c.q, c.k, c.v), arrays):
        B, _, T, hs = full.shape
        own = full[:, r * h:(r + 1) * h]
        if got.shape != own.shape:
            return [f"rank {r}: attend got {name} of shape {got.shape}; after the all-to-all rank {r} holds heads "
                    f"{r * h}:{(r + 1) * h} of every position: (B, nh/p, T, hs) = {own.shape} ({case})"]
        if not np.array_equal(got, own):
            b, hh, tt, d = np.argwhere(got != own)[0]
            src = np.argwhere(full == got[b, hh, tt, d])
            held = (f"{name}'s batch {src[0][0]}, head {src[0][1]}, position {src[0][2]}" if len(src)
                    else f"a value that is nowhere in {name}")
            return [f"rank {r}: attend's {name}[{b}, {hh}, {tt}, {d}] (batch {b}, head {r * h + hh}, position {tt}) "
                    f"holds {held} ({case}): after the all-to-all rank {r} must hold heads {r * h}:{(r + 1) * h} "
                    f"of every position, in position order (what rank j sends are positions {T // comm.size}*j "
                    f"onwards: put it at that place of the sequence axis)"]
    want = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    if not np.array_equal(c.mask, want):
        return [f"rank {r}: attend's mask over the {T} positions is wrong ({case}): "
                + ("causal: query i sees key j only if j <= i, np.tril(np.ones((T, T), dtype=bool))" if causal
                   else "without a causal mask every query sees every key (mask=None)")]
    return []


def check_ulysses(comm, fn):
    p, r = comm.size, comm.rank
    B, nh, t, hs = 2, 6, 2, 3
    h, fails = nh // p, []
    for causal in (False, True):
        q, k, v = (same(B, nh, p * t, hs, seed=s) for s in (4, 5, 6))
        want = mine(attention_forward(q, k, v, causal=causal)[0], r, t)
        attend = Attend()
        handed = [comm.asarray(mine(a, r, t)) for a in (q, k, v)]  # this rank's rows, the backend's kind
        g = graded(comm, lambda: fn(comm, *handed, attend, causal))
        case = f"B={B}, {nh} heads, T={p * t}, {t} positions per rank, {'causal' if causal else 'no mask'}, on {ranks(p)}"
        fails = (no_builtin(comm, g, "ulysses_attention", "minipar.collectives.all_to_all")
                 or heads_layout(comm, attend.calls, (q, k, v), h, causal, case)
                 or compare(comm, g.out, want, f"the attention output of positions {r * t}:{(r + 1) * t}", case)
                 or expect_traffic(comm, g, "Ulysses (all-to-alls sending (p-1)/p of q, k, v and of the output)",
                                   4 * (p - 1) * B * h * t * hs * 8,
                                   hint="each all-to-all keeps the 1/p of its input it will own and sends every "
                                        "other rank its heads; gathering whole arrays sends p times as much")
                 or sent_by_learner(comm, g, fn, "ulysses_attention", "minipar.collectives.all_to_all", COLLECTIVES))
        if stop(comm, fails):
            break
    return fails
