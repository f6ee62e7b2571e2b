"""Lab 01 (collectives): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns
a list of failure messages that say where the result differs (rank, element, expected vs got).
The smallest case comes first, so the first message is the one to read.
"""
from __future__ import annotations

import math

from ..lessons.collectives import draw
from ..trace import bytes_sent, count
from ..xp import chunk_bounds
from .checks import compare, stop, traced
from .grader import Task

KEY = "01"
TITLE = "collectives from send/recv"
FOLDER = "labs/01_collectives"
SOLUTION = "minipar.labs.lab01_solution"
HERE = "minipar.labs.lab01"

TASKS = [
    Task("1.1", "ring pass", "ring_pass", f"{HERE}:check_ring_pass"),
    Task("1.2", "tree broadcast", "tree_broadcast", f"{HERE}:check_tree_broadcast"),
    Task("1.3", "ring reduce-scatter", "ring_reduce_scatter", f"{HERE}:check_reduce_scatter"),
    Task("1.4", "ring all-gather", "ring_all_gather", f"{HERE}:check_all_gather"),
    Task("1.5", "ring all-reduce", "ring_all_reduce", f"{HERE}:check_all_reduce"),
    Task("1.6", "cost model of the ring", "predicted_ring_time", f"{HERE}:check_cost_model", sizes=(1,)),
]


def check_ring_pass(comm, fn):
    fails = []
    for n in (1, 5):
        x = draw(comm, n, "float64")
        left = (comm.rank - 1) % comm.size
        got = fn(comm, x)
        fails += compare(comm, got, draw(comm, n, "float64", rank=left), f"what it received (should be rank {left}'s x)", f"n={n}")
    return fails


def check_tree_broadcast(comm, fn):
    fails = []
    for root in sorted({0, comm.size - 1}):
        for n in (1, 6):
            x = draw(comm, n, "float64") if comm.rank == root else comm.empty(n)
            got, ev = traced(comm, lambda: fn(comm, x, root))
            fails += compare(comm, got, draw(comm, n, "float64", rank=root), f"broadcast from root {root}", f"n={n}")
            sends = count(ev, kind="send") + count(ev, kind="isend") + count(ev, kind="sendrecv")
            if comm.rank == root and sends > max(1, math.ceil(math.log2(comm.size))) and comm.size > 1:
                fails.append(f"rank {root} (the root) sent {sends} messages on {comm.size} ranks: a binomial tree "
                             f"sends at most ceil(log2 p) = {math.ceil(math.log2(comm.size))} from the root; "
                             f"is this a loop over all ranks?")
    return fails


def check_reduce_scatter(comm, fn):
    fails = []
    for n in (4, 7, 10, 2):  # 7 and 10 do not divide by 3 or 4; 2 is shorter than 3 or 4 ranks
        x = draw(comm, n, "float64")
        want = comm.builtin.reduce_scatter(x)
        a, _ = chunk_bounds(n, comm.size)[comm.rank]
        got = fn(comm, x)
        fails += compare(comm, got, want, f"its chunk {comm.rank} of the sum (chunk = elements {chunk_bounds(n, comm.size)[comm.rank]})",
                         f"n={n} on {comm.size} ranks", offset=a)
        if stop(comm, fails):
            break
    return fails


def check_all_gather(comm, fn):
    fails = []
    for n in (4, 7, 2):
        bounds = chunk_bounds(n, comm.size)
        counts = [b - a for a, b in bounds]
        a, b = bounds[comm.rank]
        x = draw(comm, n, "float64")
        got = fn(comm, x[a:b].copy() if hasattr(x, "copy") else x[a:b].clone(), counts)
        fails += compare(comm, got, x if comm.size == 1 else comm.builtin.all_gather(x[a:b]), "the gathered vector",
                         f"n={n}, counts={counts}")
        if stop(comm, fails):
            break
    return fails


def check_all_reduce(comm, fn):
    fails = []
    for n in (12, 7, 2):
        x = draw(comm, n, "float64")
        got, ev = traced(comm, lambda: fn(comm, x))
        fails += compare(comm, got, comm.builtin.all_reduce(x), "the sum", f"n={n}")
        sent = bytes_sent(ev).get(comm.world_rank(comm.rank), 0)
        ring = 2 * (comm.size - 1) * math.ceil(n / comm.size) * 8
        if not fails and sent > ring:
            fails.append(f"rank {comm.rank} sent {sent} bytes for n={n} on {comm.size} ranks; a ring sends at most "
                         f"2(p-1) chunks = {ring} bytes: is it reduce-scatter + all-gather?")
        if stop(comm, fails):
            break
    return fails


def check_cost_model(comm, fn):
    from ..costmodel import allreduce_time

    fails = []
    for nbytes, p, alpha, beta in [(1 << 20, 4, 5e-6, 1e-10), (8, 8, 2e-6, 5e-10), (3 << 24, 3, 1e-5, 2e-11), (100, 1, 1e-6, 1e-9)]:
        want = allreduce_time("ring", nbytes, p, alpha, beta, 0.0)
        got = fn(nbytes, p, alpha, beta)
        if got is None or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15):
            fails.append(f"predicted_ring_time(n={nbytes}, p={p}, alpha={alpha}, beta={beta}) = {got}, "
                         f"expected {want:.6g} s = 2(p-1)*alpha + 2(p-1)/p*n*beta")
            break
    return fails
