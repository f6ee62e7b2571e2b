"""Figures of lesson 1: the ring all-reduce step by step, and busbw vs message size.

    minipar figures --only collectives
"""
from __future__ import annotations

import os

import numpy as np

from .. import costmodel as M
from ..bench import collectives as B
from ..launcher import launch
from . import progress, pyplot, save


def plot_ring_steps(path, walk, title="Ring all-reduce on 4 ranks, step by step"):
    """One row per step (start, reduce-scatter steps, all-gather steps), one panel per rank.

    Each cell is one element of that rank's buffer; colour = which chunk it belongs to; a thick
    frame marks the chunk the rank has just received.
    """
    plt = pyplot()

    p, bounds = len(walk), walk[0]["bounds"]
    n = len(walk[0]["input"])
    steps = [("start", -1, None, None, None)] + walk[0]["steps"]
    chunk_of = np.zeros(n, int)
    for c, (a, b) in enumerate(bounds):
        chunk_of[a:b] = c
    colours = plt.get_cmap("Pastel1")(np.arange(p))
    fig, axes = plt.subplots(1, p, figsize=(2.3 * p + 1, 0.55 * len(steps) + 1.6), sharey=True)
    for r, ax in enumerate(axes):
        rows = [walk[r]["input"]] + [s[4] for s in walk[r]["steps"]]
        for i, (row, st) in enumerate(zip(rows, [None] + walk[r]["steps"])):
            got = st[3] if st else None
            for j, val in enumerate(row):
                ax.add_patch(plt.Rectangle((j, i), 1, 1, fc=colours[chunk_of[j]],
                                           ec="k", lw=2.2 if got is not None and chunk_of[j] == got else 0.4))
                ax.text(j + 0.5, i + 0.5, f"{val:g}", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, n)
        ax.set_ylim(len(rows), 0)
        ax.set_title(f"rank {r}")
        ax.set_xticks(np.arange(n) + 0.5, [f"c{c}" for c in chunk_of], fontsize=7)
        ax.set_xlabel("buffer element (chunk)")
    labels = ["input"] + [f"{ph} {s + 1}" for ph, s, *_ in steps[1:]]
    axes[0].set_yticks(np.arange(len(labels)) + 0.5, labels, fontsize=8)
    fig.suptitle(title + "\n(thick frame: the chunk received in that step; after reduce-scatter rank r owns chunk r)")
    fig.tight_layout()
    return save(fig, path)


def plot_busbw(result, path):
    """busbw vs size from a :func:`minipar.bench.collectives.run` result: one line per algorithm,
    builtin dashed, the ring model dotted."""
    plt = pyplot()

    recs, p = result["records"], result["ranks"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for alg in sorted({r["algorithm"] for r in recs}, key=B.ALGS.index):
        rs = [r for r in recs if r["algorithm"] == alg]
        ax.plot([r["bytes"] for r in rs], [r["busbw_gbs"] for r in rs], marker="o", ms=3,
                ls="--" if alg == "builtin" else "-", lw=2 if alg in ("builtin", "ring") else 1.2,
                label=f"{alg} (MPI's own)" if alg == "builtin" else alg)
    sizes = sorted({r["bytes"] for r in recs})
    model = [M.busbw("all_reduce", b, M.allreduce_time("ring", b, p, result["alpha"], result["beta"], result["gamma"]), p) / 1e9
             for b in sizes]
    ax.plot(sizes, model, ls=":", color="k", label="ring, alpha-beta-gamma model")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"All-reduce bus bandwidth on {p} ranks: from-scratch algorithms vs the builtin\n"
                 f"(fit: alpha = {result['alpha'] * 1e6:.1f} us, 1/beta = {1 / result['beta'] / 1e9 if result['beta'] else float('inf'):.2f} GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, dpi=120)


def make(outdir, quick=False, backend="mpi", device=None):
    """Run the walkthrough and the all-reduce benchmark on 4 ranks and draw both figures."""
    os.makedirs(outdir, exist_ok=True)
    progress("ring all-reduce walkthrough on 4 ranks")
    walk = launch(4, "minipar.lessons.collectives:ring_walkthrough", backend=backend, device=device, quiet=True, n=8).results
    paths = [plot_ring_steps(os.path.join(outdir, "collectives_ring_steps.png"), walk)]
    sizes = [8 * 8**k for k in range(7)] + [4 << 20] if quick else None
    progress(f"all-reduce benchmark on 4 ranks, {len(sizes) if sizes else len(B.DEFAULT_SIZES)} sizes")
    res = launch(4, "minipar.bench.collectives:run", backend=backend, device=device, quiet=True,
                 sizes=sizes, budget=0.02 if quick else 0.3, verbose=False).results[0]
    paths.append(plot_busbw(res, os.path.join(outdir, "collectives_busbw.png")))
    return paths
