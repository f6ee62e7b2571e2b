"""Benchmark: every from-scratch all-reduce against the engine's own, in one run.

    mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json bench.json
    minipar bench collectives -n 4            # the same, launching mpiexec for you

For each size (8 B ... 64 MiB of float32) and each algorithm (and ``builtin`` =
MPI_Allreduce / dist.all_reduce) it measures the time of one all-reduce (mean over a batch of
repetitions, slowest rank), the algbw and busbw (nccl-tests definitions), and the alpha-beta
prediction from a ping-pong fit. Ratios ours/builtin are taken in the same run, so machine
noise hits both sides alike. ``minipar.figures.collectives.plot_busbw`` draws a run's result.
"""
from __future__ import annotations

import time

import numpy as np

from .. import collectives as C
from .. import costmodel as M

DEFAULT_SIZES = [8 * 4**k for k in range(12)] + [16 * 2**20, 64 * 2**20]  # 8 B ... 32 MiB, 16, 64 MiB
ALGS = C.ALGORITHMS + ("builtin",)


def reduce_rate(comm, nbytes=8 << 20):
    """gamma: seconds per byte of an in-place float32 add on this rank."""
    a, b = comm.asarray(np.ones(nbytes // 4, np.float32)), comm.asarray(np.ones(nbytes // 4, np.float32))
    C._combine(a, b, "sum")
    t0 = time.perf_counter()
    for _ in range(5):
        C._combine(a, b, "sum")
    return comm.builtin.all_reduce(comm.asarray(np.array([(time.perf_counter() - t0) / 5 / nbytes])), "max")[0].item()


def time_one(comm, algorithm, x, budget=0.3):
    """Mean seconds per all-reduce over a batch sized to ~budget seconds; max over ranks."""
    run = (lambda: comm.builtin.all_reduce(x)) if algorithm == "builtin" else (lambda: C.all_reduce(comm, x, algorithm))
    comm.barrier()
    t0 = time.perf_counter()
    run()  # warm-up, also sizes the batch
    first = comm.builtin.all_reduce(comm.asarray(np.array([time.perf_counter() - t0])), "max")[0].item()
    reps = int(max(1, min(200, budget / max(first, 1e-7))))
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    mine = (time.perf_counter() - t0) / reps
    return comm.builtin.all_reduce(comm.asarray(np.array([mine])), "max")[0].item()


def run(comm, sizes=None, algorithms=ALGS, budget=0.3, verbose=True):
    """Measure; returns {"records": [...], "alpha", "beta", "gamma", "ranks"} on every rank."""
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    p = comm.size
    if p > 1:
        fit = M.pingpong(comm)
        alpha, beta = M.fit_alpha_beta([n for n, _ in fit], [t for _, t in fit])
    else:
        alpha = beta = 0.0
    gamma = reduce_rate(comm)
    records = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        x = comm.asarray(np.random.default_rng([comm.rank, n]).standard_normal(n).astype(np.float32))
        for alg in algorithms:
            t = time_one(comm, alg, x, budget)
            pred = M.allreduce_time(alg if alg != "builtin" else "ring", 4 * n, p, alpha, beta, gamma)
            records.append({
                "algorithm": alg, "bytes": 4 * n, "ranks": p, "time_s": t,
                "algbw_gbs": M.algbw(4 * n, t) / 1e9, "busbw_gbs": M.busbw("all_reduce", 4 * n, t, p) / 1e9,
                "predicted_s": pred,
            })
        if verbose and comm.rank == 0:
            print(format_row(records[-len(algorithms):]), flush=True)
    return {"records": records, "alpha": alpha, "beta": beta, "gamma": gamma, "ranks": p}


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def header(algorithms=ALGS):
    cols = "".join(f"{a[:14]:>22}" for a in algorithms)
    return f"{'size':>10}{cols}\n{'':>10}" + "".join(f"{'busbw GB/s (model)':>22}" for _ in algorithms)


def format_row(rows):
    cells = "".join(f"{r['busbw_gbs']:>12.4g} ({M.busbw('all_reduce', r['bytes'], r['predicted_s'], r['ranks']) / 1e9 if r['predicted_s'] else float('nan'):>7.3g})" for r in rows)
    return f"{_human(rows[0]['bytes']):>10}{cells}"


def ratios(records, algorithm="ring", min_bytes=16 << 20):
    """busbw(ours) / busbw(builtin) per size >= min_bytes."""
    by = {(r["algorithm"], r["bytes"]): r for r in records}
    return {b: by[(algorithm, b)]["busbw_gbs"] / by[("builtin", b)]["busbw_gbs"]
            for (a, b) in by if a == algorithm and b >= min_bytes and ("builtin", b) in by}
