"""This machine, measured for the planner: matmul rate, memory bandwidth, alpha and beta.

    measure_machine(n=2)        # ranks measure; writes ~/.cache/minipar/this_machine.json (``minipar bench machine``)
    load()                      # the record back: MINIPAR_MACHINE=FILE, else that one, else the committed one
    hardware.this_machine()     # the planner's "this-machine" preset, built from load()

Every rank measures at the same time, as ranks compute in training, each with one BLAS thread
(the launcher sets it):

- ``matmul_flops[dtype]``: a square matmul's 2 n^3 FLOPs per second (best of ``reps``, the
  slowest rank), float64 and float32, at the largest of ``sizes``;
- ``memory_bandwidth``: bytes per second of ``c = a + b`` on arrays far larger than the caches
  (3 arrays moved), the memory-bound operations' rate;
- ``alpha``, ``beta``: a least-squares fit of one-way message time vs size from a ping-pong
  between ranks 0 and 1 (``costmodel.pingpong``, ``costmodel.fit_alpha_beta``);
- ``oversubscribed``: alpha and beta again, with 2 and 4 ranks per core (``ring_probe``): every
  rank sends to the next and receives from the previous at once, as a ring collective's step
  does. With more ranks than cores a step waits until the scheduler runs the receiver, and
  MPICH's waiting ranks poll, burning their share of a core: the latency a TP all-reduce of
  many small steps pays when ranks outnumber cores.

The "this-machine" preset (``minipar.plan.hardware.this_machine``) has no calibration constant:
its rates are these measurements, read through ``load``. On a machine shared with other jobs
every number comes out low; say so wherever you quote them.
"""
from __future__ import annotations

import datetime
import json
import os
import time

import numpy as np

from .. import costmodel as M
from ..errors import UsageError
from ..records import cache_dir

MACHINE_FILE = os.path.join(os.path.dirname(__file__), "this_machine.json")  # committed: the course machine's
MACHINE_ENV = "MINIPAR_MACHINE"  # another measured preset file to read instead


def measured_file() -> str:
    """Where ``minipar bench machine`` writes unless told (``records.cache_dir()``, outside the
    repository: replacing the committed record takes ``--out minipar/plan/this_machine.json``)."""
    return os.path.join(cache_dir(), "this_machine.json")


def machine_file() -> str:
    """The record the planner reads: ``$MINIPAR_MACHINE``, else this machine's own measurement
    (:func:`measured_file`) once there is one, else the committed ``MACHINE_FILE``."""
    measured = measured_file()
    return os.environ.get(MACHINE_ENV) or (measured if os.path.exists(measured) else MACHINE_FILE)


def load(path: str | None = None) -> dict:
    """The record ``measure_machine`` wrote (``path``, else ``machine_file()``), with its path."""
    path = path or machine_file()
    try:
        with open(path) as f:
            return dict(json.load(f), path=path)
    except FileNotFoundError:
        raise UsageError(f"no measured preset at {path}: run `minipar bench machine` first") from None


# --------------------------------------------------------------------------- on the ranks


def matmul_rate(n: int, dtype: str, reps: int, clock=time.perf_counter) -> float:
    """FLOP/s of an (n x n) @ (n x n) product, best of ``reps``, timed by ``clock`` (as ``memory_rate``)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        a @ b
        best = min(best, clock() - t0)
    return 2 * n**3 / best


def memory_rate(nbytes: int, reps: int, clock=time.perf_counter) -> float:
    """Bytes per second of ``c = a + b`` (3 arrays of ``nbytes`` moved), best of ``reps``, timed by
    ``clock`` (``time.process_time``: only while this process ran, as on a machine of its own)."""
    a, b = np.ones(nbytes // 8), np.full(nbytes // 8, 2.0)
    c = np.empty_like(a)
    np.add(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        np.add(a, b, out=c)
        best = min(best, clock() - t0)
    return 3 * nbytes / best


def measure(comm, n: int = 1024, reps: int = 5, stream_bytes: int = 64 << 20) -> dict:
    """Rank side; every rank returns the same record (slowest rank's rates)."""
    worst = lambda x: comm.builtin.all_reduce(comm.asarray(np.array([x])), "min")[0].item()  # noqa: E731
    comm.barrier()
    rates = {dt: worst(matmul_rate(n, dt, reps)) for dt in ("float64", "float32")}
    comm.barrier()
    bw = worst(memory_rate(stream_bytes, reps))
    if comm.size > 1:
        fit = M.pingpong(comm, sizes=(8, 1024, 65536, 1 << 20, 4 << 20), reps=10)
        alpha, beta = M.fit_alpha_beta([s for s, _ in fit], [t for _, t in fit])
    else:
        alpha, beta = 0.0, 0.0
    return {"matmul_flops": rates, "memory_bandwidth": bw, "alpha": alpha, "beta": beta,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "ranks": comm.size,
            "matmul_n": n}


def ring_probe(comm, sizes=(8, 65536, 1 << 20), reps=20) -> dict:
    """Seconds per ring step (sendrecv to the next rank, from the previous) for each size, the
    slowest rank's mean over ``reps``; every rank returns the same record."""
    r, p = comm.rank, comm.size
    out = {}
    for n in sizes:
        x, buf = comm.asarray(np.full(n // 8, float(r))), comm.empty((n // 8,), "float64")
        comm.sendrecv(x, (r + 1) % p, buf, (r - 1) % p)  # warm-up
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.sendrecv(x, (r + 1) % p, buf, (r - 1) % p)
        out[n] = comm.builtin.all_reduce(comm.asarray(np.array([(time.perf_counter() - t0) / reps])), "max")[0].item()
    return out


# --------------------------------------------------------------------------- the whole measurement


def oversubscribed(cores: int, per_core=(2, 4)) -> dict:
    """{ranks: {"alpha", "beta"}} fitted from ``ring_probe`` on ``k * cores`` ranks for each k."""
    from ..launcher import launch

    out = {}
    for k in per_core:
        steps = launch(k * cores, "minipar.plan.machine:ring_probe", quiet=True).results[0]
        alpha, beta = M.fit_alpha_beta(list(steps), list(steps.values()))
        out[str(k * cores)] = {"alpha": alpha, "beta": beta}
    return out


def measure_machine(n: int = 2, path: str | None = None) -> dict:
    """Measure this machine on ``n`` ranks (then 2 and 4 per core) and write the record to ``path``
    (default :func:`measured_file`, its folder made if need be); returns it."""
    from ..launcher import launch

    rec = launch(n, "minipar.plan.machine:measure", quiet=True).results[0]
    rec["oversubscribed"] = oversubscribed(rec["cores"])
    rec["when"] = datetime.datetime.now().isoformat(timespec="seconds")
    rec["command"] = f"minipar bench machine -n {n}"
    rec["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    path = path or measured_file()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    return rec
