"""Figures of lesson 2: measured speedup of a tensor-parallel MLP step, and where its time goes.

    minipar figures --only tensor_parallel
    minipar bench tp --json tp.json --figures figures     # the same from a fresh benchmark

tp_speedup.png        speedup over TP = 1 vs hidden size, one line per p, ideal (= p) dashed
tp_comm_fraction.png  share of the step spent in collectives vs hidden size, one line per p

Records come from ``minipar.bench.tp`` (one per p, hidden and mode); when both a training step
and a single-token forward were measured, each figure gets one panel per mode.
"""
from __future__ import annotations

import os

from . import pyplot, save

QUICK_SIZES = (16, 256, 1024)


def _modes(records):
    return sorted({(r["mode"], r["tokens"]) for r in records}, key=lambda m: -m[1])


def _panels(records, ylabel, title, value, ideal=False, path="tp.png"):
    plt = pyplot()

    modes = _modes(records)
    fig, axes = plt.subplots(1, len(modes), figsize=(6.2 * len(modes), 4.6), squeeze=False)
    for ax, (mode, tokens) in zip(axes[0], modes):
        rs = [r for r in records if r["mode"] == mode and r["tokens"] == tokens]
        sizes = sorted({r["hidden"] for r in rs})
        for p in sorted({r["p"] for r in rs}):
            line = sorted((r for r in rs if r["p"] == p), key=lambda r: r["hidden"])
            drawn = ax.plot([r["hidden"] for r in line], [value(r) for r in line], marker="o", label=f"TP = {p}")
            if ideal and p > 1:
                ax.plot(sizes, [p] * len(sizes), ls="--", lw=1, color=drawn[0].get_color(), label=f"ideal for TP = {p}")
        if ideal:
            ax.axhline(1.0, color="k", lw=0.8)
            ax.text(sizes[0], 0.97, " below this line: slower than one rank", va="top", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(d) for d in sizes])
        ax.set_xlabel("hidden size d (MLP d -> 4d -> d)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{mode}, {tokens} token{'s' if tokens != 1 else ''} per step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, path)


def plot_speedup(records, path):
    return _panels(records, "speedup over TP = 1 (x)", "Megatron MLP, float32, one core per rank: "
                   "measured step-time speedup", lambda r: r["speedup"], ideal=True, path=path)


def plot_comm_fraction(records, path):
    return _panels(records, "time in collectives (% of the step)", "Where the step goes: all-reduce "
                   "(incl. waiting for other ranks) vs compute", lambda r: 100 * r["comm_s"] / r["time_s"], path=path)


def each_job(jobs, **_):
    """``collect``'s jobs, each announced as it starts (lesson 02's figures take minutes)."""
    from . import progress

    for job in jobs:
        progress(f"  TP={job[1]}, d = {job[2]}")
        yield job


def make(outdir, records=None, quick=False, **_):
    """Draw both figures from ``records``, or from a fresh benchmark (training step + single token)."""
    from ..bench.tp import DEFAULT_SIZES, collect

    os.makedirs(outdir, exist_ok=True)
    if records is None:
        from . import progress

        sizes = QUICK_SIZES if quick else DEFAULT_SIZES
        progress(f"TP MLP training step, d = {', '.join(map(str, sizes))}")
        records = collect(sizes=sizes, tokens=256, reps=2 if quick else 5, verbose=False, progress=each_job)
        progress("TP MLP single-token forward")
        records += collect(sizes=sizes, tokens=1, reps=3 if quick else 20, forward_only=True, verbose=False,
                           progress=each_job)
    return [plot_speedup(records, os.path.join(outdir, "tp_speedup.png")),
            plot_comm_fraction(records, os.path.join(outdir, "tp_comm_fraction.png"))]
