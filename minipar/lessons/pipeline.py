"""Pipeline parallelism on real ranks: every schedule executed against the dense model.

    from minipar import launch
    out = launch(4, "minipar.lessons.pipeline:check_schedules", m=4)
    out = launch(4, "minipar.lessons.pipeline:measure", schedule="1f1b", m=8)
    out = launch(4, "minipar.lessons.pipeline:profile", schedule="1f1b", m=8)   # vs simulate(measured costs)
    out = launch(4, "minipar.lessons.pipeline_async:check_async")            # flush vs PipeDream

Numerics (float64): the pipeline computes the same sums as the dense model but per
micro-batch, so only the summation order of the batch reductions differs (m partial sums
instead of one): relative error <= 1e-12 for the loss and every gradient.
"""
from __future__ import annotations

import numpy as np

from ..pipeline import make_schedule, simulate, theory_bubble_fraction
from ..pipeline.execute import (build_stages, measured_bubble, measured_costs, measured_durations,
                                dense_step, run_schedule)
from ..trace import merge
from .common import rel_error
from .pipeline_async import check_async

TOLERANCE = 1e-12
KINDS = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


def fitting_schedules(p: int, m: int, v: int = 2, kinds=KINDS):
    """The schedules of ``kinds`` that exist for (p, m): naive always (with m=1), interleaved
    when m % p == 0."""
    out = []
    for kind in kinds:
        if kind == "interleaved" and m % p:
            continue
        out.append(make_schedule(kind, p, m, v))
    return out


def _data(comm, m, b, width, seed):
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((m * b, width))
    t = rng.standard_normal((m * b, width))
    return x, t


def run_one(comm, schedule, layers=8, width=16, b=3, seed=0, scale=None):
    """Execute ``schedule`` once on fresh seeded weights and data; returns
    (result of run_schedule, my stages {id: module}, reference stages, reference loss)."""
    S, m = schedule.total_stages, schedule.microbatches
    x, t = _data(comm, m, b, width, seed)
    like = comm.asarray(np.zeros(1))
    stages = build_stages(S, layers, width, np.random.default_rng([seed, 0]))
    mine = {s: stages[s].to(like) for s in range(S) if schedule.stage_to_rank[s] == comm.rank}
    xs = [comm.asarray(x[i * b:(i + 1) * b]) for i in range(m)]
    ts = [comm.asarray(t[i * b:(i + 1) * b]) for i in range(m)]
    out = run_schedule(comm, schedule, mine, xs, ts, scale=scale)
    ref = build_stages(S, layers, width, np.random.default_rng([seed, 0]))   # NumPy, float64
    ref_loss = dense_step(ref, x, t)
    return out, mine, ref, ref_loss


def check_schedules(comm, m=4, v=2, layers=8, width=16, b=3, seed=0, kinds=KINDS, scale=None):
    """Every schedule of ``kinds`` that fits (comm.size, m) against the dense reference
    (``m`` may be a tuple: every schedule for each micro-batch count).

    Rows (the same list, in the same order, on every rank): for each schedule, its loss
    (computed on the last stage's rank, broadcast for the check) and the worst gradient error
    over the stages this rank owns. ``scale`` is passed to run_schedule (None: 1/m; anything
    else plants a bug the check must catch).
    """
    rows = []
    ms = (m,) if isinstance(m, int) else tuple(m)
    scheds = [sc for mm in ms for sc in fitting_schedules(comm.size, mm, v, kinds)
              if not (sc.name == "naive" and mm != ms[0])]          # naive (m=1) once
    for sched in scheds:
        out, mine, ref, ref_loss = run_one(comm, sched, layers, width, b, seed, scale)
        last = sched.stage_to_rank[sched.total_stages - 1]
        loss = comm.builtin.bcast_object(out["loss"], root=last)
        label = f"{sched.name} p={sched.ranks} m={sched.microbatches} v={sched.chunks}"
        err = rel_error(np.float64(loss), np.float64(ref_loss))
        rows.append({"what": f"{label}: loss vs dense", "error": err, "tolerance": TOLERANCE,
                     "ok": bool(err <= TOLERANCE)})
        gerr = 0.0
        for s, mod in mine.items():
            want = dict(ref[s].named_grads())
            for name, g in mod.named_grads():
                gerr = max(gerr, rel_error(g, want[name]))
        rows.append({"what": f"{label}: every gradient of my stages vs dense", "error": gerr,
                     "tolerance": TOLERANCE, "ok": bool(gerr <= TOLERANCE)})
    return rows


def tour(comm, **kw):
    """The tour's rows: every fitting schedule with m=4 on a small model, then synchronous
    (flush) and asynchronous (PipeDream) training against their references, counted memory
    included (:func:`~minipar.lessons.pipeline_async.check_async`)."""
    return check_schedules(comm, m=kw.pop("m", 4), **kw) + check_async(comm)


def traced_runs(comm, sched, layers, width, b, seed, repeats):
    """Run one step ``repeats`` times with tracing on (the earlier runs warm up); returns the
    last run's ``run_one`` result and its merged trace."""
    was = comm.tracer.enabled
    comm.tracer.enabled = True
    try:
        for _ in range(repeats):
            comm.builtin.barrier()
            comm.tracer.clear()
            last = run_one(comm, sched, layers, width, b, seed)
        return last, merge(comm)
    finally:
        comm.tracer.enabled = was


def measure(comm, schedule="1f1b", m=8, v=2, layers=8, width=128, b=64, seed=0, repeats=2):
    """Measured bubble (from the merged trace's compute events) vs simulated (F=1, B=2).

    Runs the step ``repeats`` times (the first warms up) with tracing on, keeps the last.
    Returns {"schedule", "p", "m", "v", "measured", "simulated"} on every rank.
    With small stages, message latency and shared cores dominate and the measured bubble sits
    well above the simulated one (2 ranks, m=8, 1f1b: ~0.45 at width=128, ~0.21 at width=384,
    b=256, against 0.11): pass bigger ``width`` / ``b`` to get closer.
    """
    sched = make_schedule(schedule, comm.size, m, v)
    _, events = traced_runs(comm, sched, layers, width, b, seed, repeats)
    sim = simulate(sched, {"F": 1, "B": 2})
    return {"schedule": sched.name, "p": sched.ranks, "m": sched.microbatches, "v": sched.chunks,
            "measured": measured_bubble(events, sched.ranks), "simulated": float(sim.bubble_fraction)}


def profile(comm, schedule="1f1b", m=8, v=2, layers=None, width=256, b=64, seed=0, repeats=3,
            events=False):
    """One schedule on real ranks, measured, then replayed by :func:`simulate` with the costs
    measured in the same run (:func:`~minipar.pipeline.execute.measured_costs`).

    Runs the step ``repeats`` times (traced; the earlier ones warm up), keeps the last.
    ``layers`` defaults to 2 per stage. Returns on every rank {"schedule", "stages",
    "microbatches", "chunks", "measured_bubble_fraction", "simulated_bubble_fraction" (mean
    cost per action kind), "replayed_bubble_fraction" (every action's own measured duration),
    "theory_bubble_fraction", "max_grad_error" (relative, vs the dense float64 model, max over
    ranks), "costs" (seconds), "events" (the merged trace, on rank 0 with events=True)}.
    """
    sched = make_schedule(schedule, comm.size, m, v)
    layers = layers or 2 * sched.total_stages
    (out, mine, ref, _), evs = traced_runs(comm, sched, layers, width, b, seed, repeats)
    gerr = max([rel_error(g, dict(ref[s].named_grads())[n]) for s, mod in mine.items()
                for n, g in mod.named_grads()], default=0.0)
    gerr = max(comm.builtin.allgather_object(gerr))
    costs = measured_costs(evs, sched)
    sim = simulate(sched, costs)
    replay = simulate(sched, costs, durations=measured_durations(evs))
    return {"schedule": sched.name, "stages": sched.ranks, "microbatches": sched.microbatches,
            "chunks": sched.chunks, "measured_bubble_fraction": measured_bubble(evs, sched.ranks),
            "simulated_bubble_fraction": float(sim.bubble_fraction),
            "replayed_bubble_fraction": float(replay.bubble_fraction),
            "theory_bubble_fraction": float(theory_bubble_fraction(sched.name, sched.ranks, sched.microbatches, sched.chunks)),
            "max_grad_error": gerr,
            "costs": {k: float(getattr(costs, k)) for k in ("F", "B", "I", "W", "p2p")},
            "events": evs if events and comm.rank == 0 else None}
