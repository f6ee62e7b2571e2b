"""Figures of lesson 5's trainer features: mixed precision, gradient clipping, dropout, each
drawn from its own run and checked.

    minipar figures --into figures --only 05        # or: python -m minipar.figures.train_features figures/
    out = launch(8, "minipar.figures.train_features:clip_runs", steps=3)     # a run alone
    rows = merge_rows([r["rows"] for r in out.results]); data = out.results[0]

    train_precision_curves.png    dp2 pp2 tp2 at fp64, fp32, bf16 and fp16 over one process at each
                                  (:func:`precision_runs`; checked: every step's loss to u against
                                  one process at the same precision)
    train_clip_norms.png          the global gradient norm per step of dp2 pp2 tp2 over one process's,
                                  and of each planted bug of the count (:func:`clip_runs`; checked:
                                  the grid's to 1e-12, every bug's differs)
    train_dropout_masks.png       one dropout site's mask in one process, on 4 TP ranks side by side,
                                  and with one seed shared inside the TP region (:func:`dropout_tiles`;
                                  checked: the shards tile one process's mask bit for bit, the
                                  shared seed's do not)

``--quick`` (the tour): 3 steps of random tokens for the precisions, 2 steps of dp2 tp2 with two
bugs for the norm. Every run's checks must pass (a failing one is printed and stops the figures).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..lessons.train import first_ranks, label, row, wait_politely
from ..mixed_precision import PRECISIONS
from . import DEFAULT_OUT, pyplot, save
from .train import N, checked_run, grid_config

PRECISION_COLORS = {"fp64": "#222222", "fp32": "#4C72B0", "bf16": "#DD8452", "fp16": "#55A868"}


def precision_runs(comm, steps=12, grid=(2, 2, 2, "1f1b", False), data="sorting"):
    """Rank side: the grid ``grid`` trained ``steps`` steps at every precision, each checked
    against one process at the same precision (every step's loss, the tolerance of
    ``train.precision.tolerances``; tests/test_train_precision.py checks the rest). Returns
    {"rows"} and on world rank 0 also "curves" {precision: (grid losses, one-process losses)}."""
    from ..lessons.common import rel_error
    from ..train.precision import tolerances
    from ..train.reference import train_dense
    from ..train.trainer import train

    dp, pp, tp, schedule, sp = grid
    rows, curves = [], {}
    for p in PRECISIONS:
        cfg = grid_config(dp, pp, tp, schedule, sp, steps, data=data).with_(precision=p)
        ref, _ = train_dense(cfg)
        sub = first_ranks(comm, dp * pp * tp, f"precision-{p}")
        if sub is not None:
            _, losses, _ = train(sub, cfg)
            curves[p] = (losses, ref)
            rows.append(row(f"{label(cfg)}: losses of {steps} steps = one process at {p}",
                            rel_error(np.array(losses), np.array(ref)), tolerances(cfg)[0]))
        wait_politely(comm)
    out = {"rows": rows}
    if comm.rank == 0:
        out["curves"] = curves
    return out


def plot_precision(data, path):
    """Loss per step at each precision, the grid over one process at the same precision; below,
    each one's relative difference from one float64 process, with the tolerance 2u."""
    from ..train.precision import UNIT_ROUNDOFF

    plt = pyplot()
    curves = data["curves"]
    f64 = np.array(curves["fp64"][1])
    steps = np.arange(1, len(f64) + 1)
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for p, (grid, one) in curves.items():
        c = PRECISION_COLORS[p]
        ax.plot(steps, one, "-", color=c, lw=5, alpha=0.25)
        ax.plot(steps, grid, "o", color=c, ms=4, label=f"{p}: dp2 pp2 tp2 (dots) over one process (band)")
        err = np.abs(np.array(grid) - f64) / np.abs(f64)
        dx.semilogy(steps, np.maximum(err, 1e-17), "o-", color=c, ms=4, lw=0.8, label=p)
        if p in ("bf16", "fp16"):
            dx.axhline(2 * UNIT_ROUNDOFF[p], color=c, ls="--", lw=1)
            dx.text(steps[-1], 2 * UNIT_ROUNDOFF[p], f" 2u ({p})", color=c, fontsize=7, va="bottom", ha="right")
    ax.set_ylabel("loss (global batch, the sorting task)")
    ax.legend(fontsize=7)
    dx.set_ylabel("relative difference\nfrom one float64 process")
    dx.set_xlabel("step")
    dx.set_xticks(steps)
    dx.set_ylim(5e-18, 1)
    dx.legend(fontsize=7, loc="lower right", ncol=4)
    fig.suptitle("Mixed precision on dp2 pp2 tp2: 16-bit weights and activations, float32 gradients and master "
                 "weights\n(each precision equals one process computing the same way; the 16-bit ones stay within "
                 f"2u of float64 over these {len(steps)} steps)", fontsize=10)
    return save(fig, path, tight=True)


CLIP_BUGS = ("clip_replicated_per_tp", "clip_tied_twice", "clip_every_replica")  # minipar.train.mutants


def clip_runs(comm, steps=3, grid=(2, 2, 2, "1f1b", False), clip=0.5, bugs=CLIP_BUGS, data="random"):
    """Rank side: ``grid`` trained ``steps`` steps with ``--clip clip``, every step's global
    gradient norm against one process's (1e-12), then once with each planted bug of the norm
    (``minipar.train.mutants``), which must give another norm. Returns {"rows"} and on world rank
    0 also "norms" {"one process" | "the grid" | bug: the norm of every step, before clipping},
    "clip", "grid" (its label)."""
    from ..lessons.common import rel_error
    from ..train.mutants import planted
    from ..train.reference import train_dense
    from ..train.trainer import train

    dp, pp, tp, schedule, sp = grid
    cfg = grid_config(dp, pp, tp, schedule, sp, steps, data=data).with_(clip=clip)
    ref = []
    train_dense(cfg, norms=ref)
    rows, norms = [], {"one process": ref}
    sub = first_ranks(comm, dp * pp * tp, "clip")
    if sub is not None:
        for bug in (None,) + tuple(bugs):
            with planted(bug):
                tr, _, _ = train(sub, cfg)
            err = rel_error(np.array(tr.grad_norms), np.array(ref))
            if bug is None:
                norms["the grid"] = tr.grad_norms
                rows.append(row(f"{label(cfg)}: global gradient norm of {steps} steps = one process's", err, 1e-12))
            else:
                norms[bug] = tr.grad_norms
                rows.append(row(f"planted bug {bug}: its norm ({tr.grad_norms[0]:.4g} at step 0, one process "
                                f"{ref[0]:.4g}) is caught by that check", 0.0 if err > 1e-12 else 1.0, 0.0))
    wait_politely(comm)
    return dict(rows=rows, **(dict(norms=norms, clip=clip, grid=label(cfg)) if comm.rank == 0 else {}))


def plot_clip(data, path):
    """The global gradient norm per step: one process, the grid (each parameter counted once) and
    each planted bug of the count, with the clipping threshold."""
    plt = pyplot()
    norms = data["norms"]
    steps = np.arange(len(norms["one process"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, norms["one process"], "-", color="#222222", lw=6, alpha=0.25, label="one process")
    ax.plot(steps, norms["the grid"], "o", color="#4C72B0", label=f"{data['grid']} (every parameter once)")
    for bug, c in zip(CLIP_BUGS, ("#C44E52", "#E69F00", "#8172B3")):
        if bug in norms:
            ax.plot(steps, norms[bug], "s--", color=c, ms=5, lw=1, label=f"planted bug: {bug}")
    ax.axhline(data["clip"], color="gray", ls=":", lw=1)
    ax.text(steps[-1], data["clip"], f" --clip {data['clip']}", color="gray", fontsize=8, va="bottom", ha="right")
    ax.set_xlabel("step")
    ax.set_xticks(steps)
    ax.set_ylabel("global gradient norm, before clipping")
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    ax.set_title("Gradient clipping on a grid: the norm of one process only when every parameter is counted once",
                 fontsize=10)
    return save(fig, path, tight=True)


def dropout_tiles(T=8, H=32, tp=4, p=0.5, key=(0, 0, 1, 2), row_index=0):
    """The keep mask of one dropout site inside a TP region (the MLP's hidden layer: key (seed,
    step, layer, site) with site 2), global row ``row_index``, drawn by ``nn.dropout.keep_mask``
    for the whole (T, H) in one process and for each of ``tp`` column shards, and as Megatron's
    shared seed inside the TP region draws it (each shard at columns 0 ... H/tp, the draw of the
    planted bug ``dropout_shared_in_tp``). Returns {"full", "shards", "shared", "rows"}; the
    rows check that the shards tile the full mask bit for bit and that the shared seed's do not."""
    from ..nn.dropout import keep_mask
    from ..xp import chunk_bounds

    rows = np.array([row_index])
    full = keep_mask(key, rows, (T, H), None, None, p)[0]  # (T, H)
    bounds = chunk_bounds(H, tp)
    shards = [keep_mask(key, rows, (T, H), None, c, p)[0] for c in bounds]  # tp x (T, H/tp)
    shared = [keep_mask(key, rows, (T, H), None, (0, hi - lo), p)[0] for lo, hi in bounds]
    tiled = np.concatenate(shards, axis=1)
    out = [row(f"dropout: the {tp} TP ranks' masks of a ({T}, {H}) site, side by side = one process's mask "
               f"(bitwise)", 0.0 if np.array_equal(tiled, full) else 1.0, 0.0),
           row(f"planted bug dropout_shared_in_tp (one seed inside the TP region): its {tp} shards "
               f"{'identical' if all(np.array_equal(s, shared[0]) for s in shared) else 'differ'}, and differ from one "
               f"process's mask: caught", 0.0 if not np.array_equal(np.concatenate(shared, axis=1), full) else 1.0, 0.0)]
    return dict(full=full, shards=shards, shared=shared, p=p, rows=out)


def plot_dropout(data, path):
    """Three masks of the same site (black: dropped): one process; the TP ranks' shards side by
    side, which tile it; one seed shared inside the TP region, every shard the same."""
    plt = pyplot()
    full, shards, shared = data["full"], data["shards"], data["shared"]
    tp = len(shards)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    panels = [(full, "one process: the whole hidden layer"),
              (np.concatenate(shards, axis=1), f"{tp} TP ranks, each its columns (keep_mask at the global index)"),
              (np.concatenate(shared, axis=1), f"{tp} TP ranks, one seed shared inside the TP region (bug)")]
    for ax, (m, title) in zip(axes, panels):
        ax.imshow(m, cmap="gray", vmin=0, vmax=1, interpolation="nearest", aspect="auto")
        w = m.shape[1] // tp
        if m is not full:
            for k in range(1, tp):
                ax.axvline(k * w - 0.5, color="#C44E52", lw=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("hidden feature (column)")
        ax.set_yticks([])
    axes[0].set_ylabel("position")
    fig.suptitle(f"Dropout p = {data['p']}, one row of the global batch: white kept, black dropped; red lines: the "
                 f"TP shards' boundaries", fontsize=10)
    return save(fig, path, tight=True)


def make(outdir, quick=False, backend="mpi", device=None):
    from . import progress

    os.makedirs(outdir, exist_ok=True)
    j = lambda name: os.path.join(outdir, name)  # noqa: E731
    progress("dp2 pp2 tp2 at fp64, fp32, bf16 and fp16 against one process at each")
    _, data = checked_run("minipar.figures.train_features:precision_runs", N, "precision", backend, device,
                          **(dict(steps=3, data="random") if quick else {}))
    out = [plot_precision(data, j("train_precision_curves.png"))]
    quick_clip = dict(steps=2, grid=(2, 1, 2, "1f1b", False), bugs=CLIP_BUGS[::2])  # tp2: replicated, dp2: replicas
    progress("the global gradient norm on a grid against one process, and each planted bug of its count")
    _, data = checked_run("minipar.figures.train_features:clip_runs", 4 if quick else N, "clipping", backend, device,
                          **(quick_clip if quick else {}))
    out.append(plot_clip(data, j("train_clip_norms.png")))
    data = dropout_tiles()
    bad = [r for r in data["rows"] if not r["ok"]]
    if bad:
        raise RuntimeError(f"lesson 05's dropout masks: {bad[0]['what']} failed")
    out.append(plot_dropout(data, j("train_dropout_masks.png")))
    return out


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
