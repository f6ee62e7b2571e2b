"""Lab 04 (data parallelism and ZeRO): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs. Gradients that differ per rank are
drawn from a seed that includes the rank; parameters and averaged gradients are the same draw
on every rank. Typical mistakes get their own message: averaging twice (or not at all), a whole
gradient returned where a shard was due, padding that is not zero, gathered weights kept alive.

Lengths 10, 7, 1 and 13 do not all divide by 2, 3 or 4: padding is always exercised.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..optim import adam_step
from ..trace import bytes_sent, count
from ..xp import to_numpy
from .grader import Task
from .checks import compare, stop, traced

KEY = "04"
TITLE = "data parallelism and ZeRO: gradient averaging, buckets, sharded Adam, gather on demand"
FOLDER = "labs/04_zero"
SOLUTION = "minipar.labs.lab04_solution"
HERE = "minipar.labs.lab04"

TASKS = [
    Task("4.1", "DDP gradient averaging", "average_gradients", f"{HERE}:check_average"),
    Task("4.2", "gradient buckets", "bucketed_average", f"{HERE}:check_buckets"),
    Task("4.3", "ZeRO-1 update + all-gather", "zero1_update", f"{HERE}:check_zero1"),
    Task("4.4", "ZeRO-2 reduce-scatter", "zero2_grad_shard", f"{HERE}:check_zero2"),
    Task("4.5", "ZeRO-3 gather on demand", "zero3_forward", f"{HERE}:check_zero3"),
]
LENGTHS = (10, 7, 1, 13)
LR = 1e-2


def same(shape, seed=0):
    """The same draw on every rank."""
    return np.random.default_rng([seed, *np.atleast_1d(shape)]).standard_normal(shape)


def mine(comm, shape, seed=0):
    """A draw that differs per rank (this rank's local gradient)."""
    return np.random.default_rng([seed, 1000 + comm.rank, *np.atleast_1d(shape)]).standard_normal(shape)


def padded(x, p):
    out = np.zeros(-(-x.size // p) * p)
    out[:x.size] = x.ravel()
    return out


def average_mistake(comm, got, want):
    """A message when got is want / p or want * p (averaged twice, or summed only)."""
    p = comm.size
    if p == 1 or got is None or np.shape(got) != np.shape(want) or not np.any(want != 0):
        return None
    g = to_numpy(got)
    if np.allclose(g, want / p, rtol=1e-12, atol=1e-15):
        return f"rank {comm.rank}: the result is the average divided by p = {p} again: averaged twice?"
    if np.allclose(g, want * p, rtol=1e-12, atol=1e-15):
        return f"rank {comm.rank}: the result is the sum over the {p} ranks, not the average: divide by p"
    return None


def check_list(comm, got, want, what):
    if not isinstance(got, (list, tuple)) or len(got) != len(want):
        return [f"rank {comm.rank}: {what} must return a list of {len(want)} arrays, got {type(got).__name__}"]
    fails = []
    for k, (g, w) in enumerate(zip(got, want)):
        hint = average_mistake(comm, g, w)
        fails += [hint] if hint else compare(comm, g, w, f"averaged gradient {k} (shape {w.shape})", f"p={comm.size}")
        if fails:
            break
    return fails


GRAD_SHAPES = [(10,), (3,), (7,), (4, 5), (1,)]  # 80, 24, 56, 160, 8 bytes


def check_average(comm, fn):
    grads = [mine(comm, s, k) for k, s in enumerate(GRAD_SHAPES)]
    want = [comm.builtin.all_reduce(g) / comm.size for g in grads]
    return check_list(comm, fn(comm, [g.copy() for g in grads]), want, "average_gradients")


def check_buckets(comm, fn):
    from .lab04_solution import buckets_of

    grads = [mine(comm, s, k) for k, s in enumerate(GRAD_SHAPES)]
    want = [comm.builtin.all_reduce(g) / comm.size for g in grads]
    for cap in (100, 0, 10**6):
        got, ev = traced(comm, lambda: fn(comm, [g.copy() for g in grads], cap))
        fails = check_list(comm, got, want, f"bucketed_average(bucket_bytes={cap})")
        expect, n = buckets_of(grads, cap), count(ev, kind="collective", name="all_reduce")
        if not fails and n != len(expect):
            fails = [f"bucket_bytes={cap}: expected {len(expect)} calls of minipar.collectives.all_reduce for "
                     f"buckets {expect} (pack gradients of {[g.nbytes for g in grads]} bytes in order while a "
                     f"bucket stays <= {cap} bytes, never split one), the trace shows {n}"]
        if stop(comm, fails):
            return fails
    return []


def check_zero1(comm, fn):
    p, r = comm.size, comm.rank
    for n in LENGTHS:
        n_pad = -(-n // p) * p
        S = n_pad // p
        param, m, v = same(n, 1), np.zeros(S), np.zeros(S)
        ref, ref_m, ref_v = param.copy(), np.zeros(n), np.zeros(n)
        for step in (1, 2):
            g = same(n, 10 + step)  # the averaged gradient: the same on every rank
            got, ev = traced(comm, lambda: fn(comm, param.copy(), g.copy(), m, v, step, LR))
            adam_step(ref, g, ref_m, ref_v, step, LR)
            case = f"n={n} on {p} ranks, step {step}; padded to {n_pad}, shard of rank k = [k*{S}, (k+1)*{S})"
            if got is not None and np.shape(got) == (n_pad,) and n_pad != n:
                fails = [f"rank {r}: returned {n_pad} elements, the padded vector ({case}): strip the padding, "
                         f"the parameter has {n}"]
            else:
                fails = compare(comm, got, ref, "the new parameter", case)
            if stop(comm, fails):
                return fails
            lo, hi = r * S, min((r + 1) * S, n)
            fails = compare(comm, m[: max(hi - lo, 0)], ref_m[lo:hi], f"Adam's m for this rank's shard [{lo}, {lo + S})", case)
            pad = np.concatenate([m[max(hi - lo, 0):], v[max(hi - lo, 0):]])
            if not fails and np.any(pad != 0):
                fails = [f"rank {r}: Adam's m or v is nonzero on the padding (elements {max(hi, lo)}..{lo + S - 1} of the "
                         f"padded vector, past n={n}): pad with zeros (np.zeros), not np.resize or np.empty, so the "
                         f"padding never enters the update ({case})"]
            sent, limit = bytes_sent(ev).get(comm.world_rank(r), 0), (p - 1) * S * 8
            if not fails and sent > limit:
                fails = [f"rank {r} sent {sent} bytes ({case}); the all-gather of the updated shards needs "
                         f"(p-1) x S x 8 = {limit}: the gradient is already averaged, do not reduce it again"]
            if stop(comm, fails):
                return fails
            param = ref.copy()
    return []


def check_zero2(comm, fn):
    p, r = comm.size, comm.rank
    for n in LENGTHS:
        n_pad = -(-n // p) * p
        S = n_pad // p
        grad = mine(comm, n, 2)
        want = padded(comm.builtin.all_reduce(grad), p)[r * S:(r + 1) * S] / p
        got, ev = traced(comm, lambda: fn(comm, grad.copy()))
        case = f"n={n} on {p} ranks; padded to {n_pad}, rank {r}'s shard = [{r * S}, {(r + 1) * S})"
        hint = average_mistake(comm, got, want)
        fails = [hint] if hint else compare(comm, got, want, "this rank's shard of the averaged gradient", case, offset=r * S)
        if got is not None and np.shape(got) in ((n,), (n_pad,)) and S not in (n, n_pad):
            fails = [f"rank {r}: returned the whole gradient ({np.shape(got)[0]} elements, {case}): ZeRO-2 keeps only "
                     f"this rank's shard of {S}"]
        sent, limit = bytes_sent(ev).get(comm.world_rank(r), 0), (p - 1) * S * 8
        if not fails and sent > limit:
            fails = [f"rank {r} sent {sent} bytes ({case}): a reduce-scatter sends (p-1) x S x 8 = {limit}; an "
                     f"all-reduce sends twice that, and ZeRO-2 needs only the shard"]
        if stop(comm, fails):
            return fails
    return []


def check_zero3(comm, fn):
    p, r = comm.size, comm.rank
    shapes = [(5, 7), (7, 3), (3, 6)]  # 35, 21 and 18 weights
    W = [same(s, 20 + i) for i, s in enumerate(shapes)]
    shards = []
    for w in W:
        S = -(-w.size // p)
        shards.append(padded(w, p)[r * S:(r + 1) * S].copy())
    x = same((4, 5), 30)
    fails, calls, alive = [], [], []

    def layer(i, w, y):
        if i != len(calls):
            fails.append(f"rank {r}: layer {i} ran after layers {calls}: run them in order 0, 1, 2")
        if alive and alive[-1]() is not None:
            fails.append(f"rank {r}: the gathered weights of layer {i - 1} are still alive when layer {i} runs: ZeRO-3 "
                         f"frees each layer's full weights right after use (between uses a rank keeps only shards)")
        fails.extend(compare(comm, w, W[i], f"the gathered weights of layer {i} (shape {shapes[i]})", f"p={p}"))
        root = w
        while getattr(root, "base", None) is not None:
            root = root.base
        alive.append(weakref.ref(root))
        calls.append(i)
        return np.tanh(y @ W[i])  # the right weights, so one wrong layer does not hide the next message

    want = x
    for w in W:
        want = np.tanh(want @ w)
    got, ev = traced(comm, lambda: fn(comm, [s.copy() for s in shards], shapes, x.copy(), layer))
    if fails:
        return fails[:1]
    if calls != [0, 1, 2]:
        return [f"rank {r}: layer(i, w, y) was called for layers {calls}, expected [0, 1, 2]"]
    fails = compare(comm, got, want, "the output of the 3 layers", f"p={p}")
    sent, limit = bytes_sent(ev).get(comm.world_rank(r), 0), sum((p - 1) * s.size * 8 for s in shards)
    if not fails and sent > limit:
        fails = [f"rank {r} sent {sent} bytes; all-gathering each layer's shards once sends {limit}"]
    return fails
