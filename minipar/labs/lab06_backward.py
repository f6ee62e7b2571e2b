"""Lab 06, core tasks 6.7 and 6.8 (the backward passes): the checks and their hints. The tasks
are listed in ``lab06``.

* 6.7 ring attention's backward. The learner computes every block pair through
  ``attend_backward``, the grader's kernel (minipar's ``block_attention_backward``), which records
  every call: whose K/V block it got, whose log-sum-exp, which delta, how many keys, which mask.
  So the checks see a block computed twice, in the queries' future or never, the diagonal block
  without its causal mask, and the lse of another rank's queries (it belongs to the queries, and
  stays with them). The values against the dense ``attention_backward`` of the whole sequence:
  a dK|dV that ends one rank short of its owner is named, and so is one that holds only the
  rank's own queries' part. The bytes: K|V around the ring and the partial dK|dV back to their
  owners, 4 (p-1) blocks, only to the right neighbour.
* 6.8 the mixture of experts' backward, with the Switch Transformer's load-balancing loss. The
  learner runs the layer (6.6, with the loss) and its backward; every rank is handed every
  expert's weights, the other ranks' as NaN. Against the dense one-process ``MoE`` (one token
  group per rank, one balancing group): the output, the loss, the experts' gradients on their
  owners, this rank's part of the router's gradient (the balancing loss's gradient missing is
  named), dx (a gradient row that came back to the wrong rank or token is traced to the
  (rank, token, expert) it belongs to). The bytes: 6.6's, one all-reduce of the 2E numbers of the
  loss, and each kept row's gradient once to its expert and once back.

Every message is the learner's own (sent by their code, through minipar.collectives at most), not
made by minipar's ring attention or expert-parallel layer called from the exercise.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np

from ..context_parallel.blocks import block_attention, block_attention_backward, finish
from ..lessons.experts import make_moe
from ..nn.functional import attention_backward, attention_forward
from ..xp import chunk_bounds, to_numpy
from .checks import (COLLECTIVES, compare, draw, expect_traffic, graded, no_builtin, ranks, ring_traffic, sent,
                     sent_by_learner, stop)
from .lab06_experts import sent_rows

RING = "comm.isend / comm.irecv (or comm.sendrecv) to your ring neighbours"
EXPERTS = "minipar.collectives.all_to_all / all_to_all_v / all_reduce"

BACKWARD_HINTS = {
    "6.7": (
        """The backward meets the blocks as the forward did: your queries must see every block of
        keys once more, so K and V go around the ring again. What is new: a block's dK and dV get a
        part from every rank whose queries saw it, and the block's owner must end up holding the
        sum. Think of each block's gradient as a parcel that follows the block around the ring,
        every rank it passes adding its share, until it is home.""",
        """delta = xp.sum(dout * out, axis=-1, keepdims=True), once (it is per query row). Step s (0 ..
        p-1): you hold the K|V block of rank j = (r - s) % p; attend_backward(q, k_j, v_j, dout, lse,
        delta, mask) gives your dq's part (add it) and your queries' part of block j's dK|dV. Causal:
        skip j > r, the tril mask when j == r. The parcel of block j starts at rank j + 1 (the owner
        adds its own part last, when the parcel comes home), so in step s >= 1 you receive from the
        left the parcel of the block you hold (empty at s = 1), add your part and send it right; after
        step p - 1 the parcel arriving from the left is the others' sum for your own block.""",
        """
        kv = xp.stack([k, v]); own = None; carry = None
        for s in range(p):
            j = (r - s) % p
            if s < p - 1: post irecv(nxt, (r - 1) % p) and isend(kv, (r + 1) % p)   # K|V, tag 1
            part = zeros((2, B, nh, t, hs)) or xp.stack([dk_j, dv_j]) from attend_backward
            if s == 0: own = part
            else: total = part if s == 1 else carry + part
                  carry = comm.sendrecv(total, (r + 1) % p, buf, (r - 1) % p, 2, 2)  # dK|dV, tag 2
            wait the K|V requests; kv, nxt = nxt, kv
        dkv = own if p == 1 else own + carry;  return dq, dkv[0], dkv[1]
        """,
    ),
    "6.8": (
        """The backward of the layer follows the forward's path in reverse: the output's gradient
        goes where the experts' outputs came from, the experts' input gradients go back where their
        rows came from. The gate (the router's probability) stands between the two, so the router
        gets a gradient from every kept choice, and one more from the balancing loss, which depends
        on every rank's routing (Switch Transformer, Fedus, Zoph and Shazeer).""",
        """Forward as 6.6, keeping each kept choice's expert output (out_c, back on your rank) and each
        expert's GeLU context. aux: f = routed (E,) / (k N p) and P = probs summed over tokens (E,) /
        (N p), both over every rank: one all_reduce of the concatenated 2E numbers; aux = alpha E
        f . P. Backward: d_gate[n, c] = dy[n] . out_c; the rows gate * dy[n] go to their experts (the
        combine's path reversed); each expert: dW2 = a^T d, db2 = sum d, dh = gelu_backward(d @ w2^T),
        dW1 = rows^T dh, db1 = sum dh, d_row = dh @ w1^T; the d_rows go back (the dispatch's path
        reversed) and add up per token.""",
        """
        d_probs = zeros((N, E)); d_probs[n, e_c] += d_gate[n, c]          # every kept choice
        d_probs += alpha * E * f / (N * p)                                # the balancing loss, every token
        d_logits = softmax_backward(d_probs, softmax_ctx)
        d_router = x^T @ d_logits;  dx = sum of the returned d_rows per token + d_logits @ w_router^T
        return y, aux, dx, d_router, [(dW1, db1, dW2, db2) for each of your experts]
        """,
    ),
}


# --------------------------------------------------------------------------- 6.7 ring attention backward

def mine(a, j, t):
    """Rank j's rows (positions j*t ... (j+1)*t) of a (B, nh, T, ...): the contiguous split."""
    return np.ascontiguousarray(a[..., j * t:(j + 1) * t, :])


@dataclass
class BackwardCall:
    t0: float
    t1: float
    keys: int
    mask: np.ndarray  # (tq, tk) bool: which pairs the call allowed
    block: int | None  # whose K/V block it was, None if no rank's
    lse: int | None  # whose queries' lse it was, None if no rank's
    delta_ok: bool


class AttendBackward:
    """The kernel handed to the learner: ``attend_backward(q, k, v, dout, lse, delta, mask=None)
    -> (dq, dk, dv)``, minipar's ``block_attention_backward``, with every call recorded (whose K/V
    block, whose lse, whether delta is this rank's). Arrays of either backend; the record is NumPy."""

    def __init__(self, blocks, lses, delta):
        self.blocks, self.lses, self.delta, self.calls = blocks, lses, delta, []

    def __call__(self, q, k, v, dout, lse, delta, mask=None):
        t0 = time.perf_counter()
        tq, tk = q.shape[-2], k.shape[-2]
        full = np.ones((tq, tk), bool) if mask is None else np.asarray(to_numpy(mask), bool).reshape(-1, tq, tk)[0]
        out = block_attention_backward(q, k, v, dout, lse, delta, mask)
        k, v, lse, delta = (np.array(to_numpy(a)) for a in (k, v, lse, delta))
        block = next((j for j, (kj, vj) in enumerate(self.blocks)
                      if kj.shape == k.shape and np.array_equal(kj, k) and np.array_equal(vj, v)), None)
        owner = next((j for j, lj in enumerate(self.lses) if lj.shape == lse.shape and np.array_equal(lj, lse)), None)
        ok = delta.shape == self.delta.shape and np.allclose(delta, self.delta, rtol=1e-12, atol=1e-12)
        self.calls.append(BackwardCall(t0, time.perf_counter(), tk, full, block, owner, ok))
        return out


def backward_blocks(comm, calls, t, causal, case):
    """Which block pairs were computed, with which lse, delta and mask."""
    r, p = comm.rank, comm.size
    span = lambda j: f"{j * t}:{(j + 1) * t}"  # noqa: E731  block j's positions
    if not calls:
        return [f"rank {r}: ring_attention_backward never called attend_backward ({case}): compute each block "
                f"pair with attend_backward(q, k_block, v_block, dout, lse, delta, mask)"]
    for c in calls:
        if c.keys != t:
            return [f"rank {r} called attend_backward with {c.keys} keys at once ({case}); the backward meets the "
                    f"keys one block of T/p = {t} at a time, as the forward did: the whole sequence's K and V never "
                    f"sit on one rank"]
        if c.lse is None:
            return [f"rank {r} passed attend_backward an lse that is no rank's ({case}): pass the lse you were "
                    f"handed, (B, nh, t, 1), unchanged"]
        if c.lse != r:
            return [f"rank {r} passed attend_backward the log-sum-exp of rank {c.lse}'s queries (positions "
                    f"{span(c.lse)}) with its own queries ({r * t}:{(r + 1) * t}) ({case}): lse is each query's "
                    f"softmax denominator, it belongs to the queries and stays on their rank; only K and V travel"]
        if not c.delta_ok:
            return [f"rank {r} passed attend_backward a delta that is not its queries' ({case}): delta = "
                    f"rowsum(dout * out) over hs, (B, nh, t, 1), of your own rows, the same for every block"]
        if c.block is None:
            return [f"rank {r}: attend_backward got a K/V block that is no rank's K and V ({case}): pass the block "
                    f"you hold on unchanged, and compute with it as it arrives"]
    seen = [c.block for c in calls]
    for j in seen:
        if causal and j > r:
            return [f"rank {r} computed the gradient of block {j} (keys {span(j)}), in the future of all its queries "
                    f"({span(r)}) ({case}): with a causal mask its part is zero; skip it"]
    twice = sorted({j for j in seen if seen.count(j) > 1})
    if twice:
        return [f"rank {r} computed its queries against block {twice[0]} {seen.count(twice[0])} times ({case}): "
                f"every block once"]
    missing = sorted(set(range(r + 1 if causal else p)) - set(seen))
    if missing:
        return [f"rank {r} never computed its queries against block {missing[0]} (keys {span(missing[0])}) "
                f"({case}): every K/V block passes every rank once, in the backward as in the forward"]
    for c in calls:
        own = causal and c.block == r
        want = np.tril(np.ones((t, t), bool)) if own else np.ones((t, t), bool)
        if own and c.mask.all():
            return [f"rank {r} computed the diagonal block (its queries against its own keys, {span(r)}) without "
                    f"the causal mask ({case}): query i sees key j only if j <= i, in the backward as in the "
                    f"forward: the probabilities it recomputes from lse must be the forward's"]
        if not np.array_equal(c.mask, want):
            return [f"rank {r} computed block {c.block} with a mask that hides {int((want & ~c.mask).sum())} and "
                    f"allows {int((c.mask & ~want).sum())} pairs wrongly ({case}): "
                    + ("only the diagonal block needs the causal mask; earlier blocks are all in the past (mask=None)"
                       if causal else "without a causal mask every query sees every key (mask=None)")]
    return []


def kv_grads(comm, got, dense, own_only, t, case):
    """dk, dv against the dense gradient of this rank's block, naming two mistakes: the sum of
    another rank's block (left one rank short of its owner), and this rank's queries' part only."""
    r, p = comm.rank, comm.size
    for name, g, full, part in zip(("dk", "dv"), got, dense, own_only):
        want = mine(full, r, t)
        if not compare(comm, g, want, "", case):
            continue
        g = to_numpy(g)
        close = lambda a: g.shape == a.shape and np.allclose(g, a, rtol=1e-9, atol=1e-12)  # noqa: E731
        other = next((j for j in range(p) if j != r and close(mine(full, j, t))), None)
        if other is not None:
            return [f"rank {r}: {name} is the whole gradient of block {other} (keys {other * t}:{(other + 1) * t}), "
                    f"not of rank {r}'s own keys ({case}): each block's sum must end on the block's owner; this one "
                    f"stopped on the last rank of its way round the ring, one step short of home"]
        if p > 1 and close(part):
            return [f"rank {r}: {name} holds only its own queries' part of the gradient of its keys ({case}): every "
                    f"rank's queries that saw these keys add to it; their parts travel the ring to the owner"]
        return compare(comm, g, want, f"{name} of the keys and values at positions {r * t}:{(r + 1) * t}", case)
    return []


def lse_of(q, k, v, causal):
    """(B, nh, T, 1): the log-sum-exp of every query's scores, as the forward saves it."""
    T = q.shape[-2]
    return finish(block_attention(q, k, v, np.tril(np.ones((T, T), bool)) if causal else None))[1]


def check_ring_backward(comm, fn):
    p, r = comm.size, comm.rank
    B, nh, t, hs = 1, 2, 3, 4
    fails = []
    for causal in (False, True):
        q, k, v, dout = (draw(B, nh, p * t, hs, seed=s) for s in (61, 62, 63, 64))
        out, ctx = attention_forward(q, k, v, causal=causal)
        dq, dk, dv = attention_backward(dout, ctx)
        lse = lse_of(q, k, v, causal)
        rows = [mine(a, r, t) for a in (q, k, v, out, dout, lse)]
        delta = np.sum(rows[4] * rows[3], axis=-1, keepdims=True)
        kernel = AttendBackward([(mine(k, j, t), mine(v, j, t)) for j in range(p)],
                                [mine(lse, j, t) for j in range(p)], delta)
        handed = [comm.asarray(a.copy()) for a in rows]  # this rank's rows only, the backend's kind
        g = graded(comm, lambda: fn(comm, *handed, kernel, causal))
        case = f"T={p * t}, {t} positions per rank, {'causal' if causal else 'no mask'}, on {ranks(p)}"
        mask = np.tril(np.ones((t, t), bool)) if causal else None
        own_only = block_attention_backward(*rows[:3], rows[4], rows[5], delta, mask)[1:]
        block = B * nh * t * hs  # values in one K (or V, dK, dV) block
        fails = no_builtin(comm, g, "ring_attention_backward", RING)
        if not fails and (not isinstance(g.out, (tuple, list)) or len(g.out) != 3):
            fails = [f"rank {r}: ring_attention_backward must return (dq, dk, dv), got {type(g.out).__name__} ({case})"]
        fails = (fails or backward_blocks(comm, kernel.calls, t, causal, case)
                 or compare(comm, g.out[0], mine(dq, r, t), f"dq of the queries at positions {r * t}:{(r + 1) * t}", case)
                 or kv_grads(comm, g.out[1:], (dk, dv), own_only, t, case)
                 or expect_traffic(comm, g, f"ring attention's backward ({p - 1} K|V blocks and {p - 1} partial dK|dV "
                                            f"blocks of {2 * block} doubles each, to the right)",
                                   4 * (p - 1) * block * 8, to=[(r + 1) % p],
                                   hint="K|V pass every other rank once, as in the forward, and each block's gradient "
                                        "needs p - 1 hops to collect every other rank's part and reach its owner; "
                                        "the owner adds its own part when the sum arrives (sending its part along "
                                        "with the block costs one hop more)")
                 or sent_by_learner(comm, g, fn, "ring_attention_backward", RING, COLLECTIVES))
        if stop(comm, fails):
            break
    return fails


# --------------------------------------------------------------------------- 6.8 MoE backward

@dataclass
class DenseMoE:
    """The dense one-process layer's answers for every rank's tokens, and what the messages need."""
    y: np.ndarray
    aux: float
    dx: np.ndarray
    d_logits: np.ndarray  # (N_total, E): the router's logits' gradient, balancing loss included
    d_logits_plain: np.ndarray  # without the balancing loss's gradient
    dx_plain: np.ndarray
    grads: dict
    routing: object
    probs: np.ndarray
    d_rows: dict  # (global token, expert) -> the input gradient of that kept choice's row


def dense_moe(moe, x, dy):
    """Forward and backward of the dense ``moe`` on every rank's tokens."""
    y, ctx = moe.forward(x)
    dx = moe.backward_input(dy, ctx)
    d_logits = ctx["d_logits"]
    moe.backward_weight(dy, ctx)
    plain = copy.deepcopy(moe)
    plain.aux_weight = 0.0
    _, pctx = plain.forward(x)
    dx_plain = plain.backward_input(dy, pctx)
    k = moe.k
    d_placed = np.reshape(ctx["gates"][..., None] * dy[:, None, :], (-1, dy.shape[-1]))  # (N k, C)
    rows = moe._experts_backward_input(d_placed[ctx["flat"]], copy.deepcopy(ctx["experts"]))  # (A, C)
    choice = ctx["routing"].choice.reshape(-1)
    d_rows = {(int(a) // k, int(choice[a])): rows[i] for i, a in enumerate(ctx["flat"])}
    return DenseMoE(y, float(ctx["aux"]), dx, d_logits, pctx["d_logits"], dx_plain, dict(moe.named_grads()),
                    ctx["routing"], to_numpy(ctx["probs"]), d_rows)


def wrong_grad_row(comm, dx, want, x_all, w_router, N, case):
    """For top-1: dx[n] less the router's part should be the input gradient of token n's own
    kept row; when it is another (token, expert)'s, say whose."""
    r = comm.rank
    router_part = want.d_logits @ w_router.T  # (N_total, C)
    for n in range(N):
        g = r * N + n
        if not want.routing.keep[g, 0]:
            continue
        e = int(want.routing.choice[g, 0])
        row = dx[n] - router_part[g]
        if np.allclose(row, want.d_rows[(g, e)], rtol=1e-9, atol=1e-12):
            continue
        for (m, e2), d in want.d_rows.items():
            if (m, e2) != (g, e) and np.allclose(row, d, rtol=1e-9, atol=1e-12):
                return [f"rank {r}: dx[{n}] holds the gradient of rank {m // N}'s token {m % N} through expert {e2}, "
                        f"not of token {n} through expert {e} ({case}): the rows' gradients went back to the wrong "
                        f"rank or position: each returns to the rank that dispatched the row, in the order it sent "
                        f"it (the dispatch's backward is a combine)"]
        return []
    return []


def router_grad(comm, got, want, x, N, alpha, case):
    """This rank's part of the router's gradient, x_r^T d_logits_r, naming a missing balancing loss
    and the all-ranks sum."""
    r, mine_ = comm.rank, slice(comm.rank * N, (comm.rank + 1) * N)
    target = x.T @ want.d_logits[mine_]
    fails = compare(comm, got, target, "d_router, your tokens' part of the router's gradient", case)
    if not fails:
        return []
    g = to_numpy(got)
    close = lambda a: g.shape == a.shape and np.allclose(g, a, rtol=1e-9, atol=1e-12)  # noqa: E731
    if close(x.T @ want.d_logits_plain[mine_]):
        return [f"rank {r}: d_router misses the load-balancing loss's gradient ({case}): aux = alpha E sum_e f_e P_e "
                f"(alpha = {alpha}) depends on the router through P_e, the mean probability of expert e over every "
                f"rank's tokens: every token's probability of e gets d aux / d P_e, divided by the tokens"]
    if comm.size > 1 and close(want.grads["router.w"]):
        return [f"rank {r}: d_router is the router's whole gradient, summed over every rank's tokens ({case}): "
                f"return your tokens' part only (summing the ranks' parts is the data-parallel all-reduce, not "
                f"part of this task)"]
    return fails


def moe_traffic(comm, g, moved, E, C):
    """6.6's bytes, the balancing loss's all-reduce of 2E float64, the backward's rows both ways
    (all_to_all_v's count swaps in the backward, or none: the counts are known)."""
    p, r = comm.size, comm.rank
    forward = (p - 1) * (E // p) * 8 + 2 * (p - 1) * 8 + moved * C * 8
    loss = ring_traffic([b - a for a, b in chunk_bounds(2 * E, p)], r, 8)[0]
    backward = moved * C * 8
    if sent(comm, g.events)[0] == forward + loss + backward:
        return []
    return expect_traffic(comm, g, f"the MoE layer's forward and backward (6.6's messages; one all-reduce of the 2E = "
                                   f"{2 * E} numbers of the balancing loss; each kept row's gradient to its expert and "
                                   f"back, {C} doubles a row)", forward + loss + backward + 2 * (p - 1) * 8,
                          hint="the backward sends exactly what the forward's dispatch and combine sent, the other "
                               "way round (all_to_all_v's count swaps included, or left out: you know the counts); "
                               "the router's gradient stays on its rank")


def check_moe_backward(comm, fn):
    p, r, fails = comm.size, comm.rank, []
    N, C, El, alpha = 6, 4, 2, 0.1  # tokens per rank, model width, experts per rank, the balancing loss's weight
    E = El * p
    for k in (1, 2):
        moe = make_moe(np.random.default_rng([6, 36, p, k]), E, p, k, capacity_factor=1.0, aux_weight=alpha,
                       d_model=C)
        x_all = np.random.default_rng([6, 37, p, k]).standard_normal((p * N, C))
        dy_all = np.random.default_rng([6, 38, p, k]).standard_normal((p * N, C))
        experts = [tuple(a.copy() for _, a in getattr(moe, f"expert{e}").named_parameters()) for e in range(E)]
        w_router = moe.router.params["w"].copy()
        want = dense_moe(moe, x_all, dy_all)
        handed = [w if e // El == r else tuple(np.full_like(a, np.nan) for a in w) for e, w in enumerate(experts)]
        mine_ = slice(r * N, (r + 1) * N)
        x, dy = comm.asarray(x_all[mine_].copy()), comm.asarray(dy_all[mine_].copy())  # the backend's kind
        wr, handed = comm.asarray(w_router.copy()), [tuple(map(comm.asarray, w)) for w in handed]
        g = graded(comm, lambda: fn(comm, x, dy, wr, handed, k, 1.0, alpha))
        case = f"N={N} tokens per rank, C={C}, E={E} experts, top-{k}, capacity factor 1.0, alpha={alpha}, on {ranks(p)}"
        owns = f"experts {r * El}:{(r + 1) * El} (its E/p of the E experts; the others are NaN)"
        rt = want.routing
        dest = [sent_rows(rt.choice[i * N:(i + 1) * N], rt.keep[i * N:(i + 1) * N], E)[1] // El for i in range(p)]
        moved = int((dest[r] != r).sum()) + sum(int((d == r).sum()) for i, d in enumerate(dest) if i != r)
        fails = no_builtin(comm, g, "moe_backward", EXPERTS)
        if not fails and (not isinstance(g.out, (tuple, list)) or len(g.out) != 5):
            fails = [f"rank {r}: moe_backward must return (y, aux, dx, d_router, d_experts), got "
                     f"{type(g.out).__name__} ({case})"]
        if not fails:
            y, aux, dx, d_router, d_experts = g.out
            fails = compare(comm, y, want.y[mine_], "the MoE output of your tokens", case, owns=owns)
            if not fails:
                a = aux if aux is None else np.asarray(to_numpy(aux), dtype=np.float64)
                fails = compare(comm, a, np.float64(want.aux), "aux, the balancing loss", case)
                own_f = np.bincount(rt.choice[mine_].reshape(-1), minlength=E) / (k * N)
                own = alpha * E * own_f @ want.probs[mine_].mean(axis=0)  # the loss of this rank's tokens alone
                if fails and a is not None and a.size == 1 and np.isclose(float(a.reshape(-1)[0]), own, rtol=1e-9):
                    fails = [f"rank {r}: aux is the balancing loss of your own tokens only ({case}): f_e and P_e are "
                             f"over every rank's tokens (one balancing group): sum the counts and the probabilities "
                             f"over the ranks first"]
            if not fails and (not isinstance(d_experts, (tuple, list)) or len(d_experts) != El
                              or any(not isinstance(w, (tuple, list)) or len(w) != 4 for w in d_experts)):
                fails = [f"rank {r}: d_experts must hold one (dw1, db1, dw2, db2) per expert of yours, {El}, got "
                         f"{type(d_experts).__name__} ({case})"]
            for le in range(El if not fails else 0):
                e = r * El + le
                for name, got in zip(("fc1.w", "fc1.b", "fc2.w", "fc2.b"), d_experts[le]):
                    fails = compare(comm, got, want.grads[f"expert{e}.{name}"],
                                    f"the gradient of expert {e}'s {name} (every rank's tokens)", case, owns=owns)
                    if fails:
                        break
                if fails:
                    break
            fails = fails or router_grad(comm, d_router, want, x_all[mine_], N, alpha, case)
            if not fails and compare(comm, dx, want.dx[mine_], "", case):
                d = to_numpy(dx)
                if d.shape == (N, C) and np.allclose(d, want.dx_plain[mine_], rtol=1e-9, atol=1e-12):
                    fails = [f"rank {r}: dx misses the load-balancing loss's gradient ({case}): it reaches x through "
                             f"the router, like the gates'"]
                elif k == 1 and d.shape == (N, C) and not np.isnan(d).any():
                    fails = wrong_grad_row(comm, d, want, x_all, w_router, N, case)
                fails = fails or compare(comm, dx, want.dx[mine_], "dx, the gradient of your tokens", case, owns=owns)
            fails = (fails or moe_traffic(comm, g, moved, E, C)
                     or sent_by_learner(comm, g, fn, "moe_backward", EXPERTS, COLLECTIVES))
        if stop(comm, fails):
            break
    return fails
