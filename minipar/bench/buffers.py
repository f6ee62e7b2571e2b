"""Benchmark: a ring all-reduce with its receive buffer reused (one per ring) against
reallocated in every step, measured on real ranks.

    python -m minipar.bench.buffers [-n 4] [--json FILE]      # the table of docs/buffers.md
    from minipar import launch
    out = launch(4, "minipar.bench.buffers:reuse_cost")       # one record per size, every rank

The two run in interleaved pairs, so a shared machine's load hits them alike. Besides the time,
the named buffers are counted (``minipar.lessons.buffers.counted``: allocations and bytes
allocated per call) and the page faults read from ``getrusage``: what reallocating costs even
where the clock cannot tell it apart. ``minipar figures --only data_parallel`` draws the
records (``buffers_per_rank.png``, right).
"""
from __future__ import annotations

import resource
import time

import numpy as np

from ..records import write_json
from ..collectives import drain, ring_steps
from ..lessons.buffers import counted
from ..lessons.collectives import draw
from ..xp import copy, flat


def reuse_cost(comm, sizes=(1 << 10, 1 << 16, 1 << 20, 1 << 23), pairs=7, calls=None):
    """Ring all-reduce (float64, ``sizes`` elements) with its receive buffer reused (one per
    ring) vs reallocated every step, run in interleaved pairs: per size the median time ratio
    (reallocated / reused, slowest rank per run), the allocations and bytes allocated per call,
    and the page faults per call (a fresh buffer's pages are faulted in when first written)."""
    out = []
    for n in sizes:
        x = draw(comm, n, "float64")
        k = calls or max(2, min(50, (1 << 22) // n))
        per = {True: [], False: []}
        faults = {True: [], False: []}
        for i in range(pairs):
            for reuse in ((True, False) if i % 2 else (False, True)):
                bufs = [flat(copy(x)) for _ in range(k)]
                comm.builtin.barrier()
                f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                for buf in bufs:
                    drain(ring_steps(comm, buf, reuse=reuse))
                dt, df = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                per[reuse].append(max(comm.builtin.allgather_object(dt)) / k)
                faults[reuse].append(df / k)
        counts = {}
        for reuse in (True, False):
            with counted(comm) as bufs:
                drain(ring_steps(comm, flat(copy(x)), reuse=reuse))
                counts[reuse] = bufs.report()["ring.recv"]
        ratios = [a / b for a, b in zip(per[False], per[True])]
        out.append({"n": n, "bytes": 8 * n, "reused_s": float(np.median(per[True])),
                    "reallocated_s": float(np.median(per[False])), "ratio": float(np.median(ratios)),
                    "ratio_quartiles": [float(q) for q in np.percentile(ratios, (25, 75))],
                    "allocations": {"reused": counts[True]["allocations"], "reallocated": counts[False]["allocations"]},
                    "allocated_bytes": {"reused": counts[True]["allocated_bytes"],
                                        "reallocated": counts[False]["allocated_bytes"]},
                    "page_faults": {"reused": float(np.median(faults[True])), "reallocated": float(np.median(faults[False]))},
                    "calls_per_run": k})
    return out


def main(argv=None) -> int:
    """``python -m minipar.bench.buffers [--json FILE]``: the reuse benchmark on 4 ranks (MPI)."""
    import argparse

    from ..launcher import launch

    p = argparse.ArgumentParser(prog="python -m minipar.bench.buffers", description=main.__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--json", metavar="FILE", help="write every number as JSON")
    args = p.parse_args(argv)
    reuse = launch(args.n, "minipar.bench.buffers:reuse_cost", quiet=True).results[0]
    print(f"ring all-reduce on {args.n} ranks: receive buffer reused vs reallocated every step")
    print(f"{'bytes':>10} {'reused':>10} {'realloc.':>10} {'ratio':>6} {'quartiles':>12} {'allocs':>7} {'faults/call':>17}")
    for r in reuse:
        print(f"{r['bytes']:>10} {r['reused_s'] * 1e3:>8.3f}ms {r['reallocated_s'] * 1e3:>8.3f}ms {r['ratio']:>6.2f} "
              f"{r['ratio_quartiles'][0]:>5.2f}-{r['ratio_quartiles'][1]:<5.2f} "
              f"{r['allocations']['reused']:>3}/{r['allocations']['reallocated']:<3} "
              f"{r['page_faults']['reused']:>7.0f}/{r['page_faults']['reallocated']:<7.0f}")
    if args.json:
        write_json(args.json, {"reuse": reuse})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
