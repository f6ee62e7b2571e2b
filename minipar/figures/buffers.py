"""Figures of the buffers (lessons 01, 03, 04) from real runs on 4 ranks.

    minipar figures --into figures --only data_parallel        # or: python -m minipar.figures.buffers figures/

    buffers_per_rank.png          peak bytes per rank by kind of buffer, counted vs formula; the
                                  ring with its receive buffer reused vs reallocated every step
    zero3_prefetch_timeline.png   one traced ZeRO-3 step without and with prefetch: per rank the
                                  compute lane, the gather lane and the gathered buffers' lifetimes

The numbers are also written to ``buffers_numbers.json`` (the source of docs/buffers.md).
"""
from __future__ import annotations

import os
import sys

from ..bench.buffers import reuse_cost
from ..launcher import launch
from ..lessons.buffers import per_rank, prefetch_timeline
from ..records import write_json
from . import DEFAULT_OUT, progress, pyplot, save

N = 4


def plot_per_rank(per_rank, reuse, path):
    """Left: per kind, one bar per rank (counted), a black tick per rank (formula). Right: the
    ring's time with the receive buffer reallocated every step over reused, vs message bytes."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    kinds = list(per_rank[0]["bytes"])
    w = 0.8 / len(per_rank)
    for j, res in enumerate(per_rank):
        xs = [k + (j - (len(per_rank) - 1) / 2) * w for k in range(len(kinds))]
        counted = [res["bytes"][k][0] for k in kinds]
        formula = [res["bytes"][k][1] for k in kinds]
        ax.bar(xs, counted, w, color=plt.cm.tab10(j), label=f"rank {res['rank']}")
        ax.scatter(xs, formula, marker="_", s=120, color="k", zorder=3, label="formula (send: upper bound)" if j == 0 else None)
    ax.set_xticks(range(len(kinds)), kinds, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("peak bytes held per rank")
    ax.set_yscale("symlog", linthresh=8)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.3))  # below: above, it hid a bar
    ax.set_title(f"Named buffers on {len(per_rank)} ranks, counted (bars) vs formula (ticks)", fontsize=10)
    nbytes = [r["bytes"] for r in reuse]
    bx.plot(nbytes, [r["ratio"] for r in reuse], "o-", color="#C44E52")
    bx.fill_between(nbytes, [r["ratio_quartiles"][0] for r in reuse], [r["ratio_quartiles"][1] for r in reuse],
                    color="#C44E52", alpha=0.2, lw=0)
    bx.axhline(1, color="k", lw=0.8, ls="--")
    for r in reuse:
        bx.annotate(f"{r['allocations']['reallocated']} vs {r['allocations']['reused']} alloc.", (r["bytes"], r["ratio"]),
                    fontsize=7, textcoords="offset points", xytext=(0, 6), ha="center")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("bytes all-reduced (ring, float64)")
    bx.set_ylabel("time reallocated / reused (median)")
    bx.set_title(f"Ring all-reduce on {N} ranks: receive buffer\nreallocated every step vs reused", fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def plot_prefetch(res, path):
    """Two panels (without / with prefetch), per rank three lanes: compute (forward, backward),
    the ring all-gathers, and the lifetimes of the gathered buffers (two rows: units alternate)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    colors = {"forward": "#4C72B0", "backward": "#55A868"}
    for ax, pf in zip(axes, (False, True)):
        ev = res[pf]["events"]
        step = {e.rank: e for e in ev if e.name == "step"}
        t0 = min(e.t_start for e in step.values())
        ranks = sorted(step)
        ticks, labels = [], []
        for i, r in enumerate(ranks):
            y = 5 * (len(ranks) - 1 - i)
            for e in ev:
                if e.rank != r or e.name == "step" or e.t_start < step[r].t_start - 1e-9:
                    continue
                if e.kind == "compute":
                    lane, color = y + 3, next((c for k, c in colors.items() if k in e.name), "#999999")
                elif e.kind == "collective" and e.name == "all_gather:ring":
                    lane, color = y + 2, "#C44E52"
                elif e.kind == "buffer" and e.name.startswith("zero3.gathered"):
                    unit = e.name.split()[-1]
                    lane, color = y + (unit in res["units_odd"]), "#8172B3"
                else:
                    continue
                ax.barh(lane, (e.t_end - e.t_start) * 1e3, left=(e.t_start - t0) * 1e3, height=0.8, color=color,
                        edgecolor="k", lw=0.3)
            ticks += [y + 3, y + 2, y + 0.5]
            labels += [f"rank {r} compute", f"rank {r} gather", f"rank {r} gathered bufs"]
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set_title(f"{'with' if pf else 'without'} prefetch: step {res[pf]['step_time'] * 1e3:.1f} ms (median), "
                     f"gather time hidden under compute {res[pf]['hidden'] * 1e3:.1f} ms, "
                     f"{res[pf]['overlapping']} gathers overlap a layer's compute", fontsize=9)
    axes[-1].set_xlabel("time since the step started (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#4C72B0", "#55A868", "#C44E52", "#8172B3")]
    fig.legend(handles, ["forward", "backward", "all-gather of a unit (ring)", "a unit's gathered buffer, alive"],
               fontsize=8, loc="lower center", ncol=4)
    fig.suptitle(f"One traced ZeRO-3 step, {res['units']} layers of {res['width']}x{res['width']}, batch "
                 f"{res['batch']}, {N} ranks (MPI): prefetch gathers the next layer while this one computes;\n"
                 "two gathered buffers are then alive at once (double buffering)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, path)


def figure_runs(comm, quick=False):
    """Rank side: everything the buffer figures draw, in one launch: ``per_rank`` (gathered to
    rank 0), ``reuse_cost`` (the benchmark) and ``prefetch_timeline`` (smaller with ``quick``)."""
    per = comm.builtin.allgather_object({k: v for k, v in per_rank(comm).items() if k != "rows"})
    sizes = (1 << 10, 1 << 14, 1 << 18) if quick else (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23)
    reuse = reuse_cost(comm, sizes=sizes, pairs=2 if quick else 7, calls=4 if quick else None)
    pf = prefetch_timeline(comm, **(dict(units=4, width=32, batch=32, steps=1) if quick else {}))
    return {"per_rank": per, "reuse": reuse, "prefetch": pf}


def measure(quick=False):
    """Every number behind the figures (the timeline's events kept for the plot), one launch."""
    progress(f"named buffers counted, the ring's receive buffer reused vs reallocated, ZeRO-3 with and "
             f"without prefetch traced, on {N} ranks")
    m = launch(N, "minipar.figures.buffers:figure_runs", quiet=True, quick=quick).results[0]
    pf = m["prefetch"]
    pf["units_odd"] = [u for k, u in enumerate(pf["unit_names"]) if k % 2]
    return m


def make(outdir, quick=False, **_):
    """The two figures and buffers_numbers.json from fresh runs (MPI)."""
    os.makedirs(outdir, exist_ok=True)
    m = measure(quick)
    paths = [plot_per_rank(m["per_rank"], m["reuse"], os.path.join(outdir, "buffers_per_rank.png")),
             plot_prefetch(m["prefetch"], os.path.join(outdir, "zero3_prefetch_timeline.png"))]
    numbers = {"per_rank": m["per_rank"], "reuse": m["reuse"],
               "prefetch": {str(k): {kk: vv for kk, vv in v.items() if kk != "events"} if isinstance(v, dict) else v
                            for k, v in m["prefetch"].items()}}
    write_json(os.path.join(outdir, "buffers_numbers.json"), numbers, "  wrote", default=float)
    return paths


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
