"""Lesson 02's verbs: ``minipar run tensor_parallel`` and ``minipar bench tp``.

    minipar run -n 4 tensor_parallel [--backend torch] [--dtype float32] [--trace FILE]
    minipar bench tp -n 2 4 --sizes 256 1K 4K --json tp.json
    minipar bench tp -n 2 --file minipar-labs/02_tensor_parallel/exercise.py   # your lab 02 beside minipar's

The checks are ``minipar.lessons.tensor_parallel``, the benchmark ``minipar.bench.tp``, its
figures ``minipar.figures.tp``.
"""
from __future__ import annotations

import os

from ..bench.tp import DEFAULT_P, DEFAULT_SIZES
from ..lessons.tensor_parallel import check_world_size
from ..records import write_json
from .common import (SIZE_HELP, bounded, lesson_run_parser, output_path, positive_float, progress, ranks,
                     run_and_report, size_at_most, with_example)


def add_verbs(verbs):
    r = lesson_run_parser(verbs.run, "tensor_parallel", "column/row splits, Megatron MLP and attention, SP, SUMMA vs dense",
                          "minipar run -n 4 tensor_parallel --backend torch --dtype float32",
                          validate=lambda args: check_world_size(args.n))
    r.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    r.set_defaults(func=cmd_run)

    b = verbs.bench.add_parser(
        "tp", help="Megatron MLP step time for TP = 2, 4 against TP = 1: speedup, compute vs communication",
        description="One job per (p, hidden size), each timing interleaved TP = 1 / TP = p pairs; the default "
                    "sweep (hidden 8 ... 4096) takes about 3 minutes per value of -n on 2 cores.",
        **with_example("minipar bench tp -n 2 4 --sizes 256 1K 4K --json tp.json\n"
                       "  minipar bench tp --tokens 1 --forward-only      # single-token inference"))
    b.add_argument("-n", type=ranks, nargs="+", default=list(DEFAULT_P), metavar="P",
                   help="ranks = tensor-parallel sizes, one job each, every one against TP = 1 (default 2 4)")
    b.add_argument("--sizes", type=size_at_most(65536, "a hidden size held in this machine's memory"), nargs="+", default=list(DEFAULT_SIZES), metavar="HIDDEN",
                   help=f"hidden sizes d (the MLP is d -> 4d -> d; default 8 ... 4K); {SIZE_HELP}")
    b.add_argument("--tokens", type=bounded(2**20, "rows held in this machine's memory"), default=256, help="batch x sequence rows per step (default 256)")
    b.add_argument("--reps", type=bounded(10**5, "pairs"), default=7, help="A/B pairs per size, at least (default 7)")
    b.add_argument("--budget", type=positive_float, default=0.3, help="seconds of pairs per size: more pairs where they are "
                   "fast (default 0.3, at most 200 pairs)")
    b.add_argument("--rounds", type=bounded(10**3, "rounds"), default=1, help="repeat the jobs, keep the round with the median speedup (default 1)")
    b.add_argument("--forward-only", action="store_true", help="time the forward only (inference)")
    b.add_argument("--file", metavar="EXERCISE",
                   help="also measure your lab 02 exercise (e.g. minipar-labs/02_tensor_parallel/exercise.py) in the "
                        "same jobs and pairs: a training step from your column_forward, row_forward, row_backward "
                        "and column_backward (2.1-2.4), or with --forward-only your megatron_mlp (2.5); its own "
                        "table and speedup beside minipar's, in about twice the time. Functions still raising "
                        "NotImplementedError, or giving other values than minipar's, leave it out with one line")
    b.add_argument("--json", type=output_path, help="write the records here (yours with \"code\": \"yours\")")
    b.add_argument("--figures", default="", metavar="DIR", help="also draw tp_speedup.png and tp_comm_fraction.png here")
    b.set_defaults(func=cmd_bench, validate=validate_bench)


def cmd_run(args):
    return run_and_report(args, f"tensor parallelism ({args.dtype}) against the dense model",
                          "minipar.lessons.tensor_parallel:verify", dtypes=(args.dtype,))


def validate_bench(args):
    """Before launching: the MLP's 4d hidden units (fc1's columns, fc2's rows) split over every p;
    ``--file`` exists and imports."""
    from ..errors import UsageError

    if args.file:
        from ..labs.grader import exercise_module

        if not os.path.isfile(args.file):
            raise UsageError(f"--file {args.file}: no such file")
        exercise_module(args.file)

    for p in args.n:
        bad = [d for d in args.sizes if (4 * d) % p]
        if bad:
            raise UsageError(f"-n {p}: the MLP's hidden layer of 4d does not split over {p} ranks for "
                             f"--sizes {' '.join(map(str, bad))}")


def cmd_bench(args) -> int:
    from ..bench.tp import collect, crossover, table

    mode = "forward" if args.forward_only else "forward+backward"
    print(f"Megatron MLP {mode}, {args.tokens} tokens, float32, one BLAS thread per rank; speedup = median over "
          f"interleaved pairs of TP=1/TP=p step time, quartiles beside it", flush=True)
    records = collect(args.n, args.sizes, args.tokens, args.reps, args.forward_only, args.rounds, budget=args.budget,
                      progress=progress, file=args.file)
    mine = [r for r in records if r.get("code") != "yours"]
    yours = [r for r in records if r.get("code") == "yours"]
    print(table(mine))
    for p in sorted({r["p"] for r in mine} - {1}):
        print(crossover(mine, p))
    if yours:
        used = "megatron_mlp" if args.forward_only else "column_forward, row_forward, row_backward, column_backward"
        print(f"\nyours ({used} of {args.file}), in the same jobs and pairs; weights/rank: the whole layer, "
              f"as the lab hands it to every rank")
        print(table(yours))
        for p in sorted({r["p"] for r in yours} - {1}):
            print("yours: " + crossover(yours, p))
            print(f"yours: your TP = {p} step over minipar's (median of the pairs): "
                  + ", ".join(f"d = {r['hidden']}: {r['time_vs_minipar']:.2f}x"
                              for r in sorted(yours, key=lambda r: r["hidden"]) if r["p"] == p))
    if args.json:
        write_json(args.json, records, label="records:")
    if args.figures:
        from ..figures.tp import make

        for path in make(args.figures, mine):
            print(f"figure: {path}")
    return 0
