"""Benchmark: measure "this machine" for the planner, and say what came out.

    minipar bench machine                    # 2 ranks; writes ~/.cache/minipar/this_machine.json, which the planner reads
    minipar bench machine -n 2 --out m.json  # elsewhere; MINIPAR_MACHINE=m.json makes the planner read it
    minipar bench machine --out minipar/plan/this_machine.json   # replace the committed record: only when asked

The measurement (matmul rate, memory bandwidth, alpha and beta between two ranks and with 2 and
4 ranks per core, and lesson 05's GPT's own operations at the local shape of every grid of
``minipar bench train``, timed with that grid's number of ranks computing at once) and the file
it writes belong to the planner: ``minipar.plan.machine``, whose
record the "this-machine" preset reads (``minipar.plan.hardware.this_machine``). This module runs
it and prints the numbers.
"""
from __future__ import annotations


def lesson05_ops(grids=None):
    """(model, shapes) for ``plan.machine.measure_ops``: lesson 05's GPT (any depth) and the
    (ranks, tp, micro-batch rows) of every grid of ``minipar bench train`` (``grids``: those), with
    half the rows too where a (ranks, tp) has one size only, so that other batches lie on a line."""
    from ..train.config import DEFAULT_MODEL
    from .train import GRIDS, train_config

    shapes = set()
    for dp, pp, tp in grids or GRIDS:
        cfg = train_config(dp, pp, tp)
        shapes.add((cfg.ranks, tp, cfg.microbatch_size(cfg.batch)))
    for k, t, b in list(shapes):
        if sum(1 for kk, tt, _ in shapes if (kk, tt) == (k, t)) == 1 and b > 1:
            shapes.add((k, t, b // 2))
    return {k: v for k, v in DEFAULT_MODEL.items() if k != "n_layers"}, sorted(shapes)


def report_ops(rec: dict) -> None:
    """One line on a record's measured operations (nothing when it has none)."""
    rows = rec.get("ops", {}).get("rows", [])
    biggest = {(r["ranks"], r["tp"]): r for r in sorted(rows, key=lambda r: r["b"]) if r["tp"] == 1}
    if rows:
        print(f"lesson 05's GPT: {len(rows)} (ranks, tp, rows) shapes timed, the median of {rec['ops'].get('rounds', 1)} "
              "launches each; one block, forward + backward, tp 1: "
              + ", ".join(f"{k} ranks b{r['b']} {1e3 * (r['block_f'] + r['block_b']):.1f} ms"
                          for (k, _), r in sorted(biggest.items())))


def measure_and_report(n: int = 2, out: str | None = None, grids=None, progress=lambda jobs, **_: jobs,
                       with_ops=True) -> dict:
    """``plan.machine.measure_machine`` on ``n`` ranks into ``out`` (default ``plan.machine.measured_file()``,
    outside the repository), lesson 05's GPT's operations at ``grids``' shapes (default every grid
    of ``minipar bench train``) included unless not ``with_ops``, with a line before and the
    measured numbers after; returns the record."""
    from ..plan.machine import machine_file, measure_machine, measured_file

    out = out or measured_file()
    print(f"measuring this machine on {n} ranks: matmul (float64, float32), memory bandwidth, ping-pong"
          + (", lesson 05's GPT's operations on 1-8 ranks ..." if with_ops else " ..."), flush=True)
    rec = measure_machine(n, out, ops=lesson05_ops(grids) if with_ops else None, progress=progress)
    print(f"matmul: {rec['matmul_flops']['float64'] / 1e9:.2f} GFLOP/s float64, "
          f"{rec['matmul_flops']['float32'] / 1e9:.2f} GFLOP/s float32 per rank; memory {rec['memory_bandwidth'] / 1e9:.2f} GB/s; "
          f"alpha {rec['alpha'] * 1e6:.1f} us, 1/beta {1 / rec['beta'] / 1e9 if rec['beta'] else float('inf'):.2f} GB/s; "
          f"{rec['cores']} cores, {rec['memory_bytes'] / 1e9:.1f} GB RAM (load average {rec['load_average']})")
    print("oversubscribed: " + ", ".join(f"{n} ranks: alpha {r['alpha'] * 1e6:.0f} us, 1/beta {1 / max(r['beta'], 1e-30) / 1e9:.2f} GB/s"
                                         for n, r in rec["oversubscribed"].items()))
    report_ops(rec)
    if with_ops:  # a preset of its own; without the operations, part of a run that adds them (bench plan)
        reads = "the planner's this-machine preset reads it" if out == machine_file() else f"MINIPAR_MACHINE={out} makes the planner read it"
        print(f"wrote {out} ({reads})")
    return rec


def cmd_machine(args, progress=lambda jobs, **_: jobs) -> int:
    if args.n < 2:
        print("minipar bench machine: error: -n must be >= 2 (alpha and beta need a ping-pong)")
        return 2
    measure_and_report(args.n, args.out, progress=progress)
    return 0
