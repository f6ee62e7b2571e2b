"""The pipeline lesson's synchronous (flush) vs asynchronous (PipeDream) figure: the experiment
behind it and its six panels.

    minipar figures --only pipeline          # with the lesson's other figures
    python -c "from minipar.figures.pipeline_async import make; make('figures')"   # only this one

:func:`experiment` sweeps the learning rate on one process for every scheme
(:func:`minipar.lessons.pipeline_async.sweep`), then runs each scheme at its best lr on p = 2, 4
and 8 real ranks (:func:`minipar.lessons.pipeline_async.measure`): loss curves, staleness,
memory counted per rank, speed and bubble. ``make`` writes its numbers to ``pipeline_async.json``
beside ``pipeline_async.png`` (the numbers of docs/pipeline_sync_async.md).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..lessons.common import rel_error
from ..lessons.pipeline_async import LRS, SCHEMES, TASK, best, best_lrs, sweep
from ..records import write_json
from . import progress, pyplot, save


def experiment(quick=False, ps=(2, 4, 8), backend="mpi", device=None, say=print) -> dict:
    """The sweep (one process), then on p = 2, 4, 8 real ranks each scheme at its best lr
    (:func:`~minipar.lessons.pipeline_async.measure`), whose loss curves must equal the sweep's. What the figure
    ``pipeline_async.png`` and docs/pipeline_sync_async.md show; JSON-ready."""
    from ..launcher import launch

    if quick:                               # seconds, for the tour: 4 ranks only, a short stream
        ps, n_micro, seeds, lrs = (4,), 40, (0,), (0.4, 1.6)
        speed_kw = dict(n_micro=8, m=4, width=64, b=16, repeats=1)
    else:
        n_micro, seeds, lrs, speed_kw = 1000, (0, 1, 2), LRS, {}
    say(f"sync vs async sweep: {len(SCHEMES)} schemes, p = {ps}, lr = {lrs}, seeds {seeds}, {n_micro} "
        f"micro-batches each, one process")
    t0 = time.perf_counter()
    rows = sweep(ps, lrs, seeds, n_micro)
    curve = {(r["scheme"], r["p"], r["lr"]): r.pop("curve") for r in rows if "curve" in r}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    top = best(rows)
    out = {"task": dict(TASK), "n_micro": n_micro, "seeds": list(seeds), "lrs": list(lrs),
           "sweep_seconds": time.perf_counter() - t0, "sweep": rows,
           "best": [{"scheme": s, "p": p, **v} for (s, p), v in top.items()],
           "sequential_curve": curve[("sequential", None, top[("sequential", None)]["lr"])], "runs": [],
           "machine": f"{os.cpu_count()} cores, load average {load:.1f} when the runs started"}
    for p in ps:
        say(f"sync vs async on {p} ranks: each scheme at its best lr, staleness, memory, speed")
        run = launch(p, "minipar.lessons.pipeline_async:measure", backend=backend, device=device, quiet=True,
                     lrs=best_lrs(rows, p), n_micro=n_micro, seed=seeds[0], speed_kw=speed_kw).results[0]
        run["vs_dense"] = {s: rel_error(np.array(c), np.array(curve[(s, None if s == "flush" else p, run["lrs"][s])]))
                           for s, c in run["curves"].items()}
        out["runs"].append(run)
    return out


ASYNC_STYLE = {"flush": ("#4C72B0", "flush 1F1B (= one device, one update per m micro-batches)"),
               "sequential": ("#888888", "one device, one update per micro-batch (no staleness)"),
               "nostash": ("#C44E52", "PipeDream, no weight stashing"),
               "stash": ("#DD8452", "PipeDream, weight stashing")}
P_MARKERS = {2: "o", 4: "s", 8: "^"}
LEGEND = 9  # the legends' font size: readable beside the panels' own text


def _smooth(ys, k=10):
    """Running mean over k points (the first k-1 average what exists): for reading noisy curves."""
    c = np.cumsum(np.insert(np.asarray(ys, dtype=float), 0, 0.0))
    n = np.arange(1, len(ys) + 1)
    lo = np.maximum(n - k, 0)
    return (c[n] - c[lo]) / (n - lo)


def plot_sync_vs_async(path, data):
    """Six panels from :func:`experiment`'s ``data``: the
    learning-rate sweep, the loss curves at each scheme's best lr, staleness per stage, best
    loss vs p, bytes held per rank (counted), and speed with the bubble (measured)."""
    plt = pyplot()
    task, runs = data["task"], sorted(data["runs"], key=lambda r: r["p"])
    m, ps = task["m"], [r["p"] for r in runs]
    fig, ax = plt.subplots(2, 3, figsize=(20, 12))
    (a_lr, a_curve, a_stale), (a_p, a_mem, a_speed) = ax

    # 1. final held-out loss vs lr, mean over seeds; diverged runs left out. The asynchronous
    # schemes at the largest p only: every p's best is panel 4
    finals = {}
    for r in data["sweep"]:
        if r["p"] in (None, max(ps)):
            finals.setdefault((r["scheme"], r["p"]), {}).setdefault(r["lr"], []).append(r["final"])
    for (scheme, p), by_lr in sorted(finals.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        lrs = [lr for lr in sorted(by_lr) if np.isfinite(np.mean(by_lr[lr]))]
        color, label = ASYNC_STYLE[scheme]
        a_lr.plot(lrs, [np.mean(by_lr[lr]) for lr in lrs], color=color, marker=P_MARKERS.get(p, "D"),
                  lw=1.5, linestyle="-" if p is None else "--", label=f"{scheme}" + (f", p={p}" if p else ""))
    a_lr.set_xscale("log", base=2)
    a_lr.set_yscale("log")
    a_lr.set_xlabel(f"lr per micro-batch (the flush steps with {m} x lr on {m} micro-batches)")
    a_lr.set_ylabel("held-out loss after the run (mean over seeds)")
    a_lr.set_title(f"Learning-rate sweep, {data['n_micro']} micro-batches each, p = {max(ps)}\n"
                   "(missing points diverged; every p's best: the panel below)", fontsize=10)
    a_lr.legend(fontsize=LEGEND)

    # 2. loss curves on real ranks at each scheme's best lr, largest p
    big = runs[-1]
    steps = np.arange(1, len(data["sequential_curve"]) + 1) * m
    best = {(b["scheme"], b["p"]): b for b in data["best"]}
    a_curve.plot(steps, _smooth(data["sequential_curve"]), color=ASYNC_STYLE["sequential"][0], ls="--",
                 label=f"sequential (one process), lr={best[('sequential', None)]['lr']:g}")
    for scheme in ("flush", "nostash", "stash"):
        ys = big["curves"][scheme]
        a_curve.plot(np.arange(1, len(ys) + 1) * m, _smooth(ys), color=ASYNC_STYLE[scheme][0],
                     label=f"{scheme} on {big['p']} ranks, lr={big['lrs'][scheme]:g}")
    a_curve.set_yscale("log")
    a_curve.set_xlabel("micro-batches seen")
    a_curve.set_ylabel("training loss (running mean of 10 steps)")
    exact = "bitwise" if max(big["vs_dense"]["nostash"], big["vs_dense"]["stash"]) == 0 else "NOT bitwise"
    a_curve.set_title(f"Each at its best lr on {big['p']} real ranks; vs the sweep's one-process runs:\n"
                      f"PipeDream {exact}, flush {big['vs_dense']['flush']:.0e} (summation order, grown over "
                      f"{len(big['curves']['flush'])} steps)", fontsize=10)
    a_curve.legend(fontsize=LEGEND)

    # 3. staleness counted per stage
    for r in runs:
        st = r["staleness"]["stash"]
        s = np.arange(len(st))
        a_stale.plot(s, [x["max"] for x in st], marker=P_MARKERS.get(r["p"], "D"), color="#DD8452",
                     label=f"p={r['p']}: counted (largest)")
        a_stale.plot(s, [x["mean"] for x in st], marker=P_MARKERS.get(r["p"], "D"), color="#DD8452", ls="none",
                     mfc="none", alpha=0.6)
        a_stale.plot(s, r["p"] - 1 - s, color="black", lw=0.8, ls=":")
    a_stale.plot([], [], color="black", lw=0.8, ls=":", label="p - 1 - s")
    a_stale.plot([], [], color="#DD8452", marker="o", mfc="none", ls="none", label="mean (warm-up is fresher)")
    a_stale.set_xlabel("stage s")
    a_stale.set_ylabel("updates between a forward and its backward")
    a_stale.set_title("Staleness, counted on every backward", fontsize=10)
    a_stale.legend(fontsize=LEGEND)

    # 4. best loss vs p
    for scheme in ("flush", "sequential", "nostash", "stash"):
        color = ASYNC_STYLE[scheme][0]
        if scheme in ("flush", "sequential"):
            b = best[(scheme, None)]
            a_p.axhline(b["loss"], color=color, ls="--" if scheme == "sequential" else "-",
                        label=f"{scheme} (any p), lr={b['lr']:g}")
            a_p.axhspan(b["low"], b["high"], color=color, alpha=0.1)
        else:
            bs = [best[(scheme, p)] for p in ps]
            a_p.errorbar(ps, [b["loss"] for b in bs], yerr=[[b["loss"] - b["low"] for b in bs],
                                                           [b["high"] - b["loss"] for b in bs]],
                         color=color, marker="o", capsize=3, label=f"{scheme}")
            for p, b in zip(ps, bs):
                a_p.annotate(f"lr {b['lr']:g}", (p, b["loss"]), fontsize=8, xytext=(6, 4), textcoords="offset points")
    a_p.set_xscale("log", base=2)
    a_p.set_xticks(ps, [str(p) for p in ps])
    a_p.set_xlabel("pipeline stages p (the same 8 layers)")
    a_p.set_ylabel("best held-out loss (mean; bars: seed range)")
    a_p.set_title(f"Best loss over the sweep vs p ({len(data['seeds'])} seeds)", fontsize=10)
    a_p.legend(fontsize=LEGEND)

    # 5. bytes held at the peak, counted, on the rank that holds the most (stage 0)
    from matplotlib.patches import Patch

    colors = {"gpipe": "#8172B3", "1f1b": ASYNC_STYLE["flush"][0], "nostash": ASYNC_STYLE["nostash"][0],
              "stash": ASYNC_STYLE["stash"][0]}
    parts = (("weights", "", 1.0), ("grads", "", 0.6), ("stash", "///", 0.9), ("activations", "..", 0.35))
    width = 0.2
    for k, scheme in enumerate(colors):
        for j, r in enumerate(runs):
            c, f = r["memory"][0][scheme]["counted"], r["memory"][0][scheme]["formula"]
            x, bottom = j + (k - 1.5) * width, 0
            for part, hatch, alpha in parts:
                a_mem.bar(x, c[part] / 1024, width, bottom=bottom / 1024, color=colors[scheme], alpha=alpha,
                          hatch=hatch, edgecolor="white", lw=0.5)
                bottom += c[part]
            a_mem.plot([x - width / 2, x + width / 2], [f["total"] / 1024] * 2, color="black", lw=1.5)
    handles = [Patch(color=c, label={"gpipe": "GPipe flush", "1f1b": "1F1B flush"}.get(k, f"PipeDream {k}"))
               for k, c in colors.items()]
    handles += [Patch(facecolor="#999999", alpha=a, hatch=h, edgecolor="white", label=part) for part, h, a in parts]
    handles.append(plt.Line2D([], [], color="black", lw=1.5, label="formula (total)"))
    a_mem.legend(handles=handles, fontsize=LEGEND, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    a_mem.set_xticks(range(len(runs)), [f"p={p}" for p in ps])
    a_mem.set_ylabel("KiB held by stage 0 at its peak")
    a_mem.set_title(f"Memory of stage 0 (the most loaded), counted from its arrays\n"
                    f"flushes every m={m} micro-batches of b={task['b']} rows, width {task['width']}", fontsize=10)

    # 6. speed
    for k, scheme in enumerate(("flush", "nostash", "stash")):
        xs = np.arange(len(runs)) + (k - 1) * 0.27
        per_s = [r["speed"][scheme]["per_s"] for r in runs]
        bars = a_speed.bar(xs, per_s, 0.27, color=ASYNC_STYLE[scheme][0], label=scheme)
        a_speed.bar_label(bars, [f"{r['speed'][scheme]['bubble']:.0%}" for r in runs], fontsize=8)
        a_speed.plot(xs, [r["speed"][scheme]["sim_per_s"] for r in runs], ls="none", marker="_", ms=14,
                     mew=2, color="black")
    a_speed.plot([], [], ls="none", marker="_", ms=14, mew=2, color="black",
                 label="simulated with the measured costs")
    a_speed.set_yscale("log")
    a_speed.set_xticks(range(len(runs)), [f"p={p}" for p in ps])
    sp = runs[0]["speed"]["config"]
    a_speed.set_ylabel("micro-batches per second (log)")
    a_speed.set_title(f"Speed, measured (label: bubble); width {sp['width']}, b={sp['b']}, flush m={sp['m']}\n"
                      f"{data.get('machine', '')}", fontsize=10)
    a_speed.legend(fontsize=LEGEND)

    fig.suptitle("Synchronous (flush) vs asynchronous (PipeDream) pipelines: convergence, staleness, memory, speed",
                 fontsize=12)
    fig.tight_layout()
    return save(fig, path)


def make(outdir, quick=False, backend="mpi", device=None):
    """Run :func:`experiment`, store its numbers in ``pipeline_async.json`` and draw
    ``pipeline_async.png``."""
    os.makedirs(outdir, exist_ok=True)
    data = experiment(quick=quick, backend=backend, device=device, say=progress)
    write_json(os.path.join(outdir, "pipeline_async.json"), data, "  wrote", allow_nan=True)
    return [plot_sync_vs_async(os.path.join(outdir, "pipeline_async.png"), data)]
