"""Figures of lesson 5 from one real run on 8 ranks (:func:`figure_runs`), each of its runs checked.

    minipar figures --into figures --only 05        # or: python -m minipar.figures.train figures/
    out = launch(8, "minipar.figures.train:figure_runs", checkpoint="/tmp/ckpt")   # the run alone
    rows = merge_rows([r["rows"] for r in out.results]); data = out.results[0]

One job trains every grid of the world (``GRIDS8``: every dp x pp x tp factorization of 8, with
a mix of schedules, sequence parallelism on two) on the sorting task, one after the other on
the same ranks; the checks reuse ``minipar.lessons.train`` (``grid_rows``: losses, parameters,
replicas, tied copies) and ``minipar.train.accounting`` (the formulas). From those runs:

    train_loss_curves.png         every grid's loss per step over the one-process curve, and
                                  each one's relative difference from it (float64: ~1e-16;
                                  checked: equal to 1e-12)
    train_activation_memory.png   each grid's activation peak per recompute mode: counted from the
                                  arrays the ranks hold, with the formula of docs/train.md on top
                                  (checked: to the byte)
    train_3d_step_timeline.png    one traced step of dp2 pp2 tp2: compute, TP, PP, DP and tied-sum
                                  lanes per rank (its bytes per group checked against the formula)
    train_tokens_per_s.png        tokens/s per grid from ``minipar bench train`` (its JSON,
                                  train_bench.json beside the figures)

The features of the trainer (mixed precision, clipping, dropout) draw theirs in
``minipar.figures.train_features``.

With a checkpoint directory the run also decodes greedily from the 3D grid's checkpoint at TP = 1
and 2 (identical tokens). ``--quick`` (the tour): the dp2 pp2 tp2 grid alone, three steps on
random tokens, no generation. The run's checks must all pass (a failing one is printed and stops
the figures).
"""
from __future__ import annotations

import os
import pathlib
import sys

import numpy as np

from ..lessons.train import first_ranks, grid_rows, label, make_config, row, wait_politely
from . import DEFAULT_OUT, pyplot, save

N = 8
ROOT = pathlib.Path(__file__).resolve().parents[2]
MODE_COLORS = {"none": "#4C72B0", "selective": "#DD8452", "full": "#55A868"}
LANES = ("compute", "tp", "pp", "dp")
LANE_COLORS = {"tp": "#C44E52", "pp": "#E69F00", "dp": "#8172B3", "emb": "#937860"}
INTER_NODE = "#111111"  # a message that crossed between nodes (traced with ranks per node), drawn inside its lane
ACTION_COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#55A868", "W": "#A6D96A"}



def short(label):
    """'dp2 pp2 tp2 (1f1b m=2)' -> 'dp2 pp2 tp2' on one line, the rest below."""
    head, _, rest = label.partition(" (")
    return head.replace(" ", "\n") + ("\n(" + rest if rest else "")


def plot_curves(data, path):
    """Loss per step of every grid over the one-process curve; below, |grid - one process| / one process."""
    plt = pyplot()
    ref = np.array(data["reference"])
    steps = np.arange(1, len(ref) + 1)
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ax.plot(steps, ref, "k-", lw=6, alpha=0.25, label="one process (dense GPT, float64)")
    markers = "os^vD<>ph*"
    for i, (name, losses) in enumerate(data["curves"].items()):
        ax.plot(steps, losses, marker=markers[i % len(markers)], ms=5, lw=0.8, label=name)
        err = np.abs(np.array(losses) - ref) / np.abs(ref)
        dx.semilogy(steps, np.maximum(err, 1e-17), marker=markers[i % len(markers)], ms=5, lw=0.8)
    dx.axhline(1e-12, color="k", ls="--", lw=1, label="tolerance 1e-12")
    dx.axhline(np.finfo(np.float64).eps, color="gray", ls=":", lw=1, label="float64 epsilon")
    dx.text(steps[0], 1.3e-17, "0 (identical) drawn at 1e-17", fontsize=7, color="gray", va="bottom")
    ax.set_ylabel(f"loss (global batch, {'the sorting task' if data['data'] == 'sorting' else 'random tokens'})")
    ax.legend(fontsize=7, ncol=2)
    dx.set_ylabel("relative difference\nfrom one process")
    dx.set_xlabel("step")
    dx.set_xticks(steps)
    dx.set_ylim(5e-18, 1e-10)
    dx.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Every {N}-rank dp x pp x tp grid trains the one-process GPT: the same losses, step by step\n"
                 "(only the order of the sums differs: TP all-reduces, micro-batch accumulation, DP averaging)",
                 fontsize=10)
    return save(fig, path, tight=True)


def plot_memory(data, path):
    """Per grid, the busiest rank's activation peak per recompute mode: measured bars, formula ticks."""
    plt = pyplot()
    mem = data["memory"]
    names = list(mem)
    modes = [m for m in MODE_COLORS if any(m in mem[n] for n in names)]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / len(modes)
    for i, name in enumerate(names):
        for k, mode in enumerate(modes):
            if mode not in mem[name]:
                continue
            ranks = mem[name][mode]
            measured = max(m for _, m, _ in ranks) / 2**10
            formula = max(f for _, _, f in ranks) / 2**10
            x = i + (k - (len(modes) - 1) / 2) * width
            first = not any(mode in mem[n] for n in names[:i])
            ax.bar(x, measured, width * 0.95, color=MODE_COLORS[mode], edgecolor="k", lw=0.4,
                   label=f"recompute {mode} (measured)" if first else None)
            ax.plot([x - width / 2, x + width / 2], [formula, formula], "k-", lw=2,
                    label="formula (docs/train.md)" if (i, k) == (0, 0) else None)
    ax.set_xticks(range(len(names)), [short(n) for n in names], fontsize=7)
    ax.set_ylabel("activation peak of the busiest rank (KiB)")
    ax.set_yscale("log")
    top = max(m for n in names for ranks in mem[n].values() for _, m, _ in ranks) / 2**10
    ax.set_ylim(top / 100, top * 8)
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    missing = any(len(mem[n]) < len(modes) for n in names)
    ax.set_title("Activation memory per grid and recompute mode, counted from the arrays each rank holds between "
                 "pipeline actions:\nequal to the formula on every rank, to the byte (float64"
                 + ("; a grid without a bar was not run in that mode)" if missing else ")"), fontsize=9)
    return save(fig, path, tight=True)


def plot_timeline(data, path):
    """One traced step of the 3D grid: per rank a compute lane (pipeline actions) and a lane per
    group it talks in (the TP all-reduces, the PP sends and the blocking receives, the DP average
    and the tied sum)."""
    from collections import defaultdict

    from ..trace import SEND_KINDS, comm_lanes

    plt = pyplot()
    ev = data["trace"]
    lane_of = comm_lanes(ev)
    ranks = sorted({e.rank for e in ev})
    t0 = min(e.t_start for e in ev)
    bars = defaultdict(list)  # (y, color, outlined) -> [(start ms, width ms)]
    ticks = []
    for j, r in enumerate(ranks):
        base = (len(ranks) - 1 - j) * (len(LANES) + 0.6)
        ticks += [(base + len(LANES) - 1 - k, f"rank {r} {lane}") for k, lane in enumerate(LANES)]
        for i, e in enumerate(ev):
            lane = lane_of[i]
            if e.rank != r:
                continue
            if e.kind == "compute":  # a pipeline action ("1F0"), or the update
                kind = e.name[1:2] if len(e.name) > 1 and e.name[0].isdigit() else None
                key = (base + len(LANES) - 1, ACTION_COLORS.get(kind, "#999999"), True)
            elif lane in LANE_COLORS and (e.kind == "collective" or lane == "pp"):
                key = (base + len(LANES) - 1 - LANES.index("dp" if lane == "emb" else lane), LANE_COLORS[lane], False)
            else:
                continue
            bars[key].append(((e.t_start - t0) * 1e3, (e.t_end - e.t_start) * 1e3))
    crossing = defaultdict(list)  # y -> [(start ms, width ms)] of the messages sent between nodes
    for i, e in enumerate(ev):
        if e.kind in SEND_KINDS and getattr(e, "link", "") == "inter" and lane_of[i] in LANE_COLORS:
            y = (len(ranks) - 1 - ranks.index(e.rank)) * (len(LANES) + 0.6) + len(LANES) - 1 - LANES.index(
                "dp" if lane_of[i] == "emb" else lane_of[i])
            crossing[y].append(((e.t_start - t0) * 1e3, max(e.t_end - e.t_start, 0.0) * 1e3))
    fig, ax = plt.subplots(figsize=(12, 0.26 * len(LANES) * len(ranks) + 2))
    for (y, color, outlined), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=color, edgecolor="k" if outlined else "none", lw=0.3)
    for y, spans in crossing.items():  # traced with ranks per node: what crossed between nodes, in red
        ax.broken_barh(spans, (y - 0.15, 0.3), facecolors=INTER_NODE, edgecolor="none")
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7)
    ax.set_xlabel("time since the first event of the step (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in
               (ACTION_COLORS["F"], ACTION_COLORS["B"], "#999999", LANE_COLORS["tp"], LANE_COLORS["pp"],
                LANE_COLORS["dp"], LANE_COLORS["emb"])]
    names = ["forward of a micro-batch", "backward", "optimizer update", "TP all-reduce",
             "PP send / receive (waiting)", "DP average", "tied-embedding sum"]
    if crossing:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=INTER_NODE))
        names.append("a message between nodes")
    ax.legend(handles, names,
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=4)
    cores = os.cpu_count() or 1
    crowded = (f"\n{len(ranks)} ranks share this machine's {cores} cores: most of a TP lane is a rank waiting for its "
               "partner to get a core, not data moving (one GPU per rank would shrink it)") if len(ranks) > cores else ""
    ax.set_title(f"One traced step of {data['traced']} on {len(ranks)} ranks: the TP all-reduces inside every "
                 "forward and backward,\nthe activations between the stages, then after the flush the tied sum "
                 "(first and last stage) and the DP average, once" + crowded, fontsize=9)
    return save(fig, path, tight=True)


def plot_tokens_per_s(bench, path):
    """Tokens/s of every grid in one ``minipar bench train`` run, against its one-process baseline."""
    plt = pyplot()
    rows = bench["rows"]
    base = rows[0]["tokens_per_s"]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    colors = {1: "#999999", 2: "#4C72B0", 4: "#55A868", 8: "#C44E52"}
    for i, r in enumerate(rows):
        ax.bar(i, r["tokens_per_s"], color=colors.get(r["ranks"], "#8172B3"), edgecolor="k", lw=0.4)
        ax.text(i, r["tokens_per_s"], f"{r['speedup']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.axhline(base, color="k", ls="--", lw=1, label="one process (no communicator)")
    names = ["one\nprocess" if r["ranks"] == 1 and "no communicator" in r["grid"] else short(r["grid"]) for r in rows]
    ax.set_xticks(range(len(rows)), names, fontsize=6)
    ax.set_ylabel("tokens / s")
    for n, c in colors.items():
        ax.bar(0, 0, color=c, label=f"{n} rank{'s' if n > 1 else ''}")
    ax.legend(fontsize=8, ncol=5)
    m = bench["model"]
    ax.set_title(f"minipar bench train: the documented GPT ({m['n_layers']} layers, d={m['d_model']}, T={m['seq_len']}), "
                 f"batch {bench['batch']}, {bench['cores']} cores, float64; ratios over the one-process run of the "
                 f"same job\n{bench.get('note', 'see docs/benchmarks_train.md for the conditions of the run')}",
                 fontsize=9)
    return save(fig, path, tight=True)


# --------------------------------------------------------------------------- the run (rank side)


MODEL = dict(vocab=96, d_model=16, n_heads=8, n_layers=8, seq_len=16)  # 8 | heads, vocab, layers; T % 8 == 0
GRIDS8 = [  # (dp, pp, tp, schedule, sequence parallel)
    (8, 1, 1, "1f1b", False), (4, 2, 1, "gpipe", False), (4, 1, 2, "1f1b", True), (2, 4, 1, "interleaved", False),
    (2, 2, 2, "1f1b", False), (2, 1, 4, "1f1b", False), (1, 8, 1, "1f1b", False), (1, 4, 2, "zb-h1", True),
    (1, 2, 4, "1f1b", False), (1, 1, 8, "1f1b", False)]
TRACED = (2, 2, 2)
MODES = ("none", "selective", "full")
PROMPTS = ["3142>", "9075>", "8261>"]


def grid_config(dp, pp, tp, schedule="1f1b", sp=False, steps=5, batch=16, model=None, data="sorting", lr=1e-2):
    """The lesson's configuration of a grid: the sorting task, m = pp micro-batches."""
    return make_config(model=model or MODEL, dp=dp, pp=pp, tp=tp, schedule=schedule, microbatches=pp,
                       sequence_parallel=sp, steps=steps, batch=batch, data=data, lr=lr)


def group_ranks(grid) -> dict:
    """{axis: the world ranks of my group along it} of a built ``Grid`` (its real sub-communicators)."""
    comms = {"tp": grid.tp, "pp": grid.pp, "dp": grid.dp, "emb": grid.emb}
    return {axis: [c.world_rank(i) for i in range(c.size)] if c is not None else None for axis, c in comms.items()}


def activation_rows(sub, cfg, tr):
    """(every rank's (coords, measured peak, formula), the check row) for a trained configuration."""
    from ..train.accounting import activation_peak

    mine = (tr.grid.coords, int(tr.peak_activations), activation_peak(cfg, tr.grid.coords))
    everyone = sub.builtin.allgather_object(mine)
    err = max(abs(m - f) for _, m, f in everyone)
    return everyone, row(f"{label(cfg)}: activation bytes at the peak = formula, every rank", err, 0)


def traffic_rows(sub, cfg, tr, events):
    """Bytes each rank sent per group in the traced step, against ``accounting.comm_bytes``."""
    from ..train import accounting as acc

    units = [f.n_pad for e in tr.engines for f, _, _ in e.optimizer_parts()]
    want = acc.comm_bytes(cfg, tr.grid.coords, units)
    got = acc.measured_comm(events, sub.world_rank(sub.rank))
    return [row(f"{label(cfg)}: {fam} bytes of the traced step = formula", abs(got[fam] - want[fam]), 0)
            for fam in ("tp", "pp", "dp", "emb")]


def generation(comm, directory, prompts, n_new, tps):
    """Greedy tokens from ``directory``'s checkpoint at each TP size (a KV cache); a check row
    that they are identical, and on rank 0 {tp: (texts, seconds per token)}."""
    from ..train.data import decode, encode
    from ..train.generate import generate, load_model

    ids = np.stack([encode(p) for p in prompts])
    outs = {}
    for tp in tps:
        sub = first_ranks(comm, tp, f"gen{tp}")
        if sub is not None:
            model, _ = load_model(sub, directory)
            out, per_token = generate(sub, model, ids, n_new)
            outs[tp] = ([decode(o) for o in out], per_token)
        wait_politely(comm)
    if comm.rank != 0:
        return [], None
    same = all(outs[tp][0] == outs[tps[0]][0] for tp in tps)
    return [row(f"greedy tokens identical at TP = {', '.join(map(str, tps))} (KV cache)", 0.0 if same else 1.0, 0.0)], outs


def figure_runs(comm, steps=5, grids=GRIDS8, modes=MODES, mode_grids=None, traced=TRACED, checkpoint=None,
                prompts=PROMPTS, n_new=5, tps=(1, 2), data="sorting"):
    """Rank side: train every grid of ``grids`` (on the first dp*pp*tp ranks) ``steps`` steps against one
    process; the ``traced`` grid traces its last step and, given ``checkpoint`` (a directory),
    saves there and is decoded from at each TP of ``tps``; every grid of ``mode_grids`` (default:
    all) also runs one step in each recompute mode of ``modes`` besides "none". ``data``: the
    sorting task, or "random" tokens (quick: no corpus to build). Returns
    {"rows": this rank's check rows} and on world rank 0 also "reference", "curves",
    "memory" {label: {mode: [(coords, measured, formula)]}}, "trace" (events), "traced",
    "groups" [(world rank, coords, {axis: world ranks})] of the traced grid, "generation"
    {tp: (texts, seconds per token)}."""
    from ..train.reference import train_dense
    from ..train.trainer import Trainer, train
    from ..trace import merge

    rows, curves, memory, events, traced_label, groups = [], {}, {}, [], None, []
    ref = None
    for i, (dp, pp, tp, schedule, sp) in enumerate(grids):
        cfg = grid_config(dp, pp, tp, schedule, sp, steps, data=data)
        ref = ref or train_dense(cfg)
        sub = first_ranks(comm, dp * pp * tp, f"grid{i}")
        if sub is not None:
            is_traced = (dp, pp, tp) == tuple(traced)
            tr, losses, _ = train(sub, cfg, trace_step=steps - 1 if is_traced else None,
                                  save=checkpoint if is_traced else None)
            rows += grid_rows(sub, cfg, tr, losses, *ref)
            mem, r = activation_rows(sub, cfg, tr)
            rows.append(r)
            memory[label(cfg)] = {"none": mem}
            curves[label(cfg)] = losses
            if is_traced:
                groups = sub.builtin.allgather_object((comm.rank, tr.grid.coords, group_ranks(tr.grid)))
                events = merge(sub)
                rows += traffic_rows(sub, cfg, tr, sub.tracer.events)
                sub.tracer.clear()
                traced_label = label(cfg)
            if mode_grids is None or (dp, pp, tp) in mode_grids:
                for mode in (m for m in modes if m != "none"):
                    one = cfg.with_(recompute=mode, steps=1, data="random")  # memory does not depend on the data
                    t = Trainer(sub, one)
                    t.step(0)
                    mem, r = activation_rows(sub, one, t)
                    rows.append(r)
                    memory[label(cfg)][mode] = mem
        wait_politely(comm)
    out = {"rows": rows}
    if checkpoint is not None:
        gen_rows, gen = generation(comm, checkpoint, prompts, n_new, tps)
        out["rows"] += gen_rows
    if comm.rank == 0:
        out.update(data=data, reference=ref[0], curves=curves, memory=memory, trace=events, traced=traced_label, groups=groups,
                   generation=gen if checkpoint is not None else None, steps=steps)
    return out


# --------------------------------------------------------------------------- from the run to the figures


def summarize(results):
    """The run's check rows (one per check, over every rank) and rank 0's data."""
    from ..lessons.common import merge_rows

    return merge_rows([r["rows"] for r in results]), results[0]


def checked_run(fn, n, what, backend="mpi", device=None, **kw):
    """Launch the rank side ``fn`` ("module:function") on ``n`` ranks: (its check rows, rank 0's
    data). Every row must pass: a failing one is printed and stops the figures."""
    from ..launcher import launch
    from ..lessons.common import format_rows

    rows, data = summarize(launch(n, fn, backend=backend, device=device, quiet=True, job_timeout=3600.0, **kw).results)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        print(format_rows(bad), flush=True)
        raise RuntimeError(f"{len(bad)} of lesson 05's {what} checks failed")
    return rows, data


def make(outdir, quick=False, backend="mpi", device=None, bench=None):
    import json
    import tempfile

    from . import progress

    os.makedirs(outdir, exist_ok=True)
    kw = dict(steps=3, grids=[g for g in GRIDS8 if g[:3] == (2, 2, 2)], data="random") if quick \
        else dict(steps=8, checkpoint=tempfile.mkdtemp(prefix="minipar-ckpt-"))
    progress(f"{'dp2 pp2 tp2, 3 steps' if quick else 'every 8-rank grid'} against one process on {N} ranks")
    rows, data = checked_run("minipar.figures.train:figure_runs", N, "figure-run", backend, device, **kw)
    print(f"    {len(rows)} checks ok: losses and parameters = one process, replicas and tied copies bitwise equal, "
          f"activation peaks and traffic = formula" + (", greedy tokens identical at every TP" if not quick else ""),
          flush=True)
    j = lambda name: os.path.join(outdir, name)  # noqa: E731
    out = [plot_curves(data, j("train_loss_curves.png")), plot_memory(data, j("train_activation_memory.png")),
           plot_timeline(data, j("train_3d_step_timeline.png"))]
    bench = bench or next((p for p in (j("train_bench.json"), ROOT / "figures" / "train_bench.json")
                           if os.path.exists(p)), None)
    if bench:
        with open(bench) as f:
            out.append(plot_tokens_per_s(json.load(f), j("train_tokens_per_s.png")))
    else:
        print("    no train_bench.json: run `minipar bench train --json figures/train_bench.json` for "
              "train_tokens_per_s.png", flush=True)
    return out


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT, quick="--quick" in sys.argv))
