"""Figures of lesson 6 from one real run on 4 ranks (:func:`figure_runs`).

    minipar figures --into figures --only 06        # or: python -m minipar.figures.sequence_experts figures/

    cp_ring_steps.png            which rank's K/V block each rank attends to in each ring step (from the trace),
                                 and the zigzag chunks each rank holds
    cp_balance.png               causal ring attention, contiguous vs zigzag split: every rank's compute regions
                                 on one time axis, and the seconds each rank computed
    moe_dispatch.png             one dispatch: tokens from rank i to expert j, dropped ones beside
    moe_tokens_per_expert.png    tokens routed to each expert over EP training, without and with the aux loss

The numbers behind them go to ``sequence_experts_numbers.json`` beside the figures.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..lessons import context_parallel, experts
from ..records import write_json
from . import DEFAULT_OUT, pyplot, save


N = 4



def plot_ring_steps(schedule, path, p=N):
    """schedule[r] = [(step, kv owner)] of rank r: a rank x step grid, each cell the owner."""
    from ..context_parallel import SeqLayout

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    cmap = plt.get_cmap("tab10")
    lay = SeqLayout(4 * p, p, "zigzag")
    for r, steps in enumerate(schedule):
        for s, j in steps:
            ax.add_patch(plt.Rectangle((s, r), 0.94, 0.9, color=cmap(j), alpha=0.75))
            ax.text(s + 0.47, r + 0.45, f"K/V of rank {j}\nchunks {lay.chunk_ids(j)}", ha="center", va="center",
                    fontsize=8)
    ax.set_xlim(0, p)
    ax.set_ylim(p, 0)
    ax.set_xticks(np.arange(p) + 0.47, [f"step {s}" for s in range(p)])
    ax.set_yticks(np.arange(p) + 0.45, [f"rank {r}\nq chunks {lay.chunk_ids(r)}" for r in range(p)])
    ax.set_title(f"Ring attention on {p} ranks (zigzag, {2 * p} chunks): the K/V block each rank holds per step\n"
                 "(read from the trace of a real run; during step s the next block is already on its way)", fontsize=9)
    return save(fig, path, tight=True)


def plot_balance(balance, path):
    """balance[r][kind] = {"regions", "busy", "wall"}: timelines of both splits, busy-time bars."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 2, 1.2]})
    kinds = ("contiguous", "zigzag")
    for ax, kind in zip(axes, kinds):
        t0 = min(a for b in balance for _, a, _ in b[kind]["regions"])
        for r, b in enumerate(balance):
            for name, a, e in b[kind]["regions"]:
                color = "#4C72B0" if "forward" in name else "#DD8452"
                ax.barh(r, (e - a) * 1e3, left=(a - t0) * 1e3, color=color, edgecolor="k", lw=0.3)
        ax.set_yticks(range(len(balance)), [f"rank {r}" for r in range(len(balance))])
        ax.invert_yaxis()
        ax.set_xlabel("ms (forward blue, backward orange)")
        ax.set_title(f"{kind} split: compute regions per ring step", fontsize=9)
    ax = axes[2]
    x = np.arange(len(balance))
    for i, kind in enumerate(kinds):
        ax.bar(x + (i - 0.5) * 0.38, [b[kind]["busy"] * 1e3 for b in balance], 0.38, label=kind)
    ax.set_xticks(x, [f"rank {r}" for r in x])
    ax.set_ylabel("ms computing")
    ax.set_title("busy time per rank", fontsize=9)
    ax.legend(fontsize=8)
    fig.suptitle("Causal ring attention: the contiguous split leaves early ranks idle, zigzag evens the work "
                 "(measured; see docs for the conditions)", fontsize=10)
    return save(fig, path, tight=True)


def plot_dispatch(dispatch, path):
    """dispatch[r] = {"kept", "routed", "capacity"}: the rank x expert matrix of one dispatch."""
    plt = pyplot()
    kept = np.array([d["kept"] for d in dispatch])
    routed = np.array([d["routed"] for d in dispatch])
    p, E = kept.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * E, 1.2 + 0.6 * p))
    im = ax.imshow(kept, cmap="Blues", vmin=0, vmax=max(dispatch[0]["capacity"], 1))
    for i in range(p):
        for j in range(E):
            drop = routed[i, j] - kept[i, j]
            ax.text(j, i, f"{kept[i, j]}" + (f"\n+{drop} dropped" if drop else ""), ha="center", va="center",
                    fontsize=7, color="w" if kept[i, j] > 0.6 * dispatch[0]["capacity"] else "k",
                    fontweight="bold" if drop else "normal")
    for b in range(1, p):
        ax.axvline(b * E // p - 0.5, color="k", lw=1.5)
    ax.set_xticks(range(E), [f"e{j}\n(r{j // (E // p)})" for j in range(E)], fontsize=8)
    ax.set_yticks(range(p), [f"rank {i}" for i in range(p)])
    ax.set_xlabel("expert (owning rank)")
    ax.set_title(f"One dispatch: tokens from rank i to expert j (capacity {dispatch[0]['capacity']} per rank "
                 f"and expert)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    return save(fig, path, tight=True)


def plot_tokens_per_expert(training, path):
    """training[aux_weight] = train(...) output: routed tokens per expert per step."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(training), figsize=(11, 3.8), sharey=True)
    for ax, (w, run) in zip(axes, sorted(training.items())):
        routed = np.array([s["routed"] for s in run["steps"]])  # (steps, E)
        for e in range(routed.shape[1]):
            ax.plot(routed[:, e], lw=1.2, label=f"e{e}")
        cap = run["capacity"] * run["dp"]
        ax.axhline(cap, color="k", ls="--", lw=1, label="capacity (all ranks)")
        ax.axhline(routed.sum(1).mean() / routed.shape[1], color="gray", ls=":", lw=1, label="uniform")
        spread = routed[-len(routed) // 4:].std(axis=1).mean()
        ax.set_title(f"aux loss weight {w}: spread over experts (last quarter) {spread:.1f} tokens", fontsize=9)
        ax.set_xlabel("training step")
    axes[0].set_ylabel("tokens routed (all ranks)")
    axes[-1].legend(fontsize=7, ncol=2)
    r = next(iter(training.values()))
    fig.suptitle(f"Tokens per expert over EP training: {r['E']} experts, top-{r['k']}, dp = ep = {r['dp']} ranks "
                 "(the Switch load-balancing loss pulls the load towards uniform)", fontsize=10)
    return save(fig, path, tight=True)


def numbers(res):
    """The figures' numbers (the source of docs/sequence_experts.md): busy and wall ms per rank
    per split, the dispatch matrix, and per aux weight the training's spread, loss and error."""
    out = {"balance": {k: {m: [round(r["balance"][k][m] * 1e3, 1) for r in res] for m in ("busy", "wall")}
                       for k in ("contiguous", "zigzag")},
           "dispatch": {m: [r["dispatch"][m] for r in res] for m in ("kept", "routed")},
           "training": {}}
    for w, run in res[0]["training"].items():
        routed = np.array([s["routed"] for s in run["steps"]])
        out["training"][str(w)] = {"spread_last_quarter": float(routed[-len(routed) // 4:].std(axis=1).mean()),
                                   "loss_first_last": [run["steps"][0]["loss"], run["steps"][-1]["loss"]],
                                   "max_error_vs_one_process": run["error"]}
    return out


def figure_runs(comm, quick=False):
    """Rank side: everything the lesson's figures draw, from one launch: the ring's steps, zigzag vs
    contiguous busy time, one dispatch, and tokens per expert over EP training without and with
    the load-balancing loss."""
    steps, tokens, T, hs = (4, 16, 32, 32) if quick else (40, 32, 256, 64)
    return {"ring": context_parallel.ring_schedule(comm),
            "balance": context_parallel.balance(comm, T=T * comm.size, hs=hs),
            "dispatch": experts.dispatch_matrix(comm),
            "training": {w: experts.train(comm, steps=steps, n_tokens=tokens, aux_weight=w, lr=0.2)
                         for w in (0.0, 0.3)}}


def make(outdir, quick=False, backend="mpi", device=None):
    from ..launcher import launch

    os.makedirs(outdir, exist_ok=True)
    res = launch(N, "minipar.figures.sequence_experts:figure_runs", backend=backend, device=device,
                 quiet=True, quick=quick).results
    j = lambda name: os.path.join(outdir, name)  # noqa: E731
    write_json(j("sequence_experts_numbers.json"), numbers(res), "  wrote")
    return [plot_ring_steps([r["ring"] for r in res], j("cp_ring_steps.png")),
            plot_balance([r["balance"] for r in res], j("cp_balance.png")),
            plot_dispatch([r["dispatch"] for r in res], j("moe_dispatch.png")),
            plot_tokens_per_expert(res[0]["training"], j("moe_tokens_per_expert.png"))]


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
