"""Figures of lesson 7: the planner's view of every configuration of one problem.

    minipar figures --only planning

plan_heatmap.png  predicted TFLOP/s per GPU of the best configuration in each (tp, pp) cell
                  (the rest searched; simulated pipeline); grey cells: nothing fits, with the
                  smallest memory any configuration of the cell needs
plan_memory.png   memory per GPU of the best configuration for each pp: parameters, gradients,
                  optimizer state, activations, stacked, against the GPU's capacity
plan_here.png     lesson 05's trainer on every grid of this machine: measured step time beside
                  the planner's prediction from the measured "this machine" preset, drawn from
                  the recorded run ``docs/planner_here.json`` (``minipar bench plan`` remakes it)

Full figures: GPT-3 175B on 1024 A100 80GB, global batch 1536 (the issue's first example);
``quick`` (the tour): Megatron's 7.5B model on 32 A100s, global batch 256.
"""
from __future__ import annotations

import json
import os

import numpy as np

from . import pyplot, save

HERE_RUN = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "planner_here.json")

FULL = dict(model="gpt3-175b", gpus=1024, batch=1536)
QUICK = dict(model="megatron-7.5b", gpus=32, batch=256)


def cells(model="gpt3-175b", gpus=1024, batch=1536, hardware="a100-80gb", prob=None):
    """{(tp, pp): (row or None, smallest total bytes)} of the search's columns, and the Result
    (of ``prob``, a planner Problem, when given)."""
    from ..plan import Problem, model as get_model, preset
    from ..plan.search import evaluated, simulate_rows

    res = evaluated(prob or Problem(get_model(model), gpus, 8, preset(hardware), batch))
    cfgs, ev, eligible = res.cfgs, res.ev, res.eligible
    out = {}
    for t in np.unique(cfgs.tp[eligible]):
        for p in np.unique(cfgs.pp):
            sel = np.flatnonzero((cfgs.tp == t) & (cfgs.pp == p) & eligible)
            if not len(sel):
                continue
            ok = sel[ev["mem"]["fits"][sel]]
            row = int(ok[np.argmin(ev["estimate"][ok])]) if len(ok) else None
            out[int(t), int(p)] = (row, float(ev["mem"]["total"][sel].min()))
    simulate_rows(res, [r for r, _ in out.values() if r is not None])
    return out, res


def why_pp_needs_more(out, res) -> str:
    """The caption that says why a pp = 1 cell fits where pp = 2 needs several times the memory:
    ZeRO-2/3 shard weights and gradients over dp, and the planner (like Megatron and DeepSpeed's
    pipeline engine) does not combine them with pp > 1."""
    flat = sorted((t, row) for (t, p), (row, _) in out.items() if p == 1 and row is not None)
    example = ""
    if flat:
        t, row = flat[0]
        example = (f" (tp={t}, pp=1 fits in {res.ev['mem']['total'][row] / 1e9:.0f} GB "
                   f"with ZeRO-{int(res.cfgs.zero[row])})")
    return ("grey: nothing in the cell fits; the number is the least memory any of its configurations needs.\n"
            f"With pp = 1, ZeRO-2/3 shard weights, gradients and optimizer state over the dp ranks{example}.\n"
            "ZeRO-2/3 are not combined with pp > 1 (gradients would be reduce-scattered, and ZeRO-3's weights "
            "gathered, once per micro-batch),\nso there a GPU holds its stage's whole weights and gradients: "
            "ZeRO-1 at most.")


def heatmap(out, res, path, title):
    plt = pyplot()

    tps = sorted({t for t, _ in out})
    pps = sorted({p for _, p in out})
    grid = np.full((len(tps), len(pps)), np.nan)
    for (t, p), (row, _) in out.items():
        if row is not None:
            grid[tps.index(t), pps.index(p)] = res.ev["tflops_per_gpu"][row]
    fig, ax = plt.subplots(figsize=(1.1 * len(pps) + 3, 0.8 * len(tps) + 2))
    ax.imshow(np.isnan(grid), cmap="Greys", vmin=0, vmax=3, aspect="auto")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto")
    best = np.nanmax(grid) if np.isfinite(grid).any() else np.nan
    for (t, p), (row, need) in out.items():
        i, j = tps.index(t), pps.index(p)
        if row is None:
            ax.text(j, i, f"needs\n{need / 1e9:.0f} GB", ha="center", va="center", fontsize=7, color="k")
        else:
            v = grid[i, j]
            ax.text(j, i, f"{v:.0f}" + ("\nbest" if v == best else ""), ha="center", va="center", fontsize=8,
                    color="w" if v < 0.8 * best else "k", fontweight="bold" if v == best else None)
    ax.set_xticks(range(len(pps)), [str(p) for p in pps])
    ax.set_yticks(range(len(tps)), [str(t) for t in tps])
    ax.set_xlabel("pipeline-parallel size pp")
    ax.set_ylabel("tensor-parallel size tp")
    fig.colorbar(im, ax=ax, label="predicted TFLOP/s per GPU (executed)")
    ax.set_title(title, fontsize=9)
    fig.text(0.01, 0.01, why_pp_needs_more(out, res), fontsize=8, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return save(fig, path, dpi=120)


def memory_bars(out, res, path, title):
    plt = pyplot()

    mem, prob = res.ev["mem"], res.prob
    by_pp = {}
    for (t, p), (row, _) in out.items():  # the fastest fitting configuration for each pp
        if row is not None and (p not in by_pp or res.ev["step"][row] < res.ev["step"][by_pp[p]]):
            by_pp[p] = row
    rows = [by_pp[p] for p in sorted(by_pp)]
    labels = [res.cfgs.config(r).describe(prob.batch).replace(" zero", "\nzero").replace(" recompute", "\nrecompute")
              for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 5))
    bottom = np.zeros(len(rows))
    for k in ("params", "grads", "optimizer", "activations"):
        vals = np.array([mem[k][r] for r in rows]) / 1e9
        ax.bar(range(len(rows)), vals, bottom=bottom, label=k)
        bottom += vals
    ax.axhline(prob.capacity / 1e9, color="k", ls="--", lw=1, label=f"capacity {prob.capacity / 1e9:.1f} GB")
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.set_ylabel("GB per GPU (worst pipeline rank)")
    return _save(fig, ax, path, title)


def memory_for(path, model="megatron-7.5b", gpus=64, link="infiniband", batch=512, hardware="a100-80gb"):
    """The memory bars of ``model`` on ``gpus`` GPUs (8 per node) whose nodes are joined by ``link``:
    the fastest configuration that fits for each pp (notebook 07's knobs)."""
    from ..plan import Problem, model as get_model, preset

    out, res = cells(prob=Problem(get_model(model), gpus, min(gpus, 8), preset(hardware).with_links(inter=link), batch))
    least = min(need for _, need in out.values())
    fits = any(row is not None for row, _ in out.values())
    return memory_bars(out, res, path, f"{model} on {gpus} x {hardware} ({link} between nodes), global batch {batch}\n"
                                       + ("memory per GPU of the fastest configuration per pp" if fits else
                                          f"NOTHING FITS: the smallest configuration needs {least / 1e9:.0f} GB per GPU"))


def measured_vs_predicted(labels, measured, predicted, path, title, unit="s"):
    """Bars of measured and predicted values side by side, one pair per label."""
    plt = pyplot()

    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(min(12, max(5, 1.1 * len(labels) + 2)), 4))
    ax.bar(x - 0.2, measured, 0.4, label="measured")
    ax.bar(x + 0.2, predicted, 0.4, label="predicted", hatch="//", alpha=0.8)
    ax.set_xticks(x, labels, fontsize=8, rotation=20 if len(labels) < 8 else 40, ha="right")
    ax.set_ylabel(unit)
    return _save(fig, ax, path, title)


def here(path, run=HERE_RUN):
    """Measured vs predicted step time of every grid of the recorded run on this machine."""
    with open(run) as f:
        rec = json.load(f)
    rows = sorted(rec["rows"], key=lambda r: (r["ranks"], r["measured_s"]))
    rho = rec["summary"]["all grids"]["model"]["spearman"]
    load = np.atleast_1d(rec["load_average"])  # [at the start, at the end] (one number in older records)
    near = sum(abs(r["predicted_s"] / r["measured_s"] - 1) <= 0.25 for r in rows)
    return measured_vs_predicted([f"{r['grid']} ({r['ranks']})" for r in rows], [r["measured_s"] for r in rows],
                                 [r["predicted_s"] for r in rows], path,
                                 f"lesson 05's GPT on this machine (load {load.min():.0f}-{load.max():.0f}): s/step per "
                                 f"grid (ranks); {near} of {len(rows)} within 25%, Spearman {rho:.2f}", unit="s per step")


def _save(fig, ax, path, title):
    """Legend and title, then the figure written to ``path`` and closed."""
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return save(fig, path, dpi=120, tight=True)


def make(outdir, quick=False, **_):
    os.makedirs(outdir, exist_ok=True)
    spec = QUICK if quick else FULL
    out, res = cells(**spec)
    what = f"{spec['model']} on {spec['gpus']} x A100 80GB, global batch {spec['batch']}"
    return [heatmap(out, res, os.path.join(outdir, "plan_heatmap.png"),
                    f"best configuration per (tp, pp) cell, predicted: {what}"),
            memory_bars(out, res, os.path.join(outdir, "plan_memory.png"),
                        f"memory per GPU of the fastest configuration per pp: {what}"),
            here(os.path.join(outdir, "plan_here.png"))]
