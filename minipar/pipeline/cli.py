"""``minipar schedule``: print, simulate, export and draw one pipeline schedule.

    minipar schedule 1f1b --stages 4 --microbatches 8
    minipar schedule interleaved --stages 4 --microbatches 8 --chunks 2 --json s.json --plot s.png
    minipar schedule zb-h1 --stages 4 --microbatches 8 --costs 1,1,1
"""
from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction

from .schedules import SCHEDULES, format_grid, make_schedule
from .simulate import Costs, simulate, theory_bubble_fraction

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


def add_schedule_command(subparsers):
    """Add the ``schedule`` verb to an argparse ``subparsers`` object."""
    parser = subparsers.add_parser(
        "schedule", help="print and simulate a pipeline schedule",
        description="Build a pipeline schedule, print it as a time x rank grid of actions "
                    "(1F3 = stage 1, forward, micro-batch 3; '.' = idle), and compare its "
                    "simulated bubble fraction with the textbook formula.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=list(SCHEDULES), help="which schedule")
    parser.add_argument("--stages", "-p", type=int, default=4, metavar="P",
                        help="pipeline ranks (default 4)")
    parser.add_argument("--microbatches", "-m", type=int, default=8, metavar="M",
                        help="micro-batches per batch (default 8; naive always uses 1)")
    parser.add_argument("--chunks", "-v", type=int, default=2, metavar="V",
                        help="model chunks per rank, interleaved only (default 2)")
    parser.add_argument("--costs", default="1,2", metavar="F,B[,W]",
                        help="action times, see below (default 1,2)")
    parser.add_argument("--p2p", default="0", metavar="T",
                        help="latency of a stage-to-stage send (default 0)")
    parser.add_argument("--json", metavar="FILE", help="write the schedule and results as JSON")
    parser.add_argument("--plot", metavar="FILE", help="draw the timeline to an image file")
    parser.set_defaults(func=run_schedule)
    return parser


def run_schedule(args) -> int:
    try:
        costs = parse_costs(args.costs)
        costs.p2p = Fraction(args.p2p)
        schedule = make_schedule(args.name, args.stages, args.microbatches, args.chunks)
    except ValueError as err:
        print(f"minipar schedule: error: {err}", file=sys.stderr)
        return 2
    sim = simulate(schedule, costs)
    theory = theory_bubble_fraction(schedule.name, schedule.stages, schedule.microbatches,
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
        with open(args.json, "w") as f:
            json.dump({"schedule": schedule.name, "stages": schedule.stages,
                       "microbatches": schedule.microbatches, "chunks": schedule.chunks,
                       "actions": schedule.as_strings(),
                       "bubble_fraction": float(sim.bubble_fraction),
                       "theory_bubble_fraction": float(theory),
                       "makespan": float(sim.makespan), "peak_inflight": sim.peak_inflight,
                       "costs": {k: float(getattr(costs, k)) for k in ("F", "B", "I", "W", "p2p")}},
                      f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        from .plot import save_timeline
        print(f"wrote {save_timeline(args.plot, sim)}")
    return 0


def _show(x) -> str:
    return f"{float(x):.4f} ({x})" if isinstance(x, Fraction) and x.denominator != 1 else f"{float(x):.4g}"
