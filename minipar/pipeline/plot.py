"""Pictures of pipeline schedules: timelines (Gantt), bubble curves, activation memory.

    python -c "from minipar.pipeline.plot import plot_schedules; plot_schedules('figures/pipeline_schedules.png')"

matplotlib is imported inside each function (Agg backend), so ``import minipar.pipeline``
stays light.  Costs: F = 1, B = 2 (I = W = 1 for zb-h1), i.e. time is counted in units of
one forward pass of one rank's share of the model on one micro-batch.
"""
from __future__ import annotations

from .schedules import gpipe, make_schedule, one_f_one_b
from .simulate import simulate, theory_bubble_fraction

__all__ = ["plot_timeline", "save_timeline", "plot_schedules",
           "plot_bubble_vs_microbatches", "plot_inflight_memory", "plot_measured_vs_simulated",
           "plot_sync_vs_async"]

COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}
LABELS = {"F": "F: forward", "B": "B: backward (full)", "I": "I: backward, input grad",
          "W": "W: backward, weight grad"}
TIME_LABEL = "time (units of one forward pass of one micro-batch)"
NAMES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def unit_costs(name: str):
    """The costs every figure uses: F=1, B=2, split as I=W=1 (same total work everywhere)."""
    return {"F": 1, "I": 1, "W": 1} if name == "zb-h1" else {"F": 1, "B": 2}


def plot_timeline(ax, sim_result, title: str | None = None):
    """Gantt chart of one simulated schedule on ``ax``: one row per rank (rank 0 on top),
    one box per action coloured by kind with its micro-batch number inside, bubbles empty.
    With v chunks per rank, later chunks are drawn lighter."""
    from matplotlib.patches import Patch

    sched = sim_result.schedule
    p, v = sched.ranks, sched.chunks
    T = float(sim_result.makespan)
    for r in range(p):   # light grey lane: whatever stays grey is a bubble (idle rank)
        ax.broken_barh([(0, T)], (r - 0.4, 0.8), facecolor="#EEEEEE", edgecolor="none")
    for e in sim_result.events:
        start, width = float(e.start), float(e.end - e.start)
        chunk = e.action.stage // p
        alpha = 1.0 - 0.45 * chunk / max(v - 1, 1) if v > 1 else 1.0
        ax.broken_barh([(start, width)], (e.rank - 0.4, 0.8), facecolor=COLORS[e.action.kind],
                       edgecolor="white", linewidth=0.6, alpha=alpha)
        if width >= 0.3:
            ax.text(start + width / 2, e.rank, str(e.action.microbatch), ha="center",
                    va="center", fontsize=7 if width >= 0.6 else 5, color="white")
    ax.set_ylim(p - 0.5, -0.5)                     # rank 0 at the top
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_xlim(0, T)
    ax.set_xlabel(TIME_LABEL)
    ax.set_ylabel("pipeline rank")
    kinds = sorted({e.action.kind for e in sim_result.events}, key="FBIW".index)
    handles = [Patch(color=COLORS[k], label=LABELS[k]) for k in kinds]
    handles.append(Patch(facecolor="#EEEEEE", edgecolor="#BBBBBB", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7,
              frameon=False, title="box = micro-batch" + ("\nlighter = later chunk" if v > 1 else ""),
              title_fontsize=7)
    if title is None:
        title = f"{sched.name}: p={p}, m={sched.microbatches}" + (f", v={v}" if v > 1 else "")
        title += f"  —  bubble {float(sim_result.bubble_fraction):.1%}"
    ax.set_title(title, fontsize=9, loc="left")
    return ax


def save_timeline(path, sim_result, title: str | None = None):
    """One timeline in its own figure file (used by ``minipar schedule --plot``)."""
    plt = _pyplot()
    width = min(18, 4 + 0.25 * float(sim_result.makespan))
    fig, ax = plt.subplots(figsize=(width, 0.5 * sim_result.schedule.ranks + 1.6))
    plot_timeline(ax, sim_result, title)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_schedules(path, p: int = 4, m: int = 8, v: int = 2):
    """One timeline per schedule, stacked on a shared time axis, each titled with its
    simulated bubble. The naive run pushes the whole batch (m micro-batches' worth of work)
    through at once; it runs far past the others and is cut off at their end."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(NAMES), 1, figsize=(15, len(NAMES) * (0.42 * p + 1.1)),
                             sharex=True)
    ends = []
    for ax, name in zip(axes, NAMES):
        sched = make_schedule(name, p, m, v)
        costs = unit_costs(name)
        if name == "naive":   # same work as the others: one batch = m micro-batches
            costs = {k: m * c for k, c in costs.items()}
        sim = simulate(sched, costs)
        extra = {"naive": f" (whole batch as one; ends at t={float(sim.makespan):g}, cut off)",
                 "interleaved": f", v={v} chunks per rank",
                 "zb-h1": " (B split into I + W)"}.get(name, "")
        plot_timeline(ax, sim, f"{name}{extra}: p={p}, m={sched.microbatches} — simulated "
                               f"bubble {float(sim.bubble_fraction):.1%}")
        if name != "naive":
            ends.append(float(sim.makespan))
        if ax is not axes[-1]:
            ax.set_xlabel("")
    axes[-1].set_xlim(0, max(ends))               # shared: applies to every timeline
    fig.suptitle(f"Pipeline schedules on {p} ranks, {m} micro-batches (F=1, B=I+W=2); "
                 f"grey = idle rank (bubble)")
    fig.subplots_adjust(left=0.07, right=0.83, top=0.93, bottom=0.06, hspace=0.5)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_bubble_vs_microbatches(path, p: int = 4, ms=(1, 2, 4, 8, 16, 32), v: int = 2,
                                measured=None):
    """Bubble fraction against the number of micro-batches m: theory as lines, simulation as
    markers, optional measured runs ``{schedule: [(m, bubble), ...]}`` as crosses."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    grid = range(1, max(ms) + 1)
    style = {"naive": ("#888888", "s"), "gpipe": ("#4C72B0", "o"), "1f1b": ("#DD8452", "D"),
             "interleaved": ("#8172B3", "^"), "zb-h1": ("#55A868", "v")}
    for name in NAMES:
        color, marker = style[name]
        theory_ms = [k for k in grid if (name != "interleaved" or k % p == 0)
                     and (name != "zb-h1" or k >= p)]     # ZB-H1's formula needs m >= p
        label = {"gpipe": "gpipe = 1f1b", "1f1b": None}.get(name, name)
        if name == "interleaved":
            label = f"interleaved (v={v})"
        if name != "1f1b":    # gpipe and 1f1b share one theory line
            ax.plot(theory_ms, [float(theory_bubble_fraction(name, p, k, v)) for k in theory_ms],
                    color=color, lw=1.5, alpha=0.7, label=f"{label} (theory)")
        sim_ms = [k for k in ms if name != "interleaved" or k % p == 0]
        if name == "naive":
            sim_ms = ms
        sims = []
        for k in sim_ms:
            sched = make_schedule(name, p, k, v)
            sims.append(float(simulate(sched, unit_costs(name)).bubble_fraction))
        ax.plot(sim_ms, sims, linestyle="none", marker=marker, color=color,
                markerfacecolor="none" if name == "1f1b" else color, markersize=7,
                label=f"{name} (simulated)")
    for name, points in (measured or {}).items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, linestyle="none", marker="x", markersize=9, mew=2,
                color=style.get(name, ("black",))[0], label=f"{name} (measured)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ms), [str(k) for k in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches per batch, m (log scale)")
    ax.set_ylabel("bubble fraction (idle / total rank-time)")
    ax.set_title(f"Pipeline bubble vs micro-batches, p={p} ranks (F=1, B=I+W=2)\n"
                 f"zb-h1 theory holds for m >= p; interleaved needs m divisible by p", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_inflight_memory(path, p: int = 4, m: int = 8):
    """Peak activations held per rank: GPipe keeps all m micro-batches, 1F1B at most p - r."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(p)
    for k, (name, sched) in enumerate([("gpipe", gpipe(p, m)), ("1f1b", one_f_one_b(p, m))]):
        peaks = simulate(sched, unit_costs(name)).peak_inflight
        bars = ax.bar(x + (k - 0.5) * 0.38, peaks, width=0.38, label=name,
                      color=["#4C72B0", "#DD8452"][k])
        ax.bar_label(bars, fontsize=8)
    ax.set_xticks(x, [f"rank {r}" for r in range(p)])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("peak activations held\n(micro-batches in flight)")
    ax.set_ylim(0, 1.3 * m)
    ax.set_title(f"Activation memory: GPipe vs 1F1B, p={p}, m={m}", fontsize=10)
    ax.legend(title="schedule", loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_measured_vs_simulated(path, measured, simulated, note: str = ""):
    """A real run's timeline (``measured``: :func:`~minipar.pipeline.execute.trace_timeline`,
    in ms) above :func:`simulate` of the same schedule with the costs measured in that run
    (``simulated``, costs in ms), on one time axis."""
    plt = _pyplot()
    sched = measured.schedule
    T = max(float(measured.makespan), float(simulated.makespan))
    fig, axes = plt.subplots(2, 1, figsize=(min(18, 6 + 0.3 * len(measured.events) / sched.ranks),
                                            2 * (0.5 * sched.ranks + 1.3)), sharex=True)
    c = simulated.costs
    head = f"{sched.name}: p={sched.ranks}, m={sched.microbatches}" + (f", v={sched.chunks}" if sched.chunks > 1 else "")
    plot_timeline(axes[0], measured, f"measured on real ranks ({head}) — bubble {float(measured.bubble_fraction):.1%}")
    plot_timeline(axes[1], simulated, f"simulated with the measured costs F={float(c.F):.2f} ms, "
                                      f"B={float(c.B):.2f} ms, p2p={float(c.p2p):.2f} ms — bubble "
                                      f"{float(simulated.bubble_fraction):.1%}")
    for ax in axes:
        ax.set_xlim(0, T)
    axes[0].set_xlabel("")
    axes[1].set_xlabel("time (ms)")
    fig.suptitle(f"Pipeline timeline, measured vs simulated {note}".rstrip(), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


ASYNC_STYLE = {"flush": ("#4C72B0", "flush 1F1B (= one device, one update per m micro-batches)"),
               "sequential": ("#888888", "one device, one update per micro-batch (no staleness)"),
               "nostash": ("#C44E52", "PipeDream, no weight stashing"),
               "stash": ("#DD8452", "PipeDream, weight stashing")}
P_MARKERS = {2: "o", 4: "s", 8: "^"}


def _smooth(ys, k=10):
    """Running mean over k points (the first k-1 average what exists): for reading noisy curves."""
    import numpy as np

    c = np.cumsum(np.insert(np.asarray(ys, dtype=float), 0, 0.0))
    n = np.arange(1, len(ys) + 1)
    lo = np.maximum(n - k, 0)
    return (c[n] - c[lo]) / (n - lo)


def plot_sync_vs_async(path, data):
    """Six panels from :func:`minipar.lessons.pipeline_async.experiment`'s ``data``: the
    learning-rate sweep, the loss curves at each scheme's best lr, staleness per stage, best
    loss vs p, bytes held per rank (counted), and speed with the bubble (measured)."""
    import numpy as np

    plt = _pyplot()
    task, runs = data["task"], sorted(data["runs"], key=lambda r: r["p"])
    m, ps = task["m"], [r["p"] for r in runs]
    fig, ax = plt.subplots(2, 3, figsize=(18, 10))
    (a_lr, a_curve, a_stale), (a_p, a_mem, a_speed) = ax

    # 1. final held-out loss vs lr, mean over seeds; diverged runs left out
    finals = {}
    for r in data["sweep"]:
        finals.setdefault((r["scheme"], r["p"]), {}).setdefault(r["lr"], []).append(r["final"])
    for (scheme, p), by_lr in sorted(finals.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        lrs = [lr for lr in sorted(by_lr) if np.isfinite(np.mean(by_lr[lr]))]
        color, label = ASYNC_STYLE[scheme]
        a_lr.plot(lrs, [np.mean(by_lr[lr]) for lr in lrs], color=color, marker=P_MARKERS.get(p, "D"),
                  lw=1.2, alpha=1.0 if p in (None, max(ps)) else 0.55, linestyle="-" if p is None else "--",
                  label=f"{scheme}" + (f", p={p}" if p else ""))
    a_lr.set_xscale("log", base=2)
    a_lr.set_yscale("log")
    a_lr.set_xlabel(f"lr per micro-batch (the flush steps with {m} x lr on {m} micro-batches)")
    a_lr.set_ylabel("held-out loss after the run (mean over seeds)")
    a_lr.set_title(f"Learning-rate sweep, {data['n_micro']} micro-batches each\n(missing points diverged)", fontsize=10)
    a_lr.legend(fontsize=6.5, ncol=2)

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
    a_curve.legend(fontsize=7)

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
    a_stale.legend(fontsize=7)

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
                a_p.annotate(f"lr {b['lr']:g}", (p, b["loss"]), fontsize=6, xytext=(4, 4), textcoords="offset points")
    a_p.set_xscale("log", base=2)
    a_p.set_xticks(ps, [str(p) for p in ps])
    a_p.set_xlabel("pipeline stages p (the same 8 layers)")
    a_p.set_ylabel("best held-out loss (mean; bars: seed range)")
    a_p.set_title(f"Best loss over the sweep vs p ({len(data['seeds'])} seeds)", fontsize=10)
    a_p.legend(fontsize=7)

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
    a_mem.legend(handles=handles, fontsize=6.5, ncol=2)
    a_mem.set_xticks(range(len(runs)), [f"p={p}" for p in ps])
    a_mem.set_ylabel("KiB held by stage 0 at its peak")
    a_mem.set_title(f"Memory of stage 0 (the most loaded), counted from its arrays\n"
                    f"flushes every m={m} micro-batches of b={task['b']} rows, width {task['width']}", fontsize=10)

    # 6. speed
    for k, scheme in enumerate(("flush", "nostash", "stash")):
        xs = np.arange(len(runs)) + (k - 1) * 0.27
        per_s = [r["speed"][scheme]["per_s"] for r in runs]
        bars = a_speed.bar(xs, per_s, 0.27, color=ASYNC_STYLE[scheme][0], label=scheme)
        a_speed.bar_label(bars, [f"{r['speed'][scheme]['bubble']:.0%}" for r in runs], fontsize=6)
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
    a_speed.legend(fontsize=7)

    fig.suptitle("Synchronous (flush) vs asynchronous (PipeDream) pipelines: convergence, staleness, memory, speed",
                 fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
