"""Benchmark: DDP and tensor parallelism under emulated links, measured beside the planner's
prediction for each (``minipar bench links``).

    minipar bench machine && minipar bench links --slowdown 200 [--links none nvlink] [--json FILE]

The runs themselves are lesson 07's link you can feel (``minipar.lessons.planning.feel``: 2
ranks, every link on its own copy of the communicator, the variants taking turns step by step);
this prints them against the planner's "this machine" preset with the emulated link added.
"""
from __future__ import annotations

from ..records import write_json
from ..lessons.planning import feel, feel_summary


def bench_links(args) -> int:
    from ..plan.hardware import this_machine

    hw = this_machine("float64")
    print(f"DDP and tensor parallelism under emulated links (links {args.slowdown:g}x slower than the real ones); "
          f"this machine: {hw.peak_flops / 1e9:.2f} GFLOP/s float64, alpha {hw.intra.alpha * 1e6:.0f} us, "
          f"{hw.intra.bandwidth / 1e9:.2f} GB/s ({hw.sources['measured']})", flush=True)
    rows = feel(tuple(args.links), args.slowdown, args.steps)
    print(f"{'run':<5} {'link':<10} {'measured s':>11} {'predicted s':>12} {'pred/meas':>10}")
    for r in rows:
        print(f"{r['what']:<5} {r['link']:<10} {r['measured_s']:11.4f} {r['predicted_s']:12.4f} "
              f"{r['predicted_s'] / r['measured_s']:10.2f}")
    for line in feel_summary(rows):
        print(line)
    if args.json:
        write_json(args.json, rows)
    return 0
