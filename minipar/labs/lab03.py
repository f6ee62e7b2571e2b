"""Lab 03 (pipeline parallelism): the tasks and their checks.

Tasks 3.1-3.3 are pure functions (schedules as data, a bubble fraction from timed events):
their checks run in one process (``sizes=(1,)``) over many (p, m), smallest first. A broken
schedule is reported with minipar's validator grid (time x rank, the offending step marked
``>1F3<``); a valid one that differs from minipar's order with its first differing action
("rank 2, position 5: expected 2B1, got 2F3").

A bubble fraction that is the theory (p-1)/(m+p-1) instead of a measurement from the events
is named as such (the cases include costs and schedules where the two differ).

Task 3.4 (which rank an action receives from / sends to, with which tag) is checked against
minipar's executor convention (``minipar.pipeline.execute.peer_and_tag``) on every action of
several schedules (first GPipe and 1F1B, the ones the learner wrote, for p = 1 .. 4; then ZB-H1's
split backward and interleaved 1F1B's v = 2 chunks), then *used*: minipar's executor
(``run_schedule(..., pairing=fn)``) runs one training step per schedule on real ranks (1, 2, 3,
4) with the learner's pairing deciding every message, on the backend's arrays (NumPy, or torch
tensors), and the loss and every gradient are compared with the dense single-process model
(float64, only the summation order of the batch differs: relative error <= 1e-12).
Everywhere, a graded function imported from minipar instead of written is refused (the grader).

Task 3.5 (core: the learner's own executor runs 1F1B on real ranks) is checked in
``minipar.labs.lab03_executor``.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..lessons.pipeline import TOLERANCE, _data, rel_error
from ..pipeline import (Action, Schedule, ScheduleError, format_grid, gpipe, interleaved_1f1b, naive,
                        one_f_one_b, simulate, validate, zero_bubble_h1)
from ..pipeline.execute import build_stages, peer_and_tag, reference_step, run_schedule
from .checks import attempt, graded, no_builtin, stop
from .lab03_executor import step as executor_step
from .grader import WORLD_SIZES, Task

TITLE = "pipeline schedules, bubbles and messages, and a 1F1B executor"
HERE = "minipar.labs.lab03"

TASKS = [
    Task("3.1", "GPipe schedule", "gpipe", f"{HERE}:check_gpipe", sizes=(1,),
         reference=("minipar.pipeline.schedules:gpipe",)),
    Task("3.2", "1F1B schedule", "one_f_one_b", f"{HERE}:check_one_f_one_b", sizes=(1,),
         reference=("minipar.pipeline.schedules:one_f_one_b",)),
    Task("3.3", "bubble fraction", "bubble_fraction", f"{HERE}:check_bubble_fraction", sizes=(1,),
         reference=("minipar.pipeline.execute:measured_bubble",)),
    Task("3.4", "send/recv pairing", "peer_and_tag", f"{HERE}:check_peer_and_tag", budget=45,  # 4 s on 4 ranks
         reference=("minipar.pipeline.execute:peer_and_tag",)),
    Task("3.5", "1F1B on real ranks", "pipeline_step", "minipar.labs.lab03_executor:check_executor", tier="core",
         reference=("minipar.pipeline.execute:run_schedule", "minipar.pipeline.asynchronous:train_flush",
                    "minipar.pipeline.asynchronous:train_async")),
]

# Hints, stage by stage (`minipar check 03 --hint 3.2`): a nudge naming the idea and what to read,
# the shape of the loop, then near-pseudocode. The answer: `minipar lab solution 03 --task 3.2`.
HINTS = {
    "3.1": (
        """A schedule is data: per rank, the list of Action(stage, kind, microbatch) it runs, in
        order. GPipe fills the pipeline with every micro-batch before it drains it: on its own stage,
        a rank has nothing else to decide than the order of two phases.""",
        """For each rank r in range(p): [Action(r, "F", i) for i in range(m)] followed by
        [Action(r, "B", i) for i in range(m)] (first in, first out).""",
        """
        return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)] for r in range(p)]
        """,
    ),
    "3.2": (
        """1F1B starts each backward as early as it can, so few micro-batches are alive at once: a
        warm-up of forwards, a steady state of one forward then one backward, a cool-down of
        backwards. How many forwards must rank r run before the first gradient can come back to it?
        Count the stages after it.""",
        """Rank r warms up with w = min(p - 1 - r, m) forwards (0 .. w-1). Then for i in range(w, m):
        forward i, then the backward of the oldest waiting micro-batch, i - w. Last, the backwards
        m - w .. m - 1. With m < p, w = m: every forward, then every backward.""",
        """
        for r in range(p):
            w = min(p - 1 - r, m)
            ops = [F(r, i) for i in range(w)]
            for i in range(w, m): ops += [F(r, i), B(r, i - w)]
            ops += [B(r, i) for i in range(m - w, m)]
        """,
    ),
    "3.3": (
        """The bubble is idle rank-time over all rank-time: every rank counts for the whole makespan,
        from the first start to the last end (a measured trace does not start at 0).""",
        """span = max end - min start; busy = the sum of (end - start) over all events; the bubble is
        (p * span - busy) / (p * span). Only + - * /, so that Fractions stay exact.""",
        """
        start = min(s for _, s, _ in events); span = max(e for _, _, e in events) - start
        busy = sum(e - s for _, s, e in events)
        return (p * span - busy) / (p * span)
        """,
    ),
    "3.4": (
        """On the executor an F receives its input from the stage before and sends its output to the
        stage after; a B (or I) receives the gradient from the stage after and sends the input's
        gradient to the stage before; a W talks to no one. Stage k lives on rank
        schedule.stage_to_rank[k]; a tag names the stage a message goes *into* (act_tag, grad_tag at
        the top of the exercise).""",
        """m = schedule.microbatches, last = schedule.total_stages - 1, owner = schedule.stage_to_rank.
        F on s: recv (owner[s-1], act_tag(s, i, m)) unless s == 0; send (owner[s+1], act_tag(s+1, i, m))
        unless s == last. B and I on s: recv (owner[s+1], grad_tag(s, i, m)) unless s == last; send
        (owner[s-1], grad_tag(s-1, i, m)) unless s == 0. W: (None, None).""",
        """
        if kind == "F":
            return ((owner[s-1], act_tag(s, i, m)) if s > 0 else None,
                    (owner[s+1], act_tag(s+1, i, m)) if s < last else None)
        if kind in ("B", "I"):
            return ((owner[s+1], grad_tag(s, i, m)) if s < last else None,
                    (owner[s-1], grad_tag(s-1, i, m)) if s > 0 else None)
        return None, None
        """,
    ),
    "3.5": (
        """Walk your actions in order: a forward needs its input (the data on the first stage, a
        message from the stage before elsewhere), a backward needs its output gradient (the loss's
        on the last stage, a message from the stage after elsewhere), and each produces what the
        neighbour's action needs. The order of the actions is safe; the danger is a send that waits
        for a receiver who is itself waiting to send to you. What kind of send never waits?""",
        """Receive with a blocking comm.recv exactly where an action needs the data (into
        comm.empty(shape, dtype) of a micro-batch). Send with comm.isend, which returns at once: keep
        each request (its array must stay as it is until it completes), drop the ones whose test()
        is True after every action, and wait for the rest before returning. Tags: act_tag(s + 1, i, m)
        for F's output to rank s + 1, grad_tag(s - 1, i, m) for B's input gradient to rank s - 1 (the
        receive uses the tag of the stage it goes into). Keep each forward's saved context in a dict
        by micro-batch and pop it at its backward.""",
        """
        saved, dys, pending, total = {}, {}, [], 0.0
        for s, kind, i in actions:
            if kind == "F":
                x = microbatches[i] if s == 0 else comm.recv(comm.empty(shape, dtype), s - 1, act_tag(s, i, m))
                y, saved[i] = stage.forward(x)
                if s == last: value, dys[i] = loss(y, i); total += value
                else: pending.append(comm.isend(y, s + 1, act_tag(s + 1, i, m)))
            else:
                dy = dys.pop(i) if s == last else comm.recv(comm.empty(shape, dtype), s + 1, grad_tag(s, i, m))
                dx = stage.backward(dy, saved.pop(i))
                if s > 0: pending.append(comm.isend(dx, s - 1, grad_tag(s - 1, i, m)))
            pending = [q for q in pending if not q.test()]
        for q in pending: q.wait()
        return total if s == last else None
        """,
    ),
}

GPIPE_CASES = [(1, 1), (2, 1), (1, 3), (2, 3), (3, 2), (4, 4), (4, 8), (3, 7)]
ONE_F_ONE_B_CASES = [(1, 1), (2, 1), (1, 4), (2, 3), (3, 2), (4, 1), (4, 3), (4, 8), (3, 7)]


def indent(text: str, by: str = "        ") -> str:
    return "\n".join(by + line for line in text.splitlines())


# ---------------------------------------------------------------- 3.1, 3.2: schedules

def as_schedule(name, p, m, got, reference: Schedule):
    """The learner's action lists as a Schedule with the reference's rules (same stage
    placement, same in-flight bound); (schedule, None) or (None, failure message)."""
    call = f"{name}(p={p}, m={m})"
    if hasattr(got, "actions"):        # a Schedule is fine too
        got = got.actions
    if got is None:
        return None, f"{call} returned None (expected a list of p={p} lists of Action)"
    try:
        rows = [list(r) for r in got]
    except TypeError:
        return None, f"{call} returned {type(got).__name__}, expected a list of p={p} lists of Action"
    if len(rows) != p:
        return None, f"{call} returned {len(rows)} action lists, expected one per rank: p={p}"
    try:
        rows = [[a if isinstance(a, (Action, str)) else Action(*a) for a in r] for r in rows]
        sched = Schedule(f"{name} (yours)", p, m, 1, rows, inflight_limit=reference.inflight_limit)
    except (ValueError, TypeError) as err:
        return None, f"{call}: cannot read an action ({err}); use Action(stage, kind, microbatch) as in the exercise"
    return sched, None


def first_difference(got: Schedule, want: Schedule):
    """'rank r, position i: expected X, got Y' for the first differing action, or None."""
    for r, (g, w) in enumerate(zip(got.actions, want.actions)):
        for i, (a, b) in enumerate(zip(g, w)):
            if tuple(a) != tuple(b):
                return f"rank {r}, position {i}: expected {b}, got {a}"
        if len(g) != len(w):
            i = min(len(g), len(w))
            return (f"rank {r} has {len(g)} actions, expected {len(w)}: "
                    + (f"position {i} should be {w[i]}" if len(w) > i else f"{g[i]} at position {i} is extra"))
    return None


def check_schedule(name, fn, reference, cases, note="", bound=""):
    for p, m in cases:
        want = reference(p, m)
        sched, why = as_schedule(name, p, m, fn(p, m), want)
        if why:
            return [why]
        try:
            validate(sched)
        except ScheduleError as err:
            return [f"{name}(p={p}, m={m}) is not a valid schedule; the validator's grid "
                    f"(time steps as columns, the offending step marked >..<):\n{indent(str(err))}"
                    + (f"\n        ({bound})" if "in flight" in str(err) and bound else "")]
        diff = first_difference(sched, want)
        if diff:
            return [f"{name}(p={p}, m={m}) is valid but not minipar's {name}: {diff}{note}\n"
                    f"        expected:\n{indent(_rows(want), ' ' * 10)}\n"
                    f"        got:\n{indent(_rows(sched), ' ' * 10)}"]
    return []


def _rows(s: Schedule) -> str:
    return "\n".join(f"rank {r}: " + " ".join(map(str, ops)) for r, ops in enumerate(s.actions))


def check_gpipe(comm, fn):
    return check_schedule("gpipe", fn, gpipe, GPIPE_CASES,
                          note=" (backwards run first in, first out: micro-batch 0 first)")


def check_one_f_one_b(comm, fn):
    return check_schedule("one_f_one_b", fn, one_f_one_b, ONE_F_ONE_B_CASES,
                          note=" (warm-up on rank r: min(p-1-r, m) forwards, then F,B pairs)",
                          bound="1F1B's promise: rank r holds at most min(p-r, m) micro-batches; "
                                "warm up with min(p-1-r, m) forwards, then one F, one B")


# ---------------------------------------------------------------- 3.3: bubble fraction

def bubble_cases():
    """(label, events [(rank, start, end)], p, m, expected, idle, makespan, busy), smallest first."""
    cases = [("gpipe p=2 m=2", gpipe(2, 2), {"F": 1, "B": 2}),
             ("naive p=3", naive(3), {"F": 1, "B": 2}),
             ("gpipe p=4 m=8", gpipe(4, 8), {"F": 1, "B": 2}),
             ("1f1b p=3 m=2", one_f_one_b(3, 2), {"F": 1, "B": 2}),
             ("1f1b p=4 m=6, F=1 B=3 p2p=0.5", one_f_one_b(4, 6), {"F": 1, "B": 3, "p2p": Fraction(1, 2)}),
             ("zb-h1 p=4 m=6, F=I=W=1", zero_bubble_h1(4, 6), {"F": 1, "I": 1, "W": 1}),
             ("interleaved p=2 m=4 v=2", interleaved_1f1b(2, 4, 2), {"F": 1, "B": 2}),
             ("gpipe p=3 m=5, float costs F=0.7 B=1.9", gpipe(3, 5), {"F": 0.7, "B": 1.9})]
    out = []
    for label, sched, costs in cases:
        sim = simulate(sched, costs)
        ev = [(e.rank, e.start, e.end) for e in sim.events]
        out.append((label, ev, sched.ranks, sched.microbatches, sim.bubble_fraction, sum(sim.idle), sim.makespan,
                    sum(sim.busy)))
    label, ev, p, m, want, idle, span, busy = out[2]
    shifted = [(r, s + 100, e + 100) for r, s, e in ev]   # a measured trace does not start at 0
    out.append((label + ", every time + 100 (as in a measured trace)", shifted, p, m, want, idle, span, busy))
    return out


def check_bubble_fraction(comm, fn):
    for label, events, p, m, want, idle, span, busy in bubble_cases():
        got = fn(list(events), p)
        if got is not None and math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12):
            continue
        msg = (f"bubble_fraction for {label} ({len(events)} events on p={p} ranks) = {got}, expected "
               f"{want} = idle / (p * makespan) = {idle} / ({p} * {span})")
        hints = {"idle / busy: divide by all the rank-time, p * makespan, not by the busy part": idle / busy,
                 "idle / makespan: the denominator needs p * makespan (every rank's time)": idle / span,
                 "busy / (p * makespan): that is the busy fraction, 1 - bubble": busy / (p * span),
                 f"the theory (p-1)/(m+p-1) = {p - 1}/{m + p - 1}, not the bubble of these events: measure the "
                 f"idle time from the events (with unequal costs, messages or split backwards the two "
                 f"differ)": Fraction(p - 1, m + p - 1)}
        for hint, value in hints.items():
            if got is not None and math.isclose(float(got), float(value), rel_tol=1e-9):
                msg += f"; you computed {hint}"
                break
        if got is not None and label.endswith("measured trace)"):
            msg += "; the makespan is last end - first start, not last end"
        return [msg]
    return []


# ---------------------------------------------------------------- 3.4: the send/recv pairing

def written_schedules(p):
    """The schedules on p ranks that the lab's tasks have the learner write: GPipe, and 1F1B with
    m < p and m > p."""
    return [gpipe(p, 3), one_f_one_b(p, 2), one_f_one_b(p, 5)]


def further_schedules(p):
    """What task 3.4 adds on p ranks: a split backward (ZB-H1) and v = 2 chunks per rank
    (interleaved 1F1B, where stage s lives on rank s % p)."""
    return [zero_bubble_h1(p, 3), interleaved_1f1b(p, p, 2)]


def pairing_schedules(p):
    """The schedules task 3.4 runs on p ranks: the learner's own kinds first."""
    return written_schedules(p) + further_schedules(p)


def pairing_table(most):
    """The schedules whose every action 3.4 checks, in this order: the kinds the learner wrote for
    p = 1 .. most, then the further ones for p = 1 .. most (the first failing case names a
    schedule of the lab's own tasks where one shows the mistake)."""
    return [s for kinds in (written_schedules, further_schedules) for p in range(1, most + 1) for s in kinds(p)]


def _side(value):
    return "nothing" if value is None else f"rank {value[0]} with tag {value[1]}"


def describe_pairing_error(action, schedule, got, want):
    s, kind, i = action
    r = schedule.stage_to_rank[s]
    m = schedule.microbatches
    head = (f"{schedule.name} p={schedule.ranks} m={m} v={schedule.chunks}, "
            f"rank {r}'s action {action}")
    what = {"F": "activation", "B": "gradient", "I": "gradient", "W": "nothing"}[kind]
    for side, g, w in (("receives", got[0], want[0]), ("sends", got[1], want[1])):
        if g == w:
            continue
        if w is None:
            why = {("receives", "F"): "stage 0 reads its micro-batch from the data",
                   ("sends", "F"): "the last stage computes the loss",
                   ("receives", "B"): "the last stage gets its gradient from the loss",
                   ("sends", "B"): "stage 0 has no previous stage",
                   }.get((side, kind if kind != "I" else "B"), "W needs no message")
            return f"{head} {side} {'from' if side == 'receives' else 'to'} {_side(g)}; expected nothing: {why}"
        if g is None or g[0] != w[0]:
            if kind == "F":
                src = s - 1 if side == "receives" else s + 1
            else:
                src = s + 1 if side == "receives" else s - 1
            way = ("comes from" if side == "receives" else "must go to")
            return (f"{head} {side} its {what} {'from' if side == 'receives' else 'to'} {_side(g)}; "
                    f"the {what} of {action} {way} stage {src}, which lives on rank {w[0]}")
        tag_fn = "act_tag" if kind == "F" else "grad_tag"
        into = (s if side == "receives" else s + 1) if kind == "F" else (s if side == "receives" else s - 1)
        return (f"{head} {side} with tag {g[1]}; expected {tag_fn}(stage={into}, microbatch={i}, m={m}) "
                f"= {w[1]} (the tag names the stage the message goes *into*)")
    return None


def _normal(value):
    if value is None:
        return None
    rank, tag = value
    return (int(rank), int(tag))


def check_pairing_table(fn, schedules):
    for sched in schedules:
        for ops in sched.actions:
            for a in ops:
                got = fn(a, sched)
                if not (isinstance(got, (tuple, list)) and len(got) == 2):
                    return [f"peer_and_tag({a}, {sched.name} p={sched.ranks}) returned {got!r}; "
                            f"expected (recv, send), each (rank, tag) or None"]
                got = (_normal(got[0]), _normal(got[1]))
                want = peer_and_tag(a, sched)
                if got != want:
                    return [describe_pairing_error(a, sched, got, want)]
    return []


def step_with_pairing(comm, sched, pairing, m_batch=3, width=8, layers=8):
    """One training step of ``sched`` on minipar's executor with ``pairing`` placing every
    message; (what :func:`graded` saw of the step, the loss broadcast to every rank, this rank's
    {stage: module}, the dense reference stages, the dense loss)."""
    S, m = sched.total_stages, sched.microbatches
    x, t = _data(comm, m, m_batch, width, seed=3)
    like = comm.asarray(np.zeros(1))  # the backend's kind: NumPy arrays, or torch tensors
    stages = build_stages(S, layers, width, np.random.default_rng([3, 0]))
    mine = {s: stages[s].to(like) for s in range(S) if sched.stage_to_rank[s] == comm.rank}
    xs = [comm.asarray(x[k * m_batch:(k + 1) * m_batch]) for k in range(m)]
    ts = [comm.asarray(t[k * m_batch:(k + 1) * m_batch]) for k in range(m)]
    run = graded(comm, lambda: run_schedule(comm, sched, mine, xs, ts, pairing=pairing))
    loss = comm.builtin.bcast_object(run.out["loss"], root=sched.stage_to_rank[S - 1])
    ref = build_stages(S, layers, width, np.random.default_rng([3, 0]))
    return run, loss, mine, ref, reference_step(ref, x, t)


def check_peer_and_tag(comm, fn):
    # 1. every action of the schedules for p = 1 .. 4 (whatever the number of ranks: it is pure)
    #    against minipar's convention; every rank computes the same verdict, rank 0 reports it
    fails = check_pairing_table(fn, pairing_table(max(*WORLD_SIZES, comm.size)))
    if fails:
        return fails if comm.rank == 0 else []
    # 2. one training step per schedule on these ranks, every message placed by fn
    out = []
    for sched in pairing_schedules(comm.size):
        g, loss, mine, ref, ref_loss = step_with_pairing(comm, sched, fn)
        label = f"a training step of {sched.name} p={sched.ranks} m={sched.microbatches} v={sched.chunks} with your pairing"
        out += no_builtin(comm, g, "peer_and_tag", "nothing: it only names peers and tags")
        err = rel_error(np.float64(loss if loss is not None else np.nan), np.float64(ref_loss))
        if not err <= TOLERANCE and comm.rank == 0:
            out.append(f"{label}: loss {loss}, expected {ref_loss} (dense model), relative error {err:.3g}")
        for s, mod in mine.items():
            want = dict(ref[s].named_grads())
            for name, grad in mod.named_grads():
                e = rel_error(grad, want[name])
                if not e <= TOLERANCE:
                    out.append(f"{label}: rank {comm.rank}, stage {s} gradient {name}: relative error "
                               f"{e:.3g} vs the dense model (tolerance {TOLERANCE:g})")
                    break
        if stop(comm, out):   # every rank stops at the same schedule
            break
    return out


# ---------------------------------------------------------------- the exercise's demo

INVALID = {ScheduleError: "not a valid schedule"}  # what attempt() reports for a broken schedule


def demo(comm, gpipe_fn, one_f_one_b_fn, bubble_fn, pairing_fn, step_fn=None, m=None):
    """What ``mpiexec -n P python -m mpi4py labs/03_pipeline/exercise.py`` (or the same file under
    ``torchrun --nproc-per-node P``) shows: on rank 0 the grid of the learner's GPipe and 1F1B
    for p = P ranks, each with its simulated bubble (through the learner's ``bubble_fraction``)
    against (p-1)/(m+p-1) and its peak in-flight activations; then, on every rank, one real
    training step of the learner's 1F1B (minipar's if theirs is missing or invalid) with every
    message placed by the learner's pairing; then (``step_fn``, task 3.5) one step of 1F1B run by
    the learner's own executor, its messages checked as task 3.5's grader checks them."""
    p = comm.size
    m = m or 2 * p
    run_sched = one_f_one_b(p, m)
    for name, fn, ref in (("gpipe", gpipe_fn, gpipe), ("1f1b", one_f_one_b_fn, one_f_one_b)):
        def build():
            sched, why = as_schedule(name, p, m, fn(p, m), ref(p, m))
            if why:
                raise ScheduleError(why)
            validate(sched)
            return sched
        sched, why = attempt(build, INVALID)
        if comm.rank != 0:
            if name == "1f1b" and sched is not None:
                run_sched = sched
            continue
        print(f"\n== your {name}, p={p}, m={m}: " + (why or "valid"), flush=True)
        if sched is None:
            continue
        if name == "1f1b":
            run_sched = sched
        print(format_grid(sched))
        sim = simulate(sched, {"F": 1, "B": 2})
        bubble, why = attempt(lambda: bubble_fn([(e.rank, e.start, e.end) for e in sim.events], p))
        theory = Fraction(p - 1, m + p - 1)
        print(f"simulated with F=1, B=2: makespan {sim.makespan}; your bubble_fraction: "
              f"{why or f'{float(bubble):.4f}'}; theory (p-1)/(m+p-1) = {theory} = {float(theory):.4f}")
        print(f"peak activations held per rank: {sim.peak_inflight}", flush=True)
    # one training step on these ranks with the learner's pairing
    step, why = attempt(lambda: step_with_pairing(comm, run_sched, pairing_fn))
    if comm.rank == 0:
        if why:
            print(f"\n== a training step with your peer_and_tag: {why}")
        else:
            _, loss, _, _, ref_loss = step
            whose = "" if "yours" in run_sched.name else " (minipar's: yours is missing or invalid)"
            print(f"\n== a training step of {run_sched.name}{whose} on {p} ranks with your peer_and_tag: "
                  f"loss {loss:.12f}, dense model {ref_loss:.12f}, relative error "
                  f"{rel_error(np.float64(loss), np.float64(ref_loss)):.2g}")
    if step_fn is not None:
        ran, why = attempt(lambda: executor_step(comm, step_fn, p, m))
        if comm.rank == p - 1:
            if why:
                print(f"\n== your pipeline_step: {why}")
            else:
                g, stage, _, _, _, _, ref_loss = ran
                held = len(stage.at_peak)
                print(f"\n== your pipeline_step, 1F1B p={p} m={m}: loss "
                      + (f"{g.out:.12f}" if isinstance(g.out, float) else repr(g.out))
                      + f", dense model {ref_loss:.12f}; the last stage held the activations of at most {held} "
                        f"micro-batch{'es' if held != 1 else ''} at once", flush=True)
    if comm.rank == 0:
        print("now grade it: minipar check 03", flush=True)
