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
  many small steps pays when ranks outnumber cores;
- ``ops`` (``measure_ops``, given a model and its local shapes): the model's own operations
  timed as the ranks will run them: lesson 05's block forward and backward, the embedding, head
  and loss, and FlatAdam's update, with k ranks computing at once (``op_probe``). Small
  matmuls, elementwise passes, the per-call costs of Python and NumPy and the cores' sharing
  are all in these seconds; so are the TP all-reduces' ring steps as a group met them among
  ranks of other groups computing, which the ring probe above (every rank communicating, none
  computing) does not see. The planner prices lesson 05's GPT from them (``timing.measured_ops``).

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


# --------------------------------------------------------------------------- the model's own operations


P2P = ("send", "recv", "sendrecv", "isend", "irecv")  # the steps a ring collective is made of


def transfer_seconds(group, events) -> float:
    """Seconds of this rank's point-to-point steps (``events``, traced) that the ring formula
    prices: each step's shortest duration over the ``group`` (every rank of a TP group runs the
    same steps in the same order). The last rank to reach a step waits for no one: its time is
    the transfer. A rank that arrived earlier waited for a partner still computing, or not yet
    run by the scheduler: that wait is part of what computing on shared cores costs, and stays
    with the compute."""
    mine = []  # one duration per step: a step's isend and irecv overlap, merged
    reach = float("-inf")
    for a, b in sorted((e.t_start, e.t_end) for e in events if e.kind in P2P):
        if a < reach:
            mine[-1] += max(0.0, b - reach)
        else:
            mine.append(b - a)
        reach = max(reach, b)
    if group.size == 1:
        return 0.0
    every = group.builtin.allgather_object(mine)
    n = min(len(d) for d in every)
    return float(np.sum(np.min(np.array([d[:n] for d in every]), axis=0))) if n else 0.0


def _per_rep(comm, fn, seconds, group=None, reps=None):
    """(seconds per call of ``fn``, of which the TP group's transfers): the mean over a loop of at
    least ``seconds`` (every rank runs the same number of calls, the group's collectives stay in
    step), so that ranks sharing a core are timed over many of the scheduler's slices, not in
    the one a best-of-n would catch; the slowest rank's. Transfers: ``transfer_seconds`` of the
    traced steps in ``group``."""
    fn()  # warm-up
    if reps is None:
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
        want = np.array([min(20.0, max(3.0, seconds / max(one, 1e-9)))], dtype=np.float64)  # float on every rank
        reps = int(comm.builtin.all_reduce(comm.asarray(want), "max")[0].item())
    comm.barrier()
    tracer, was = comm.tracer, comm.tracer.enabled
    tracer.clear()
    tracer.enabled = True
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    wall = time.perf_counter() - t0
    tracer.enabled = was
    talk = transfer_seconds(group, tracer.events) if group is not None else 0.0
    tracer.clear()
    out = comm.builtin.all_reduce(comm.asarray(np.array([wall / reps, talk / reps])), "max")
    return float(out[0]), float(out[1])


OP_SECONDS = 0.05  # each timing of op_probe: the mean over a loop of at least this long


def op_probe(comm, model: dict, shapes, seconds: float = OP_SECONDS, seed: int = 0) -> dict:
    """Rank side, every rank at once (as in training, k = comm.size ranks on the cores): the
    trainer's own layers (``train.model.build_stage``: a ``ParallelBlock``, the embedding, ln_f,
    the vocab-parallel head and its cross-entropy) on their TP groups (``tp`` consecutive ranks),
    for every (tp, b) of ``shapes`` (b: the micro-batch's rows), and FlatAdam on flat arrays.

    Each row: seconds of one block's forward and backward, and of the ends' (embedding + position,
    then ln_f, head and loss; their backwards) per micro-batch, the TP collectives' transfers
    taken out (``transfer_seconds``); ``block_comm``: those transfers, forward and backward, the
    planner's TP communication on this machine (``op_seconds``' comm_f, comm_b). ``adam``: seconds of
    one update of n parameters at two sizes, for a line ``a + n * per_param``."""
    from ..mixed_precision import FlatAdam
    from ..tensor_parallel.vocab import vocab_parallel_cross_entropy
    from ..train.model import GPT, GPTConfig, build_stage

    gpt = GPTConfig(**{**model, "n_layers": 1})
    dense = GPT(gpt, seed)
    rng = np.random.default_rng([seed, comm.rank])
    rows = []
    for tp in sorted({t for t, _ in shapes}):
        group = comm.split(comm.rank // tp, key=comm.rank, name=f"tp{tp}")
        stage = build_stage(group, dense, 0, 1)
        stage.to(comm.empty((1,), "float64"))
        (_, blk), = stage.blocks()
        lo = group.rank * gpt.vocab // tp
        for b in sorted({b for t, b in shapes if t == tp}):
            ids = comm.asarray(rng.integers(0, gpt.vocab, (b, gpt.seq_len)))
            labels = comm.asarray(rng.integers(0, gpt.vocab, (b, gpt.seq_len)))
            x = comm.asarray(rng.standard_normal((b, gpt.seq_len, gpt.d_model)))  # (b, T, C)

            y, ctx = blk.forward(x)  # backward runs again and again on one context (each layer's
            d, ends = None, None  # backward sets, then pops, what its backward_weight takes)

            def block_f():
                blk.forward(x)

            def block_b():
                blk.backward(y, ctx)

            def ends_f():
                nonlocal d, ends
                h, c_e = stage.embed.forward(ids)  # (b, T, C)
                h, c_p = stage.pos.forward(h)
                z, c_l = stage.ln_f.forward(h)
                logits, c_h = stage.head.forward(z)  # (b, T, V/tp)
                _, d = vocab_parallel_cross_entropy(group, logits, labels, lo)
                ends = (c_e, c_p, c_l, c_h)

            def ends_b():
                c_e, c_p, c_l, c_h = ends
                dz = stage.ln_f.backward(stage.head.backward(d, c_h), c_l)
                stage.embed.backward(stage.pos.backward(dz, c_p), c_e)

            ends_f()
            (bf, bf_c), (bb, bb_c), (ef, ef_c), (eb, eb_c) = (_per_rep(comm, f, seconds, group) for f in
                                                                (block_f, block_b, ends_f, ends_b))
            rows.append({"ranks": comm.size, "tp": tp, "b": b, "block_f": bf - bf_c, "block_b": bb - bb_c,
                         "ends_f": ef - ef_c, "ends_b": eb - eb_c, "block_comm": [bf_c, bb_c]})
    adam = []
    for n in (1024, GPT(GPTConfig(**model), seed).num_params()):
        p, g = comm.asarray(rng.standard_normal(n)), comm.asarray(rng.standard_normal(n))
        opt = FlatAdam(p)
        adam.append([n, _per_rep(comm, lambda: opt.step(p, g), seconds)[0]])
    (n0, t0), (n1, t1) = adam
    per = max(0.0, (t1 - t0) / (n1 - n0))
    return {"rows": rows, "adam": {"ranks": comm.size, "overhead": max(0.0, t0 - per * n0), "per_param": per}}


def probe_launch(k: int, model: dict, shapes, seconds: float = OP_SECONDS) -> dict:
    """One job of ``k`` ranks running ``op_probe`` on the shapes of ``shapes`` ({(ranks, tp, b)})
    that have k ranks."""
    from ..launcher import launch

    return launch(k, "minipar.plan.machine:op_probe", quiet=True, watchdog=600.0, model=model, seconds=seconds,
                  shapes=sorted({(t, b) for n, t, b in shapes if n == k})).results[0]


def merged_ops(model: dict, launches: dict, seconds: float, took_s: float) -> dict:
    """The record's ``ops`` from ``launches`` ({k: [op_probe results, one per launch]}): each
    number the median of its launches (``median_launches``)."""
    rows, adam = [], {}
    for k in sorted(launches):
        merged = median_launches(launches[k])
        rows += merged["rows"]
        adam[str(k)] = {"overhead": merged["adam"]["overhead"], "per_param": merged["adam"]["per_param"]}
    return {"model": dict(model), "rows": rows, "adam": adam, "seconds": seconds,
            "rounds": min(len(v) for v in launches.values()), "took_s": took_s}


def measure_ops(model: dict, shapes, seconds: float = OP_SECONDS, progress=lambda jobs, **_: jobs, rounds: int = 3) -> dict:
    """``op_probe`` for every rank count of ``shapes`` ({(ranks, tp, b)}), each its own job of
    that many ranks, ``rounds`` times (the rounds interleaved): the record's ``ops``, each number
    the median of its launches. With more ranks than cores, which ranks the scheduler runs
    together is decided anew in every launch, and a launch's seconds move with it. ``progress``
    wraps the jobs (the CLI passes a bar)."""
    t0 = time.perf_counter()
    ks = sorted({k for k, _, _ in shapes})
    jobs = [k for _ in range(rounds) for k in ks]
    got = {k: [] for k in ks}
    for k in progress(jobs, desc="the model's operations, k ranks at once", total=len(jobs), unit="job"):
        got[k].append(probe_launch(k, model, shapes, seconds))
    return merged_ops(model, got, seconds, time.perf_counter() - t0)  # took_s: the whole probe, launches included


def median_launches(launches) -> dict:
    """``op_probe``'s results of several launches on the same shapes, as one: every number the
    median of its launches (``block_comm`` element by element)."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    rows = []
    for same in zip(*(got["rows"] for got in launches)):  # one shape, every launch
        rows.append({**same[0], **{k: med([r[k] for r in same]) for k in ("block_f", "block_b", "ends_f", "ends_b")},
                     "block_comm": [med([r["block_comm"][i] for r in same]) for i in (0, 1)]})
    adam = {k: med([got["adam"][k] for got in launches]) for k in ("overhead", "per_param")}
    return {"rows": rows, "adam": dict(launches[0]["adam"], **adam)}


def ops_apply(ops: dict, spec) -> bool:
    """Whether the record's ``ops`` were measured on ``spec`` (a ``models.ModelSpec``): lesson 05's
    GPT of the same width, heads, sequence, vocabulary and MLP, any depth."""
    from dataclasses import replace
    from types import SimpleNamespace

    from .models import minipar_gpt

    if not ops:
        return False
    m = ops["model"]
    gpt = SimpleNamespace(n_layers=spec.layers, d_model=m["d_model"], n_heads=m["n_heads"], seq_len=m["seq_len"],
                          vocab=m["vocab"], hidden=m.get("d_hidden") or 4 * m["d_model"])
    return replace(minipar_gpt(gpt), name=spec.name) == spec


OP_KEYS = ("block_f", "block_b", "ends_f", "ends_b", "comm_f", "comm_b")


def op_seconds(ops: dict, ranks: int, tp: int, b: int):
    """{block_f, block_b, ends_f, ends_b, comm_f, comm_b}: seconds per micro-batch of ``b`` rows on
    a rank of a TP group of ``tp`` with ``ranks`` ranks computing (comm_f, comm_b: one block's TP
    ring steps, forward and backward, its ``block_comm``): the measured row, else the straight line
    through the two measured b nearest to it for that (ranks, tp) (time grows with the rows, plus
    a fixed cost per operation); None when that (ranks, tp) was not measured at two sizes."""
    have = {r["b"]: dict(r, comm_f=r["block_comm"][0], comm_b=r["block_comm"][1])
            for r in ops.get("rows", ()) if r["ranks"] == ranks and r["tp"] == tp}
    if b in have:
        return {k: have[b][k] for k in OP_KEYS}
    if len(have) < 2:
        return None
    b0, b1 = sorted(sorted(have, key=lambda x: (abs(x - b), x))[:2])
    w = (b - b0) / (b1 - b0)
    return {k: max(0.0, have[b0][k] + w * (have[b1][k] - have[b0][k])) for k in OP_KEYS}


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


def measure_machine(n: int = 2, path: str | None = None, ops=None, progress=lambda jobs, **_: jobs) -> dict:
    """Measure this machine on ``n`` ranks (then 2 and 4 per core) and write the record to ``path``
    (default :func:`measured_file`, its folder made if need be); returns it. ``ops``: (model,
    shapes) of ``measure_ops``, the operations of the model to be planned at its local shapes."""
    from ..launcher import launch

    rec = launch(n, "minipar.plan.machine:measure", quiet=True).results[0]
    rec["oversubscribed"] = oversubscribed(rec["cores"])
    if ops is not None:
        rec["ops"] = measure_ops(*ops, progress=progress)
    rec["when"] = datetime.datetime.now().isoformat(timespec="seconds")
    rec["command"] = f"minipar bench machine -n {n}"
    rec["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    path = path or measured_file()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    return rec
