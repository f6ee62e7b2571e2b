"""Benchmark: search for a strategy on the ranks, then run the strategies: predicted vs measured
step times (``minipar search``).

    from minipar import launch
    out = launch(4, "minipar.bench.autoparallel:compare", model="block", budget=20)
    out.results[0]["rows"]       # one row per strategy: predicted and measured seconds

``compare`` is what ``minipar search`` runs on every rank (``format_report`` is what it prints):

1. calibrate (cached: :mod:`minipar.autoparallel.calibrate`);
2. search: every rank runs its own Markov chains (rank r starts from the r-th starting point,
   its own random seed) for ``budget`` seconds; the ranks then swap their best costs and the
   winner's strategy (as arrays, through minipar's collectives), so all agree on one;
3. run each hand-written strategy and the found one on the ranks: the fastest of ``reps``
   steps (each timed on its slowest rank), next to the simulator's prediction.
"""
from __future__ import annotations

import os

import numpy as np

from .. import collectives
from ..autoparallel.calibrate import CLOCKS, calibrate
from ..autoparallel.execute import Executor
from ..autoparallel.graph import describe, hand_written, space
from ..autoparallel.models import build
from ..autoparallel.search import decode, encode, mcmc
from ..autoparallel.sharding import Mesh
from ..autoparallel.simulate import Simulator
from ..xp import to_numpy


def keep_freed_memory() -> bool:
    """Ask glibc's allocator to keep freed memory instead of handing it back to the system.

    A step allocates and frees activations of many sizes; by default glibc returns large freed
    blocks (mmap, heap trimming) and the next allocation page-faults them back in. An operator
    measured alone, again and again, never sees that: measured here, a block's step took 1.6x
    the sum of its operators' times until this was switched off, and 1.2x after. True if set
    (False where the C library is not glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20) and libc.mallopt(M_TRIM_THRESHOLD, 2**30))
    except (OSError, AttributeError):
        return False


def step_time(comm, executor, reps=5, clock="wall") -> float:
    """The fastest of ``reps`` steps, each timed on its slowest rank (after one warm-up step).
    The fastest, like the calibration's operator times: on a shared machine the others include
    time the ranks spent descheduled, which no simulator of this program can know about."""
    executor.step()
    times, now = [], CLOCKS[clock]
    for _ in range(reps):
        comm.barrier()
        t0 = now()
        executor.step()
        mine = comm.asarray(np.array([now() - t0]))
        times.append(float(collectives.all_reduce(comm, mine, op="max")[0]))
    return float(np.min(times))


def search_on_ranks(comm, sim, sp, starts, budget, seed=0, iterations=None):
    """Parallel chains, one search per rank; returns (best strategy, its cost, per-rank results)."""
    names = list(starts)
    mine = {n: starts[n] for n in names[comm.rank:] + names[:comm.rank]}  # my turn goes first
    res = mcmc(sim, sp, mine, budget=budget, iterations=iterations, seed=seed * 1000 + comm.rank)
    costs = collectives.all_gather(comm, comm.asarray(np.array([res.cost])))
    costs = to_numpy(costs)  # (from the GPU, under torch on cuda)
    winner = int(np.argmin(costs))
    codes = comm.asarray(np.array(encode(res.best, sp), dtype=np.int64))
    codes = collectives.broadcast(comm, codes, root=winner)
    stats = collectives.all_gather(comm, comm.asarray(np.array([res.iterations, res.accepted, res.chains],
                                                                dtype=np.int64)))
    return decode(to_numpy(codes), sp), float(costs[winner]), to_numpy(stats).reshape(-1, 3), res


def compare(comm, model="block", mesh=None, budget=20.0, reps=5, dtype="float64", seed=0, recalibrate=False,
            iterations=None, sizes=None, verbose=False, cache=True, clock="wall"):
    """The whole `minipar search`: returns, on every rank, {"rows": [...], "found": ..., ...}."""
    keep_freed_memory()  # for the calibration and the runs alike
    mesh_shape = tuple(mesh) if mesh else (comm.size,)
    m = build(model, **(sizes or {}))
    g = m.graph
    costs = calibrate(comm, g, mesh_shape, dtype, recalibrate=recalibrate, cache=cache, verbose=verbose, clock=clock)
    sim, sp = Simulator(g, mesh_shape, costs), space(g, mesh_shape)
    starts = hand_written(g, mesh_shape)
    if verbose and comm.rank == 0:
        print(f"searching for {budget:g} s on {comm.size} ranks ({len(starts)} hand-written starts, then random) ...",
              flush=True)
    found, cost, stats, _ = search_on_ranks(comm, sim, sp, starts, budget, seed, iterations)
    grid = Mesh(mesh_shape, comm)
    params, inputs = m.draw(seed)
    like = comm.asarray(np.zeros(1, dtype=dtype))
    rows = []
    for name, strategy in [*starts.items(), ("found by search", found)]:
        sim_r = sim.run(strategy)
        measured = step_time(comm, Executor(grid, g, strategy, params, inputs, like), reps, clock)
        rows.append({"strategy": name, "predicted_s": sim_r.time, "measured_s": measured,
                     "error": (sim_r.time - measured) / measured, "comm_s": max(sim_r.comm),
                     "bytes": max(sim_r.bytes)})
        if verbose and comm.rank == 0:
            print(f"  ran {name}", flush=True)
    return {"model": model, "sizes": m.sizes, "mesh": mesh_shape, "ranks": comm.size, "dtype": dtype,
            "found": {k: list(v) for k, v in found.items()}, "found_lines": describe(g, found),
            "found_cost": cost, "rows": rows, "alpha": costs.alpha, "beta": costs.beta, "gamma": costs.gamma,
            "iterations": int(stats[:, 0].sum()), "accepted": int(stats[:, 1].sum()), "chains": int(stats[:, 2].sum()),
            "budget": budget, "clock": clock, "load_average": os.getloadavg()[0], "cores": os.cpu_count()}


def format_report(r) -> str:
    sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
    lines = [f"\nmodel {r['model']} ({sizes}), {r['ranks']} ranks, mesh {'x'.join(map(str, r['mesh']))}",
             f"alpha-beta fit: alpha {r['alpha'] * 1e6:.1f} us, beta {r['beta'] * 1e9:.3f} ns/byte "
             f"({1e-9 / r['beta'] if r['beta'] else float('inf'):.2f} GB/s), gamma {r['gamma'] * 1e9:.3f} ns/byte",
             f"search: {r['iterations']} moves in {r['chains']} chains on {r['ranks']} ranks, {r['budget']:g} s",
             f"times: {r['clock']} clock; load average {r['load_average']:.1f} on {r['cores']} cores at the end"
             + (" (a busy machine: see docs/autoparallel.md)" if r["load_average"] > r["cores"] else ""),
             f"\nstrategy found (predicted {r['found_cost'] * 1e3:.2f} ms per step):"]
    lines += ["  " + line for line in r["found_lines"]]
    w = max(len(row["strategy"]) for row in r["rows"]) + 2
    lines += ["", f"  {'strategy':<{w}}{'predicted':>11}{'measured':>11}{'error':>8}{'comm (pred.)':>14}{'sent/rank':>12}"]
    for row in r["rows"]:
        lines.append(f"  {row['strategy']:<{w}}{row['predicted_s'] * 1e3:>8.2f} ms{row['measured_s'] * 1e3:>8.2f} ms"
                     f"{row['error'] * 100:>+7.0f}%{row['comm_s'] * 1e3:>11.2f} ms{row['bytes'] / 1e6:>9.2f} MB")
    return "\n".join(lines)
