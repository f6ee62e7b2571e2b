"""Lesson 08's verbs: ``minipar search`` (find a strategy for a model, then run it and the
classic ones) and ``minipar run auto_parallel`` (the lesson's checks).

    minipar search --model block --ranks 4 --budget 20
    minipar search --model vocab --ranks 4 --mesh 2x2 --budget 10 --json found.json
    minipar run -n 4 auto_parallel [--backend torch] [--dtype float32]

Everything that can be wrong with the request is refused, in one line, before any rank starts.
The search on the ranks and its report are ``minipar.bench.autoparallel``, the checks
``minipar.lessons.auto_parallel``.
"""
from __future__ import annotations

import argparse
import functools
import sys

from ..autoparallel.models import PRESETS
from ..errors import UsageError
from ..records import write_json
from .common import bounded, lesson_run_parser, output_path, positive_float, progress, ranks, run_and_report

SIZE_FLAGS = ("B", "T", "C", "H", "V", "n_heads")


def add_verbs(verbs):
    """``minipar search`` and ``minipar run auto_parallel``."""
    add_search_command(verbs.top)
    r = lesson_run_parser(verbs.run, "auto_parallel", "redistribute every placement pair; strategies vs dense",
                          "minipar run -n 4 auto_parallel --backend torch")
    r.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    r.set_defaults(func=cmd_run)


def cmd_run(args):
    return run_and_report(args, f"placements, redistribute and strategies ({args.dtype}) against the dense model",
                          "minipar.lessons.auto_parallel:verify", dtypes=(args.dtype,))


def add_search_command(subparsers):
    p = subparsers.add_parser(
        "search", help="FlexFlow-style search for a parallel strategy, then predicted vs measured times",
        description="Calibrate (operator times and an alpha-beta fit, cached), search strategies with "
                    "Markov-chain Monte Carlo on the execution simulator, then run the strategy found and the "
                    "hand-written ones (data parallel, Megatron TP, a sequence split) on real ranks.",
        epilog="example:\n  minipar search --model block --ranks 4 --budget 20\n"
               "  minipar search --model vocab --ranks 4 --mesh 2x2 --budget 10\n\n"
               f"models: {', '.join(f'{k} ({cfg})' for k, cfg in ((k, ' '.join(f'{a}={b}' for a, b in v.items())) for k, v in PRESETS.items()))}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="block", help=f"one of {', '.join(PRESETS)} (default block)")
    p.add_argument("--ranks", "-n", type=ranks, default=4, help="ranks to launch (default 4)")
    p.add_argument("--mesh", help="mesh shape, e.g. 4 or 2x2 (default: 1-D over every rank)")
    p.add_argument("--budget", type=positive_float, default=20.0, help="seconds of search (default 20)")
    p.add_argument("--reps", type=bounded(10**4, "measured steps"), default=5, help="measured steps per strategy (the fastest counts; default 5)")
    p.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time steps and calibration on the wall clock (default) or in CPU seconds of each rank "
                        "(on a machine shared with other jobs: leaves out time spent waiting for a core)")
    p.add_argument("--recalibrate", action="store_true", help="measure this machine again (ignore the cache)")
    p.add_argument("--json", metavar="FILE", type=output_path, help="write the report as JSON")
    for k in SIZE_FLAGS:
        p.add_argument(f"--{k.replace('_', '-')}", dest=k, type=bounded(65536, "a model searched on this machine"), metavar="N", help=f"override the model's {k}")
    p.set_defaults(func=cmd_search)
    return p


def parse_mesh(text, ranks):
    if text is None:
        return (ranks,)
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--mesh {text!r}: write sizes like 4 or 2x2") from None
    if not 1 <= len(shape) <= 2 or min(shape) < 1:
        raise UsageError(f"--mesh {text!r}: give one or two positive sizes, like 4 or 2x2")
    if shape[0] * (shape[1] if len(shape) > 1 else 1) != ranks:
        raise UsageError(f"--mesh {text} has {'x'.join(map(str, shape))} = "
                         f"{shape[0] * (shape[1] if len(shape) > 1 else 1)} ranks, but --ranks is {ranks}")
    return shape


def check_args(args):
    """Everything knowable before launching: raises UsageError naming the argument."""
    from ..autoparallel.models import build

    if args.ranks < 1 or args.ranks > 64:
        raise UsageError(f"--ranks {args.ranks}: give 1 to 64 ranks")
    if not args.budget > 0:
        raise UsageError(f"--budget {args.budget}: give a positive number of seconds")
    if args.reps < 1:
        raise UsageError(f"--reps {args.reps}: give at least 1")
    mesh = parse_mesh(args.mesh, args.ranks)
    sizes = {k: getattr(args, k) for k in SIZE_FLAGS if getattr(args, k) is not None}
    build(args.model, **sizes)  # refuses an unknown model or a size it does not have
    return mesh, sizes


def search_phase(bar, line: str) -> None:
    """Moves ``bar`` on the lines ``compare`` prints on rank 0: calibrated (the search starts), then
    each strategy measured."""
    if line.startswith("searching for"):
        bar.set_description("search: search, then measure")
        bar.update(1)
    elif line.startswith("  ran "):
        bar.update(1)


def cmd_search(args) -> int:
    try:
        mesh, sizes = check_args(args)
    except UsageError as err:
        print(f"minipar search: error: {err}", file=sys.stderr)
        return 2
    from ..autoparallel.graph import hand_written
    from ..autoparallel.models import build
    from ..bench.autoparallel import format_report
    from ..launcher import launch

    where = f"{args.ranks} ranks, mesh {'x'.join(map(str, mesh))}, {args.backend}, {args.dtype}, {args.clock} clock"
    print(f"minipar search: model {args.model} on {where}", flush=True)
    runs = len(hand_written(build(args.model, **sizes).graph, mesh)) + 1  # the hand-written strategies and the found one
    with progress(total=1 + runs, desc="search: calibrate", unit="phase") as bar:
        out = launch(args.ranks, "minipar.bench.autoparallel:compare", backend=args.backend, quiet=False,
                     on_line=functools.partial(search_phase, bar), model=args.model, mesh=mesh, budget=args.budget,
                     reps=args.reps, dtype=args.dtype, seed=args.seed, recalibrate=args.recalibrate, sizes=sizes,
                     verbose=True, clock=args.clock)
    report = out.results[0]
    print(format_report(report))
    if args.json:
        write_json(args.json, report)
    return 0
