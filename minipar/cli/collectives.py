"""Lesson 01's verbs: ``minipar run collectives`` and ``minipar bench collectives``.

    minipar run -n 5 collectives --backend torch --trace trace.json
    minipar bench collectives -n 4 --json bench.json
    mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json out.json   # already on ranks

The checks are ``minipar.lessons.collectives``, the benchmark ``minipar.bench.collectives``.
The lesson's ``minipar cluster`` verbs (nodes on one machine) are in ``minipar/cli/cluster.py``.
"""
from __future__ import annotations

import sys

from ..records import write_json
from .common import (SIZE_HELP, in_mpi_job, lesson_run_parser, output_path, positive_float, ranks, relaunch,
                     run_and_report, size_at_most, strip_n, with_example)


def add_verbs(verbs):
    from .cluster import add_verbs as add_cluster_verbs

    add_cluster_verbs(verbs)  # ``minipar cluster ...``: the same collectives across (emulated) machines
    rc = lesson_run_parser(verbs.run, "collectives", "every from-scratch collective vs the builtin",
                           "minipar run -n 5 collectives --backend torch --trace trace.json")
    rc.set_defaults(func=cmd_run)

    bc = verbs.bench.add_parser("collectives", help="all-reduce algorithms vs the builtin: time, algbw, busbw",
                                description="Times every all-reduce algorithm and the builtin at each size; rank 0 "
                                            "prints a row per size as it goes. Typically 1 to 2 minutes on 4 ranks "
                                            "of 2 cores with the default sizes (8 B ... 64 MiB).",
                                **with_example("minipar bench collectives -n 4 --json out.json --plot busbw.png\n"
                                               "  mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json out.json"))
    bc.add_argument("-n", type=ranks, help="launch this many ranks with mpiexec (omit when already under mpiexec)")
    bc.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    bc.add_argument("--sizes", type=size_at_most(2**34, "16 GiB: a message held in this machine's memory, twice"), nargs="+", metavar="SIZE",
                    help=f"message sizes in bytes (default 8 ... 64M); {SIZE_HELP}")
    from ..bench.collectives import ALGS

    bc.add_argument("--algorithms", nargs="+", choices=ALGS, metavar="ALG",
                    help=f"subset of algorithms (default all): {', '.join(ALGS)}")
    bc.add_argument("--budget", type=positive_float, default=0.3, help="seconds of repetitions per measurement")
    bc.add_argument("--json", type=output_path, help="write one record per (algorithm, size) here")
    bc.add_argument("--plot", metavar="FILE", type=output_path,
                    help="also draw busbw against size into FILE (none without it; figures/collectives_busbw.png "
                         "is drawn by `minipar figures --into figures`)")
    bc.set_defaults(func=cmd_bench)


def cmd_run(args):
    from ..lessons.collectives import summarize

    return run_and_report(args, "every collective against the builtin", "minipar.lessons.collectives:verify",
                          summarize=summarize)


def cmd_bench(args) -> int:
    """Run on every rank of an mpiexec job; started outside one with ``-n N``, start that job first."""
    if args.n and args.n > 1 and not in_mpi_job():
        return relaunch(args.n, strip_n(sys.argv[1:]))
    import minipar

    from ..bench import collectives as B

    comm = minipar.init(args.backend)
    algs = tuple(args.algorithms) if args.algorithms else B.ALGS
    if comm.rank == 0:
        print(f"all-reduce benchmark on {comm.size} ranks ({args.backend}); float32; "
              f"busbw = algbw * 2(p-1)/p; model = alpha-beta-gamma fit from a ping-pong")
        print(B.header(algs), flush=True)
    result = B.run(comm, args.sizes, algs, args.budget)
    if comm.rank == 0:
        print(f"fit: alpha = {result['alpha'] * 1e6:.2f} us, beta = {result['beta'] * 1e9:.4f} ns/B "
              f"(1/beta = {1 / result['beta'] / 1e9 if result['beta'] else float('inf'):.2f} GB/s), "
              f"gamma = {result['gamma'] * 1e9:.4f} ns/B")
        if "builtin" in algs:
            for alg in algs:
                if alg != "builtin":
                    r = B.ratios(result["records"], alg)
                    if r:
                        print(f"busbw {alg}/builtin at >= 16 MiB: " + ", ".join(f"{b >> 20} MiB: {v:.2f}x" for b, v in sorted(r.items())))
        if args.json:
            write_json(args.json, result["records"])
        if args.plot:
            from ..figures.collectives import plot_busbw

            print(f"wrote {plot_busbw(result, args.plot)}")
    return 0
