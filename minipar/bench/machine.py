"""Benchmark: measure "this machine" for the planner, and say what came out.

    minipar bench machine                    # 2 ranks; writes ~/.cache/minipar/this_machine.json, which the planner reads
    minipar bench machine -n 2 --out m.json  # elsewhere; MINIPAR_MACHINE=m.json makes the planner read it
    minipar bench machine --out minipar/plan/this_machine.json   # replace the committed record: only when asked

The measurement (matmul rate, memory bandwidth, alpha and beta between two ranks and with 2 and
4 ranks per core) and the file it writes belong to the planner: ``minipar.plan.machine``, whose
record the "this-machine" preset reads (``minipar.plan.hardware.this_machine``). This module runs
it and prints the numbers.
"""
from __future__ import annotations


def measure_and_report(n: int = 2, out: str | None = None) -> dict:
    """``plan.machine.measure_machine`` on ``n`` ranks into ``out`` (default ``plan.machine.measured_file()``,
    outside the repository), with a line before and the measured numbers after; returns the record."""
    from ..plan.machine import machine_file, measure_machine, measured_file

    out = out or measured_file()
    print(f"measuring this machine on {n} ranks: matmul (float64, float32), memory bandwidth, ping-pong ...",
          flush=True)
    rec = measure_machine(n, out)
    print(f"matmul: {rec['matmul_flops']['float64'] / 1e9:.2f} GFLOP/s float64, "
          f"{rec['matmul_flops']['float32'] / 1e9:.2f} GFLOP/s float32 per rank; memory {rec['memory_bandwidth'] / 1e9:.2f} GB/s; "
          f"alpha {rec['alpha'] * 1e6:.1f} us, 1/beta {1 / rec['beta'] / 1e9 if rec['beta'] else float('inf'):.2f} GB/s; "
          f"{rec['cores']} cores, {rec['memory_bytes'] / 1e9:.1f} GB RAM (load average {rec['load_average']})")
    print("oversubscribed: " + ", ".join(f"{n} ranks: alpha {r['alpha'] * 1e6:.0f} us, 1/beta {1 / max(r['beta'], 1e-30) / 1e9:.2f} GB/s"
                                         for n, r in rec["oversubscribed"].items()))
    reads = "the planner's this-machine preset reads it" if out == machine_file() else f"MINIPAR_MACHINE={out} makes the planner read it"
    print(f"wrote {out} ({reads})")
    return rec


def cmd_machine(args) -> int:
    if args.n < 2:
        print("minipar bench machine: error: -n must be >= 2 (alpha and beta need a ping-pong)")
        return 2
    measure_and_report(args.n, args.out)
    return 0
