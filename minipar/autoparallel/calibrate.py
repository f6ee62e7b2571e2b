"""Measure this machine once, on the ranks themselves, for the simulator.

    costs = calibrate(comm, graph, mesh_shape=(4,))     # collective: call it on every rank

Three things are measured, every rank at the same time (so the ranks compete for the cores as
they will when the strategy runs), and averaged over the ranks:

1. every operator signature a search can ask for: forward and backward on pieces of that
   shape (the fastest of a few repetitions);
2. the collectives: each redistribution step (all-gather, all-reduce, reduce-scatter,
   all-to-all) on every mesh axis at a few sizes; alpha, beta and gamma are the least-squares
   fit of ``transitions.step_time`` to those times;
3. the time per byte of a local copy.

The results are cached in ``$MINIPAR_CACHE_DIR/autoparallel.json`` (default
``$XDG_CACHE_HOME/minipar/`` or ``~/.cache/minipar/``), one entry per host, backend, dtype and
mesh. Later runs measure only the signatures they have not seen; ``recalibrate=True`` starts
over. Tests point MINIPAR_CACHE_DIR at a temporary folder that pytest removes.
"""
from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from .. import collectives
from ..records import cache_dir
from . import ops
from .sharding import P, R, Shard, block, local_block
from .transitions import redistribution_steps, run_step, step_time
from .simulate import Costs, signatures
from ..xp import to_numpy

SIZES = (2**10, 2**13, 2**16, 2**19)  # bytes per rank's tensor in the collective fit
# wall: seconds on the clock (what a step takes). cpu: seconds this process ran (leaves out the
# time it waited, descheduled, for a core: on a machine shared with other jobs, the only clock
# whose readings mean the same from one minute to the next)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def cache_file() -> str:
    return os.path.join(cache_dir(), "autoparallel.json")


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def machine_key(comm, dtype, mesh_shape, clock="wall") -> str:
    return f"{platform.node()}|{comm.backend}|{dtype}|mesh {'x'.join(map(str, mesh_shape))}|{clock} clock"


def _mean_over_ranks(comm, values):
    a = comm.asarray(np.asarray(values, dtype=np.float64))
    return to_numpy(collectives.all_reduce(comm, a)).astype(np.float64) / comm.size


def _max_over_ranks(comm, value):
    a = comm.asarray(np.array([value], dtype=np.float64))
    return float(collectives.all_reduce(comm, a, op="max")[0])


_SCRATCH = []  # 64 MB, allocated on first use: more than the caches hold


def _timed(fn, reps, cold=False, clock="wall"):
    """The fastest of ``reps`` runs after a warm-up: the time when nothing else interrupts (as
    ``timeit`` advises); the step times it predicts are compared with measured minima too.
    cold: overwrite 64 MB before each run, so the operator's inputs are no longer in the caches
    (inside a step, other operators have run in between)."""
    times = []
    for _ in range(reps + 1):
        if cold:
            _SCRATCH[:] = _SCRATCH or [np.zeros(2**23)]
            np.add(_SCRATCH[0], 1.0, out=_SCRATCH[0])
        now = CLOCKS[clock]
        t0 = now()
        fn()
        times.append(now() - t0)
    return float(np.min(times[1:]))


# --------------------------------------------------------------------------- 1. operators


def measure_ops(comm, graph, mesh_shape, sigs, dtype="float64", reps=3, seed=0, clock="wall") -> dict:
    """{repr(signature): [forward s, backward s]} for ``sigs`` (every rank measures them all)."""
    rng = np.random.default_rng([seed, comm.rank])
    A = lambda shape: comm.asarray(rng.standard_normal(shape).astype(dtype))  # noqa: E731
    rows = []
    for sig, (op, lay, co) in sigs:
        _, in_shapes, p_shapes, out_shape, _ = sig
        x = [A(s) for s in in_shapes]
        if op.kind == "norm":  # a variance must be positive
            x[2] = x[2] * x[2] + 0.5
        params = {p: A(s) for p, s in zip(op.params, p_shapes)}
        out_block = block(graph.tensors[op.output].shape, lay.out, mesh_shape, co)
        dy = A(out_shape)
        held = {}

        def fwd():
            held["y"], held["ctx"] = ops.forward(op, x, params, out_block)

        fwd()
        ctx0 = held["ctx"]
        t_f = _timed(fwd, reps, cold=True, clock=clock)
        t_b = _timed(lambda: ops.backward(op, dy, ctx0), reps, cold=True, clock=clock)
        rows.append([t_f, t_b])
    means = _mean_over_ranks(comm, rows) if rows else np.zeros((0, 2))
    return {repr(sig): [float(f), float(b)] for (sig, _), (f, b) in zip(sigs, means.reshape(-1, 2))}


# --------------------------------------------------------------------------- 2. collectives, 3. copies


def fit_network(comm, mesh, dtype="float64", sizes=SIZES, reps=5, clock="wall"):
    """(alpha, beta, gamma, samples): least squares of every redistribution step kind's measured
    time against its alpha-beta-gamma formula, on every mesh axis. samples: (kind, axis, bytes,
    measured s, the formula's s with the fit) for the record."""
    item = np.dtype(dtype).itemsize
    rows, times, samples = [], [], []
    for axis, m in enumerate(mesh.shape):
        if m == 1:
            continue
        for n in sizes:
            cols = max(m, n // item // (4 * m))
            shape = (4 * m, cols)
            full = np.random.default_rng([len(rows)]).standard_normal(shape).astype(dtype)
            for src_pl, dst_pl in ((Shard(0), R), (P, R), (P, Shard(0)), (Shard(0), Shard(1))):
                src = tuple(src_pl if i == axis else R for i in range(len(mesh.shape)))
                dst = tuple(dst_pl if i == axis else R for i in range(len(mesh.shape)))
                (step,) = redistribution_steps(src, dst)
                x = comm.asarray(local_block(full, src, mesh.shape, mesh.coords))
                comm.barrier()
                t = _max_over_ranks(comm, _timed(lambda: run_step(mesh, x, step, shape), reps, clock=clock))
                unit = [step_time(step, shape, mesh.shape, mesh.coords, item, *e) for e in np.eye(3)]
                rows.append(unit)
                times.append(t)
                samples.append((step.kind, axis, int(np.prod(shape)) * item, t))
    if not rows:
        return 0.0, 0.0, 0.0, samples
    A, t = np.array(rows), np.array(times)
    w = 1.0 / t  # relative errors: small messages count as much as large ones
    keep = [0, 1, 2]
    while True:  # non-negative least squares on three unknowns: drop a negative one and refit
        coef = np.linalg.lstsq(A[:, keep] * w[:, None], t * w, rcond=None)[0]
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    out = np.zeros(3)
    out[keep] = np.maximum(coef, 0)
    samples = [(*sample, float(fitted)) for sample, fitted in zip(samples, A @ out)]
    return float(out[0]), float(out[1]), float(out[2]), samples


def measure_copy(comm, dtype="float64", nbytes=2**22, reps=5, clock="wall") -> float:
    """Seconds per byte of copying an array (what a slice or a zero fill costs)."""
    x = comm.asarray(np.random.default_rng(comm.rank).standard_normal(nbytes // np.dtype(dtype).itemsize).astype(dtype))
    t = _timed(lambda: x * 1.0, reps, clock=clock)
    return float(_mean_over_ranks(comm, [t / nbytes])[0])


# --------------------------------------------------------------------------- all of it, cached


def calibrate(comm, graph, mesh_shape, dtype="float64", strategies=None, recalibrate=False, cache=True,
              verbose=False, clock="wall") -> Costs:
    """The :class:`Costs` of this machine for ``graph`` on ``mesh_shape`` (collective).

    ``strategies``: measure only the signatures these need (default: every one a search may
    visit). Cached as described in the module docstring."""
    from .sharding import Mesh

    mesh = Mesh(mesh_shape, comm)
    path, key = cache_file(), machine_key(comm, dtype, mesh_shape, clock)
    data = _load(path) if cache else {}
    entry = {} if recalibrate else dict(data.get(key, {}))
    entry.setdefault("ops", {})
    t0 = time.perf_counter()
    if "alpha" not in entry:
        a, b, g, samples = fit_network(comm, mesh, dtype, clock=clock)
        entry.update(alpha=a, beta=b, gamma=g, copy=measure_copy(comm, dtype, clock=clock), samples=samples)
    sigs = sorted(signatures(graph, mesh_shape, strategies).items(), key=lambda kv: repr(kv[0]))
    missing = [(s, v) for s, v in sigs if repr(s) not in entry["ops"]]
    entry["ops"].update(measure_ops(comm, graph, mesh_shape, missing, dtype, clock=clock))
    if verbose and comm.rank == 0:
        print(f"calibrated in {time.perf_counter() - t0:.1f} s: {len(missing)} new of {len(sigs)} operator "
              f"signatures; alpha {entry['alpha'] * 1e6:.1f} us, beta {entry['beta'] * 1e9:.3f} ns/B "
              f"({cache_file() if cache else 'not cached'})", flush=True)
    if cache and comm.rank == 0:
        latest = _load(path)  # another job may have added entries meanwhile
        latest[key] = {**latest.get(key, {}), **entry, "ops": {**latest.get(key, {}).get("ops", {}), **entry["ops"]}}
        _save(path, latest)
    comm.barrier()
    return Costs(entry["alpha"], entry["beta"], entry["gamma"], entry["copy"],
                 table=entry["ops"], itemsize=np.dtype(dtype).itemsize)
