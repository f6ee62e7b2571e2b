"""Benchmark: when does tensor parallelism make a Megatron MLP faster?

    minipar bench tp                                  # TP = 1, 2, 4 x hidden 16 ... 4096, 256 tokens
    minipar bench tp -n 1 2 --sizes 512 2048 --json tp.json
    minipar bench tp --tokens 1 --forward-only        # single-token inference

The Megatron MLP (hidden -> 4 hidden -> hidden, float32) runs forward + backward on p ranks
for each hidden size. Every rank gets ONE BLAS thread (OMP_NUM_THREADS=1 and friends, set in
the environment before mpiexec starts the ranks), so TP = p uses p cores and TP = 1 one core:
the comparison is "same per-core speed, p times the cores, plus the all-reduces".

Per (p, hidden), from the trace of the measured steps: ``time_s`` (the fastest of ``reps``
steps, on the slowest rank: best-of-n is the usual defence against a machine shared with other
jobs), ``comm_s`` (time that rank spent inside collectives in that step, waiting for the others
included), ``compute_s = time_s - comm_s``, ``speedup`` = time at p = 1 / time at p, and
``weight_bytes`` (the weights this rank holds: 1/p of the layer, whatever the speed).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

DEFAULT_SIZES = (16, 64, 128, 256, 512, 1024, 2048, 4096)  # 16: below the crossover
DEFAULT_P = (1, 2, 4)
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def measure(comm, sizes=DEFAULT_SIZES, tokens=256, reps=5, dtype="float32", forward_only=False, seed=0):
    """Rank side: time the TP MLP step for each hidden size; one record per size (every rank)."""
    from .. import nn
    from ..tensor_parallel import ParallelMLP
    from ..xp import nbytes

    records, tracer = [], comm.tracer
    for hidden in sizes:
        rng = np.random.default_rng([seed, hidden])  # the same weights on every rank
        dense = nn.MLP(hidden, 4 * hidden, rng)
        x = comm.asarray(rng.standard_normal((tokens, hidden)).astype(dtype))  # (N, hidden)
        dy = comm.asarray(rng.standard_normal((tokens, hidden)).astype(dtype))
        model = ParallelMLP(comm, dense).to(x)
        del dense

        def step():
            y, ctx = model.forward(x)
            if not forward_only:
                model.backward(dy, ctx)

        step()  # warm-up: first touch of the buffers, BLAS set-up
        steps = []  # (seconds, seconds in collectives) per measured step
        for _ in range(reps):
            comm.barrier()
            tracer.clear()
            tracer.enabled = True
            t0 = time.perf_counter()
            step()
            t = time.perf_counter() - t0
            tracer.enabled = False
            steps.append((t, sum(e.duration for e in tracer.events if e.kind == "collective")))
        tracer.clear()
        slowest = max(comm.builtin.allgather_object(min(steps)))  # my best step; the slowest rank sets the pace
        records.append({"p": comm.size, "hidden": hidden, "tokens": tokens,
                        "mode": "forward" if forward_only else "forward+backward",
                        "time_s": slowest[0], "comm_s": slowest[1], "compute_s": slowest[0] - slowest[1],
                        "weight_bytes": sum(nbytes(w) for _, w in model.named_parameters())})
    return records


def collect(ps=DEFAULT_P, sizes=DEFAULT_SIZES, tokens=256, reps=5, forward_only=False, rounds=1, verbose=True):
    """Launch ``measure`` for each p (1 always included); returns the records with ``speedup``.

    rounds > 1 repeats the sweep over p, interleaved (1, 2, 4, 1, 2, 4, ...), and keeps each
    (p, hidden)'s fastest round, so that a burst of load from other jobs does not land on one
    p only.
    """
    from ..launcher import launch

    for var in ONE_THREAD:  # inherited by mpiexec and every rank it starts
        os.environ[var] = "1"
    ps = sorted(set(ps) | {1})
    best = {}
    for k in range(rounds):
        for p in ps:
            out = launch(p, "minipar.bench.tp:measure", quiet=True, watchdog=600, sizes=list(sizes), tokens=tokens,
                         reps=reps, forward_only=forward_only)
            for r in out.results[0]:
                key = (r["p"], r["hidden"])
                if key not in best or r["time_s"] < best[key]["time_s"]:
                    best[key] = r
            if verbose:
                print(f"  round {k + 1}/{rounds}, TP={p}: done ({len(sizes)} sizes)", flush=True)
    records = [best[key] for key in sorted(best)]
    base = {r["hidden"]: r["time_s"] for r in records if r["p"] == 1}
    for r in records:
        r["speedup"] = base[r["hidden"]] / r["time_s"]
    return records


def table(records) -> str:
    """A Markdown table of the records."""
    lines = ["| TP p | hidden | tokens | step (ms) | compute (ms) | comm (ms) | comm % | speedup | weights/rank (MiB) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(records, key=lambda r: (-r["tokens"], r["mode"], r["hidden"], r["p"])):
        lines.append(f"| {r['p']} | {r['hidden']} | {r['tokens']} | {r['time_s'] * 1e3:.2f} | {r['compute_s'] * 1e3:.2f} | "
                     f"{r['comm_s'] * 1e3:.2f} | {100 * r['comm_s'] / r['time_s']:.0f} | {r['speedup']:.2f} | "
                     f"{r['weight_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def add_bench_command(bench_subparsers):
    """Register ``minipar bench tp``."""
    import argparse

    b = bench_subparsers.add_parser(
        "tp", help="Megatron MLP step time for TP = 1, 2, 4: speedup, compute vs communication",
        epilog="example:\n  minipar bench tp -n 1 2 4 --sizes 256 1024 4096 --json tp.json\n"
               "  minipar bench tp --tokens 1 --forward-only      # single-token inference",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("-n", type=int, nargs="+", default=list(DEFAULT_P), metavar="P",
                   help="tensor-parallel sizes to launch (default 1 2 4; 1 is always added: the baseline)")
    b.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), metavar="HIDDEN",
                   help="hidden sizes d (the MLP is d -> 4d -> d; default 16 ... 4096)")
    b.add_argument("--tokens", type=int, default=256, help="batch x sequence rows per step (default 256)")
    b.add_argument("--reps", type=int, default=5, help="measured steps per size (the fastest counts; default 5)")
    b.add_argument("--rounds", type=int, default=1, help="repeat the sweep over p, keep the fastest round (default 1)")
    b.add_argument("--forward-only", action="store_true", help="time the forward only (inference)")
    b.add_argument("--json", help="write the records here")
    b.add_argument("--figures", default="", metavar="DIR", help="also draw tp_speedup.png and tp_comm_fraction.png here")
    b.set_defaults(func=bench_command)


add_bench_tp = add_bench_command  # the name the course plan used


def bench_command(args) -> int:
    mode = "forward" if args.forward_only else "forward+backward"
    print(f"Megatron MLP {mode}, {args.tokens} tokens, float32, one BLAS thread per rank")
    records = collect(args.n, args.sizes, args.tokens, args.reps, args.forward_only, args.rounds)
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"records: {args.json}")
    if args.figures:
        from ..figures.tp import make

        for path in make(args.figures, records):
            print(f"figure: {path}")
    return 0
