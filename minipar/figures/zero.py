"""Figures of lesson 4 from real runs: ZeRO memory and traffic, DDP overlap, DP vs DDP.

    minipar figures --into figures --only data_parallel        # or: python -m minipar.figures.zero figures/

    zero_memory.png            bytes per rank per stage, stacked params/grads/optimizer, predicted vs measured
    zero_traffic.png           bytes sent per rank per step, per engine, vs 2(N-1)/N and 3(N-1)/N Psi
    ddp_overlap_timeline.png   one traced DDP step without and with overlap: compute and all-reduce lanes
    dp_vs_ddp.png              rank 0 against the other ranks: bytes moved and compute time per step

The lesson's other figures (its buffers, ZeRO-3's prefetch timeline) are ``minipar.figures.buffers``'s.

The measured numbers are also written to ``zero_numbers.json`` beside the figures (the source of
docs/benchmarks_zero.md). Timings need one BLAS thread per rank: ``minipar.launch`` gives every
rank one unless the environment says otherwise.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..launcher import launch
from ..records import write_json
from . import DEFAULT_OUT, progress, pyplot, save

N = 4
COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}


def plot_memory(records, path, n=N):
    """Stacked bars per stage: predicted (hatched) next to measured (solid), KB per rank."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in records:
        for dx, key, hatch in ((-0.2, "predicted", "//"), (0.2, "measured", None)):
            bottom = 0.0
            for c in ("params", "grads", "optimizer"):
                v = r[key][f"{c}_bytes"] / 1e3
                ax.bar(r["stage"] + dx, v, 0.38, bottom=bottom, color=COLORS[c], hatch=hatch, alpha=0.55 if hatch else 1,
                       edgecolor="k", lw=0.5, label=c if (key == "measured" and r["stage"] == 0) else None)
                bottom += v
            ax.text(r["stage"] + dx, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=8)
        ax.plot(r["stage"], r["paper"]["total_bytes"] / 1e3, "k_", ms=30, mew=2,
                label="ZeRO paper formula" if r["stage"] == 0 else None)
    psi, (bp, bg, k) = records[0]["psi"], records[0]["bytes_per_param"]
    ax.set_xticks([0, 1, 2, 3], ["DDP\n(stage 0)", "ZeRO-1\noptimizer", "ZeRO-2\n+ gradients", "ZeRO-3\n+ parameters"])
    ax.set_ylabel("bytes per rank (KB), peak over a step")
    ax.set_title(f"Memory per rank: predicted (hatched, formula + padding + gathered layers) vs measured\n"
                 f"Psi = {psi} parameters, N = {n} ranks, mixed-precision Adam ({bp} + {bg} + K={k} bytes/param)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def plot_stages(path, params=7.5e9, dp=64, optimizer="adam", precision="mixed"):
    """The ZeRO paper's formulas (:func:`minipar.memory.calculate`) for stages 0-3 side by side:
    GB per GPU of weights, gradients and optimizer state, for ``params`` parameters on ``dp`` GPUs."""
    from ..memory import BYTES, CATEGORIES, GB, calculate

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for stage in range(4):
        res, bottom = calculate(params, dp, stage, optimizer, precision), 0.0
        for c in CATEGORIES:
            ax.bar(stage, res[f"{c}_bytes"] / GB, 0.6, bottom=bottom, color=COLORS[c], edgecolor="k", lw=0.5,
                   label=c if stage == 0 else None)
            bottom += res[f"{c}_bytes"] / GB
        ax.text(stage, bottom, f"{bottom:.3g} GB", ha="center", va="bottom", fontsize=8)
    bp, bg, k = BYTES[(optimizer, precision)]
    ax.set_xticks([0, 1, 2, 3], ["DDP\n(stage 0)", "ZeRO-1\noptimizer", "ZeRO-2\n+ gradients", "ZeRO-3\n+ parameters"])
    ax.set_ylabel("GB per GPU (before activations)")
    ax.set_title(f"ZeRO's formulas: Psi = {params:.3g} parameters on N = {dp} GPUs,\n{optimizer} in {precision} "
                 f"precision ({bp} + {bg} + K={k} bytes/param)", fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, path, tight=True)


def plot_traffic(records, path, n=N):
    """Bytes sent per rank per step, in units of Psi x bytes/param, against the ring formulas."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r["engine"] for r in records]
    units = [r["sent"] / (r["psi"] * r["bytes_per_param"]) for r in records]
    ax.bar(range(len(names)), units, color=["#8172B3"] * 2 + ["#4C72B0"] * 2 + ["#C44E52"], edgecolor="k")
    for i, (u, r) in enumerate(zip(units, records)):
        ax.text(i, u, f"{u:.3f} Psi\n({r['sent'] / 1e3:.0f} KB)", ha="center", va="bottom", fontsize=8)
    for f, ls in ((2, "--"), (3, ":")):
        ax.axhline(f * (n - 1) / n, color="k", ls=ls, lw=1, label=f"{f}(N-1)/N Psi = {f * (n - 1) / n:.2f} Psi")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("bytes sent per rank per step (x Psi x bytes/param)")
    ax.set_ylim(0, 3 * (n - 1) / n * 1.3)
    ax.set_title(f"Traffic per rank per step, measured from the trace (N = {n}, Psi = {records[0]['psi']}, float64)\n"
                 "ZeRO-1/2 cost what DDP costs; ZeRO-3 gathers the weights twice: +50%", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save(fig, path)


def plot_overlap(res, path, backend):
    """Two panels (without / with overlap), per rank a compute lane and an all-reduce lane."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax, ov in zip(axes, (False, True)):
        ev = res[ov]["events"]
        step = {e.rank: e for e in ev if e.name == "step"}
        t0 = min(e.t_start for e in step.values())
        ranks = sorted(step)
        for i, r in enumerate(ranks):
            y = 2 * (len(ranks) - 1 - i)
            for e in ev:
                if e.rank != r or e.name == "step" or e.kind not in ("compute", "collective") or e.t_start < step[r].t_start:
                    continue
                lane, color = (y + 1, "#4C72B0" if "forward" in e.name else "#55A868" if "backward" in e.name else "#999999") \
                    if e.kind == "compute" else (y, "#C44E52")
                ax.barh(lane, (e.t_end - e.t_start) * 1e3, left=(e.t_start - t0) * 1e3, height=0.8, color=color,
                        edgecolor="k", lw=0.3, alpha=0.6 if e.kind == "collective" else 1)
        ax.set_yticks([2 * (len(ranks) - 1 - i) + d for i in range(len(ranks)) for d in (1, 0)],
                      [f"rank {r} {lane}" for r in ranks for lane in ("compute", "all-reduce")], fontsize=8)
        ax.set_title(f"{'with' if ov else 'without'} overlap: step {res[ov]['step_time'] * 1e3:.1f} ms (median), "
                     f"all-reduce left after the backward {res[ov]['exposed'] * 1e3:.1f} ms", fontsize=9)
    axes[-1].set_xlabel("time since the step started (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#4C72B0", "#55A868", "#999999", "#C44E52")]
    fig.legend(handles, ["forward", "backward", "update", "bucket all-reduce (ring)"], fontsize=8, loc="lower center", ncol=4)
    fig.suptitle(f"One traced DDP step, buckets of two layers ({backend} backend): overlap starts each bucket's "
                 f"all-reduce inside the backward\nsaved per step: {res['saved'] * 1e3:.1f} ms "
                 f"(exposed communication {res['exposed_saved'] * 1e3:.1f} ms less)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save(fig, path)


def plot_dp_vs_ddp(res, path):
    """Per rank: MB sent + received per step (left) and compute ms (right), DP next to DDP."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    ranks = sorted(res["DP"]["load"])
    x = np.arange(len(ranks))
    for dx, name, color in ((-0.2, "DP", "#C44E52"), (0.2, "DDP", "#4C72B0")):
        load = res[name]["load"]
        sent = np.array([load[r]["sent"] for r in ranks]) / 1e6
        recv = np.array([load[r]["received"] for r in ranks]) / 1e6
        ax1.bar(x + dx, sent, 0.38, color=color, edgecolor="k", label=f"{name} sent")
        ax1.bar(x + dx, recv, 0.38, bottom=sent, color=color, alpha=0.45, edgecolor="k", label=f"{name} received")
        ax2.bar(x + dx, [load[r]["compute"] * 1e3 for r in ranks], 0.38, color=color, edgecolor="k", label=name)
    for ax in (ax1, ax2):
        ax.set_xticks(x, [f"rank {r}" for r in ranks])
        ax.legend(fontsize=8)
    ax1.set_ylabel("MB per step")
    ax1.set_title("bytes moved per rank per step", fontsize=10)
    ax2.set_ylabel("compute time per step (ms, median)")
    ax2.set_title("compute per rank (DP: loss + update on rank 0 only;\nDDP: every rank updates its replica, the work ZeRO-1 shards)",
                  fontsize=9)
    fig.suptitle(f"DP (rank 0 scatters, replicates, gathers) vs DDP (one ring all-reduce), N = {len(ranks)}, "
                 f"Psi = {res['DP']['psi']}, float64\nstep time (median): DP {res['DP']['step_time'] * 1e3:.1f} ms, "
                 f"DDP {res['DDP']['step_time'] * 1e3:.1f} ms", fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def measure(quick=False, overlap_backend=None):
    """Every measurement behind the figures, as one JSON-able dict (events kept for the timeline)."""
    lesson = "minipar.lessons.data_parallel"
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
    backend = overlap_backend or ("torch" if has_torch else "mpi")  # gloo progresses on its own threads
    ov = dict(units=4, width=64, batch=64, steps=3) if quick else {}
    out = {}
    for key, what in (("memory", "memory per rank, ZeRO stages 0-3"), ("traffic", "bytes sent per step, per engine"),
                      ("dp_vs_ddp", "DP vs DDP load")):
        progress(f"{what} on {N} ranks")
        kw = {"memory": dict(units=8, width=66), "traffic": dict(units=4, width=66)}.get(key, {})
        out[key] = launch(N, f"{lesson}:{key}", quiet=True, **kw).results[0]
    progress(f"DDP with and without overlap on 2 ranks ({backend})")
    out["overlap"] = launch(2, f"{lesson}:overlap", backend=backend, quiet=True, **ov).results[0]
    out["overlap_backend"] = backend
    if backend != "mpi":  # the same measurement on MPI, for the numbers
        progress("the same overlap on MPI, for the numbers")
        res = launch(2, f"{lesson}:overlap", quiet=True, **ov).results[0]
        out["overlap_mpi"] = {str(k): {kk: vv for kk, vv in v.items() if kk != "events"} if isinstance(v, dict) else v
                              for k, v in res.items()}
    return out


def make(outdir, quick=False, backend=None, device=None, overlap_backend=None):
    """The four figures (and zero_numbers.json) from fresh runs; ``backend`` picks the one the
    overlap timeline is traced on (memory and traffic are counted on MPI)."""
    os.makedirs(outdir, exist_ok=True)
    m = measure(quick, overlap_backend or backend)
    paths = [plot_memory(m["memory"], os.path.join(outdir, "zero_memory.png")),
             plot_traffic(m["traffic"], os.path.join(outdir, "zero_traffic.png")),
             plot_overlap(m["overlap"], os.path.join(outdir, "ddp_overlap_timeline.png"), m["overlap_backend"]),
             plot_dp_vs_ddp(m["dp_vs_ddp"], os.path.join(outdir, "dp_vs_ddp.png"))]
    numbers = {k: v for k, v in m.items() if k != "overlap"}
    numbers["overlap"] = {str(k): {kk: vv for kk, vv in v.items() if kk != "events"} if isinstance(v, dict) else v
                          for k, v in m["overlap"].items()}
    write_json(os.path.join(outdir, "zero_numbers.json"), numbers, "  wrote", default=float)
    return paths


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
