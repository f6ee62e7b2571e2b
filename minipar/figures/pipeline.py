"""Figures of the pipeline lesson, drawn from the schedules, their simulation and real runs.

    minipar figures --only pipeline
    python -c "from minipar.figures.pipeline import plot_schedules; plot_schedules('figures/pipeline_schedules.png')"

Timelines (Gantt), bubble curves and activation memory of the schedules in
``minipar.pipeline``. Costs: F = 1, B = 2 (I = W = 1 for zb-h1), i.e. time is counted in units
of one forward pass of one rank's share of the model on one micro-batch.

The measured figures launch 4 ranks once (:func:`figure_runs`):
a traced 1F1B run drawn above its simulation with the costs measured in it, and measured bubble
fractions over the theory curves. Synchronous vs asynchronous pipelines are
:mod:`minipar.figures.pipeline_async`'s.
"""
from __future__ import annotations

import os

from ..lessons.pipeline import profile
from ..pipeline import Costs, gpipe, make_schedule, one_f_one_b, simulate, theory_bubble_fraction
from . import progress, pyplot, save

COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}
LABELS = {"F": "F: forward", "B": "B: backward (full)", "I": "I: backward, input grad",
          "W": "W: backward, weight grad"}
TIME_LABEL = "time (units of one forward pass of one micro-batch)"
NAMES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")


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
    plt = pyplot()
    width = min(18, 4 + 0.25 * float(sim_result.makespan))
    fig, ax = plt.subplots(figsize=(width, 0.5 * sim_result.schedule.ranks + 1.6))
    plot_timeline(ax, sim_result, title)
    fig.tight_layout()
    return save(fig, path, dpi=130)


def plot_schedule(path, schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2):
    """One schedule simulated with the unit costs, titled with its bubble beside the formula's
    (notebook 03's knobs)."""
    sim = simulate(make_schedule(schedule, p, m, v), unit_costs(schedule))
    theory = f", formula {float(theory_bubble_fraction(schedule, p, m, v)):.1%}" if schedule != "zb-h1" or m >= p else ""
    return save_timeline(path, sim, f"{schedule}: p={p}, m={sim.schedule.microbatches}"
                                    + (f", v={v}" if schedule == "interleaved" else "")
                                    + f" — simulated bubble {float(sim.bubble_fraction):.1%}{theory}")


def plot_schedules(path, p: int = 4, m: int = 8, v: int = 2):
    """One timeline per schedule, each titled with its simulated bubble. The naive run pushes
    the whole batch (m micro-batches' worth of work) through at once and runs far past the
    others, so it is drawn whole on its own time axis; the others share one."""
    plt = pyplot()
    fig, axes = plt.subplots(len(NAMES), 1, figsize=(15, len(NAMES) * (0.42 * p + 1.1)))
    for ax in axes[2:]:
        ax.sharex(axes[1])
    ends = []
    for ax, name in zip(axes, NAMES):
        sched = make_schedule(name, p, m, v)
        costs = unit_costs(name)
        if name == "naive":   # same work as the others: one batch = m micro-batches
            costs = {k: m * c for k, c in costs.items()}
        sim = simulate(sched, costs)
        extra = {"naive": f" (whole batch as one pass; its own time axis: it ends at t={float(sim.makespan):g})",
                 "interleaved": f", v={v} chunks per rank",
                 "zb-h1": " (B split into I + W)"}.get(name, "")
        plot_timeline(ax, sim, f"{name}{extra}: p={p}, m={sched.microbatches} — simulated "
                               f"bubble {float(sim.bubble_fraction):.1%}")
        if name != "naive":
            ends.append(float(sim.makespan))
        if ax is not axes[-1] and name != "naive":
            ax.set_xlabel("")
    axes[-1].set_xlim(0, max(ends))               # shared by every timeline but the naive one
    fig.suptitle(f"Pipeline schedules on {p} ranks, {m} micro-batches (F=1, B=I+W=2); "
                 f"grey = idle rank (bubble)")
    fig.subplots_adjust(left=0.07, right=0.83, top=0.93, bottom=0.06, hspace=0.5)
    return save(fig, path, dpi=130)


def plot_bubble_vs_microbatches(path, p: int = 4, ms=(1, 2, 4, 8, 16, 32), v: int = 2,
                                measured=None):
    """Bubble fraction against the number of micro-batches m: theory as lines, simulation as
    markers, optional measured runs ``{schedule: [(m, bubble), ...]}`` as crosses."""
    plt = pyplot()
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
    return save(fig, path, dpi=130)


def plot_inflight_memory(path, p: int = 4, m: int = 8):
    """Peak activations held per rank: GPipe keeps all m micro-batches, 1F1B at most p - r."""
    import numpy as np

    plt = pyplot()
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
    return save(fig, path, dpi=130)


def plot_measured_vs_simulated(path, measured, simulated, note: str = ""):
    """A real run's timeline (``measured``: :func:`~minipar.pipeline.execute.trace_timeline`,
    in ms) above :func:`simulate` of the same schedule with the costs measured in that run
    (``simulated``, costs in ms), on one time axis."""
    plt = pyplot()
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
    return save(fig, path, dpi=130)


def figure_runs(comm, ms=(2, 4, 8), width=256, b=64, repeats=2):
    """Rank side: everything the pipeline figures measure on 4 ranks, in one launch: a traced
    1F1B (m=8) run with its measured costs (:func:`minipar.lessons.pipeline.profile`), and the
    measured bubble of gpipe and 1f1b for each m in ``ms``. Returned on rank 0 (None elsewhere)."""
    kw = dict(width=width, b=b, repeats=repeats)
    out = {"timeline": profile(comm, "1f1b", 8, events=True, **kw),
           "bubbles": {k: [(m, profile(comm, k, m, **kw)["measured_bubble_fraction"]) for m in ms]
                       for k in ("gpipe", "1f1b")}}
    return out if comm.rank == 0 else None


def make(outdir, quick=False, backend="mpi", device=None):
    from ..launcher import launch
    from ..pipeline.execute import trace_timeline

    os.makedirs(outdir, exist_ok=True)
    paths = [
        plot_schedules(os.path.join(outdir, "pipeline_schedules.png"), p=4, m=8, v=2),
        plot_inflight_memory(os.path.join(outdir, "pipeline_memory.png"), p=4, m=8),
    ]
    kw = dict(ms=(2, 8), width=256, b=32, repeats=2) if quick else \
        dict(ms=(1, 2, 4, 8, 16), width=512, b=128, repeats=3)
    progress(f"1F1B timeline, GPipe and 1F1B bubbles for m = {', '.join(map(str, kw['ms']))}, on 4 ranks")
    data = launch(4, "minipar.figures.pipeline:figure_runs", backend=backend, device=device,
                  quiet=True, **kw).results[0]
    run = data["timeline"]
    sched = make_schedule(run["schedule"], run["stages"], run["microbatches"])
    ms_costs = Costs(**{k: 1e3 * run["costs"][k] for k in ("F", "I", "W", "p2p")})   # ms
    paths.append(plot_measured_vs_simulated(
        os.path.join(outdir, "pipeline_measured_vs_simulated.png"),
        trace_timeline(run["events"], sched), simulate(sched, ms_costs),
        note=f"(4 ranks on this machine's cores, width {kw['width']}, {kw['b']} rows per micro-batch)"))
    paths.append(plot_bubble_vs_microbatches(os.path.join(outdir, "bubble_vs_microbatches.png"), p=4,
                                             measured=data["bubbles"]))
    return paths
