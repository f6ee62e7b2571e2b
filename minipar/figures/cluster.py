"""Figures of the cluster on one box (lesson 01's ``minipar cluster``): drawn from the records
``minipar cluster bench`` and ``minipar cluster placement`` write, never measured here.

    sudo minipar cluster bench --rates 100mbit 1gbit 10gbit --reps 5 --json figures/cluster_bench.json
    sudo minipar cluster placement --rates 100mbit 1gbit --json figures/cluster_placement.json
    minipar figures --into figures --only collectives        # draws both from those records

- ``cluster_allreduce.png``: per link rate, the flat ring, the hierarchical all-reduce and MPI's
  own, measured (solid) against the two-level alpha-beta prediction (dashed); beside it busbw
  over the configured rate, with the 0.8 the link-bound run should reach.
- ``cluster_placement.png``: lesson 05's trainer with TP inside the nodes and TP across them:
  the step time measured (and the planner's, where a record carries ``predicted_s``) beside
  the bytes that crossed between the nodes.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from . import pyplot, save

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "figures" / "cluster_bench.json"  # minipar cluster bench --json
PLACEMENT = ROOT / "figures" / "cluster_placement.json"  # minipar cluster placement --json
ALGS = ("ring", "hierarchical", "builtin")
LABELS = {"ring": "flat ring", "hierarchical": "hierarchical", "builtin": "MPI's own (MPICH)"}
TARGET = 0.8  # busbw / rate a link-bound run should reach


def load(path) -> list[dict]:
    with open(path) as f:
        return json.load(f)


def allreduce_series(records) -> dict:
    """{algorithm: {"rate_bits": [...], "seconds": [...], "predicted": [...] or None, "busbw_over_rate": [...]}},
    rates ascending: what :func:`allreduce` draws, read from the records and nothing else."""
    out = {}
    for alg in ALGS:
        rs = sorted((r for r in records if r["algorithm"] == alg), key=lambda r: r["rate_bits"])
        if rs:
            out[alg] = {"rate_bits": [r["rate_bits"] for r in rs], "seconds": [r["seconds"] for r in rs],
                        "predicted": [r["predicted"] for r in rs] if all("predicted" in r for r in rs) else None,
                        "busbw_over_rate": [r["busbw"] / (r["rate_bits"] / 8) for r in rs]}
    return out


def _where(records) -> str:
    r = records[0]
    loads = sorted(x["load_average"] for x in records if x.get("load_average") is not None)
    busy = f"; load average {loads[0]:.0f}-{loads[-1]:.0f} on {os.cpu_count()} cores" if loads else ""
    return (f"{r['bytes'] / 2**20:g} MiB float32 on {r['nodes']} nodes x {r['ranks_per_node']} ranks, "
            f"median of {r.get('reps', '?')}{busy}")


def allreduce(records, path, note: str = "") -> str:
    """Left: ms per all-reduce against the uplink's rate, measured and predicted. Right: busbw / rate."""
    plt = pyplot()
    series = allreduce_series(records)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(12, 1.1 * len(series)), 5.5))
    colours = dict(zip(ALGS, ("C0", "C1", "C2")))
    for alg, s in series.items():
        gbit = np.array(s["rate_bits"]) / 1e9
        ax.plot(gbit, 1e3 * np.array(s["seconds"]), marker="o", color=colours[alg], label=f"{LABELS[alg]}, measured")
        if s["predicted"]:
            ax.plot(gbit, 1e3 * np.array(s["predicted"]), ls="--", marker="x", color=colours[alg],
                    label=f"{LABELS[alg]}, predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("uplink rate (Gbit/s)")
    ax.set_ylabel("ms per all-reduce (slowest rank)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("time: measured against the two-level alpha-beta model", fontsize=9)
    rates = sorted({b for s in series.values() for b in s["rate_bits"]})
    x = np.arange(len(rates))
    width = 0.8 / max(1, len(series))
    for k, (alg, s) in enumerate(series.items()):
        ys = [s["busbw_over_rate"][s["rate_bits"].index(b)] if b in s["rate_bits"] else np.nan for b in rates]
        bars = bx.bar(x + (k - (len(series) - 1) / 2) * width, ys, width, color=colours[alg], label=LABELS[alg])
        bx.bar_label(bars, fmt="%.2f", fontsize=7)
    bx.axhline(TARGET, color="k", ls=":", lw=1, label=f"{TARGET} of the rate")
    bx.set_xticks(x, [f"{b / 1e9:g} Gbit/s" if b >= 1e9 else f"{b / 1e6:g} Mbit/s" for b in rates])
    bx.set_ylabel("busbw / configured rate")
    bx.legend(fontsize=7)
    bx.set_title("busbw (nccl-tests' definition) over the uplink's rate", fontsize=9)
    fig.suptitle(f"All-reduce across shaped links: {_where(records)}" + (f"\n{note}" if note else ""), fontsize=10)
    return save(fig, path, dpi=110, tight=True)


def placement_series(records) -> list[dict]:
    """One entry per (rate, placement), rates ascending (the records' order within a rate): label,
    step seconds, the planner's (or None), bytes between nodes, and ``link_s``: the time each
    node's uplink needs for its half of those bytes at the configured rate, alone."""
    rs = sorted(records, key=lambda r: r.get("rate_bits") or _bits(r["rate"]))
    return [{"label": f"{r['rate']}: {r['placement']}", "step_s": r["step_s"], "predicted": r.get("predicted_s"),
             "inter_bytes": r["inter_bytes"], "link_s": r["inter_bytes"] / 2 / ((r.get("rate_bits") or _bits(r["rate"])) / 8)}
            for r in rs]


def _bits(rate: str) -> int:
    from ..cluster.nodes import parse_rate

    return parse_rate(rate)


def placement(records, path, note: str = "") -> str:
    """Left: step time per (rate, placement), measured (and predicted where recorded). Right: bytes between nodes."""
    plt = pyplot()
    series = placement_series(records)
    x = np.arange(len(series))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(12, 1.1 * len(series)), 5.5))
    predicted = [s["predicted"] for s in series]
    width = 0.4 if any(p is not None for p in predicted) else 0.6
    bars = ax.bar(x - (width / 2 if width == 0.4 else 0), [1e3 * s["step_s"] for s in series], width, label="measured")
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.plot(x - (width / 2 if width == 0.4 else 0), [1e3 * s["link_s"] for s in series], "k_", ms=28, mew=2,
            label="the uplink's share alone (bytes / rate)")
    if width == 0.4:
        ax.bar(x + width / 2, [1e3 * p if p is not None else np.nan for p in predicted], width, hatch="//", alpha=0.8,
               label="predicted")
    ax.set_xticks(x, [s["label"] for s in series], fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("ms per step (median, slowest rank)")
    ax.legend(fontsize=7)
    ax.set_title("step time", fontsize=9)
    bars = bx.bar(x, [s["inter_bytes"] / 1e6 for s in series], 0.6, color="C3")
    bx.bar_label(bars, fmt="%.2f", fontsize=7)
    bx.set_xticks(x, [s["label"] for s in series], fontsize=7, rotation=60, ha="right")
    bx.set_ylabel("MB sent between nodes per step (all ranks)")
    bx.set_title("bytes across the uplinks (traced, exact)", fontsize=9)
    grids = sorted({r.get("comparison", "tp") for r in records})
    what = {"tp": "dp2 x tp2: TP inside or across", "pp": "pp2 x tp2: PP or TP across", "ddp": "dp2: one node or across"}
    fig.suptitle("Lesson 05's trainer on 2 nodes: " + "; ".join(what.get(g, g) for g in grids)
                 + (f"\n{note}" if note else ""), fontsize=10)
    return save(fig, path, dpi=110, tight=True)


def make(outdir, quick=False, backend="mpi", device=None, bench=BENCH, placements=PLACEMENT):
    """Both figures from the recorded runs (measuring needs root and minutes: see the module's docstring)."""
    os.makedirs(outdir, exist_ok=True)
    return [allreduce(load(bench), os.path.join(outdir, "cluster_allreduce.png")),
            placement(load(placements), os.path.join(outdir, "cluster_placement.png"))]
