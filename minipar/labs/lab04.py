"""Lab 04 (data parallelism and ZeRO): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs or which rule was broken. Gradients
that differ per rank are drawn from a seed that includes the rank; parameters and averaged
gradients are the same draw on every rank. The rules (``minipar.labs.checks``):

* traffic: exactly what minipar's ring collectives send for the technique: one all-reduce per
  gradient (4.1) or per bucket (4.2), the all-gather of the updated shards only (4.3), a
  reduce-scatter, not an all-reduce (4.4), one all-gather per layer (4.5); a builtin or mpi4py
  collective sends 0 bytes through comm, and ``comm.builtin`` (including its object transport:
  no state gathered through objects) is refused inside the learner's call; the messages are the
  learner's own, sent through minipar.collectives, not by minipar's answers called from the
  exercise;
* own data: ZeRO-1's averaged gradient is NaN outside this rank's shard, so an update of the
  whole vector (or of the wrong shard) shows;
* memory: ZeRO-3 frees each layer's gathered weights before the next layer runs, and the bytes
  of the arrays the call holds at its peak (NumPy's buffers, torch's storages:
  ``minipar.labs.memory``) stay within one layer's full weights plus the activations: gathering
  every layer up front fails even if each is freed later, and so does the previous layer's
  weights still held while the next all-gather runs; the message names the arrays alive at the
  peak and the lines that made them.

Every check hands the learner the backend's arrays (``comm.asarray``: NumPy under MPI, torch
tensors under torch.distributed) and reads the results back as NumPy.

Typical mistakes get their own message: averaging twice (or not at all), a bucket that exactly
fills bucket_bytes split, a whole gradient returned where a shard was due, padding that is not
zero, gathered weights kept alive.
Lengths 10, 7, 1 and 13 do not all divide by 2, 3 or 4: padding is always exercised.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from ..optim import adam_step
from ..trace import count
from ..xp import is_torch, namespace, to_numpy
from .checks import (COLLECTIVES, Memory, chunk_counts, compare, expect_traffic, graded, held_at_most,
                     no_builtin, poisoned, ranks, ring_traffic, sent_by_learner, stop)
from .grader import Task

TITLE = "data parallelism and ZeRO: gradient averaging, buckets, sharded Adam, gather on demand"
HERE = "minipar.labs.lab04"
INSTEAD = "minipar.collectives (all_reduce, reduce_scatter, all_gather: rings on send/recv)"

TASKS = [
    Task("4.1", "DDP gradient averaging", "average_gradients", f"{HERE}:check_average"),
    Task("4.2", "gradient buckets", "bucketed_average", f"{HERE}:check_buckets"),
    Task("4.3", "ZeRO-1 update + all-gather", "zero1_update", f"{HERE}:check_zero1"),
    Task("4.4", "ZeRO-2 reduce-scatter", "zero2_grad_shard", f"{HERE}:check_zero2"),
    Task("4.5", "ZeRO-3 gather on demand", "zero3_forward", f"{HERE}:check_zero3"),
]

# Hints, stage by stage (`minipar check 04 --hint 4.3`): a nudge naming the idea and what to read,
# the shape of the loop, then near-pseudocode. The answer: `minipar lab solution 04 --task 4.3`.
HINTS = {
    "4.1": (
        """DDP: each rank's gradient is one term of a sum; minipar.collectives.all_reduce(comm, g) adds
        them up on every rank. The lesson: notebooks/04_data_parallel_zero.ipynb.""",
        """One all_reduce per gradient, in a list comprehension over grads; divide the sum by
        comm.size once (not each rank's input).""",
        """
        return [all_reduce(comm, g) / comm.size for g in grads]
        """,
    ),
    "4.2": (
        """Fewer, larger messages: pack the gradients in order into buckets of at most bucket_bytes
        (g.nbytes; a bucket may hold exactly bucket_bytes), never splitting one; all-reduce each
        bucket as one flat array (the flattened gradients concatenated: namespace(g).concat from
        minipar.xp, NumPy's or torch's), then cut it back into the shapes.""",
        """Greedy packing: for i, g in enumerate(grads): if there is a bucket and used + g.nbytes <=
        bucket_bytes, add i to the last bucket (used += g.nbytes); else start a new bucket [i]
        (used = g.nbytes). Then per bucket: flat = all_reduce(comm, flat) / comm.size, and walk an
        offset through it: out[i] = flat[at:at + size(g)].reshape(g.shape) (size from minipar.xp).""",
        """
        buckets = greedy packing as above
        out = [None] * len(grads)
        for bucket in buckets:
            flat = all_reduce(comm, namespace(grads[0]).concat([grads[i].reshape(-1) for i in bucket])) / comm.size
            at = 0
            for i in bucket:
                out[i] = flat[at:at + size(grads[i])].reshape(grads[i].shape); at += size(grads[i])
        return out
        """,
    ),
    "4.3": (
        """ZeRO-1: each rank keeps Adam's moments for 1/p of the parameters, updates only that shard
        (minipar.optim.adam_step, in place), and an all_gather brings the whole parameter back to
        every rank. Padding with zeros to a multiple of p makes the shards equal.""",
        """n_pad = ceil(n / p) * p; pad param and avg_grad with zeros (zeros((n_pad,), like=param) from
        minipar.xp, then copy the vector in); S = n_pad // p; yours is [r*S, (r+1)*S). shard = a copy
        (copy from minipar.xp) of your part of the padded param; adam_step(shard, your part of the
        padded gradient, m, v, step, lr). all_gather(comm, shard) is the padded vector: keep [:n].
        Read only your part of avg_grad: the rest is NaN on your rank.""",
        """
        P, G = padded(param), padded(avg_grad); S = size(P) // p; mine = slice(r * S, (r + 1) * S)
        shard = copy(P[mine])
        adam_step(shard, G[mine], m, v, step, lr)
        return all_gather(comm, shard)[:size(param)]
        """,
    ),
    "4.4": (
        """ZeRO-2 never builds the whole averaged gradient: reduce_scatter(comm, x) gives rank r the sum
        of chunk r only, at half the traffic of an all-reduce.""",
        """Pad grad with zeros to a multiple of p, so that the chunks are 4.3's equal shards;
        reduce_scatter the padded vector and divide by comm.size.""",
        """
        padded = zeros((-(-size(grad) // comm.size) * comm.size,), like=grad); padded[:size(grad)] = grad
        return reduce_scatter(comm, padded) / comm.size
        """,
    ),
    "4.5": (
        """ZeRO-3: a layer's weights are whole only while that layer computes: all_gather its shards
        just before, free the result just after, so at most one layer is ever whole (the grader
        counts the bytes of the arrays held, and names those alive at the peak).""",
        """y = x; for each layer i: w = all_gather(comm, shards[i])[:math.prod(shapes[i])] reshaped
        to shapes[i]; y = layer(i, w, y); then del w (and anything else still referring to the
        gathered array) before the next layer's all_gather.""",
        """
        y = x
        for i, (shard, shape) in enumerate(zip(shards, shapes)):
            w = all_gather(comm, shard)[:math.prod(shape)].reshape(shape)
            y = layer(i, w, y)
            del w
        return y
        """,
    ),
}
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


def all_reduce_traffic(comm, sizes):
    """(bytes, messages) of one ring all-reduce (flat, float64) per entry of ``sizes``."""
    out = [ring_traffic(chunk_counts(n, comm.size), comm.rank, 8) for n in sizes]
    return sum(b for b, _ in out), sum(m for _, m in out)


def shard_traffic(comm, S, times=1):
    """(bytes, messages) of ``times`` ring reduce-scatters or all-gathers of p shards of S."""
    return times * (comm.size - 1) * S * 8, times * (comm.size - 1) * (S > 0)


def average_mistake(comm, got, want):
    """A message when got is want / p or want * p (averaged twice, or summed only)."""
    p = comm.size
    g = to_numpy(got) if got is not None else None
    if p == 1 or g is None or g.shape != np.shape(want) or not np.any(want != 0):
        return None
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


def reference_average(comm, grads):
    """The average over the ranks by the engine's own all-reduce (the grader's reference), as NumPy."""
    return [to_numpy(comm.builtin.all_reduce(comm.asarray(g))) / comm.size for g in grads]


def check_average(comm, fn):
    grads = [mine(comm, s, k) for k, s in enumerate(GRAD_SHAPES)]
    want = reference_average(comm, grads)
    g = graded(comm, lambda: fn(comm, [comm.asarray(a.copy()) for a in grads]))
    nbytes, msgs = all_reduce_traffic(comm, [a.size for a in grads])
    return (no_builtin(comm, g, "average_gradients", INSTEAD)
            or check_list(comm, g.out, want, "average_gradients")
            or expect_traffic(comm, g, f"one ring all-reduce per gradient ({len(grads)} gradients of "
                                       f"{[a.size for a in grads]} doubles)", nbytes, msgs)
            or sent_by_learner(comm, g, fn, "average_gradients", INSTEAD, COLLECTIVES))


def expected_buckets(nbytes, cap, fits=lambda size, cap: size <= cap):
    """The exercise's packing rule, for the check: gradients in order join the current bucket
    while it stays <= cap bytes, a gradient is never split; index lists per bucket. ``fits``:
    the rule a typical mistake uses instead (``<``: a bucket that exactly fills cap is split)."""
    out, size = [], 0
    for i, b in enumerate(nbytes):
        if out and fits(size + b, cap):
            out[-1].append(i)
            size += b
        else:
            out.append([i])
            size = b
    return out


BUCKET_CAPS = (100, 160, 0, 10**6)  # 160: gradients 0, 1, 2 fill a bucket exactly (80 + 24 + 56), as does 3 alone


def check_buckets(comm, fn):
    grads = [mine(comm, s, k) for k, s in enumerate(GRAD_SHAPES)]
    want = reference_average(comm, grads)
    for cap in BUCKET_CAPS:
        g = graded(comm, lambda: fn(comm, [comm.asarray(a.copy()) for a in grads], cap))
        fails = no_builtin(comm, g, "bucketed_average", INSTEAD) or check_list(
            comm, g.out, want, f"bucketed_average(bucket_bytes={cap})")
        nbytes = [a.nbytes for a in grads]
        expect = expected_buckets(nbytes, cap)
        n = count(g.events, kind="collective", name="all_reduce:ring")
        if not fails and n != len(expect):
            split = expected_buckets(nbytes, cap, fits=lambda size, cap: size < cap)
            fails = [f"bucket_bytes={cap}: expected {len(expect)} calls of minipar.collectives.all_reduce for "
                     f"buckets {expect} (pack gradients of {nbytes} bytes in order while a "
                     f"bucket stays <= {cap} bytes, never split one), the trace shows {n}"
                     + (f": that is {split}, where a bucket that exactly fills bucket_bytes is split; it fits "
                        f"(a bucket may hold exactly bucket_bytes: split only past it, on >, not >=)"
                        if n == len(split) != len(expect) else "")]
        sizes = [sum(grads[i].size for i in bucket) for bucket in expect]
        nbytes, msgs = all_reduce_traffic(comm, sizes)
        fails = fails or expect_traffic(comm, g, f"one ring all-reduce per bucket (buckets of {sizes} doubles, "
                                                 f"bucket_bytes={cap})", nbytes, msgs)
        fails = fails or sent_by_learner(comm, g, fn, "bucketed_average", INSTEAD, COLLECTIVES)
        if stop(comm, fails):
            return fails
    return []


def check_zero1(comm, fn):
    p, r = comm.size, comm.rank
    for n in LENGTHS:
        n_pad = -(-n // p) * p
        S = n_pad // p
        lo, hi = r * S, min((r + 1) * S, n)
        param, m, v = same(n, 1), comm.asarray(np.zeros(S)), comm.asarray(np.zeros(S))  # updated in place
        ref, ref_m, ref_v = param.copy(), np.zeros(n), np.zeros(n)
        for step in (1, 2):
            g = same(n, 10 + step)  # the averaged gradient: the same on every rank
            mine_only = comm.asarray(poisoned(g, slice(lo, max(hi, lo))))  # the rest: the other ranks' updates
            run = graded(comm, lambda: fn(comm, comm.asarray(param.copy()), mine_only, m, v, step, LR))
            got = to_numpy(run.out) if run.out is not None else None
            adam_step(ref, g, ref_m, ref_v, step, LR)
            case = f"n={n} on {ranks(p)}, step {step}; padded to {n_pad}, shard of rank k = [k*{S}, (k+1)*{S})"
            fails = no_builtin(comm, run, "zero1_update", INSTEAD)
            if not fails and got is not None and np.shape(got) == (n_pad,) and n_pad != n:
                fails = [f"rank {r}: returned {n_pad} elements, the padded vector ({case}): strip the padding, "
                         f"the parameter has {n}"]
            fails = fails or compare(comm, got, ref, "the new parameter", case,
                                     owns=f"elements {lo}:{max(hi, lo)} of the averaged gradient, its shard")
            if stop(comm, fails):
                return fails
            mn, vn = to_numpy(m), to_numpy(v)
            fails = compare(comm, mn[: max(hi - lo, 0)], ref_m[lo:hi], f"Adam's m for this rank's shard [{lo}, {lo + S})",
                            case)
            pad = np.concatenate([mn[max(hi - lo, 0):], vn[max(hi - lo, 0):]])
            if not fails and np.any(pad != 0):
                fails = [f"rank {r}: Adam's m or v is nonzero on the padding (elements {max(hi, lo)}..{lo + S - 1} of the "
                         f"padded vector, past n={n}): pad with zeros (np.zeros), not np.resize or np.empty, so the "
                         f"padding never enters the update ({case})"]
            nbytes, msgs = shard_traffic(comm, S)
            fails = fails or expect_traffic(comm, run, f"the ring all-gather of the updated shards ({case})", nbytes,
                                            msgs, hint="the gradient is already averaged: do not reduce it again; "
                                                       "gather the p updated shards of S elements once")
            fails = fails or sent_by_learner(comm, run, fn, "zero1_update", INSTEAD, COLLECTIVES)
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
        want = padded(to_numpy(comm.builtin.all_reduce(comm.asarray(grad))), p)[r * S:(r + 1) * S] / p
        run = graded(comm, lambda: fn(comm, comm.asarray(grad.copy())))
        got = to_numpy(run.out) if run.out is not None else None
        case = f"n={n} on {ranks(p)}; padded to {n_pad}, rank {r}'s shard = [{r * S}, {(r + 1) * S})"
        hint = average_mistake(comm, got, want)
        fails = no_builtin(comm, run, "zero2_grad_shard", INSTEAD) or (
            [hint] if hint else compare(comm, got, want, "this rank's shard of the averaged gradient", case, offset=r * S))
        if got is not None and np.shape(got) in ((n,), (n_pad,)) and S not in (n, n_pad):
            fails = [f"rank {r}: returned the whole gradient ({np.shape(got)[0]} elements, {case}): ZeRO-2 keeps only "
                     f"this rank's shard of {S}"]
        nbytes, msgs = shard_traffic(comm, S)
        fails = fails or expect_traffic(comm, run, f"a ring reduce-scatter of the padded gradient ({case})", nbytes, msgs,
                                        hint="an all-reduce sends twice that, and ZeRO-2 needs only the shard")
        fails = fails or sent_by_learner(comm, run, fn, "zero2_grad_shard", INSTEAD, COLLECTIVES)
        if stop(comm, fails):
            return fails
    return []


def owner(a):
    """The array that owns ``a``'s memory: the end of a NumPy view's ``.base`` chain, a torch
    view's ``._base`` (torch keeps the owner there directly), else ``a`` itself."""
    if is_torch(a):
        return a if a._base is None else a._base
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


ZERO3_SHAPES = [(63, 65), (65, 61), (61, 67), (67, 59)]  # about 32 KB each; padding on 2, 3 and 4 ranks
SLACK = 8192  # bytes: activations (a layer's output is at most 4 x 67 doubles, 2144 bytes)


def check_zero3(comm, fn):
    p, r = comm.size, comm.rank
    shapes = ZERO3_SHAPES
    W = [same(s, 20 + i) for i, s in enumerate(shapes)]
    shards = []
    for w in W:
        S = -(-w.size // p)
        shards.append(padded(w, p)[r * S:(r + 1) * S].copy())
    x = same((4, shapes[0][0]), 30)
    Wk = [comm.asarray(w) for w in W]  # the weights in the backend's kind, for the layers' own product
    fails, calls, alive = [], [], []
    memory = Memory()

    def layer(i, w, y):
        with memory.paused():  # the grader's own work here is not the learner's memory
            if i != len(calls):
                fails.append(f"rank {r}: layer {i} ran after layers {calls}: run them in order 0, 1, 2, 3")
            if alive and alive[-1]() is not None:
                fails.append(f"rank {r}: the gathered weights of layer {i - 1} are still alive when layer {i} runs: "
                             f"ZeRO-3 frees each layer's full weights right after use (between uses a rank keeps "
                             f"only shards)")
            fails.extend(compare(comm, w, W[i], f"the gathered weights of layer {i} (shape {shapes[i]})", f"p={p}"))
            alive.append(weakref.ref(owner(w)))
            calls.append(i)
            return namespace(Wk[i]).tanh(y @ Wk[i])  # the right weights: one wrong layer does not hide the next message

    want = x
    for w in W:
        want = np.tanh(want @ w)
    args = [comm.asarray(s.copy()) for s in shards], shapes, comm.asarray(x.copy())  # made before the call
    run = graded(comm, lambda: fn(comm, *args, layer), memory=memory)
    fails = no_builtin(comm, run, "zero3_forward", INSTEAD) or fails[:1]
    if not fails and calls != list(range(len(shapes))):
        fails = [f"rank {r}: layer(i, w, y) was called for layers {calls}, expected {list(range(len(shapes)))}"]
    fails = fails or compare(comm, run.out, want, f"the output of the {len(shapes)} layers", f"p={p}")
    nbytes, msgs = sum(shard_traffic(comm, s.size)[0] for s in shards), sum(shard_traffic(comm, s.size)[1] for s in shards)
    fails = fails or expect_traffic(comm, run, f"one ring all-gather per layer (shards of {[s.size for s in shards]} "
                                               f"doubles)", nbytes, msgs)
    biggest = max(s.size for s in shards) * p * 8
    everything = sum(s.size for s in shards) * p * 8
    if not fails:
        held = held_at_most(comm, run, biggest + SLACK, "zero3_forward",
                            f"ZeRO-3 holds one layer's full weights at a time: the largest layer ({biggest} bytes, "
                            f"padded) + {SLACK} for activations; every layer at once is {everything}")
        fails = [held[0] + layers_at_once(run.at_peak, min(math.prod(s) for s in shapes) * 8)] if held else []
    return fails or sent_by_learner(comm, run, fn, "zero3_forward", INSTEAD, COLLECTIVES)


def layers_at_once(held, layer_bytes):
    """What a memory failure of 4.5 adds when more than one gathered layer was alive at its peak
    (arrays of at least ``layer_bytes``: a layer's weights, its shard aside)."""
    layers = [h for h in held if h.nbytes >= layer_bytes]
    if len(layers) < 2:
        return ""
    named = [h.name for h in layers if h.name]
    return (f". {len(layers)} gathered layers were alive at once" + (f" ({', '.join(named)})" if named else "")
            + ": a layer's weights must be freed (del, or nothing left referring to them) before the next "
              "all_gather")
