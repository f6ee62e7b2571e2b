"""Lesson 01's verbs: ``minipar run collectives`` and ``minipar bench collectives``.

    minipar run -n 5 collectives --backend torch --trace trace.json
    minipar bench collectives -n 4 --json bench.json
    minipar bench collectives -n 4 --file minipar-labs/01_collectives/exercise.py   # your lab 01 beside them
    mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json out.json   # already on ranks

The checks are ``minipar.lessons.collectives``, the benchmark ``minipar.bench.collectives``.
The lesson's ``minipar cluster`` verbs (nodes on one machine) are in ``minipar/cli/cluster.py``.
"""
from __future__ import annotations

import os
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
    bc.add_argument("--file", metavar="EXERCISE",
                    help="also measure your lab 01 exercise (e.g. minipar-labs/01_collectives/exercise.py) in the same "
                         "run: its ring_all_reduce as the column 'yours', then its ring_reduce_scatter, ring_all_gather "
                         "and tree_broadcast each beside minipar's and the builtin. A function that still raises "
                         "NotImplementedError, or gives other values than the builtin, is left out with one line")
    bc.add_argument("--json", type=output_path, help="write one record per (collective, algorithm, size) here")
    bc.add_argument("--plot", metavar="FILE", type=output_path,
                    help="also draw minipar's and the builtin's all-reduce busbw against size into FILE (none without "
                         "it; yours is in the table and --json; figures/collectives_busbw.png is drawn by `minipar "
                         "figures --into figures`)")
    bc.set_defaults(func=cmd_bench, validate=validate_bench)


def cmd_run(args):
    from ..lessons.collectives import summarize

    return run_and_report(args, "every collective against the builtin", "minipar.lessons.collectives:verify",
                          summarize=summarize)


def validate_bench(args):
    """Before launching: ``--file`` exists and imports (one line if not; on the ranks of a job
    started by hand, :func:`learners` says it once)."""
    if args.file:
        from ..errors import UsageError
        from ..labs.grader import exercise_module

        if not os.path.isfile(args.file):
            raise UsageError(f"--file {args.file}: no such file")
        if not in_mpi_job():
            exercise_module(args.file)


def learners(comm, args):
    """{collective: the learner's function} from ``--file`` (every rank imports it), or None when
    it does not import (rank 0 says why, in one line)."""
    from ..bench.collectives import learner_functions
    from ..errors import UsageError
    from ..labs.grader import exercise_module

    try:
        module, problem = exercise_module(args.file), None
    except UsageError as err:
        module, problem = None, str(err)
    problem = next((w for w in comm.builtin.allgather_object(problem) if w), None)
    if problem:
        if comm.rank == 0:
            print(f"minipar bench collectives: error: {problem}", file=sys.stderr, flush=True)
        return None
    return learner_functions(comm, module, args.sizes)


def cmd_bench(args) -> int:
    """Run on every rank of an mpiexec job; started outside one with ``-n N``, start that job first."""
    if args.n and args.n > 1 and not in_mpi_job():
        return relaunch(args.n, strip_n(sys.argv[1:]))
    import minipar

    from ..bench import collectives as B

    comm = minipar.init(args.backend)
    algs = tuple(args.algorithms) if args.algorithms else B.ALGS
    yours = learners(comm, args) if args.file else {}
    if yours is None:
        return 2
    if "all_reduce" in yours:
        algs += (B.YOURS,)
    if comm.rank == 0:
        print(f"all-reduce benchmark on {comm.size} ranks ({args.backend}); float32; "
              f"busbw = algbw * 2(p-1)/p; model = alpha-beta-gamma fit from a ping-pong")
        if args.file:
            print(f"yours: {', '.join(B.LAB01[c][0] for c in yours)} of {args.file}" if yours else
                  f"yours: nothing in {args.file} to measure yet")
        print(B.header(algs), flush=True)
    result = B.run(comm, args.sizes, algs, args.budget, yours=yours)
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
        for collective in yours:
            mine = "ring" if collective == "all_reduce" else B.MINIPARS[collective]
            r = B.ratios(result["records"], B.YOURS, 0, against=mine, collective=collective)
            if r:
                print(f"busbw yours/minipar's {mine} ({collective.replace('_', '-')}): "
                      + ", ".join(f"{B._human(b)}: {v:.2f}x" for b, v in sorted(r.items())))
        if args.json:
            write_json(args.json, result["records"])
        if args.plot:
            from ..figures.collectives import plot_busbw

            ours = [r for r in result["records"] if r["algorithm"] in B.ALGS and r["collective"] == "all_reduce"]
            print(f"wrote {plot_busbw({**result, 'records': ours}, args.plot)}")
    return 0
