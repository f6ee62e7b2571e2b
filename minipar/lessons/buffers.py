"""Buffers on real ranks: each one named, its bytes per rank counted against its formula, and
what double buffering hides, traced.

    from minipar import launch
    out = launch(4, "minipar.lessons.buffers:check")          # every count below, as check rows
    python -m minipar.lessons.buffers --json buffers.json     # the checks and ZeRO-3's prefetch, traced
    python -m minipar.bench.buffers                           # what reusing one buffer saves, measured

A buffer holds partial results while ranks communicate. Each is named where it is allocated
(``minipar.trace.buffer``) and counted per rank (``comm.tracer.buffers``), and the checks
compare the count with the formula, to the byte:

    kind                 lesson  holds                                        peak bytes per rank
    ring.recv            01      the chunk arriving in a reduce-scatter step  the largest chunk, once per ring
    tree/naive/... .recv 01      a whole vector from a child or partner       the whole vector
    ddp.bucket grads     04      a flat, padded gradient bucket               sum of n_pad x b, once
    zero.flat params     04      a unit's weights, padded to a multiple of N  n_pad x b; padding (-n) mod N
    zero3.gathered       04      a unit's gathered weights                    2 adjacent units with prefetch, else 1
    pipeline.recv act    03      activations received, kept for the backward  the in-flight count x A
    pipeline.send        03      what an isend still owns                     <= buffers_in_flight x A

Every check also counts allocations, so a buffer reallocated every step shows up even when its
peak does not change. Counts are exact integers: each row's tolerance is 0.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .. import collectives as C
from .. import nn
from ..data_parallel import DDP, local_batch
from ..pipeline import make_schedule
from ..pipeline.execute import buffers_in_flight, peer_and_tag
from ..records import write_json
from ..trace import merge
from ..xp import chunk_bounds, itemsize
from ..zero import ZeRO1, ZeRO2, ZeRO3
from .collectives import draw
from .fixtures import DIMS, make_data, make_model, row, stepper, traced, uniform_model
from .pipeline import run_one


@contextmanager
def counted(comm):
    """Count this rank's named buffers inside the block, from zero; yields ``comm.tracer.buffers``."""
    bufs = comm.tracer.buffers
    was, bufs.enabled = bufs.enabled, True
    bufs.reset()
    try:
        yield bufs
    finally:
        bufs.enabled = was


def count_row(what, got, want, at_most=False):
    """A check row for exact counts: error = largest |got - want| / max(want, 1) over the pairs
    (with ``at_most``: only what exceeds want counts). Tolerance 0."""
    errs = [(max(g - w, 0) if at_most else abs(g - w)) / max(w, 1) for g, w in zip(got, want)]
    return row(what, max(errs, default=0.0), 0.0)


def peak(report, kind):
    return report.get(kind, {}).get("peak_bytes", 0)


def allocs(report, kind):
    return report.get(kind, {}).get("allocations", 0)


# --------------------------------------------------------------------------- lesson 01: the ring


def ring_all_reduce(comm, x):
    return C.all_reduce(comm, x, "ring")


def recv_formula(algorithm, n, p, rank, itemsize):
    """(peak bytes, allocations) of one all-reduce's receive buffer: the ring's is the largest
    chunk; the others receive whole vectors (naive: on rank 0 only)."""
    if algorithm == "ring":
        return max(b - a for a, b in chunk_bounds(n, p)) * itemsize, 1
    if algorithm == "naive" and rank != 0:
        return 0, 0
    return n * itemsize, 1


def ring_buffers(comm, lengths=(1, 7, 1000), dtype="float64", ring=ring_all_reduce):
    """The receive buffer of one all-reduce, per algorithm and length, counted: check rows, and
    a table {algorithm, n, bytes, formula} for the notebook. ``ring(comm, x)`` stands in for
    the ring all-reduce (a planted bug, or a solution that skips the ring, is refused)."""
    rows, table = [], []
    for alg in C.ALGORITHMS:
        got, want = [], []
        for n in lengths:
            x = draw(comm, n, dtype)
            with counted(comm) as bufs:
                ring(comm, x) if alg == "ring" else C.all_reduce(comm, x, alg)
                rep = bufs.report()
            f = recv_formula(alg, n, comm.size, comm.rank, itemsize(x))
            got += [peak(rep, f"{alg}.recv"), allocs(rep, f"{alg}.recv")]
            want += list(f)
            table.append({"algorithm": alg, "n": n, "bytes": got[-2], "formula": f[0]})
        what = ("the largest chunk, allocated once, reused every step" if alg == "ring"
                else "the whole vector" + (" (rank 0)" if alg == "naive" else ""))
        rows.append(count_row(f"{alg} all-reduce: receive buffer per rank == {what}", got, want))
    return {"rows": rows, "table": table}


# --------------------------------------------------------------------------- lesson 04: DDP and ZeRO


def ddp_buffers(comm, steps=3, bucket_bytes=600, engine=DDP, seed=0):
    """DDP's flat buckets over ``steps`` steps: each bucket's params and grads allocated once
    (n_pad x b bytes), one ring receive buffer per bucket per step (n_pad/N x b)."""
    x, y = make_data(comm, seed + 1)
    with counted(comm) as bufs:
        ddp = engine(comm, make_model(seed).to(x), bucket_bytes=bucket_bytes)
        for _ in range(steps):
            ddp.train_step(local_batch(comm, x), local_batch(comm, y))
        rep = bufs.report()
    e, pads = ddp.b_work, [bucket[1].n_pad for bucket in ddp.buckets]
    rows = [count_row(f"DDP ({len(pads)} buckets): {k} bytes per rank == padded bucket bytes, "
                      f"allocated once in {steps} steps", [peak(rep, k), allocs(rep, k)], [sum(pads) * e, len(pads)])
            for k in ("ddp.bucket grads", "ddp.bucket params")]
    rows.append(count_row("DDP: one ring receive buffer per bucket per step == n_pad/N",
                          [peak(rep, "ring.recv"), allocs(rep, "ring.recv")],
                          [max(pads) // comm.size * e, len(pads) * steps]))
    return {"rows": rows, "report": rep, "buckets": pads, "bytes_per_param": e}


def unit_params(engine, u) -> int:
    """Parameters of unit ``u``, counted from the model's own arrays (not from its flat layout)."""
    return sum(int(np.prod(p.shape)) for _, p in engine.model.children()[u].named_parameters())


def linear_model(seed=0, dims=DIMS):
    """Linear layers back to back (units of 42, 48 and 21 weights, padded to 44, 48, 24 on 4
    ranks), no activation between them: a unit's gathered weights that outlive its compute then
    meet the next unit's gather (an activation layer between them would hide that)."""
    rng = np.random.default_rng(seed)
    model = nn.Sequential(*[nn.Linear(a, b, rng) for a, b in zip(dims, dims[1:])])
    for _, p in model.named_parameters():
        p[...] = rng.standard_normal(p.shape) / np.sqrt(dims[0])
    return model


def zero_buffers(comm, steps=2, seed=0, zero1=ZeRO1, zero2=ZeRO2, zero3=ZeRO3):
    """ZeRO's flat buffers over ``steps`` steps: the padding of every unit (ZeRO-1), the full
    gradient of one unit at a time (ZeRO-2), the gathered units (ZeRO-3, with and without
    prefetch: double buffering holds two adjacent units)."""
    x, y = make_data(comm, seed + 1)
    N, rows, out = comm.size, [], {}

    def run(cls, **kw):
        with counted(comm) as bufs:
            engine = cls(comm, linear_model(seed).to(x), **kw)
            for _ in range(steps):
                engine.train_step(local_batch(comm, x), local_batch(comm, y))
            return engine, bufs.report(), bufs.labels("zero.flat params")

    z1, rep, flats = run(zero1)
    e = z1.b_work
    got = [flats.get(u, 0) // e - unit_params(z1, u) for u in z1.units]
    want = [-unit_params(z1, u) % N for u in z1.units]
    out["padding"] = dict(zip(z1.units, got))
    out["params"] = {u: unit_params(z1, u) for u in z1.units}
    rows.append(count_row(f"ZeRO-1: padding of each unit's flat buffer == (-n) mod N = {want}", got, want))
    rows.append(count_row("ZeRO-1: flat params + grads allocated once per unit",
                          [allocs(rep, "zero.flat params"), allocs(rep, "zero.flat grads")], [len(z1.units)] * 2))
    z2, rep, _ = run(zero2)
    pads = [z2.flats[u].n_pad for u in z2.units]
    rows.append(count_row("ZeRO-2: one unit's full gradient at a time == max n_pad, new every backward",
                          [peak(rep, "zero.unit grad"), allocs(rep, "zero.unit grad")],
                          [max(pads) * e, len(pads) * steps]))
    for prefetch in (False, True):
        z3, rep, _ = run(zero3, prefetch=prefetch)
        pairs = [a + b for a, b in zip(pads, pads[1:])] if prefetch and len(pads) > 1 else pads
        out[f"gathered prefetch={prefetch}"] = peak(rep, "zero3.gathered")
        rows.append(count_row(f"ZeRO-3 {'with' if prefetch else 'without'} prefetch: gathered weights per rank == "
                              f"{'two adjacent units' if prefetch else 'one unit'}, gathered twice a step",
                              [peak(rep, "zero3.gathered"), allocs(rep, "zero3.gathered")],
                              [max(pairs) * e, 2 * len(pads) * steps]))
    out.update(rows=rows, units=dict(zip(z2.units, pads)), bytes_per_param=e)
    return out


# --------------------------------------------------------------------------- lesson 03: the pipeline


PIPELINE_KINDS = ("pipeline.recv act", "pipeline.recv grad", "pipeline.send")


def pipeline_buffers(comm, schedules=("gpipe", "1f1b", "zb-h1"), m=8, width=16, b=4, seed=0):
    """One step of each schedule on real ranks: the activations and gradients received and the
    send buffers this rank holds at once, against :func:`buffers_in_flight` x A (A = b x width x
    8 bytes, one micro-batch's activation); all of them freed by the end of the step."""
    rows, table = [], []
    A = b * width * 8
    for name in schedules:
        s = make_schedule(name, comm.size, m)
        with counted(comm) as bufs:
            run_one(comm, s, layers=2 * s.total_stages, width=width, b=b, seed=seed)
            rep = bufs.report()
        want = buffers_in_flight(s, comm.rank)
        peers = [(a, *peer_and_tag(a, s)) for a in s.actions[comm.rank]]  # (action, recv from, send to)
        n_recv = {"pipeline.recv act": sum(1 for a, src, _ in peers if src and a.kind == "F"),
                  "pipeline.recv grad": sum(1 for a, src, _ in peers if src and a.kind != "F")}
        n_send = sum(1 for _, _, dst in peers if dst)
        for k in PIPELINE_KINDS:
            table.append({"schedule": name, "rank": comm.rank, "kind": k, "bytes": peak(rep, k), "formula": want[k] * A})
        rows.append(count_row(f"{name}: activations and gradients received, held at once == in flight x A",
                              [peak(rep, k) for k in PIPELINE_KINDS[:2]] + [allocs(rep, k) for k in PIPELINE_KINDS[:2]],
                              [want[k] * A for k in PIPELINE_KINDS[:2]] + [n_recv[k] for k in PIPELINE_KINDS[:2]]))
        rows.append(count_row(f"{name}: send buffers held at once <= what the schedule lets a rank know was received",
                              [peak(rep, "pipeline.send")], [want["pipeline.send"] * A], at_most=True))
        rows.append(count_row(f"{name}: one send buffer per message, none left after the step",
                              [allocs(rep, "pipeline.send")] + [rep.get(k, {}).get("alive_bytes", 0) for k in PIPELINE_KINDS],
                              [n_send, 0, 0, 0]))
    return {"rows": rows, "table": table, "A": A}


def check(comm):
    """Every buffer count of lessons 01, 03 and 04 against its formula, as check rows."""
    return (ring_buffers(comm)["rows"] + pipeline_buffers(comm)["rows"] + ddp_buffers(comm)["rows"]
            + zero_buffers(comm)["rows"])


def per_rank(comm, n=1000, schedule="1f1b"):
    """This rank's peak bytes per kind of buffer, counted and by formula ({kind: [counted,
    formula]}), one run of each lesson's example (the figure's bars), and the check rows."""
    ring, pipe = ring_buffers(comm, lengths=(n,)), pipeline_buffers(comm, schedules=(schedule,))
    ddp, zero = ddp_buffers(comm), zero_buffers(comm)
    e = ddp["bytes_per_param"]
    units = list(zero["units"].values())
    out = {"ring.recv": [next(t["bytes"] for t in ring["table"] if t["algorithm"] == "ring"),
                         next(t["formula"] for t in ring["table"] if t["algorithm"] == "ring")],
           "ddp.bucket grads": [peak(ddp["report"], "ddp.bucket grads"), sum(ddp["buckets"]) * e],
           "zero.flat padding": [sum(zero["padding"].values()) * e, sum(-n % comm.size for n in zero["params"].values()) * e],
           "zero3.gathered (prefetch)": [zero["gathered prefetch=True"], max(a + b for a, b in zip(units, units[1:])) * e],
           "zero3.gathered (none)": [zero["gathered prefetch=False"], max(units) * e]}
    for t in pipe["table"]:
        out[f"{t['kind']} ({schedule}{', bound' if t['kind'] == 'pipeline.send' else ''})"] = [t["bytes"], t["formula"]]
    rows = ring["rows"] + pipe["rows"] + ddp["rows"] + zero["rows"]
    return {"rank": comm.rank, "bytes": out, "rows": rows, "n": n, "schedule": schedule}


# --------------------------------------------------------------------------- ZeRO-3 prefetch, traced


def _union(spans):
    """Disjoint, sorted intervals covering ``spans``."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlapping(events, rank, gather="all_gather:ring"):
    """(gathers of ``rank`` that overlap a layer's compute, seconds during which a gather is in
    flight while a layer computes: what double buffering hides). Gathers in flight together
    count once."""
    comp = _union((e.t_start, e.t_end) for e in events if e.rank == rank and e.kind == "compute" and e.name != "step")
    gathers = [e for e in events if e.rank == rank and e.kind == "collective" and e.name == gather]
    n = sum(any(a < g.t_end and b > g.t_start for a, b in comp) for g in gathers)
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in _union((g.t_start, g.t_end) for g in gathers)
                 for c, d in comp)
    return n, hidden


def prefetch_timeline(comm, units=6, width=192, batch=512, steps=7, seed=0, zero3=ZeRO3):
    """ZeRO-3 with and without prefetch, traced steps alternating: per setting the median step
    time, the median gather time hidden under a layer's compute (min over ranks), how many gathers overlap a
    layer's compute, and the merged trace of its median step (rank 0) for the timeline.
    ``zero3(comm, model, prefetch=)`` stands in for the engine (a planted bug is refused)."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    engines = {pf: zero3(comm, uniform_model(units, width, seed).to(x), prefetch=pf) for pf in (False, True)}
    steppers = {pf: stepper(engine, x, y) for pf, engine in engines.items()}
    runs = {False: [], True: []}
    me = comm.world_rank(comm.rank)
    for _ in range(steps):
        for pf, step in steppers.items():
            events, dt = traced(comm, step)
            n, hidden = overlapping(events, me)
            runs[pf].append((max(comm.builtin.allgather_object(dt)), min(comm.builtin.allgather_object(hidden)),
                             min(comm.builtin.allgather_object(n)), events))
    out = {"units": units, "width": width, "batch": batch, "unit_names": list(engines[True].units)}
    for pf, rs in runs.items():
        times = [t for t, *_ in rs]
        median = int(np.argsort(times)[len(times) // 2])
        events = merge(comm, rs[median][3])
        out[pf] = {"step_time": float(np.median(times)), "hidden": float(np.median([h for _, h, _, _ in rs])),
                   "overlapping": min(n for *_, n, _ in rs), "events": events if comm.rank == 0 else None}
    return out


def prefetch_rows(res):
    """Check rows from :func:`prefetch_timeline`: with prefetch, every gather but the first of the
    forward and of the backward overlaps a layer's compute, 2(units - 1); without, none."""
    u = res["units"]
    return [count_row(f"ZeRO-3 without prefetch: no gather overlaps compute (trace, {u} units)",
                      [res[False]["overlapping"]], [0]),
            count_row(f"ZeRO-3 with prefetch: 2(units-1) = {2 * (u - 1)} gathers overlap a layer's compute (trace)",
                      [res[True]["overlapping"]], [2 * (u - 1)])]


def main(argv=None) -> int:
    """``python -m minipar.lessons.buffers [--json FILE]``: the checks and the prefetch timeline's
    numbers, on 4 ranks (MPI)."""
    import argparse

    from ..launcher import launch
    from .common import format_rows, merge_rows

    p = argparse.ArgumentParser(prog="python -m minipar.lessons.buffers", description=main.__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--json", metavar="FILE", help="write every number as JSON")
    args = p.parse_args(argv)
    rows = merge_rows(launch(args.n, "minipar.lessons.buffers:check", quiet=True).results)
    print(format_rows(rows))
    pf = launch(args.n, "minipar.lessons.buffers:prefetch_timeline", quiet=True).results[0]
    print(f"\nZeRO-3, {pf['units']} layers of {pf['width']}x{pf['width']}, batch {pf['batch']}, {args.n} ranks:")
    for k in (False, True):
        print(f"  prefetch={k!s:<5}  step {pf[k]['step_time'] * 1e3:7.2f} ms   gather hidden under compute "
              f"{pf[k]['hidden'] * 1e3:7.2f} ms   gathers overlapping compute {pf[k]['overlapping']}")
    print(format_rows(prefetch_rows(pf)))
    if args.json:
        write_json(args.json, {"rows": rows,
                               "prefetch": {str(k): {kk: vv for kk, vv in v.items() if kk != "events"}
                                            if isinstance(v, dict) else v for k, v in pf.items()}})
    return 0 if all(r["ok"] for r in rows + prefetch_rows(pf)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
