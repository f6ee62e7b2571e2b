"""Lesson 05's notebook and figures: the runs they draw, on real ranks, each checked.

    out = launch(8, "minipar.lessons.train_runs:lesson", checkpoint="/tmp/ckpt")   # everything below
    rows = merge_rows([r["rows"] for r in out.results]); data = out.results[0]

One job trains every grid of the world (``GRIDS8``: every dp x pp x tp factorization of 8, with
a mix of schedules, sequence parallelism on two) on the sorting task, one after the other on
the same ranks, and draws from those runs:

    curves      every grid's loss per step, and the one-process run's: equal to 1e-12 (float64)
    memory      each rank's activation peak, counted from the arrays it holds, and the formula
                (``minipar.train.accounting``): to the byte, for each recompute mode
    timeline    the last step of the 3D grid, traced: compute, TP, PP, DP and tied-sum lanes, and
                its bytes per group against the formula
    generation  greedy text from the 3D grid's checkpoint at TP = 1 and 2: identical tokens

``zero_with_pipeline`` puts seed 003's argument (why ZeRO-2/3 are rarely combined with PP) in
numbers. The checks reuse ``minipar.lessons.train`` (``grid_rows``: losses, parameters,
replicas, tied copies) and ``minipar.train.accounting`` (the formulas).
"""
from __future__ import annotations

import numpy as np

from .train import first_ranks, grid_rows, label, make_config, row, wait_politely

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


def lesson(comm, steps=5, grids=GRIDS8, modes=MODES, mode_grids=None, traced=TRACED, checkpoint=None,
           prompts=PROMPTS, n_new=5, tps=(1, 2), data="sorting"):
    """Train every grid of ``grids`` (on the first dp*pp*tp ranks) ``steps`` steps against one
    process; the ``traced`` grid traces its last step and, given ``checkpoint`` (a directory),
    saves there and is decoded from at each TP of ``tps``; every grid of ``mode_grids`` (default:
    all) also runs one step in each recompute mode of ``modes`` besides "none". ``data``: the
    sorting task, or "random" tokens (quick: no corpus to build). Returns
    {"rows": this rank's check rows} and on world rank 0 also "reference", "curves",
    "memory" {label: {mode: [(coords, measured, formula)]}}, "trace" (events), "traced",
    "groups" [(world rank, coords, {axis: world ranks})] of the traced grid, "generation"
    {tp: (texts, seconds per token)}."""
    from ..train.trainer import Trainer, train, train_reference
    from ..trace import merge

    rows, curves, memory, events, traced_label, groups = [], {}, {}, [], None, []
    ref = None
    for i, (dp, pp, tp, schedule, sp) in enumerate(grids):
        cfg = grid_config(dp, pp, tp, schedule, sp, steps, data=data)
        ref = ref or train_reference(cfg)
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


# --------------------------------------------------------------------------- ZeRO-2/3 with a pipeline


def zero_with_pipeline(psi, dp, pp, tp, m, bytes_param=2, bytes_grad=2, k=12):
    """Bytes per rank of model state and of DP traffic per step, for ZeRO stages 0-3 combined with
    a pipeline of m micro-batches (seed 003's argument, in numbers).

    A rank holds psi / (pp tp) parameters. Its gradients are complete only after the last
    micro-batch's backward (the flush), and they are averaged over dp ranks:

        stage 0, 1  one all-reduce (ZeRO-1: reduce-scatter + all-gather): 2 (dp-1)/dp of the gradients
        stage 2     keeping only a shard of the gradients means reduce-scattering each micro-batch's
                    contribution as it is produced: m reduce-scatters + the parameters' all-gather,
                    (m + 1) (dp-1)/dp, in m small pieces on the pipeline's critical path (holding
                    the full gradient until the flush instead saves nothing)
        stage 3     the weights are gathered for every micro-batch's forward and again for its
                    backward, and its gradient reduce-scattered: 3 m (dp-1)/dp
    """
    from ..memory import zero_bytes

    share = psi / (pp * tp)
    unit = (dp - 1) / dp * share * bytes_grad
    traffic = {0: 2 * unit, 1: 2 * unit, 2: (m + 1) * unit, 3: 3 * m * unit}
    return [dict(stage=s, memory=zero_bytes(share, dp, s, bytes_param, bytes_grad, k)["total_bytes"],
                 dp_traffic=traffic[s], collectives_per_step={0: 1, 1: 2, 2: m + 1, 3: 3 * m}[s])
            for s in range(4)]
