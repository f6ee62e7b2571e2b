"""Lesson 8 on real ranks: placements, redistribute, strategies run end to end, and the search.

    from minipar import launch
    out = launch(4, "minipar.lessons.auto_parallel:tour")                       # every check, MPI
    out = launch(4, "minipar.lessons.auto_parallel:verify", backend="torch", dtypes=("float32",))
    out = launch(2, "minipar.lessons.auto_parallel:against_dtensor", backend="torch")

Checks, each against a reference that does not use the technique:

1. ``redistribute``: every pair of placements on a 1-D mesh (3-D tensors) and on a 2-D mesh
   (2-D tensors), shapes that divide and shapes that do not. Reference: gather every rank's
   piece (the engine's own object transport), assemble the full tensor, cut out what this rank
   should hold. Pure data movement (no Partial in the source) must be bitwise equal; a move
   that sums addends to 1e-12. The bytes each rank sent (the trace) must equal the formula of
   every step, exactly, which also rules out the engine's collectives (they are not traced).
2. The executor: the hand-written strategies, weight-free operators each on a single rank
   (FlexFlow's Operator dimension) and random strategies, on the 1-D and the 2-D mesh, for
   an MLP under a vocabulary head and a transformer block; loss and every parameter gradient
   against the dense ``minipar.nn`` model; the bytes sent against the simulator's count
   (exact); the parameter elements each rank holds against the strategy's layout (exact).

Numerics: float64 runs must match the float64 dense model to 1e-12 relative (only summation
orders differ). float32 runs are compared with the same float64 reference at 1e-5: sums of at
most a few hundred float32 terms (6e-8 each), measured ~1e-6.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..autoparallel import (Executor, Mesh, Partial, R, P, Shard, assemble, build, fmt, hand_written,
                            local_block, predicted_bytes, redistribute, redistribution_steps, space, step_bytes)
from ..autoparallel.sharding import local_shape
from ..trace import bytes_sent
from ..xp import chunk_bounds, to_numpy
from .common import TOLERANCE, Checks
from .common import merge_rows as summarize  # noqa: F401  (re-exported for tests)

MODELS = {"vocab": dict(B=4, T=5, C=6, H=10, V=13), "block": dict(B=4, T=6, C=8, n_heads=4, H=20)}


def meshes(p):
    """The meshes a world of p ranks is checked on: 1-D, and 2 x p/2 when p is even and > 2."""
    return [(p,)] + ([(2, p // 2)] if p > 2 and p % 2 == 0 else [])


def _noise(mesh, src, x, key):
    """Addends for the Partial axes of ``src`` that cancel over each axis (so the sum stays x)."""
    for i, pl in enumerate(src):
        if isinstance(pl, Partial):
            other = [c for j, c in enumerate(mesh.coords) if j != i]
            n = np.random.default_rng([*key, i, *other]).standard_normal((mesh.shape[i],) + x.shape)
            x = x + (n - n.mean(axis=0))[mesh.coords[i]]
    return x


def check_redistribute(ch, comm, mesh_shape, shapes, seed=0):
    """Every (src, dst) pair of placements on ``mesh_shape`` for each of ``shapes``."""
    mesh, dtype = Mesh(mesh_shape, comm), ch.dtype
    item = np.dtype(dtype).itemsize
    for shape in shapes:
        pls = [Shard(d) for d in range(len(shape))] + [R, P]
        combos = list(itertools.product(pls, repeat=len(mesh_shape)))
        full = np.random.default_rng([seed, *shape]).standard_normal(shape)
        worst = {"moved": 0.0, "summed": 0.0}
        wrong_bytes, outs = [], []
        for a, src in enumerate(combos):
            x = _noise(mesh, src, local_block(full, src, mesh_shape, mesh.coords), (seed, a))
            for dst in combos:
                was, comm.tracer.enabled = comm.tracer.enabled, True
                start = len(comm.tracer.events)
                try:
                    outs.append(to_numpy(redistribute(mesh, comm.asarray(x.astype(dtype)), src, dst, shape)))
                except (ValueError, RuntimeError, IndexError) as err:  # a broken move: a failed row, not a traceback
                    outs.append(f"{fmt(src)}->{fmt(dst)} raised {type(err).__name__}: {err}")
                sent = bytes_sent(comm.tracer.events[start:], comm.world_rank(comm.rank))
                comm.tracer.enabled = was
                del comm.tracer.events[start:]
                want_b = sum(step_bytes(s, shape, mesh_shape, mesh.coords, item) for s in redistribution_steps(src, dst))
                if sent != want_b:
                    wrong_bytes.append(f"{fmt(src)}->{fmt(dst)} sent {sent} B, formula {want_b} B")
        # the reference: gather everything (the engine's transport, not ours), assemble, cut out
        everyone = comm.builtin.allgather_object(outs)
        raised = [y for ys in everyone for y in ys if isinstance(y, str)]
        for i, (src, dst) in enumerate(itertools.product(combos, repeat=2)):
            kind = "summed" if P in src or dtype != "float64" else "moved"
            if any(isinstance(ys[i], str) for ys in everyone):
                worst[kind] = np.inf
                continue
            if P in dst:  # addends are not unique: compare their sum
                got, want = assemble([ys[i] for ys in everyone], dst, shape, mesh_shape), full
            else:
                got, want = outs[i], local_block(full, dst, mesh_shape, mesh.coords)
            err = np.inf if got.shape != want.shape else float(np.max(np.abs(got - want), initial=0.0) / np.max(np.abs(full)))
            worst[kind] = max(worst[kind], err)
        where = f"mesh {'x'.join(map(str, mesh_shape))}, shape {shape}"
        n = len(combos) ** 2
        ch.flag(f"redistribute, {n} pairs, {where}: data moves bitwise" + (f" ({raised[0]})" if raised else ""),
                worst["moved"], 0.0)
        ch.flag(f"redistribute, {n} pairs, {where}: moves that sum addends", worst["summed"], TOLERANCE[dtype])
        ch.flag(f"redistribute, {n} pairs, {where}: bytes sent = formula"
                + (f" (first wrong: {wrong_bytes[0]})" if wrong_bytes else ""), len(wrong_bytes))


def random_strategies(graph, mesh_shape, n, seed=0):
    sp, rng = space(graph, mesh_shape), np.random.default_rng([seed, 5])
    return {f"random {i}": {o: sp[o][rng.integers(len(sp[o]))] for o in sp} for i in range(n)}


def operator_placement(graph, mesh_shape):
    """Every operator without weights on one coordinate ("@k", k turning with the operator:
    LayerNorm's mean and variance land on different ranks), the others replicated."""
    names = [o.name for o in graph.ops]
    return {o.name: ((f"@{names.index(o.name) % min(mesh_shape)}",) * len(mesh_shape) if not o.params
                     else ("-",) * len(mesh_shape)) for o in graph.ops}


def check_executor(ch, comm, mesh_shape, model, sizes, n_random=3, seed=0, strategies=None):
    """Hand-written and random strategies of ``model`` (or the given ``strategies``) against the dense model."""
    mesh, m = Mesh(mesh_shape, comm), build(model, **sizes)
    params, inputs = m.draw(seed)
    loss_ref, grads_ref = m.dense_step(params, inputs)
    like = comm.asarray(np.zeros(1, dtype=ch.dtype))
    where = f"{model}, mesh {'x'.join(map(str, mesh_shape))}"
    strategies = strategies or {
        **hand_written(m.graph, mesh_shape), "operators on single ranks": operator_placement(m.graph, mesh_shape),
        **random_strategies(m.graph, mesh_shape, n_random, seed)}
    wrong_bytes, wrong_memory = [], []
    for name, strategy in strategies.items():
        ex = Executor(mesh, m.graph, strategy, params, inputs, like)
        was, comm.tracer.enabled = comm.tracer.enabled, True
        start = len(comm.tracer.events)
        loss, grads = ex.step()
        sent = bytes_sent(comm.tracer.events[start:], comm.world_rank(comm.rank))
        comm.tracer.enabled = was
        del comm.tracer.events[start:]
        lays = ex.program.layouts
        loss_pl = lays[m.graph.ops[-1].name].out
        stored = {p: lay.stored[p] for lay in lays.values() for p in lay.stored}
        everyone = comm.builtin.allgather_object((loss, {p: to_numpy(g) for p, g in grads.items()}))  # the reference's gather
        got_loss = float(assemble([np.array(e[0]) for e in everyone], loss_pl, (), mesh_shape))
        errs = {"loss": abs(got_loss - loss_ref) / abs(loss_ref)}
        for p in grads:
            full = assemble([e[1][p] for e in everyone], stored[p], params[p].shape, mesh_shape)
            errs[p] = float(np.max(np.abs(full - grads_ref[p])) / np.max(np.abs(grads_ref[p])))
        worst = max(errs, key=errs.get)
        tol = TOLERANCE[ch.dtype]
        ch.flag(f"executor, {where}, {name}: loss and {len(grads)} gradients vs dense"
                + (f" (worst {worst})" if errs[worst] > tol else ""), errs[worst], tol)
        want_b = predicted_bytes(m.graph, strategy, mesh_shape, np.dtype(ch.dtype).itemsize)[comm.rank]
        if sent != want_b:
            wrong_bytes.append(f"{name}: sent {sent} B, simulator {want_b} B")
        want_held = sum(int(np.prod(local_shape(params[p].shape, stored[p], mesh_shape, mesh.coords))) for p in stored)
        if ex.held_elements() != want_held:
            wrong_memory.append(f"{name}: holds {ex.held_elements()} parameter elements, layout says {want_held}")
    ch.flag(f"executor, {where}: bytes sent = simulator's count, {len(strategies)} strategies"
            + (f" (first wrong: {wrong_bytes[0]})" if wrong_bytes else ""), len(wrong_bytes))
    ch.flag(f"executor, {where}: parameter elements held = layout, {len(strategies)} strategies"
            + (f" (first wrong: {wrong_memory[0]})" if wrong_memory else ""), len(wrong_memory))


# --------------------------------------------------------------------------- the drivers


def verify(comm, dtypes=("float64",), seed=0, n_random=3, dtensor=False, quick=False):
    """Every check on this world size, once per dtype; returns the rows of ``Checks``.
    quick: one shape (that does not divide) per mesh instead of two."""
    p = comm.size
    rows = []
    for dtype in dtypes:
        ch = Checks(comm, dtype)
        for mesh_shape in meshes(p):
            shapes = [(2 * p, p + 1, 3), (p + 1, 2 * p - 1, 1)] if len(mesh_shape) == 1 else [(4, 6), (3, 5)]
            shapes = shapes[1:] if quick else shapes
            check_redistribute(ch, comm, mesh_shape, shapes, seed)
            for model, sizes in MODELS.items():
                check_executor(ch, comm, mesh_shape, model, sizes, n_random, seed)
        rows += [{**r, "what": f"[{dtype}] {r['what']}"} if dtype != "float64" else r for r in ch.rows]
    return rows + (against_dtensor(comm, seed) if dtensor else [])


def tour(comm, seed=0):
    """The lesson's checks in float64 (see ``verify``)."""
    return verify(comm, ("float64",), seed, n_random=2, quick=True)


def run_strategies(comm, model, sizes, strategies, mesh=None, dtype="float64", seed=0):
    """Given strategies ({name: {op: choice}}, a found one say) of ``model`` on real ranks against
    the dense model: loss and gradients, bytes sent = simulator's count, parameters held = layout."""
    ch = Checks(comm, dtype)
    strategies = {name: {op: tuple(c) for op, c in s.items()} for name, s in strategies.items()}
    check_executor(ch, comm, tuple(mesh or (comm.size,)), model, sizes, seed=seed, strategies=strategies)
    return ch.rows


def redistribution_times(comm, sizes=(2**13, 2**16, 2**19), reps=3):
    """Each collective move (all-gather, all-reduce, reduce-scatter, all-to-all) timed on the 1-D
    mesh of all ranks at a few sizes, beside its alpha-beta-gamma time with the alpha, beta,
    gamma fitted to them all (what calibration does): {"alpha", "beta", "gamma", "rows": [(kind,
    axis, bytes of the tensor, measured s, formula s)]}."""
    from ..autoparallel.calibrate import fit_network

    alpha, beta, gamma, rows = fit_network(comm, Mesh((comm.size,), comm), sizes=sizes, reps=reps)
    return {"alpha": alpha, "beta": beta, "gamma": gamma, "rows": rows}


# a machine like a small cluster node: 10 GFLOP/s per rank, 5 us latency, 1 GB/s per link
FIXED_COSTS = dict(alpha=5e-6, beta=1e-9, gamma=1e-10, copy=1e-10, flop_time=1e-10, op_overhead=1e-5)
# where one strategy does not fit every operator (docs/autoparallel.md)
SEARCH_CASES = {"wide": dict(B=8, T=64, C=32, n_heads=4, H=1024), "vocab": dict(B=8, T=64, C=32, H=32, V=4096)}


def search_fixed_costs(model, sizes, mesh=(4,), iterations=2500, seed=0, comm=True, margin=0.03):
    """The search in one process on the fixed cost model above (no calibration): {"starts": {name:
    predicted s}, "found": strategy, "cost": s, "lines": one line per operator, "result": SearchResult,
    "rows": [ok when the strategy found is at least ``margin`` faster than every hand-written one]}."""
    from ..autoparallel import Costs, Simulator, describe, mcmc

    m = build(model, **sizes)
    sim = Simulator(m.graph, tuple(mesh), Costs(**FIXED_COSTS, comm=comm))
    res = mcmc(sim, space(m.graph, tuple(mesh)), hand_written(m.graph, tuple(mesh)), iterations=iterations, seed=seed)
    best = min(res.start_costs.values())
    row = {"what": f"search, {model} on mesh {'x'.join(map(str, mesh))}: found {res.cost * 1e3:.2f} ms, best "
                   f"hand-written {best * 1e3:.2f} ms (at least {margin:.0%} faster)",
           "error": max(0.0, res.cost / ((1 - margin) * best) - 1), "tolerance": 0.0, "ok": res.cost <= (1 - margin) * best}
    return {"starts": res.start_costs, "found": res.best, "cost": res.cost, "lines": describe(m.graph, res.best),
            "result": res, "rows": [row]}


def against_dtensor(comm, seed=0, pairs_2d=32):
    """minipar's redistribute vs torch DTensor's, on the torch backend (gloo), 1-D and 2-D meshes.

    Same full values for every pair of placements (on the 2-D mesh, ``pairs_2d`` of them drawn
    at random) and every shape, except the pairs that make a Partial: DTensor's public
    ``redistribute`` refuses those (its Replicate -> Partial, used inside, divides the value by
    m on every rank; ours keeps it on coordinate 0). Where the shape divides, the local pieces
    are equal too. Where it does not they differ by design: DTensor cuts like ``torch.chunk``
    (ceil(n/m) per piece, the last ones short or empty: 5 over 4 is 2, 2, 1, 0), minipar like
    ``chunk_bounds`` (the first n % m one longer: 2, 1, 1, 1); a row checks DTensor's sizes.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor import Partial as TPartial, Replicate as TReplicate, Shard as TShard

    ch, rng = Checks(comm, "float64"), np.random.default_rng([seed, 9])
    tplace = lambda pls: [TShard(p.dim) if isinstance(p, Shard) else TPartial() if isinstance(p, Partial)  # noqa: E731
                          else TReplicate() for p in pls]
    for mesh_shape in meshes(comm.size):
        mesh, tmesh = Mesh(mesh_shape, comm), init_device_mesh("cpu", mesh_shape)
        combos = list(itertools.product([Shard(0), Shard(1), R, P], repeat=len(mesh_shape)))
        pairs = [(a, b) for a, b in itertools.product(combos, repeat=2) if not any(d == P and s != P for s, d in zip(a, b))]
        if len(mesh_shape) > 1:
            pairs = [pairs[i] for i in sorted(rng.choice(len(pairs), min(pairs_2d, len(pairs)), replace=False))]
        for shape in ([(2 * comm.size, 4), (comm.size + 1, 3)] if len(mesh_shape) == 1 else [(4, 6), (3, 5)]):
            full = np.random.default_rng([seed, *shape]).standard_normal(shape)
            divides = all(n % m == 0 for n in shape for m in mesh_shape)
            worst_full, worst_local, sizes = 0.0, 0.0, 0
            for src, dst in pairs:
                ours = to_numpy(redistribute(mesh, torch.tensor(local_block(full, src, mesh_shape, mesh.coords)),
                                             src, dst, shape))
                # DTensor's source: its own pieces of the full tensor; a Partial axis keeps them on coordinate 0
                base = distribute_tensor(torch.tensor(full), tmesh, tplace([R if p == P else p for p in src])).to_local()
                if any(p == P and c for p, c in zip(src, mesh.coords)):
                    base = base * 0
                theirs = DTensor.from_local(base, tmesh, tplace(src), shape=torch.Size(shape),
                                            stride=torch.empty(shape).stride()).redistribute(tmesh, tplace(dst))
                ours_full = assemble(comm.builtin.allgather_object(ours), dst, shape, mesh_shape)
                worst_full = max(worst_full, float(np.max(np.abs(ours_full - theirs.full_tensor().numpy()))))
                local = theirs.to_local().numpy()
                if divides and P not in dst:
                    sizes += local.shape != ours.shape
                    if local.shape == ours.shape:
                        worst_local = max(worst_local, float(np.max(np.abs(local - ours), initial=0.0)))
            where = f"{len(pairs)} pairs, mesh {'x'.join(map(str, mesh_shape))}, shape {shape}"
            ch.flag(f"DTensor redistribute, {where}: same full tensors", worst_full / np.max(np.abs(full)), 1e-12)
            if divides:
                ch.flag(f"DTensor redistribute, {where}: same local pieces, same sizes",
                        max(worst_local / np.max(np.abs(full)), sizes), 1e-12)
        if len(mesh_shape) == 1:  # where the chunk rules differ: DTensor's piece sizes are torch.chunk's
            n, m = comm.size + 1, comm.size
            got = comm.builtin.allgather_object(distribute_tensor(torch.zeros(n), tmesh, [TShard(0)]).to_local().shape[0])
            chunk = [max(0, min(-(-n // m), n - r * -(-n // m))) for r in range(m)]
            ours = [b - a for a, b in chunk_bounds(n, m)]
            ch.flag(f"DTensor splits {n} over {m} as {got} (torch.chunk: {chunk}); minipar as {ours} (chunk_bounds)",
                    float(got != chunk))
    return ch.rows
