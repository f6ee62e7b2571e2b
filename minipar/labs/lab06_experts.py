"""Lab 06, tasks 6.4-6.6 (mixture of experts): the checks. The tasks are listed in ``lab06``.

Every rank routes its own tokens (a fresh draw seeded by its rank; probabilities skewed towards
the first experts, so capacity drops tokens). The expected values come from minipar's own
``experts.routing.route`` and the dense ``experts.MoE`` with one token group per rank (the same
capacity and the same drops as the ranks). The rules:

* 6.4 routing sends nothing: every rank decides its own drops, from its own token count. A
  capacity computed over all ranks' tokens, token-major priority, or a floor instead of the
  ceiling each get their own message;
* 6.5 the dispatch: the per-source counts (a transposed matrix, what this rank *sends* instead of
  what it receives, is named), the rows grouped by local expert, and the traffic to the byte: one
  all-to-all of the (p, E/p) int64 counts, one all-to-all-v of the kept rows (its own count swap
  included); gathering every token on every rank sends other counts;
* 6.6 the whole layer: a rank holds only its E/p experts (the others are handed as NaN, so running
  them shows), the output is the dense MoE's, the traffic is the dispatch's and the combine's
  exactly, and a row that comes back to the wrong token is traced to the (rank, token, expert)
  it belongs to.

Every message is the learner's own (sent by their code, through minipar.collectives at most), not
made by minipar's expert-parallel layer (``minipar.experts``) called from the exercise.
"""
from __future__ import annotations

import math

import numpy as np

from ..experts.routing import capacity, kept_order, route
from ..lessons.experts import make_moe
from ..nn.functional import gelu_forward
from ..xp import to_numpy
from .checks import COLLECTIVES, compare, expect_traffic, graded, no_builtin, ranks, sent_by_learner, stop

INSTEAD = "minipar.collectives.all_to_all / all_to_all_v (pairwise send/recv)"
ROUTE_CASES = [(12, 4, 1, 1.0), (12, 6, 2, 1.0), (10, 4, 2, 0.75), (9, 3, 2, 1.5)]  # N, E, k, capacity factor


def probabilities(rank, N, E, seed=0):
    """Rank ``rank``'s router probabilities (N, E): softmax of logits skewed towards expert 0."""
    logits = np.random.default_rng([6, seed, 100 + rank, N, E]).standard_normal((N, E)) + np.linspace(1.5, 0, E)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# --------------------------------------------------------------------------- 6.4 routing

def keep_by(choice, cap, E, token_major=False):
    """keep (N, k) for ``cap`` per expert, priority choice-major (the rule) or token-major."""
    N, k = choice.shape
    order = [(n, c) for n in range(N) for c in range(k)] if token_major else [(n, c) for c in range(k) for n in range(N)]
    keep, used = np.zeros((N, k), bool), np.zeros(E, int)
    for n, c in order:
        e = choice[n, c]
        keep[n, c], used[e] = used[e] < cap, used[e] + (used[e] < cap)
    return keep


def route_mistake(comm, keep, probs, want, k, f, case):
    """Why ``keep`` differs from the rule: a message naming the mistake."""
    N, E = probs.shape
    r, p, cap = comm.rank, comm.size, capacity(N, E, k, f)
    floor = math.floor(f * k * N / E)
    alternatives = [(capacity(p * N, E, k, f), False,
                     f"matches a capacity of ceil({f} * {k} * {p * N} / {E}) = {capacity(p * N, E, k, f)}, computed over "
                     f"all {p} ranks' tokens; capacity is per rank: every rank decides its own drops from its own {N} "
                     f"tokens, ceil(factor * k * N / E) = {cap}"),
                    (cap, True, "keeps choices token by token (token 0's choices, then token 1's ...); priority is "
                                "choice-major: every token's first choice before any second choice, each in token "
                                "order (Switch / GShard)"),
                    (floor, False, f"matches a capacity of floor({f} * {k} * {N} / {E}) = {floor}: round up, "
                                   f"capacity = ceil(factor * k * N / E) = {cap}")]
    for c, token_major, why in alternatives:
        if c != cap or token_major:
            if np.array_equal(keep, keep_by(want.choice, c, E, token_major)):
                return [f"rank {r}: keep {why} ({case})"]
    n, c = np.argwhere(keep != want.keep)[0]
    e = want.choice[n, c]
    return [f"rank {r}: token {n}'s choice {c} (expert {e}) should be {'kept' if want.keep[n, c] else 'dropped'} "
            f"({case}): expert {e} takes the first {cap} = ceil(factor * k * N / E) of its assignments in priority "
            f"order (your keep keeps {int(keep[want.choice == e].sum())} of its {int((want.choice == e).sum())})"]


def check_route(comm, fn):
    r, fails = comm.rank, []
    for N, E, k, f in ROUTE_CASES:
        probs = probabilities(r, N, E)
        want = route(probs, k, capacity(N, E, k, f))
        handed = comm.asarray(probs.copy())  # the backend's kind: NumPy or torch
        g = graded(comm, lambda: fn(comm, handed, k, f))
        case = f"N={N} tokens per rank, E={E}, top-{k}, capacity factor {f}, on {ranks(comm.size)}"
        fails = no_builtin(comm, g, "route", "no communication at all")
        if not fails and (not isinstance(g.out, (tuple, list)) or len(g.out) != 2):
            fails = [f"rank {r}: route must return (choice, keep), got {type(g.out).__name__} ({case})"]
        if not fails:
            choice, keep = (np.asarray(to_numpy(a)) for a in g.out)
            if choice.shape != (N, k) or keep.shape != (N, k):
                fails = [f"rank {r}: choice and keep must be ({N}, {k}): one row per token, one column per choice; "
                         f"got {choice.shape} and {keep.shape} ({case})"]
            elif not np.array_equal(choice, want.choice):
                n = int(np.argwhere(choice != want.choice)[0][0])
                fails = [f"rank {r}: token {n}'s choices are experts {choice[n].tolist()}, expected "
                         f"{want.choice[n].tolist()}: the {k} most probable, best first ({case})"]
            elif not np.array_equal(keep.astype(bool), want.keep):
                fails = route_mistake(comm, keep.astype(bool), probs, want, k, f, case)
        fails = fails or expect_traffic(comm, g, "routing (every rank decides its own tokens' experts and drops)", 0, 0)
        if stop(comm, fails):
            break
    return fails


# --------------------------------------------------------------------------- 6.5 dispatch

def tokens(rank, N, E, C, k, f=1.0):
    """Rank ``rank``'s tokens x (N, C) and their routing (choice, keep)."""
    x = np.random.default_rng([6, 7, rank, N, C]).standard_normal((N, C))
    rt = route(probabilities(rank, N, E, seed=1), k, capacity(N, E, k, f))
    return x, rt.choice, rt.keep


def sent_rows(choice, keep, E):
    """(order, experts): the kept assignments n*k + c in dispatch order, and each one's expert."""
    order = kept_order(choice, keep)
    return order, choice.reshape(-1)[order]


def expected_dispatch(data, r, E, k):
    """(rows, counts) rank r's experts receive: rows by local expert, then source rank, then
    priority; counts (p, E/p)."""
    p = len(data)
    El = E // p
    rows, counts = [], np.zeros((p, El), np.int64)
    for le in range(El):
        for i, (x, choice, keep) in enumerate(data):
            order, experts = sent_rows(choice, keep, E)
            sel = order[experts == r * El + le]
            rows.append(x[sel // k])
            counts[i, le] = len(sel)
    return np.concatenate(rows), counts


def dispatch_mistake(comm, rows, counts, want_rows, want_counts, own, case):
    r, p = comm.rank, comm.size
    if counts.shape != want_counts.shape:
        return [f"rank {r}: counts has shape {counts.shape}; expected {want_counts.shape}: rows from each source rank "
                f"(axis 0) for each of your E/p local experts (axis 1) ({case})"]
    if not np.array_equal(counts, want_counts):
        if p > 1 and np.array_equal(counts, own):
            return [f"rank {r}: counts equals what rank {r} sends (its own row of the dispatch matrix: rows for each "
                    f"rank's experts), not what it receives: the counts are transposed; counts[i, e] is what rank i "
                    f"sends to your expert e: exchange the (p, E/p) matrices with one all-to-all ({case})"]
        i, e = np.argwhere(counts != want_counts)[0]
        return [f"rank {r}: counts[{i}, {e}] = {counts[i, e]}, expected {want_counts[i, e]}: the kept rows rank {i} "
                f"sends to your local expert {e} ({case})"]
    if rows.shape == want_rows.shape and not np.allclose(rows, want_rows, rtol=1e-12, atol=1e-12):
        by_source = np.concatenate([want_rows[_blocks(want_counts)[le][i]] for i in range(p)
                                    for le in range(want_counts.shape[1])])
        if np.array_equal(rows, by_source):
            return [f"rank {r}: the rows are in the order they arrived (by source rank); group them by local expert: "
                    f"expert 0's rows from rank 0, 1, ..., then expert 1's ... ({case})"]
    return compare(comm, rows, want_rows, "the rows your experts receive (by local expert, then source rank, then "
                                          "priority)", case)


def _blocks(counts):
    """[local expert][source] -> the slice of the expected rows (expert-major) holding that block."""
    flat = counts.T.reshape(-1)  # expert-major
    at = np.concatenate([[0], np.cumsum(flat)])
    p, El = counts.shape
    return [[slice(at[le * p + i], at[le * p + i + 1]) for i in range(p)] for le in range(El)]


def dispatch_traffic(comm, g, sent_others, E, C, combine=False):
    """The count exchange (p-1) x E/p int64, each all-to-all-v's count swap (p-1) int64, the rows."""
    p = comm.size
    nbytes = (p - 1) * (E // p) * 8 + (p - 1) * 8 * (1 + combine) + sent_others * C * 8
    what = "a dispatch" + (" and a combine" if combine else "")
    return expect_traffic(comm, g, f"{what} (one all-to-all of the ({p}, {E // p}) int64 counts, "
                                   f"{'two all-to-all-v' if combine else 'one all-to-all-v'} of the kept rows)", nbytes,
                          hint="the count exchange, then each kept row sent once to its expert's rank"
                               + (" and once back" if combine else "") + "; gathering every token on every rank "
                               "sends every row to every rank")


def check_dispatch(comm, fn):
    p, r, fails = comm.size, comm.rank, []
    N, C = 8, 3
    for E, k in ((2 * p, 2), (p, 1)):
        data = [tokens(i, N, E, C, k) for i in range(p)]
        x, choice, keep = data[r]
        want_rows, want_counts = expected_dispatch(data, r, E, k)
        order, experts = sent_rows(choice, keep, E)
        own = np.bincount(experts, minlength=E).reshape(p, E // p)
        handed = comm.asarray(x.copy())  # the backend's kind; choice and keep stay NumPy (host bookkeeping)
        g = graded(comm, lambda: fn(comm, handed, choice.copy(), keep.copy(), E))
        case = f"N={N} tokens per rank, C={C}, E={E} experts, top-{k}, on {ranks(p)}"
        fails = no_builtin(comm, g, "dispatch", INSTEAD)
        if not fails and (not isinstance(g.out, (tuple, list)) or len(g.out) != 2):
            fails = [f"rank {r}: dispatch must return (rows, counts), got {type(g.out).__name__} ({case})"]
        if not fails:
            rows, counts = (np.asarray(to_numpy(a)) for a in g.out)
            fails = (dispatch_mistake(comm, rows, counts, want_rows, want_counts, own, case)
                     or dispatch_traffic(comm, g, int(own.sum() - own[r].sum()), E, C)
                     or sent_by_learner(comm, g, fn, "dispatch", INSTEAD, COLLECTIVES))
        if stop(comm, fails):
            break
    return fails


# --------------------------------------------------------------------------- 6.6 the layer

def expert_out(w, rows):
    """One expert (w1, b1, w2, b2): GeLU(rows @ w1 + b1) @ w2 + b2."""
    w1, b1, w2, b2 = w
    return gelu_forward(rows @ w1 + b1)[0] @ w2 + b2


def wrong_row(comm, y, x_all, probs, routing, experts, n0, N):
    """For top-1: y[n] / gate should be its own expert's output on token n; if it is another
    (token, expert)'s output, say whose (the combine sent rows to the wrong rank or place)."""
    r = comm.rank
    for n in range(N):
        g = r * N + n
        if not routing.keep[g, 0]:
            continue
        e = routing.choice[g, 0]
        row = y[n] / probs[g, e]
        if np.allclose(row, expert_out(experts[e], x_all[g]), rtol=1e-9, atol=1e-12):
            continue
        for m in range(len(x_all)):
            for e2 in range(len(experts)):
                if np.allclose(row, expert_out(experts[e2], x_all[m]), rtol=1e-9, atol=1e-12):
                    return [f"rank {r}: y[{n}] is its gate times expert {e2}'s output for token {m % N} of rank "
                            f"{m // N}, not expert {e}'s output for token {n} ({n0}): the combine sent rows back to "
                            f"the wrong rank or position: every row returns to the rank it came from, in the order "
                            f"that rank sent it (undo the expert-major order before the all-to-all-v)"]
        return []
    return []


def check_moe_forward(comm, fn):
    p, r, fails = comm.size, comm.rank, []
    N, C, El = 6, 4, 2  # tokens per rank, model width, experts per rank
    E = El * p
    for k in (1, 2):
        dense = make_moe(np.random.default_rng([6, 8, p, k]), E, p, k, capacity_factor=1.0, d_model=C)
        x_all = np.random.default_rng([6, 9, p, k]).standard_normal((p * N, C))
        y_all, ctx = dense.forward(x_all)
        experts = [tuple(a.copy() for _, a in getattr(dense, f"expert{e}").named_parameters()) for e in range(E)]
        handed = [w if e // El == r else tuple(np.full_like(a, np.nan) for a in w) for e, w in enumerate(experts)]
        x = comm.asarray(x_all[r * N:(r + 1) * N].copy())  # the backend's kind: NumPy or torch
        w_router, handed = comm.asarray(dense.router.params["w"].copy()), [tuple(map(comm.asarray, w)) for w in handed]
        g = graded(comm, lambda: fn(comm, x, w_router, handed, k, 1.0))
        case = f"N={N} tokens per rank, C={C}, E={E} experts, top-{k}, capacity factor 1.0, on {ranks(p)}"
        rt = ctx["routing"]
        dest = [sent_rows(rt.choice[i * N:(i + 1) * N], rt.keep[i * N:(i + 1) * N], E)[1] // El for i in range(p)]
        moved = int((dest[r] != r).sum()) + sum(int((d == r).sum()) for i, d in enumerate(dest) if i != r)
        fails = no_builtin(comm, g, "moe_forward", INSTEAD)
        if not fails and k == 1 and np.shape(g.out) == (N, C) and not np.isnan(to_numpy(g.out)).any():
            fails = wrong_row(comm, to_numpy(g.out), x_all, to_numpy(ctx["probs"]), rt, experts, case, N)
        fails = (fails or compare(comm, g.out, y_all[r * N:(r + 1) * N], "the MoE output of your tokens", case,
                                  owns=f"experts {r * El}:{(r + 1) * El} (its E/p of the E experts; the others are NaN)")
                 or dispatch_traffic(comm, g, moved, E, C, combine=True)
                 or sent_by_learner(comm, g, fn, "moe_forward", INSTEAD, COLLECTIVES))
        if stop(comm, fails):
            break
    return fails
