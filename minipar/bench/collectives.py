"""Benchmark: every from-scratch all-reduce against the engine's own, in one run.

    mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json bench.json
    minipar bench collectives -n 4            # the same, launching mpiexec for you

For each size (8 B ... 64 MiB of float32) and each algorithm (and ``builtin`` =
MPI_Allreduce / dist.all_reduce) it measures the time of one all-reduce (mean over a batch of
repetitions, slowest rank), the algbw and busbw (nccl-tests definitions), and the alpha-beta
prediction from a ping-pong fit. Ratios ours/builtin are taken in the same run, so machine
noise hits both sides alike. ``minipar.figures.collectives.plot_busbw`` draws a run's result.

A learner's lab 01 exercise (``--file``) joins the same run as ``yours``: its ring_all_reduce is
one more column of the all-reduce table, and its ring_reduce_scatter, ring_all_gather and
tree_broadcast each get a table of their own beside minipar's (a ring, a ring, a binomial tree)
and the builtin (:func:`learner_functions`, then ``run(..., yours=...)``). Each record says its
``collective`` ("all_reduce", "reduce_scatter", "all_gather", "broadcast"); for the
all-gather ``bytes`` is the gathered vector, as in nccl-tests.
"""
from __future__ import annotations

import time

import numpy as np

from .. import collectives as C
from .. import costmodel as M
from .. import xp

DEFAULT_SIZES = [8 * 4**k for k in range(12)] + [16 * 2**20, 64 * 2**20]  # 8 B ... 32 MiB, 16, 64 MiB
ALGS = C.ALGORITHMS + ("builtin",)
YOURS = "yours"  # the algorithm name of a learner's function in the records and the tables
# the lab 01 functions a learner's exercise brings, by the collective each is (function, task);
# each but the all-reduce is measured beside minipar's algorithm for it and the builtin
LAB01 = {"all_reduce": ("ring_all_reduce", "1.5"), "reduce_scatter": ("ring_reduce_scatter", "1.3"),
         "all_gather": ("ring_all_gather", "1.4"), "broadcast": ("tree_broadcast", "1.2")}
MINIPARS = {"reduce_scatter": "ring", "all_gather": "ring", "broadcast": "tree"}  # minipar's algorithm of each


def reduce_rate(comm, nbytes=8 << 20):
    """gamma: seconds per byte of an in-place float32 add on this rank."""
    a, b = comm.asarray(np.ones(nbytes // 4, np.float32)), comm.asarray(np.ones(nbytes // 4, np.float32))
    C._combine(a, b, "sum")
    t0 = time.perf_counter()
    for _ in range(5):
        C._combine(a, b, "sum")
    return comm.builtin.all_reduce(comm.asarray(np.array([(time.perf_counter() - t0) / 5 / nbytes])), "max")[0].item()


def time_one(comm, algorithm, x, budget=0.3, call=None):
    """Mean seconds per all-reduce (or per ``call()``, when given) over a batch sized to ~budget
    seconds; max over ranks."""
    run = call or ((lambda: comm.builtin.all_reduce(x)) if algorithm == "builtin" else
                   (lambda: C.all_reduce(comm, x, algorithm)))
    comm.barrier()
    t0 = time.perf_counter()
    run()  # warm-up, also sizes the batch
    first = comm.builtin.all_reduce(comm.asarray(np.array([time.perf_counter() - t0])), "max")[0].item()
    reps = int(max(1, min(200, budget / max(first, 1e-7))))
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    mine = (time.perf_counter() - t0) / reps
    return comm.builtin.all_reduce(comm.asarray(np.array([mine])), "max")[0].item()


def _vector(comm, nbytes):
    """This rank's float32 input of ``nbytes`` (a fresh draw per rank and size; at least one element)."""
    n = max(1, nbytes // 4)
    return comm.asarray(np.random.default_rng([comm.rank, n]).standard_normal(n).astype(np.float32))


def inputs(comm, collective, x):
    """(the arguments after comm that a function of ``collective`` takes, the builtin's call) on
    this rank's vector x: the all-reduce and the reduce-scatter take x; the all-gather this rank's
    chunk of x (``xp.chunk_bounds``) and every chunk's length; the broadcast goes from rank 0,
    whose x it is, into a buffer of x's shape elsewhere (written again by every call)."""
    b = comm.builtin
    if collective == "all_gather":
        bounds = xp.chunk_bounds(len(x), comm.size)
        lo, hi = bounds[comm.rank]
        chunk = xp.copy(x[lo:hi])  # (counts[r],)
        return (chunk, [stop - start for start, stop in bounds]), lambda: b.all_gather(chunk)
    if collective == "broadcast":
        buf = x if comm.rank == 0 else xp.empty(x.shape, like=x)
        return (buf, 0), lambda: b.broadcast(buf, 0)
    return (x,), (lambda: b.all_reduce(x)) if collective == "all_reduce" else (lambda: b.reduce_scatter(x))


def _wrong(comm, collective, fn, nbytes):
    """Why the learner's ``fn`` cannot be measured at ``nbytes`` on this rank (not implemented, an
    exception, a result the builtin does not give), or None."""
    args, builtin = inputs(comm, collective, _vector(comm, nbytes))
    want = np.array(xp.to_numpy(builtin()), copy=True)
    if collective == "broadcast" and comm.rank != 0:
        args[0][:] = float("nan")  # a rank that returns before it receives shows
    try:
        got = fn(comm, *args)
    except NotImplementedError as err:
        return f"is not implemented yet (it raises NotImplementedError({str(err)!r}))"
    except Exception as err:  # noqa: BLE001 - the learner's code: said in one line, then measured without it
        return f"raised {type(err).__name__} on rank {comm.rank}: {err}"
    got = None if got is None else np.asarray(xp.to_numpy(got))
    if got is None or got.shape != want.shape:
        return (f"returned {'None' if got is None else f'shape {got.shape}'} on rank {comm.rank} at "
                f"{_human(nbytes)}, where the builtin gives shape {want.shape}")
    scale = float(np.abs(want).max()) if want.size else 0.0
    ok = np.isclose(got, want, rtol=1e-5, atol=1e-6 * (1.0 + scale))  # float32 sums in another order
    if not ok.all():
        i = int(np.argmin(ok.reshape(-1)))
        return (f"differs from the builtin at {_human(nbytes)} on rank {comm.rank}: element {i} is "
                f"{got.reshape(-1)[i]:.6g}, the builtin's {want.reshape(-1)[i]:.6g}")
    return None


def learner_functions(comm, module, sizes=None):
    """{collective: function} of the lab 01 functions in the learner's ``module`` (imported on
    every rank) that can be measured: a function that is missing, still raises
    NotImplementedError, raises anything else, or gives a result other than the builtin's at any
    of ``sizes`` is left out, with one line (rank 0 prints it). The same on every rank."""
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    out = {}
    for collective, (name, task) in LAB01.items():
        fn = getattr(module, name, None)
        why = None if callable(fn) else "is not in the file"
        for nbytes in sizes if why is None else ():
            why = next((w for w in comm.builtin.allgather_object(_wrong(comm, collective, fn, nbytes)) if w), None)
            if why:
                break
        if why is None:
            out[collective] = fn
        elif comm.rank == 0:
            print(f"yours: {name} (task {task}) {why}: not measured"
                + ("" if why.startswith("is not") else f" (`minipar check 01 --task {task}` says where)"), flush=True)
    return out


def _record(collective, algorithm, nbytes, p, t, predicted):
    return {"algorithm": algorithm, "bytes": nbytes, "ranks": p, "time_s": t, "algbw_gbs": M.algbw(nbytes, t) / 1e9,
            "busbw_gbs": M.busbw(collective, nbytes, t, p) / 1e9, "predicted_s": predicted, "collective": collective}


def predicted(collective, nbytes, p, alpha, beta, gamma):
    """The alpha-beta(-gamma) seconds of minipar's algorithm for ``collective`` (other than the
    all-reduce): a ring reduce-scatter, a ring all-gather, a binomial-tree broadcast."""
    if collective == "reduce_scatter":
        return M.reduce_scatter_time(nbytes, p, alpha, beta, gamma)
    if collective == "all_gather":
        return M.all_gather_time(nbytes, p, alpha, beta)
    return (p - 1).bit_length() * (alpha + nbytes * beta)  # ceil(log2 p) rounds


def run(comm, sizes=None, algorithms=ALGS, budget=0.3, verbose=True, yours=None):
    """Measure; returns {"records": [...], "alpha", "beta", "gamma", "ranks"} on every rank.
    ``yours``: a learner's functions, from :func:`learner_functions`; its all-reduce is measured
    where ``algorithms`` names YOURS, its other collectives after the all-reduce, each beside
    minipar's and the builtin."""
    yours = yours or {}
    algorithms = tuple(a for a in algorithms if a != YOURS or "all_reduce" in yours)
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    p = comm.size
    if p > 1:
        fit = M.pingpong(comm)
        alpha, beta = M.fit_alpha_beta([n for n, _ in fit], [t for _, t in fit])
    else:
        alpha = beta = 0.0
    gamma = reduce_rate(comm)
    records = []
    for nbytes in sizes:
        x = _vector(comm, nbytes)
        for alg in algorithms:
            call = (lambda: yours["all_reduce"](comm, x)) if alg == YOURS else None
            t = time_one(comm, alg, x, budget, call)
            pred = M.allreduce_time(alg if alg in C.ALGORITHMS else "ring", 4 * len(x), p, alpha, beta, gamma)
            records.append(_record("all_reduce", alg, 4 * len(x), p, t, pred))
        if verbose and comm.rank == 0:
            print(format_row(records[-len(algorithms):]), flush=True)
    for collective in [c for c in MINIPARS if c in yours]:
        algs = (YOURS, MINIPARS[collective], "builtin")
        if verbose and comm.rank == 0:
            print(f"\n{collective.replace('_', '-')}: {LAB01[collective][0]} (yours), minipar's {algs[1]} and "
                  f"the builtin; busbw = algbw * {'1' if collective == 'broadcast' else '(p-1)/p'}", flush=True)
            print(header(algs), flush=True)
        for nbytes in sizes:
            x = _vector(comm, nbytes)
            args, builtin = inputs(comm, collective, x)
            calls = {YOURS: lambda: yours[collective](comm, *args),
                     algs[1]: lambda: getattr(C, collective)(comm, *args), "builtin": builtin}
            for alg in algs:
                t = time_one(comm, alg, x, budget, calls[alg])
                records.append(_record(collective, alg, 4 * len(x), p, t,
                                       predicted(collective, 4 * len(x), p, alpha, beta, gamma)))
            if verbose and comm.rank == 0:
                print(format_row(records[-len(algs):]), flush=True)
    return {"records": records, "alpha": alpha, "beta": beta, "gamma": gamma, "ranks": p}


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def header(algorithms=ALGS):
    cols = "".join(f"{a[:14]:>22}" for a in algorithms)
    return f"{'size':>10}{cols}\n{'':>10}" + "".join(f"{'busbw GB/s (model)':>22}" for _ in algorithms)


def format_row(rows):
    cells = "".join(f"{r['busbw_gbs']:>12.4g} ({M.busbw(r.get('collective', 'all_reduce'), r['bytes'], r['predicted_s'], r['ranks']) / 1e9 if r['predicted_s'] else float('nan'):>7.3g})" for r in rows)
    return f"{_human(rows[0]['bytes']):>10}{cells}"


def ratios(records, algorithm="ring", min_bytes=16 << 20, against="builtin", collective="all_reduce"):
    """busbw(algorithm) / busbw(against) of one collective, per size >= min_bytes."""
    by = {(r["algorithm"], r["bytes"]): r for r in records if r.get("collective", "all_reduce") == collective}
    return {b: by[(algorithm, b)]["busbw_gbs"] / by[(against, b)]["busbw_gbs"]
            for (a, b) in by if a == algorithm and b >= min_bytes and (against, b) in by}
