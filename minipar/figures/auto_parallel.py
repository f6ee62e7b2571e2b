"""Figures of lesson 8: the strategy the search found, and simulated vs measured step times.

    minipar figures --only auto_parallel

auto_parallel_strategy.png        the operator graph of each model, every operator coloured by
                                  its choice (Sample / Attribute / Parameter / Operator /
                                  replicated); arrows name the redistribution inserted between
                                  operators in the forward; a weight whose gradient needs a
                                  collective is marked
auto_parallel_sim_vs_measured.png predicted vs measured step time of every strategy (hand-written
                                  and found), on 2 and 4 ranks, with the +-20% band

Runs come from ``minipar.bench.autoparallel.compare`` (the same as ``minipar search``); the
full set is written beside the figures as ``auto_parallel_runs.json``.
"""
from __future__ import annotations

import os

from ..records import write_json
from . import pyplot, save

RUNS = [("block", 2), ("block", 4), ("vocab", 2), ("vocab", 4)]
QUICK = dict(sizes={"B": 4, "T": 16, "C": 32, "H": 64}, budget=1.0, reps=1)
COLORS = {"Sample": "#4c72b0", "Attribute": "#55a868", "Parameter": "#c44e52", "Operator": "#8172b2",
          "replicated": "#bbbbbb", "mixed": "#dd8452"}


def collect(quick=False, backend="mpi", device=None, budget=10.0):
    from ..launcher import launch

    runs = [("block", 2)] if quick else RUNS
    out = []
    for model, n in runs:
        kw = dict(QUICK, sizes={**QUICK["sizes"], **({"n_heads": 2} if model == "block" else {"V": 256})}) if quick \
            else dict(budget=budget, reps=5)
        out.append(launch(n, "minipar.bench.autoparallel:compare", backend=backend, device=device, quiet=True,
                          model=model, cache=not quick, **kw).results[0])
    return out


def _category(choice):
    from ..autoparallel.ops import category

    cats = {category(c) for c in choice}
    return cats.pop() if len(cats) == 1 else "mixed"


def _depths(graph):
    depth = {t: 0 for t in graph.inputs}
    for op in graph.ops:
        depth[op.output] = 1 + max(depth[t] for t in op.inputs)
    return depth


def plot_strategy(reports, path):
    plt = pyplot()
    from matplotlib.patches import Patch

    from ..autoparallel import build, build_program, redistribution_steps

    chosen = {}
    for r in reports:  # the largest mesh of each model
        if r["model"] not in chosen or r["ranks"] > chosen[r["model"]]["ranks"]:
            chosen[r["model"]] = r
    fig, axes = plt.subplots(1, len(chosen), figsize=(6.4 * len(chosen), 8.5), squeeze=False)
    for ax, r in zip(axes[0], chosen.values()):
        g = build(r["model"], **{k: v for k, v in r["sizes"].items()}).graph
        strategy = {k: tuple(v) for k, v in r["found"].items()}
        prog = build_program(g, strategy)
        depth, pos = _depths(g), {}
        rows = {}
        for op in g.ops:
            rows.setdefault(depth[op.output], []).append(op)
        for d, ops in rows.items():
            for i, op in enumerate(ops):
                pos[op.output] = ((i - (len(ops) - 1) / 2) * 2.2, -d)
        pos["x"], pos["target"] = (0.0, 0.0), (3.0, -max(depth.values()) + 0.5)
        moves = {}
        for ins in prog.instructions:
            if getattr(ins, "what", None) == "act":
                moves[ins.name, ins.dst] = ", ".join(s.kind.replace("_", "-") for s in redistribution_steps(ins.src, ins.dst))
        for op in g.ops:
            for k, t in enumerate(op.inputs):
                (x0, y0), (x1, y1) = pos[t], pos[op.output]
                ax.annotate("", xy=(x1, y1 + 0.22), xytext=(x0, y0 - 0.22),
                            arrowprops=dict(arrowstyle="->", color="#666", lw=0.9,
                                            connectionstyle="arc3,rad=0.25" if abs(y0 - y1) > 1.5 else "arc3"))
                label = moves.get((t, prog.layouts[op.name].ins[k]))
                if label:
                    ax.text((x0 + x1) / 2 + 0.1, (y0 + y1) / 2, label, fontsize=7, color="#a0322d", ha="left")
        for t in g.inputs:
            ax.text(*pos[t], t, ha="center", va="center", fontsize=9, style="italic")
        for op in g.ops:
            choice = strategy[op.name]
            x, y = pos[op.output]
            grad_comm = any(m.what == "param" and m.name in op.params and any(
                s.kind in ("all_reduce", "reduce_scatter", "all_gather") for s in redistribution_steps(m.src, m.dst))
                for m in prog.instructions if getattr(m, "what", None) == "param")
            ax.text(x, y, f"{op.name}\n{','.join(choice)}" + (" *" if grad_comm else ""), ha="center", va="center",
                    fontsize=8, bbox=dict(boxstyle="round,pad=0.35", fc=COLORS[_category(choice)], ec="k", lw=0.6,
                                          alpha=0.9))
        ax.set_xlim(-4.5, 4.5)
        ax.set_ylim(-max(depth.values()) - 0.8, 0.6)
        ax.axis("off")
        ax.set_title(f"{r['model']} on {r['ranks']} ranks: found by search\npredicted {r['found_cost'] * 1e3:.2f} ms "
                     f"per step (* = the weight gradient needs a collective)", fontsize=10)
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="lower center", ncol=3, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save(fig, path)


def plot_sim_vs_measured(reports, path):
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7.2, 6.2))
    marks = {2: "o", 3: "^", 4: "s", 8: "D"}
    names = sorted({row["strategy"] for r in reports for row in r["rows"]})
    colors = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    hi = max(max(row["predicted_s"], row["measured_s"]) for r in reports for row in r["rows"]) * 1.15e3
    lo = min(min(row["predicted_s"], row["measured_s"]) for r in reports for row in r["rows"]) * 0.85e3
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="0.9", label="within 20%")
    for r in reports:
        for row in r["rows"]:
            ax.scatter(row["measured_s"] * 1e3, row["predicted_s"] * 1e3, marker=marks.get(r["ranks"], "x"),
                       color=colors[row["strategy"]], s=45, edgecolor="k", lw=0.5)
    for name in names:
        ax.scatter([], [], color=colors[name], label=name)
    for n in sorted({r["ranks"] for r in reports}):
        ax.scatter([], [], marker=marks.get(n, "x"), color="w", edgecolor="k", label=f"{n} ranks")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(v)[0] in "25" else ""))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms, fastest of the repetitions, slowest rank)")
    ax.set_ylabel("simulated step time (ms)")
    models = ", ".join(sorted({r["model"] for r in reports}))
    load = [r["load_average"] for r in reports if "load_average" in r]
    cond = f"\n{reports[0].get('clock', 'wall')} clock" + (
        f", load average {min(load):.0f}-{max(load):.0f} on {reports[0]['cores']} cores" if load else "")
    ax.set_title(f"Execution simulator vs real ranks ({models}){cond}", fontsize=11)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def make(outdir, reports=None, quick=False, backend="mpi", device=None, **_):
    """Both figures from ``reports`` (``compare`` results), or from fresh runs."""
    os.makedirs(outdir, exist_ok=True)
    if reports is None:
        reports = collect(quick, backend, device)
        if not quick:
            write_json(os.path.join(outdir, "auto_parallel_runs.json"), reports, "  wrote")
    return [plot_strategy(reports, os.path.join(outdir, "auto_parallel_strategy.png")),
            plot_sim_vs_measured(reports, os.path.join(outdir, "auto_parallel_sim_vs_measured.png"))]
