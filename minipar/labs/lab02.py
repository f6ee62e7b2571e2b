"""Lab 02 (tensor parallelism): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs. Every rank draws the same full
weights and inputs (one seeded rng), so the expected value is always a slice of the dense
single-process result. Typical mistakes get their own message: the bias added on every rank
before the all-reduce, a missing all-reduce of the input gradient, the wrong rank's shard.

Dimensions are multiples of 12, so that 1, 2, 3 and 4 ranks all split them evenly.
"""
from __future__ import annotations

import numpy as np

from ..nn import CausalSelfAttention
from ..nn.functional import gelu_forward
from ..trace import bytes_sent, count
from ..xp import chunk_bounds, to_numpy
from .grader import Task
from .checks import compare, traced

KEY = "02"
TITLE = "tensor parallelism: column and row splits, f and g, Megatron MLP, heads-split attention"
FOLDER = "labs/02_tensor_parallel"
SOLUTION = "minipar.labs.lab02_solution"
HERE = "minipar.labs.lab02"

TASKS = [
    Task("2.1", "column split, forward", "column_forward", f"{HERE}:check_column_forward"),
    Task("2.2", "row split, forward", "row_forward", f"{HERE}:check_row_forward"),
    Task("2.3", "column split, backward (f)", "column_backward", f"{HERE}:check_column_backward"),
    Task("2.4", "row split, backward (g)", "row_backward", f"{HERE}:check_row_backward"),
    Task("2.5", "Megatron MLP", "megatron_mlp", f"{HERE}:check_megatron_mlp"),
    Task("2.6", "heads-split attention", "heads_attention", f"{HERE}:check_heads_attention"),
]


def draw(*shape, seed=0):
    """The same random array on every rank (seeded by the shape)."""
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


def cols(comm, a, r=None):
    """Columns chunk r (default: mine) of a (last axis)."""
    lo, hi = chunk_bounds(a.shape[-1], comm.size)[comm.rank if r is None else r]
    return a[..., lo:hi]


def rows(comm, a):
    lo, hi = chunk_bounds(a.shape[0], comm.size)[comm.rank]
    return a[lo:hi]


def _close(got, want, tol=1e-12):
    g = to_numpy(got) if got is not None else None
    return g is not None and g.shape == want.shape and np.allclose(g, want, rtol=tol, atol=tol)


def _messages(events):
    return sum(count(events, kind=k) for k in ("send", "isend", "sendrecv"))


def _bias_once(comm, got, want, b, what):
    """A pinpointed message when got = want + (p - 1) b: the bias went in before the sum."""
    if comm.size > 1 and _close(got, want + (comm.size - 1) * b):
        return [f"rank {comm.rank}: {what} is off by exactly (p-1)*b = {comm.size - 1}*b: the bias was added on "
                f"every rank before the all-reduce, so the sum holds it p times; add it once, after the sum"]
    return []


def check_column_forward(comm, fn):
    x, w, b = draw(5, 12), draw(12, 24), draw(24)
    got, ev = traced(comm, lambda: fn(comm, x, w, b))
    want = cols(comm, x @ w + b)
    if not _close(got, want):
        for k in range(comm.size):
            if k != comm.rank and _close(got, cols(comm, x @ w + b, k)):
                lo, hi = chunk_bounds(24, comm.size)[comm.rank]
                return [f"rank {comm.rank} returned the columns of rank {k}'s chunk: rank r must take chunk r, "
                        f"here columns {lo}:{hi} of w and b (chunk_bounds(d_out, p)[comm.rank])"]
        return compare(comm, got, want, f"Y_{comm.rank} = x @ A_{comm.rank} + b_{comm.rank} (its columns of Y)",
                       f"x (5, 12), w (12, 24) on {comm.size} ranks")
    if _messages(ev):
        return [f"rank {comm.rank} sent {_messages(ev)} messages: the column split's forward needs none (x is on every rank)"]
    return []


def check_row_forward(comm, fn):
    x, w, b = draw(5, 24), draw(24, 12), draw(12)
    got = fn(comm, x, w, b)
    want = x @ w + b
    return _bias_once(comm, got, want, b, "Y") or compare(
        comm, got, want, "Y = sum_r X_r @ A_r + b", f"x (5, 24), w (24, 12) on {comm.size} ranks")


def check_column_backward(comm, fn):
    x, w, dy = draw(5, 12), draw(12, 24), draw(5, 24)
    dy_r = np.ascontiguousarray(cols(comm, dy))
    got = fn(comm, dy_r, x, w)
    if not isinstance(got, tuple) or len(got) != 3:
        return [f"rank {comm.rank}: column_backward must return a tuple (dx, dw_r, db_r), got {type(got).__name__}"]
    dx, dw, db = got
    if comm.size > 1 and _close(dx, dy_r @ cols(comm, w).T):
        return [f"rank {comm.rank}: dx is only this rank's partial sum dY_r @ A_r^T: every rank's columns used x, "
                f"so dx is the sum over ranks (f's backward is an all-reduce)"]
    case = f"x (5, 12), w (12, 24) on {comm.size} ranks"
    return (compare(comm, dx, dy @ w.T, "dx (the whole input gradient)", case)
            or compare(comm, dw, x.T @ dy_r, "dw_r = x^T dY_r (its columns of dw)", case)
            or compare(comm, db, dy_r.sum(0), "db_r = sum of dY_r over rows", case))


def check_row_backward(comm, fn):
    x, w, dy = draw(5, 24), draw(24, 12), draw(5, 12)
    got, ev = traced(comm, lambda: fn(comm, dy, x, w))
    if not isinstance(got, tuple) or len(got) != 3:
        return [f"rank {comm.rank}: row_backward must return a tuple (dx_r, dw_r, db), got {type(got).__name__}"]
    dx, dw, db = got
    case = f"x (5, 24), w (24, 12) on {comm.size} ranks"
    fails = (compare(comm, dx, cols(comm, dy @ w.T), "dx_r = dY @ A_r^T (the gradient of X_r only)", case)
             or compare(comm, dw, rows(comm, x.T @ dy), "dw_r = X_r^T dY (its rows of dw)", case)
             or compare(comm, db, dy.sum(0), "db = sum of dY over rows (whole on every rank)", case))
    if not fails and _messages(ev):
        fails = [f"rank {comm.rank} sent {_messages(ev)} messages: g's backward is the identity (dY is already on "
                 f"every rank), so the row split's backward needs no communication"]
    return fails


def check_megatron_mlp(comm, fn):
    x, w1, b1, w2, b2 = draw(5, 12), draw(12, 48), draw(48), draw(48, 12), draw(12)
    got, ev = traced(comm, lambda: fn(comm, x, w1, b1, w2, b2))
    want = gelu_forward(x @ w1 + b1)[0] @ w2 + b2
    fails = _bias_once(comm, got, want, b2, "Y") or compare(
        comm, got, want, "Y = GeLU(x @ w1 + b1) @ w2 + b2", f"x (5, 12), hidden 48 on {comm.size} ranks")
    sent, p = bytes_sent(ev).get(comm.world_rank(comm.rank), 0), comm.size
    one_ring = 2 * (p - 1) * -(-5 * 12 // p) * 8
    if not fails and sent > one_ring:
        fails = [f"rank {comm.rank} sent {sent} bytes; one ring all-reduce of the (5, 12) output sends at most "
                 f"{one_ring}: fc1's columns feed the GeLU on the same rank, so the only message is the all-reduce after fc2"]
    return fails


def check_heads_attention(comm, fn):
    B, T, C, nh = 2, 5, 24, 12
    x = draw(B, T, C)
    ref = CausalSelfAttention(C, nh, np.random.default_rng(0))
    for name, a in (("qkv", ref.qkv), ("proj", ref.proj)):
        a.params["w"], a.params["b"] = draw(*a.params["w"].shape, seed=1), draw(*a.params["b"].shape, seed=1)
    want, _ = ref.forward(x)
    got = fn(comm, x, ref.qkv.params["w"], ref.qkv.params["b"], ref.proj.params["w"], ref.proj.params["b"], nh)
    return _bias_once(comm, got, want, ref.proj.params["b"], "the output") or compare(
        comm, got, want, "the attention output", f"x (2, 5, 24), {nh} heads on {comm.size} ranks")
