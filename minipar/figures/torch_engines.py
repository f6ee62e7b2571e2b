"""Figures of lesson 9 from real runs on the torch backend: DDP's overlap, measured from the trace,
and the memory each rank holds under DDP and FSDP, counted.

    minipar figures --into figures --only torch_engines     # or: python -m minipar.figures.torch_engines figures/

    torch_ddp_overlap.png   one traced step of minipar.torch's DDP on 2 ranks: per rank the forward,
                            the backward with a tick where each gradient was accumulated, and each
                            bucket's ring from its first message to its last; the backward's end marked
    torch_fsdp_memory.png   bytes per rank of parameters, gradients (and DDP's buckets) and Adam's state
                            for the lesson's GPT (6 blocks) under DDP and FSDP on 2 ranks, counted, beside
                            the formula

The runs are the lesson's own drivers (``minipar.lessons.torch_ddp.timeline`` and
``minipar.lessons.torch_fsdp.memory_per_rank``, launched together as
``minipar.lessons.torch_engines:measured``), whose check rows the figures' titles repeat.
"""
from __future__ import annotations

import os
import sys

from ..launcher import launch
from . import DEFAULT_OUT, progress, pyplot, save

N = 2
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "wait for the buckets": "#999999", "ring": "#C44E52",
          "params_bytes": "#4C72B0", "grads_bytes": "#DD8452", "buckets_bytes": "#C9A66B", "optimizer_bytes": "#55A868"}


def plot_overlap(res, path):
    """Per rank: a compute lane (forward, backward with a tick per accumulated gradient, the wait in
    finish) over one thin lane per bucket (its ring, from its first message to its last); a dashed
    line where that rank's backward ended."""
    plt = pyplot()
    ev = res["events"]
    names = [name for name, _ in res["buckets"]]
    nb, lane = len(names), 0.45
    block = 1.4 + nb * lane  # one rank's height
    fig, ax = plt.subplots(figsize=(10, 1.6 + res["ranks"] * (0.9 + 0.28 * nb)))
    t0 = min(e.t_start for e in ev if e.name == "forward")
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    ticks, labels = [], []
    for r in range(res["ranks"]):
        top = (res["ranks"] - r) * block  # this rank's compute lane
        mine = [e for e in ev if e.rank == r]
        for e in mine:
            if e.kind == "compute" and e.name in COLORS:
                ax.barh(top, ms(e.t_end) - ms(e.t_start), left=ms(e.t_start), height=0.8, color=COLORS[e.name],
                        edgecolor="k", lw=0.3)
            elif e.kind == "compute" and e.name.startswith("grad "):
                ax.plot([ms(e.t_start)] * 2, [top + 0.45, top + 0.65], color="k", lw=0.8)
            elif e.kind == "collective" and e.name in names:
                y = top - 0.9 - lane * names.index(e.name)
                ax.barh(y, ms(e.t_end) - ms(e.t_start), left=ms(e.t_start), height=lane * 0.8, color=COLORS["ring"],
                        alpha=0.45, edgecolor="k", lw=0.3)
                ax.plot([ms(e.t_start)] * 2, [y - lane * 0.4, y + lane * 0.4], color=COLORS["ring"], lw=2.5)
        end = next(e.t_end for e in mine if e.name == "backward")
        ax.plot([ms(end)] * 2, [top - 0.9 - lane * (nb - 0.5), top + 0.5], color="k", ls="--", lw=1)
        ticks += [top] + [top - 0.9 - lane * k for k in range(nb)]
        labels += [f"rank {r} compute"] + [f"bucket {k}" for k in range(nb)]
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("time since the forward started (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("forward", "backward", "wait for the buckets")]
    handles += [plt.Rectangle((0, 0), 1, 1, color=COLORS["ring"], alpha=0.45),
                plt.Line2D([], [], color="k", lw=0.8), plt.Line2D([], [], color="k", ls="--")]
    ax.legend(handles, ["forward", "backward", "finish: wait for the rings", "a bucket's ring (bold: its first message)",
                        "a gradient accumulated", "the backward returned"], fontsize=7, loc="upper right", ncol=2)
    ax.set_ylim(top - 0.9 - lane * nb, res["ranks"] * block + 1.6)
    ok = all(r["ok"] for r in res["rows"])
    ax.set_title(f"minipar.torch DDP, one traced step on {res['ranks']} ranks (gloo): {res['layers']} x "
                 f"Linear({res['width']}, {res['width']}) + GELU, float32, batch {res['batch']} per rank, "
                 f"{nb} buckets of <= {res['bucket_size_mb']} MiB\nevery bucket's ring starts before the "
                 f"backward ends, on every rank: {'yes' if ok else 'NO'} (measured from the trace)", fontsize=9)
    fig.tight_layout()
    return save(fig, path)


def plot_memory(res, path):
    """Per rank, DDP beside FSDP: stacked measured bytes by category (FSDP's gathered block and its
    full gradient, alive only while a block runs, hatched), the formula's total as a tick."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    records = sorted(res["records"], key=lambda r: (r["rank"], r["engine"] != "DDP"))
    parts = (("params_bytes", "gathered_bytes", "params (FSDP: shards and the unsharded)", "one gathered block"),
             ("grads_bytes", "unit_grad_bytes", "grads (FSDP: grad shards)", "one block's full gradient"),
             ("buckets_bytes", None, "DDP's bucket copies", None), ("optimizer_bytes", None, "Adam's state", None))
    labels = []
    for i, r in enumerate(records):
        bottom = 0.0
        for cat, peak, name, peak_name in parts:
            held = r["measured"][cat] / 1e3
            extra = r["transient"][peak] / 1e3 if peak else 0.0
            for v, hatch, label in ((held - extra, None, name), (extra, "//", peak_name)):
                if v > 0:
                    ax.bar(i, v, 0.6, bottom=bottom, color=COLORS[cat], edgecolor="k", lw=0.5, hatch=hatch,
                           alpha=0.55 if hatch else 1, label=label)
                    bottom += v
        want = sum(r["predicted"][c] for c, *_ in parts) / 1e3
        ax.plot([i - 0.35, i + 0.35], [want, want], "k-", lw=2, label="the formula (total)")
        ax.text(i, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=8)
        labels.append(f"{r['engine']}\nrank {r['rank']}")
    handles, names = ax.get_legend_handles_labels()
    seen = dict(zip(names, handles))
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper center", ncol=3)
    ax.set_xticks(range(len(records)), labels)
    ax.set_ylabel("KB held per rank after an Adam step")
    ax.set_ylim(0, 1.4 * max(sum(r["measured"][c] for c, *_ in parts) for r in records) / 1e3)
    ok = all(r["ok"] for r in res["rows"])
    ax.set_title(f"The lesson's GPT with {res['n_layer']} blocks (Psi = {records[0]['psi']:,}, {res['dtype']}, Adam) on "
                 f"{res['ranks']} ranks: FSDP shards its units (the blocks)\ncounted (bars) == "
                 f"lesson 04's formula + torch's allowance (ticks): {'yes' if ok else 'NO'}, every rank and category",
                 fontsize=9)
    fig.tight_layout()
    return save(fig, path)


def measure(quick=False, device=None):
    """The lesson's two runs, in one launch on N ranks (torch backend): (timeline, memory)."""
    progress(f"one traced DDP step, and DDP's and FSDP's memory per rank, on {N} ranks (torch)")
    out = launch(N, "minipar.lessons.torch_engines:measured", backend="torch", device=device, quiet=True,
                 quick=quick).results[0]
    return out["timeline"], out["memory"]


def make(outdir, quick=False, backend=None, device=None):
    """The two figures from fresh runs (on the torch backend, whatever ``backend`` says: the
    lesson's engines wrap torch modules)."""
    os.makedirs(outdir, exist_ok=True)
    overlap, memory = measure(quick, device)
    return [plot_overlap(overlap, os.path.join(outdir, "torch_ddp_overlap.png")),
            plot_memory(memory, os.path.join(outdir, "torch_fsdp_memory.png"))]


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
