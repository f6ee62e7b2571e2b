"""Lesson 03's verbs: ``minipar schedule`` (print, simulate, export and draw one pipeline
schedule) and ``minipar run pipeline`` (execute one on real ranks, measured vs simulated).

    minipar schedule 1f1b --stages 4 --microbatches 8
    minipar schedule interleaved --stages 4 --microbatches 8 --chunks 2 --json s.json --plot s.png
    minipar schedule zb-h1 --stages 4 --microbatches 8 --costs 1,1,1
    minipar run -n 4 pipeline --schedule 1f1b --microbatches 8 --json out.json --trace trace.json
"""
from __future__ import annotations

import argparse
import sys
from fractions import Fraction

from ..pipeline.schedules import SCHEDULES, format_grid, make_schedule
from ..pipeline.simulate import Costs, simulate, theory_bubble_fraction
from ..records import write_json
from ..errors import UsageError
from .common import bounded, lesson_run_parser, output_path

# ``schedule`` prints and simulates every action of every rank: past this many it takes minutes
# (and memory) for a grid nobody reads.
MAX_ACTIONS = 50_000
MAX_STAGES = 4096

EPILOG = """\
examples:
  minipar schedule 1f1b --stages 4 --microbatches 8
  minipar schedule interleaved --stages 4 --microbatches 8 --chunks 2 --json s.json
  minipar schedule zb-h1 --stages 4 --microbatches 8 --costs 1,1,1 --plot zb.png

costs (time per micro-batch for one rank's share of the model; with --chunks V every chunk
action takes cost/V):  --costs F,B  gives forward F and full backward B (zb-h1 splits it
evenly, I = W = B/2);  --costs F,B,W  reads the second number as the input-gradient part I
and the third as the weight-gradient part W, so a full backward costs B + W.
Values may be integers, decimals or fractions like 1/2; integers give exact results.
The theoretical bubble assumes F=1, B=2 (I=W=1); compare it with the default costs.
"""


def parse_costs(text: str) -> Costs:
    """``"1,2"`` -> F=1, B=2;  ``"1,1,1"`` -> F=1, I=1, W=1 (B = I + W = 2)."""
    try:
        values = [Fraction(x.strip()) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--costs {text!r}: expected numbers like 1,2 or 1,1,1") from None
    values = [int(x) if x.denominator == 1 else x for x in values]
    if len(values) == 2:
        return Costs(F=values[0], B=values[1])
    if len(values) == 3:
        return Costs(F=values[0], I=values[1], W=values[2])
    raise ValueError(f"--costs {text!r}: give F,B or F,B,W (2 or 3 numbers)")


def add_verbs(verbs):
    """``minipar schedule`` and ``minipar run pipeline``."""
    add_schedule_command(verbs.top)
    add_run_command(verbs.run)


def add_schedule_command(subparsers):
    """Add the ``schedule`` verb to an argparse ``subparsers`` object."""
    parser = subparsers.add_parser(
        "schedule", help="print and simulate a pipeline schedule",
        description="Build a pipeline schedule, print it as a time x rank grid of actions "
                    "(1F3 = stage 1, forward, micro-batch 3; '.' = idle), and compare its "
                    "simulated bubble fraction with the textbook formula.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=list(SCHEDULES), help="which schedule")
    parser.add_argument("--stages", "-p", "-n", type=bounded(MAX_STAGES, "pipeline stages"), default=4, metavar="P",
                        help="pipeline ranks (default 4; -n as in every verb)")
    parser.add_argument("--microbatches", "-m", type=bounded(MAX_ACTIONS, "micro-batches"), default=8, metavar="M",
                        help="micro-batches per batch (default 8; naive always uses 1)")
    parser.add_argument("--chunks", "-v", type=bounded(MAX_STAGES, "model chunks"), default=2, metavar="V",
                        help="model chunks per rank, interleaved only (default 2)")
    parser.add_argument("--costs", default="1,2", metavar="F,B[,W]",
                        help="action times, see below (default 1,2)")
    parser.add_argument("--p2p", default="0", metavar="T",
                        help="latency of a stage-to-stage send (default 0)")
    parser.add_argument("--json", metavar="FILE", type=output_path, help="write the schedule and results as JSON")
    parser.add_argument("--plot", metavar="FILE", type=output_path, help="draw the timeline to an image file")
    parser.set_defaults(func=cmd_schedule)
    return parser


def cmd_schedule(args) -> int:
    try:
        actions = args.stages * args.microbatches * (args.chunks if args.name == "interleaved" else 1)
        if actions > MAX_ACTIONS:
            raise UsageError(f"--stages {args.stages} x --microbatches {args.microbatches}"
                             + (f" x --chunks {args.chunks}" if args.name == "interleaved" else "")
                             + f" = {actions:,} forward actions: at most {MAX_ACTIONS:,}, so the grid prints "
                             f"and simulates in seconds")
        costs = parse_costs(args.costs)
        costs.p2p = Fraction(args.p2p)
        schedule = make_schedule(args.name, args.stages, args.microbatches, args.chunks)
    except ValueError as err:
        print(f"minipar schedule: error: {err}", file=sys.stderr)
        return 2
    sim = simulate(schedule, costs)
    theory = theory_bubble_fraction(schedule.name, schedule.ranks, schedule.microbatches,
                                    schedule.chunks)
    print(format_grid(schedule))
    print()
    for r, ops in enumerate(schedule.actions):
        print(f"rank {r}: {' '.join(map(str, ops))}")
    print()
    print(f"costs: F={costs.F} B={costs.B} (I={costs.I} W={costs.W}) p2p={costs.p2p}"
          + (f", each chunk action / {schedule.chunks}" if schedule.chunks > 1 else ""))
    print(f"makespan:            {_show(sim.makespan)}")
    print(f"bubble (simulated):  {_show(sim.bubble_fraction)}")
    print(f"bubble (theory):     {_show(theory)}  [F=1, B=2 (I=W=1)]")
    print(f"peak in-flight activations per rank: {sim.peak_inflight}")
    if args.json:
        write_json(args.json, {"schedule": schedule.name, "stages": schedule.ranks,
                               "microbatches": schedule.microbatches, "chunks": schedule.chunks,
                               "actions": schedule.as_strings(),
                               "bubble_fraction": float(sim.bubble_fraction),
                               "theory_bubble_fraction": float(theory),
                               "makespan": float(sim.makespan), "peak_inflight": sim.peak_inflight,
                               "costs": {k: float(getattr(costs, k)) for k in ("F", "B", "I", "W", "p2p")}})
    if args.plot:
        from ..figures.pipeline import save_timeline
        print(f"wrote {save_timeline(args.plot, sim)}")
    return 0


def _show(x) -> str:
    return f"{float(x):.4f} ({x})" if isinstance(x, Fraction) and x.denominator != 1 else f"{float(x):.4g}"


RUN_EXAMPLE = "minipar run -n 4 pipeline --schedule 1f1b --microbatches 8 --json out.json --trace trace.json"
# the size of docs/benchmarks_pipeline.md, where one action (~5 ms) outweighs the per-call
# overhead of a message, so measured and simulated bubbles can be compared
WIDTH, BATCH = 512, 128


def add_run_command(run_subparsers):
    """Add ``minipar run pipeline`` (execute a schedule on real ranks, measured vs simulated)."""
    r = lesson_run_parser(run_subparsers, "pipeline", "execute a schedule on real ranks: measured vs "
                          "simulated vs theory bubble, gradients vs the dense model", RUN_EXAMPLE,
                          validate=validate_run)
    r.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b")
    r.add_argument("--microbatches", "-m", type=bounded(4096, "micro-batches run on this machine"), default=8, metavar="M")
    r.add_argument("--chunks", "-v", type=bounded(MAX_STAGES, "model chunks", low=-(2**31)), default=2, metavar="V",
                   help="interleaved only (default 2)")
    r.add_argument("--width", type=bounded(65536, "a layer held in this machine's memory", low=-(2**31)), default=WIDTH,
                   help=f"layer width (default {WIDTH}: the size of docs/benchmarks_pipeline.md)")
    r.add_argument("--batch", type=bounded(2**20, "rows held in this machine's memory", low=-(2**31)), default=BATCH, help=f"rows per micro-batch (default {BATCH})")
    r.add_argument("--layers", type=bounded(MAX_STAGES, "layers run on this machine", low=-(2**31)), help="Linear+GeLU layers (default 2 per stage)")
    r.add_argument("--repeats", type=bounded(10**4, "steps", low=-(2**31)), default=3, help="steps run, the last one measured (default 3)")
    r.set_defaults(func=cmd_run)
    return r


def validate_run(args):
    """Before launching: the schedule exists for (-n, --microbatches, --chunks), sizes are >= 1."""
    from ..errors import UsageError

    for flag in ("width", "batch", "layers", "repeats"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag} {value}: must be >= 1")
    try:
        make_schedule(args.schedule, args.n, args.microbatches, args.chunks)
    except ValueError as err:
        raise UsageError(f"-n {args.n} --microbatches {args.microbatches}: {err}") from None


def cmd_run(args) -> int:
    from ..launcher import launch
    from ..trace import write_chrome_trace

    print(f"running {args.schedule} on {args.n} ranks ({args.backend}), m={args.microbatches}, "
          f"width {args.width}, {args.batch} rows per micro-batch ...", flush=True)
    out = launch(args.n, "minipar.lessons.pipeline:profile", backend=args.backend, quiet=True,
                 schedule=args.schedule, m=args.microbatches, v=args.chunks, layers=args.layers,
                 width=args.width, b=args.batch, repeats=args.repeats, events=bool(args.trace))
    r = out.results[0]
    c = r["costs"]
    print(f"measured costs: F={c['F'] * 1e3:.3f} ms  B={c['B'] * 1e3:.3f} ms (I={c['I'] * 1e3:.3f} "
          f"W={c['W'] * 1e3:.3f})  p2p={c['p2p'] * 1e3:.3f} ms  (per micro-batch, one rank's share)")
    print(f"bubble  measured:  {r['measured_bubble_fraction']:.3f}")
    print(f"        simulated: {r['simulated_bubble_fraction']:.3f}   (simulate() with the measured mean cost per action kind)")
    print(f"        replayed:  {r['replayed_bubble_fraction']:.3f}   (simulate() with every action's own measured duration)")
    print(f"        theory:    {r['theory_bubble_fraction']:.3f}   (F=1, B=2, no p2p)")
    print(why_they_differ(r, args.n))
    tol = 1e-12 if args.backend == "mpi" else 1e-5
    ok = r["max_grad_error"] <= tol
    print(f"max gradient error vs the dense float64 model: {r['max_grad_error']:.1e} "
          f"({'ok' if ok else 'FAIL'}, tolerance {tol:.0e})")
    if args.trace:
        print(f"trace: {write_chrome_trace(args.trace, r['events'])} ({len(r['events'])} events; "
              f"open in https://ui.perfetto.dev)")
    if args.json:
        keys = ("schedule", "stages", "microbatches", "measured_bubble_fraction",
                "simulated_bubble_fraction", "theory_bubble_fraction", "max_grad_error")
        write_json(args.json, {**{k: r[k] for k in keys}, "replayed_bubble_fraction": r["replayed_bubble_fraction"],
                               "chunks": r["chunks"], "costs": c})
    return 0 if ok else 1


def why_they_differ(r, n: int) -> str:
    """Where the gap between the measured and the theoretical bubble comes from, in numbers."""
    import os

    c, gap = r["costs"], r["measured_bubble_fraction"] - r["theory_bubble_fraction"]
    F = c["F"] or float("nan")
    lines = [f"measured - theory = {100 * gap:+.1f} points. The theory assumes B = 2F and free messages; "
             f"this run had B = {c['B'] / F:.2f} F and p2p = {c['p2p'] / F:.2f} F.",
             f"  Those costs in simulate(): {r['simulated_bubble_fraction']:.3f}; every action's own duration: "
             f"{r['replayed_bubble_fraction']:.3f}; the remaining "
             f"{100 * (r['measured_bubble_fraction'] - r['replayed_bubble_fraction']):+.1f} points are time "
             f"between actions (Python, MPI calls, waiting for a core)."]
    cores = os.cpu_count() or 1
    if n > cores:
        lines.append(f"  {n} ranks share {cores} cores: a rank that is ready waits for a core, which no simulation models.")
    if F < 2e-3:
        lines.append(f"  F = {F * 1e3:.2f} ms is small against the per-call overhead: try --width {WIDTH} --batch {BATCH} "
                     f"(docs/benchmarks_pipeline.md).")
    return "\n".join(lines)
