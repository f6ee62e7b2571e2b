"""Pipeline parallelism on real ranks: every schedule executed against the dense model.

    from minipar import launch
    out = launch(4, "minipar.lessons.pipeline:check_schedules", m=4)
    out = launch(4, "minipar.lessons.pipeline:measure", schedule="1f1b", m=8)

Numerics (float64): the pipeline computes the same sums as the dense model but per
micro-batch, so only the summation order of the batch reductions differs (m partial sums
instead of one): relative error <= 1e-12 for the loss and every gradient.
"""
from __future__ import annotations

import numpy as np

from ..pipeline import make_schedule, simulate
from ..pipeline.execute import build_stages, measured_bubble, reference_step, run_schedule
from ..trace import merge
from ..xp import to_numpy

TOLERANCE = 1e-12
KINDS = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


def rel_error(got, want) -> float:
    got, want = np.asarray(to_numpy(got), np.float64), np.asarray(to_numpy(want), np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


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
    ref_loss = reference_step(ref, x, t)
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
        label = f"{sched.name} p={sched.stages} m={sched.microbatches} v={sched.chunks}"
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
    """The tour's rows: every fitting schedule with m=4 on a small model."""
    return check_schedules(comm, m=kw.pop("m", 4), **kw)


def measure(comm, schedule="1f1b", m=8, v=2, layers=8, width=128, b=64, seed=0, repeats=2):
    """Measured bubble (from the merged trace's compute events) vs simulated (F=1, B=2).

    Runs the step ``repeats`` times (the first warms up) with tracing on, keeps the last.
    Returns {"schedule", "p", "m", "v", "measured", "simulated"} on every rank.
    With small stages, message latency and shared cores dominate and the measured bubble sits
    well above the simulated one (2 ranks, m=8, 1f1b: ~0.45 at width=128, ~0.21 at width=384,
    b=256, against 0.11): pass bigger ``width`` / ``b`` to get closer.
    """
    sched = make_schedule(schedule, comm.size, m, v)
    was = comm.tracer.enabled
    comm.tracer.enabled = True
    try:
        for _ in range(repeats):
            comm.builtin.barrier()
            comm.tracer.clear()
            run_one(comm, sched, layers, width, b, seed)
        events = merge(comm)
    finally:
        comm.tracer.enabled = was
    sim = simulate(sched, {"F": 1, "B": 2})
    return {"schedule": sched.name, "p": sched.stages, "m": sched.microbatches, "v": sched.chunks,
            "measured": measured_bubble(events, sched.stages), "simulated": float(sim.bubble_fraction)}
