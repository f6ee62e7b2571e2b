"""Lab 05, task 5.6: the global gradient norm that ``--clip`` clips by, on every grid of 2 and 4
ranks (the rest of the lab's checks: ``minipar.labs.lab05``).

Each rank is handed only its own pieces of a tiny GPT's gradients (its stage's parameters, its TP
shard, its ZeRO shard over dp; the other dp ranks' elements NaN) and must return the norm of one
process, float64, to 1e-12. The typical mistakes are named by the value they give: the rank's own
pieces only, parameters whole on every TP rank counted tp times, the tied embedding counted on
both ends, the sum over the pipeline missing, the one over dp missing.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..xp import chunk_bounds, to_numpy
from .checks import COLLECTIVES, draw, graded, no_builtin, poisoned, sent_by_learner, stop

INSTEAD = "minipar.collectives.all_reduce (a ring on send/recv) or comm.sendrecv"

# Task 5.6's hints, stage by stage (`minipar check 05 --hint 5.6`; lab05.HINTS holds every task's).
NORM_HINTS = {
    "5.6": (
        """Every rank adds the squares of the elements it answers for, one all-reduce (sum) over the
        whole grid adds those up, and the norm is the square root. The work is choosing what a rank
        answers for, so that each element of the model is counted once: a TP shard by its TP rank,
        a parameter held whole on every TP rank by one of them, the tied embedding by one end of
        the pipeline, a ZeRO shard by its dp rank. The trainer: Trainer.grad_norm and counted_here
        in minipar/train/trainer.py.""",
        """d, p, t = grid.coords. Skip a piece that is not split (whole on every TP rank) unless t == 0;
        skip 'wte' on the last stage when grid.pp.size > 1 (the first stage counts it); of the rest
        add (g[lo:hi] ** 2).sum(): the other elements are other dp ranks' (NaN here). Keep the sum in
        an array of one element (zeros((1,), like=g) from minipar.xp, in float64), all_reduce it over
        grid.world, and take the square root.""",
        """
        d, p, t = grid.coords
        mine = zeros((1,), like=grads[0][1])
        for name, g, split, (lo, hi) in grads:
            if (split or t == 0) and not (name == "wte" and p == grid.pp.size - 1 and p > 0):
                mine += (g[lo:hi] ** 2).sum()
        return math.sqrt(float(all_reduce(grid.world, mine)[0]))
        """,
    ),
}


NC, NV, NT, NL = 8, 24, 6, 4  # a tiny GPT: width, vocabulary, positions, layers (4: over 1, 2 or 4 stages)
LAYER = {"ln1.gamma": ((NC,), None), "attn.qkv.w": ((NC, 3 * NC), 1), "attn.proj.w": ((NC, NC), 0),
         "attn.proj.b": ((NC,), None), "mlp.fc.w": ((NC, 4 * NC), 1), "mlp.fc.b": ((4 * NC,), 0)}  # shape, TP axis
NORM_GRIDS = {2: [(1, 1, 2), (1, 2, 1), (2, 1, 1)], 4: [(1, 2, 2), (2, 2, 1), (2, 1, 2), (1, 4, 1)]}  # (dp, pp, tp)


def stage_params(p, pp):
    """[(name, shape, TP axis or None: whole on every TP rank)] of stage p of pp: the first holds
    the embeddings, every stage NL/pp blocks, the last ln_f and the head, tied to wte (its copy is
    listed again there when pp > 1)."""
    out = [("wte", (NV, NC), 0), ("wpe", (NT, NC), None)] if p == 0 else []
    per = NL // pp
    out += [(f"h{i}.{k}", shape, ax) for i in range(p * per, (p + 1) * per) for k, (shape, ax) in LAYER.items()]
    if p == pp - 1:
        out += [("ln_f.gamma", (NC,), None)] + ([("wte", (NV, NC), 0)] if pp > 1 else [])
    return out


def norm_pieces(dp, pp, tp, coords, seed):
    """What rank at coords = (d, p, t) holds: [(name, g, split, (lo, hi))], g its TP piece of the
    parameter's gradient, flat, NaN outside its ZeRO shard lo:hi over dp; and the one-process
    gradients {name: array}, every parameter once."""
    d, p, t = coords
    full = {n: draw(*shape, seed=seed + zlib.crc32(n.encode())) * (3.0 if ax is None else 1.0)
            for q in range(pp) for n, shape, ax in stage_params(q, pp)}  # replicated ones larger: their count shows
    out = []
    for name, shape, ax in stage_params(p, pp):
        g = full[name]
        if ax is not None:
            a, b = chunk_bounds(shape[ax], tp)[t]
            g = np.take(g, np.arange(a, b), axis=ax)
        g = g.ravel()
        lo, hi = chunk_bounds(g.size, dp)[d]
        out.append((name, poisoned(g, slice(lo, hi)), ax is not None, (lo, hi)))
    return out, full


def norm_mistakes(dp, pp, tp, coords, full):
    """{what a typical mistake gives on this rank: its name}, to say which one a wrong norm is."""
    d, p, t = coords

    def norm(stages, tp_times=1, tied=1, dp_part=False, own=False):
        s = 0.0
        for q in stages:
            for name, shape, ax in stage_params(q, pp):
                if name == "wte" and q == pp - 1 and pp > 1 and tied == 1:
                    continue
                g = full[name]
                if own and ax is not None:
                    a, b = chunk_bounds(shape[ax], tp)[t]
                    g = np.take(g, np.arange(a, b), axis=ax)
                g = g.ravel()
                if dp_part:
                    g = g[slice(*chunk_bounds(g.size, dp)[d])]
                s += float(np.sum(g * g)) * (tp_times if ax is None else 1)
        return float(np.sqrt(s))

    every = range(pp)
    out = {norm([p], tied=2, own=True, dp_part=True): "the norm of this rank's own pieces only: every rank holds a part of "
                                               "the model, so the sum of squares must be added up over the whole grid"}
    if tp > 1:
        out[norm(every, tp_times=tp)] = (f"the parameters held whole on every TP rank (LayerNorms, row-parallel "
                                         f"biases, wpe) counted on each of them: {tp} times; let one TP rank count them")
    if pp > 1:
        out[norm(every, tied=2)] = ("the tied embedding counted on the first and on the last stage: it is one "
                                    "parameter, let one end count it")
        out[norm([p])] = "the sum over the pipeline is missing: that is the norm of this rank's stage only"
    if dp > 1:
        out[norm(every, dp_part=True)] = ("the sum over dp is missing: each dp rank holds only its ZeRO shard, the "
                                          "shards add up over grid.dp")
    return out


def check_grad_norm(comm, fn):
    from ..grid import Grid

    r = comm.rank
    for dp, pp, tp in NORM_GRIDS.get(comm.size, [(1, 1, comm.size)]):
        grid = Grid(comm, dp, pp, tp)
        for seed in (0, 1):
            pieces, full = norm_pieces(dp, pp, tp, grid.coords, seed)
            want = float(np.sqrt(sum(float(np.sum(g * g)) for g in full.values())))
            case = f"dp{dp} pp{pp} tp{tp}, rank {r} at (d, p, t) = {grid.coords}, seed {seed}"
            g = graded(comm, lambda: fn(grid, [(n, comm.asarray(a.copy()), s, c) for n, a, s, c in pieces]))
            fails = no_builtin(comm, g, "global_grad_norm", INSTEAD)
            got = None
            if not fails:
                try:
                    got = float(to_numpy(g.out)) if g.out is not None else None
                except (TypeError, ValueError):
                    got = None
                if got is None:
                    fails = [f"rank {r}: global_grad_norm returned {type(g.out).__name__}, expected the norm, a float "
                             f"({case})"]
            if not fails and not (abs(got - want) <= 1e-12 * want):
                head = f"rank {r}: the norm is {got!r}, expected {want!r}, the norm of one process ({case})"
                if np.isnan(got):
                    fails = [f"{head}: NaN comes from the poison, the other dp ranks' elements of a ZeRO-sharded "
                             f"gradient: only g[lo:hi] is this rank's"]
                else:
                    named = [why for v, why in norm_mistakes(dp, pp, tp, grid.coords, full).items()
                             if abs(got - v) <= 1e-9 * v]
                    fails = [head + (f": {named[0]}" if named else "")]
            fails = fails or sent_by_learner(comm, g, fn, "global_grad_norm", INSTEAD, COLLECTIVES)
            if stop(comm, fails):
                return fails
    return []
