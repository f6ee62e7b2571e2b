"""Lesson 4 on real ranks: DP, DDP and ZeRO against one process, against each other, and measured.

    from minipar import launch
    out = launch(4, "minipar.lessons.data_parallel:tour")                    # every check, MPI
    out = launch(3, "minipar.lessons.data_parallel:verify", backend="torch")  # same code, gloo
    out = launch(4, "minipar.lessons.data_parallel:memory")                  # bytes per rank per stage
    out = launch(4, "minipar.lessons.data_parallel:traffic")                 # bytes sent per rank per step
    out = launch(2, "minipar.lessons.data_parallel:against_torch", backend="torch")

Every check trains the same seeded model (odd layer sizes: no layer divides by 2, 3 or 4, so
padding is always exercised) on the same seeded batch for a few Adam steps.

Numerics: the references compute in float64. DP and DDP must match one process on the whole
batch to 1e-12 relative (max |got - want| / max |want|): only the order of the gradient sums
differs. Where the order is the same by construction the check is bitwise (tolerance 0): every
ZeRO stage against DDP with one bucket per layer (same ring, same chunks), DDP with overlap
against DDP without, offloaded against not, and the replicas against each other. Mixed
precision (float16 working copy, fp32 Adam) is checked bitwise against mixed-precision DDP, and
against one float64 process to MIXED_TOL = 2e-3: the weights are float16 (a rounding of 2^-11 =
4.9e-4 of each weight) and the float16 gradients move Adam's steps a little (measured: 3e-4 to
9e-4 on 1-4 ranks, MPI and gloo). A skipped Adam step moves every weight by about lr = 1e-2,
3e-2 of the largest weight here, so the check sees it.

Memory and traffic are counted, and compared with the formula with padding *exactly*: the
bytes of every array a rank holds (with the padding of each flat unit and the gathered layers),
and the bytes a rank sends per step, factor x (N-1) x the padded shard of each unit or bucket.
The paper's factor x (N-1)/N x Psi is shown beside it.
"""
from __future__ import annotations

import numpy as np

from ..data_parallel import DDP, DP, local_batch, train_dense
from ..memory import zero_bytes
from ..trace import SEND_KINDS, bytes_sent, merge
from ..xp import to_numpy
from ..zero import ZeRO
from .common import format_rows  # noqa: F401  (format_rows: re-exported)
from .common import merge_rows as summarize  # noqa: F401  (re-exported for notebooks and tests)
from .fixtures import make_data, make_model, max_error, row, stepper, traced, train, uniform_model

TOL = 1e-12
MIXED_TOL = 2e-3  # float16 weights vs float64 (see the module docstring)


# --------------------------------------------------------------------------- correctness


def verify(comm, steps=3, seed=0, lr=1e-2):
    """Every engine against one process and against each other; rows in the same order on every rank."""
    x, y = make_data(comm, seed + 1)
    model = lambda: make_model(seed).to(x)  # noqa: E731
    dense = model()
    train_dense(dense, x, y, steps, lr)
    ref = {n: to_numpy(p) for n, p in dense.named_parameters()}
    rows, got = [], {}

    dp_model = model()
    dp = DP(comm, dp_model, x.shape[0], x.shape[1:], lr=lr)
    for _ in range(steps):
        dp.train_step(x if comm.rank == 0 else None, y if comm.rank == 0 else None)
    if comm.rank == 0:
        got["DP"] = {n: to_numpy(p) for n, p in dp_model.named_parameters()}
    got["DP"] = comm.builtin.bcast_object(got.get("DP"), 0)  # rank 0's master model
    rows.append(row(f"DP (rank 0 scatters/gathers) == one process, {steps} Adam steps", max_error(got["DP"], ref), TOL))

    variants = {"DDP, one all-reduce": dict(), "DDP, 600-byte buckets (layers 2+4, 0)": dict(bucket_bytes=600),
                "DDP, buckets + overlap": dict(bucket_bytes=600, overlap=True),
                "DDP, a bucket per layer": dict(bucket_bytes=0),
                "DDP, a bucket per layer + overlap": dict(bucket_bytes=0, overlap=True)}
    for name, kw in variants.items():
        got[name] = train(DDP(comm, model(), lr=lr, **kw), x, y, steps)
        rows.append(row(f"{name} == one process", max_error(got[name], ref), TOL))
    base = got["DDP, a bucket per layer"]
    rows.append(row("DDP overlap == DDP blocking (bitwise)", max_error(got["DDP, a bucket per layer + overlap"], base), 0.0))
    for stage in (1, 2, 3):
        got[f"ZeRO-{stage}"] = train(ZeRO(comm, model(), stage, lr=lr), x, y, steps)
        rows.append(row(f"ZeRO-{stage} == DDP (bitwise, float64)", max_error(got[f"ZeRO-{stage}"], base), 0.0))
    rows.append(row("ZeRO-3 == one process", max_error(got["ZeRO-3"], ref), TOL))
    no_prefetch = train(ZeRO(comm, model(), 3, lr=lr, prefetch=False), x, y, steps)
    rows.append(row("ZeRO-3 without prefetch == with (bitwise)", max_error(no_prefetch, got["ZeRO-3"]), 0.0))

    mixed = {s: train(ZeRO(comm, model(), s, lr=lr, precision="fp16"), x, y, steps) for s in (0, 1, 2, 3)}
    for s in (1, 2, 3):
        rows.append(row(f"ZeRO-{s} == DDP (bitwise, mixed float16/fp32)", max_error(mixed[s], mixed[0]), 0.0))
    rows.append(row(f"mixed precision DDP == one process (float16 weights: {MIXED_TOL:.0e})", max_error(mixed[0], ref),
                    MIXED_TOL))
    off = train(ZeRO(comm, model(), 2, lr=lr, precision="fp16", offload=True), x, y, steps)
    rows.append(row("ZeRO-Offload == ZeRO-2 (bitwise, mixed)", max_error(off, mixed[2]), 0.0))

    everyone = comm.builtin.allgather_object({k: got[k] for k in ("DDP, buckets + overlap", "ZeRO-3")})
    diff = max(max_error(other[k], everyone[0][k], False) for other in everyone for k in other)
    rows.append(row("every replica holds the same parameters (bitwise)", diff, 0.0))
    return rows


# --------------------------------------------------------------------------- memory and traffic


def memory(comm, units=4, width=34, batch=8, mixed=True, steps=2, seed=0):
    """Per stage (0 = DDP): peak bytes held by this rank, the prediction with padding and gathered
    layers, and the paper's formula. One record per stage."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    out = []
    for stage in (0, 1, 2, 3):
        engine = ZeRO(comm, uniform_model(units, width, seed).to(x), stage, precision="fp16" if mixed else None)
        for _ in range(steps):
            engine.train_step(local_batch(comm, x), local_batch(comm, y))
        out.append({"stage": stage, "measured": engine.measured_memory(), "predicted": engine.predicted_memory(),
                    "paper": zero_bytes(engine.psi, comm.size, stage, *engine.bytes_per_param()),
                    "psi": engine.psi, "bytes_per_param": engine.bytes_per_param()})
    return out


TRAFFIC_FACTOR = {"DDP": 2, "DDP buckets+overlap": 2, "ZeRO-1": 2, "ZeRO-2": 2, "ZeRO-3": 3}


def padded_lengths(engine) -> list[int]:
    """The padded length of every flat buffer the engine communicates: ZeRO's units, DDP's buckets."""
    flats = engine.flats.values() if hasattr(engine, "flats") else [bucket[1] for bucket in engine.buckets]
    return [f.n_pad for f in flats]


def traffic(comm, units=4, width=34, batch=8, mixed=False, seed=0):
    """Bytes sent by this rank in one step, per engine: "sent" (from the trace), "predicted" (exact:
    factor x (N-1) ring steps x the padded shard n_pad/N of each buffer x bytes/param) and "paper"
    (factor x (N-1)/N x Psi x bytes/param, no padding)."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    precision = "fp16" if mixed else None
    make = {"DDP": lambda m: DDP(comm, m, precision=precision),
            "DDP buckets+overlap": lambda m: DDP(comm, m, bucket_bytes=2 * width * width, overlap=True, precision=precision),
            **{f"ZeRO-{s}": (lambda s: lambda m: ZeRO(comm, m, s, precision=precision))(s) for s in (1, 2, 3)}}
    out = []
    for name, fn in make.items():
        engine = fn(uniform_model(units, width, seed).to(x))
        events, _ = traced(comm, stepper(engine, x, y))
        sent = bytes_sent(events, comm.world_rank(comm.rank))
        b = engine.bytes_per_param()[0]
        n, f = comm.size, TRAFFIC_FACTOR[name]
        predicted = f * (n - 1) * sum(n_pad // n for n_pad in padded_lengths(engine)) * b
        out.append({"engine": name, "sent": sent, "predicted": predicted, "paper": f * (n - 1) / n * engine.psi * b,
                    "psi": engine.psi, "bytes_per_param": b})
    return out


def _rows_memory(records, tol=0.0):
    rows = []
    for r in records:
        err = max(abs(r["measured"][k] - r["predicted"][k]) / r["predicted"][k]
                  for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes"))
        rows.append(row(f"stage {r['stage']} memory per rank == formula (+padding, gathered layer)", err, tol))
    return rows


def _rows_traffic(records, tol=0.0):
    return [row(f"{r['engine']}: bytes sent per rank per step == {TRAFFIC_FACTOR[r['engine']]}(N-1)/N Psi_padded (exact)",
                abs(r["sent"] - r["predicted"]) / r["predicted"] if r["predicted"] else float(r["sent"]), tol)
            for r in records]


# --------------------------------------------------------------------------- DP vs DDP, overlap


def load(comm, events):
    """Per rank: bytes sent, bytes received (sends addressed to it), compute seconds."""
    out = {}
    for r in range(comm.size):
        w = comm.world_rank(r)
        out[r] = {"sent": bytes_sent(events, w),
                  "received": sum(e.bytes for e in events if e.kind in SEND_KINDS and e.peer == w),
                  "compute": sum(e.duration for e in events if e.rank == w and e.kind == "compute" and e.name != "step")}
    return out


def dp_vs_ddp(comm, units=4, width=256, batch=256, steps=5, seed=0):
    """Traced steps of DP and of DDP: every rank's load (rank 0's against the others'), bytes
    from the last step, compute seconds and step time as medians over ``steps``."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    root = comm.rank == 0
    out = {}
    for name in ("DP", "DDP"):
        model = uniform_model(units, width, seed).to(x)
        if name == "DP":
            dp = DP(comm, model, batch, (width,))
            step = lambda: dp.train_step(x if root else None, y if root else None)  # noqa: E731
        else:
            step = stepper(DDP(comm, model), x, y)
        loads, times = [], []
        for _ in range(steps):
            _, dt = traced(comm, step)
            loads.append(load(comm, merge(comm)))
            times.append(max(comm.builtin.allgather_object(dt)))
        for r, ld in loads[-1].items():
            ld["compute"] = float(np.median([lds[r]["compute"] for lds in loads]))
        out[name] = {"load": loads[-1], "step_time": float(np.median(times)), "psi": model.num_params()}
    return out


def exposed_comm(events):
    """Seconds between the end of the last backward and the start of the update: the gradient
    communication that the backward did not hide."""
    bw_end = max(e.t_end for e in events if e.kind == "compute" and e.name.startswith("backward"))
    return min(e.t_start for e in events if e.name == "update") - bw_end


def overlap(comm, units=8, width=192, batch=1024, bucket_bytes=None, steps=9, seed=0):
    """DDP with and without overlap, steps alternating so both see the same machine load: the
    median over steps of the step time and of the exposed communication (max over ranks), and
    rank 0's merged trace of each one's median step, for the timeline."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    bucket_bytes = 2 * 8 * (width + 1) * width if bucket_bytes is None else bucket_bytes  # two float64 layers
    steppers = {ov: stepper(DDP(comm, uniform_model(units, width, seed).to(x), bucket_bytes=bucket_bytes,
                                overlap=ov), x, y) for ov in (False, True)}
    runs = {False: [], True: []}  # (step time, exposed, this rank's events)
    for _ in range(steps):
        for ov, step in steppers.items():
            events, dt = traced(comm, step)
            runs[ov].append((max(comm.builtin.allgather_object(dt)),
                             max(comm.builtin.allgather_object(exposed_comm(events))), events))
    out = {}
    for ov, rs in runs.items():
        times = [t for t, _, _ in rs]
        median = int(np.argsort(times)[len(times) // 2])
        events = merge(comm, rs[median][2])
        out[ov] = {"step_time": float(np.median(times)), "exposed": float(np.median([e for _, e, _ in rs])),
                   "events": events if comm.rank == 0 else None}
    out["saved"] = out[False]["step_time"] - out[True]["step_time"]
    out["exposed_saved"] = out[False]["exposed"] - out[True]["exposed"]
    return out


# --------------------------------------------------------------------------- against PyTorch, tour, CLI


def against_torch(comm, steps=3, seed=0, lr=1e-2):
    """minipar ZeRO-1 vs ZeroRedundancyOptimizer, minipar ZeRO-3 vs FSDP2 (torch backend, float64)."""
    from ..zero import torch_reference as ref

    x, y = make_data(comm, seed + 1)
    rows = []
    z1 = train(ZeRO(comm, make_model(seed).to(x), 1, lr=lr), x, y, steps)
    t1 = ref.train_zero_redundancy(comm, make_model(seed), local_batch(comm, x), local_batch(comm, y), steps, lr)
    rows.append(row("ZeRO-1 == torch ZeroRedundancyOptimizer (+DDP)", max_error(z1, t1), TOL))
    z3 = train(ZeRO(comm, make_model(seed).to(x), 3, lr=lr), x, y, steps)
    t3, reduction = ref.train_fsdp2(comm, make_model(seed), local_batch(comm, x), local_batch(comm, y), steps, lr)
    rows.append(row(f"ZeRO-3 == torch FSDP2 fully_shard (gloo reduce-scatter: {reduction})", max_error(z3, t3), TOL))
    return rows


def tour(comm, seed=0, offload_dir=None):
    """Correctness, memory and traffic checks on this world size; then ZeRO-Infinity's two
    techniques (``zero_infinity``): NVMe offload (its files in ``offload_dir``) and tiling."""
    from . import zero_infinity

    return (verify(comm, seed=seed) + _rows_memory(memory(comm, seed=seed)) + _rows_traffic(traffic(comm, seed=seed))
            + zero_infinity.offload(comm, seed=seed, path=offload_dir) + zero_infinity.tiling(comm, seed=seed))
