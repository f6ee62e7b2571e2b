"""Benchmark: when does tensor parallelism make a Megatron MLP faster?

    minipar bench tp                                  # TP = 2, 4 against TP = 1, hidden 8 ... 4096, 256 tokens
    minipar bench tp -n 2 --sizes 8 16 32 64 --json tp.json
    minipar bench tp --tokens 1 --forward-only        # single-token inference
    minipar bench tp -n 2 --file minipar-labs/02_tensor_parallel/exercise.py   # a learner's lab 02 beside it

The Megatron MLP (hidden -> 4 hidden -> hidden, float32) runs forward + backward for each
hidden size. Every rank gets ONE BLAS thread (OMP_NUM_THREADS=1 and friends, set in the
environment before mpiexec starts the ranks), so TP = p uses p cores and TP = 1 one core: the
comparison is "same per-core speed, p times the cores, plus the all-reduces".

A machine shared with other jobs changes speed from one second to the next, so the two sides
of each speedup are measured in the same job, in interleaved pairs: (A) rank 0 alone runs the
MLP as TP = 1 (``ParallelMLP`` on a one-rank communicator, the same code) while the other
ranks wait without using a core (sleeping on a receive), then (B) all p ranks run the TP step;
the next pair runs B first, then A. Each pair gives one ratio A/B; the speedup is the median of
the ratios and the spread is their quartiles (what a burst of load on one side of one pair
cannot move). Pairs per size: at least ``reps``, more while they fit in ``budget`` seconds.

Per (p, hidden): ``time_s`` (median over the pairs of the TP step on the slowest rank),
``comm_s`` (median time inside collectives on that rank, waiting for the others included),
``compute_s = time_s - comm_s``, ``base_s`` (median TP = 1 step), ``speedup`` (median of the
pairs' ratios), ``speedup_q1`` / ``speedup_q3`` (their quartiles), ``pairs``, and
``weight_bytes`` (the weights this rank holds: 1/p of the layer, whatever the speed).

A learner's lab 02 exercise (``file``) is measured in the same jobs and the same pairs
(:class:`YourMLP`, sides C and D beside minipar's A and B); its records say ``"code": "yours"``.
"""
from __future__ import annotations

import os
import time

import numpy as np

DEFAULT_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # 8 and 16: below the crossover
DEFAULT_P = (2, 4)
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
WAKE_TAG = 7100


def pair_stats(a, b) -> dict:
    """Pairs of times (a_k: TP = 1, b_k: TP = p) -> the median of the ratios a_k / b_k and its quartiles."""
    ratios = np.asarray(a, float) / np.asarray(b, float)
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return {"speedup": float(med), "speedup_q1": float(q1), "speedup_q3": float(q3), "pairs": len(ratios)}


def alternates(order: str) -> bool:
    """True when a sequence of "A"/"B" samples comes in pairs that each hold one A and one B."""
    return len(order) % 2 == 0 and all(sorted(order[i:i + 2]) == ["A", "B"] for i in range(0, len(order), 2))


def wait_for_rank0(comm, tag):
    """The other ranks while rank 0 runs alone: sleep on a receive, so they take no core from it."""
    if comm.rank == 0:
        token = comm.asarray(np.zeros(1))
        for r in range(1, comm.size):
            comm.send(token, r, tag)
    else:
        req = comm.irecv(comm.asarray(np.zeros(1)), 0, tag)
        while not req.test():
            time.sleep(2e-4)


# the lab 02 functions a learner's exercise must bring (``--file``), per mode: the TP MLP's
# forward (task 2.5), or a training step from the splits (2.1, 2.2, then 2.4, 2.3)
LAB02 = {"forward": ("megatron_mlp",),
         "forward+backward": ("column_forward", "row_forward", "row_backward", "column_backward")}
TASKS = {"megatron_mlp": "2.5", "column_forward": "2.1", "row_forward": "2.2", "row_backward": "2.4",
         "column_backward": "2.3"}


class YourMLP:
    """The Megatron MLP on ``comm`` from a learner's lab 02 functions, with ``ParallelMLP``'s
    ``forward(x) -> (y, ctx)`` and ``backward(dy, ctx) -> dx``.

    Every rank holds the whole weights, as the lab hands them, and the functions take their
    shard at every call. Forward only: ``megatron_mlp`` (2.5). A training step:
    ``column_forward`` (2.1) for fc1, GeLU on this rank's columns, ``row_forward`` (2.2) for fc2,
    then ``row_backward`` (2.4), GeLU's backward and ``column_backward`` (2.3): one all-reduce
    each way, as Megatron's. ``row_forward`` and ``row_backward`` take fc2's input whole-shaped,
    (N, H): this rank's columns are written into such a buffer (one copy of N x H/p values per
    step), its other columns stay zero and are never read.
    """

    def __init__(self, comm, functions, dense, like, forward_only=False):
        from ..xp import chunk_bounds, from_numpy

        self.comm, self.f, self.forward_only = comm, functions, forward_only
        self.w1, self.b1, self.w2, self.b2 = (from_numpy(np.asarray(a), like) for a in (
            dense.fc1.params["w"], dense.fc1.params["b"], dense.fc2.params["w"], dense.fc2.params["b"]))
        self.lo, self.hi = chunk_bounds(self.w1.shape[1], comm.size)[comm.rank]  # my columns of the hidden layer
        self.whole = None  # (N, H): fc2's input, my columns filled

    def weight_bytes(self):
        from ..xp import nbytes

        return sum(nbytes(w) for w in (self.w1, self.b1, self.w2, self.b2))

    def forward(self, x):
        from ..nn.functional import gelu_forward
        from ..xp import zeros

        f, c = self.f, self.comm
        if self.forward_only:
            return f.megatron_mlp(c, x, self.w1, self.b1, self.w2, self.b2), None  # (N, d)
        h = f.column_forward(c, x, self.w1, self.b1)  # (N, H/p)
        a, gelu = gelu_forward(h)  # (N, H/p)
        if self.whole is None or self.whole.shape[0] != a.shape[0]:
            self.whole = zeros((a.shape[0], self.w1.shape[1]), like=a)  # (N, H)
        self.whole[:, self.lo:self.hi] = a
        return f.row_forward(c, self.whole, self.w2, self.b2), (x, gelu)  # (N, d), one all-reduce

    def backward(self, dy, ctx):
        from ..nn.functional import gelu_backward

        (x, gelu), f, c = ctx, self.f, self.comm
        da, _, _ = f.row_backward(c, dy, self.whole, self.w2)  # (N, H/p); dw2 (H/p, d), db2 (d,)
        dx, _, _ = f.column_backward(c, gelu_backward(da, gelu), x, self.w1)  # (N, d), one all-reduce
        return dx


def try_yours(comm, file, forward_only=False, tokens=6, seed=0):
    """Rank side, before ``--file``'s benchmark: why the learner's MLP cannot be measured (a
    function missing or still raising NotImplementedError, an exception, values other than
    ``ParallelMLP``'s), or None; the same on every rank."""
    from .. import nn
    from ..labs.grader import exercise_module
    from ..tensor_parallel import ParallelMLP
    from ..xp import to_numpy

    functions, hidden, why = exercise_module(file), 4 * comm.size, None  # hidden 4p: every split even
    missing = [n for n in LAB02["forward" if forward_only else "forward+backward"] if not callable(getattr(functions, n, None))]
    if missing:
        why = f"{', '.join(missing)} (task {', '.join(TASKS[n] for n in missing)}) not in the file"
    else:
        rng = np.random.default_rng([seed, hidden])
        dense = nn.MLP(hidden, 4 * hidden, rng)
        x = comm.asarray(rng.standard_normal((tokens, hidden)).astype("float32"))
        dy = comm.asarray(rng.standard_normal((tokens, hidden)).astype("float32"))
        mine, yours = ParallelMLP(comm, dense).to(x), YourMLP(comm, functions, dense, x, forward_only)
        try:
            y, ctx = yours.forward(x)
            got = [y] if forward_only else [y, yours.backward(dy, ctx)]
        except NotImplementedError as err:
            why = f"not implemented yet (it raises NotImplementedError({str(err)!r}))"
        except Exception as err:  # noqa: BLE001 - the learner's code: one line, then minipar's alone
            why = f"raised {type(err).__name__} on rank {comm.rank}: {err}"
        if why is None:
            y, ctx = mine.forward(x)
            want = [y] if forward_only else [y, mine.backward(dy, ctx)]
            for what, g, w in zip(("y", "dx"), got, want):
                g, w = np.asarray(to_numpy(g), float), np.asarray(to_numpy(w), float)
                if g.shape != w.shape or not np.allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max()):
                    why = (f"gives another {what} than minipar's ParallelMLP on rank {comm.rank}"
                           + (f" (shape {g.shape}, not {w.shape})" if g.shape != w.shape else
                              f" (max error {np.abs(g - w).max():.3g})"))
                    break
    return next((w for w in comm.builtin.allgather_object(why) if w), None)


def measure(comm, sizes=DEFAULT_SIZES, tokens=256, reps=7, budget=0.3, dtype="float32", forward_only=False,
            seed=0, file=None):
    """Rank side: interleaved pairs (TP = 1 on rank 0 alone, TP = comm.size on every rank) per
    hidden size; one record per size on every rank (see the module docstring). ``file``: a
    learner's lab 02 exercise, measured in the same pairs (:class:`YourMLP`: TP = 1 on rank 0
    alone, then TP = p; each pair runs minipar's and yours, ABCD then DCBA); its records say
    ``"code": "yours"``, with ``time_vs_minipar`` (the median over the pairs of its TP = p step
    time over minipar's)."""
    from .. import nn
    from ..tensor_parallel import ParallelMLP
    from ..xp import nbytes

    functions = None
    if file:
        from ..labs.grader import exercise_module

        functions = exercise_module(file)
    records, tracer, p = [], comm.tracer, comm.size
    solo = comm.split(0 if comm.rank == 0 else None, name="solo") if p > 1 else None  # rank 0 alone
    for hidden in sizes:
        rng = np.random.default_rng([seed, hidden])  # the same weights on every rank
        dense = nn.MLP(hidden, 4 * hidden, rng)
        x = comm.asarray(rng.standard_normal((tokens, hidden)).astype(dtype))  # (N, hidden)
        dy = comm.asarray(rng.standard_normal((tokens, hidden)).astype(dtype))
        models = {"B": ParallelMLP(comm, dense).to(x)}  # A, B: minipar's at TP = 1, TP = p; C, D: yours
        if solo is not None:  # rank 0 of p > 1
            models["A"] = ParallelMLP(solo, dense).to(x)  # the whole layer, on rank 0 only
        if functions is not None:
            models["D"] = YourMLP(comm, functions, dense, x, forward_only)
            if solo is not None:
                models["C"] = YourMLP(solo, functions, dense, x, forward_only)
        del dense

        def step(side):
            y, ctx = models[side].forward(x)
            if not forward_only:
                models[side].backward(dy, ctx)

        def timed(side):
            """(seconds, seconds in collectives) of one step; A and C run on rank 0 only."""
            comm.builtin.barrier()
            if side in "AC" and comm.rank:
                wait_for_rank0(comm, WAKE_TAG)
                return 0.0, 0.0
            tracer.clear()
            tracer.enabled = side in "BD"
            t0 = time.perf_counter()
            step(side)
            t = time.perf_counter() - t0
            tracer.enabled = False
            if side in "AC":
                wait_for_rank0(comm, WAKE_TAG)
            return t, sum(e.duration for e in tracer.events if e.kind == "collective")

        sides = ("A", "B") if p > 1 else ("B",)
        if functions is not None:
            sides += ("C", "D") if p > 1 else ("D",)
        first = [timed(side)[0] for side in sides]  # warm-up: first touch of the buffers, BLAS set-up
        pairs = comm.builtin.bcast_object(int(min(200, max(reps, budget / max(sum(first), 1e-9)))), 0)
        samples, order = {side: [] for side in sides}, ""
        for k in range(pairs):
            for side in (sides if k % 2 == 0 else sides[::-1]):
                samples[side].append(timed(side))
                order += side
        tracer.clear()

        def record(solo_side, tp_side):
            everyone = comm.builtin.allgather_object(samples[tp_side])  # per rank: [(t, comm_t)] per pair
            b = [max((rank[k] for rank in everyone), key=lambda tc: tc[0]) for k in range(pairs)]  # slowest rank
            a = [t for t, _ in samples[solo_side]] if p > 1 else [t for t, _ in b]
            a = comm.builtin.bcast_object(a, 0)
            time_s, comm_s = float(np.median([t for t, _ in b])), float(np.median([c for _, c in b]))
            model = models[tp_side]
            held = model.weight_bytes() if isinstance(model, YourMLP) else \
                sum(nbytes(w) for _, w in model.named_parameters())
            return {"p": p, "hidden": hidden, "tokens": tokens, "mode": "forward" if forward_only else "forward+backward",
                    "time_s": time_s, "comm_s": comm_s, "compute_s": time_s - comm_s,
                    "base_s": float(np.median(a)), **pair_stats(a, [t for t, _ in b]), "order": order,
                    "weight_bytes": held}, [t for t, _ in b]

        mine, mine_b = record("A", "B")
        records.append(mine)
        if functions is not None:
            yours, yours_b = record("C", "D")
            records.append({**yours, "code": "yours",
                            "time_vs_minipar": float(np.median(np.asarray(yours_b) / np.asarray(mine_b)))})
    return records


def no_bar(jobs, desc="", total=None, unit=""):
    """The default ``progress`` of ``collect``: the jobs, as they are (the CLI passes a bar)."""
    return jobs


def collect(ps=DEFAULT_P, sizes=DEFAULT_SIZES, tokens=256, reps=7, forward_only=False, rounds=1, verbose=True,
            budget=0.3, progress=no_bar, file=None):
    """Launch ``measure`` for each p and hidden size, one job each (so that ``progress``, e.g. a
    bar, can count them); returns its records plus TP = 1's (from the first p's rank-0 runs),
    every one with ``speedup`` and its quartiles. ``rounds`` > 1 repeats the launches (p
    interleaved: 2, 4, 2, 4, ...) and keeps, per (p, hidden), the round with the median speedup.
    ``file``: a learner's lab 02 exercise, tried first (:func:`try_yours`, on the smallest p: one
    line and minipar's alone when it cannot be measured), then measured beside minipar's in the
    same jobs; its records say ``"code": "yours"``.
    """
    from ..launcher import launch

    for var in ONE_THREAD:  # inherited by mpiexec and every rank it starts
        os.environ[var] = "1"
    ps = sorted(set(ps) - {1}) or [1]
    if file:
        why = launch(ps[0], "minipar.bench.tp:try_yours", quiet=True, watchdog=120, file=file,
                     forward_only=forward_only).results[0]
        if why:
            names = LAB02["forward" if forward_only else "forward+backward"]
            print(f"yours: {', '.join(names)} of {file}: {why}; not measured (`minipar check 02"
                  f"{''.join(' --task ' + TASKS[n] for n in names)}` says more)", flush=True)
            file = None
    jobs = [(k, p, hidden) for k in range(rounds) for p in ps for hidden in sizes]
    runs = {}
    for k, p, hidden in progress(jobs, desc=f"TP {'/'.join(map(str, ps))} against TP 1", total=len(jobs), unit="job"):
        if verbose and hidden == sizes[0]:
            print(f"  round {k + 1}/{rounds}: TP={p} against TP=1, {len(sizes)} sizes on {p} ranks ...", flush=True)
        out = launch(p, "minipar.bench.tp:measure", quiet=True, watchdog=600, sizes=[hidden], tokens=tokens,
                     reps=reps, budget=budget, forward_only=forward_only, file=file)
        for r in out.results[0]:
            r.pop("order")
            runs.setdefault((r.get("code", ""), p, r["hidden"]), []).append(r)
    records = [sorted(rs, key=lambda r: r["speedup"])[len(rs) // 2] for _, rs in sorted(runs.items())]
    if ps != [1]:
        first = [r for r in records if r["p"] == ps[0]]
        records = [{**{k: v for k, v in r.items() if k != "time_vs_minipar"}, "p": 1, "time_s": r["base_s"],
                    "comm_s": 0.0, "compute_s": r["base_s"], "speedup": 1.0, "speedup_q1": 1.0, "speedup_q3": 1.0,
                    "weight_bytes": r["weight_bytes"] * (1 if r.get("code") == "yours" else ps[0])}  # yours: whole
                   for r in first] + records
    return sorted(records, key=lambda r: (r["hidden"], r["p"]))


def crossover(records, p=2) -> str:
    """Where TP = p starts to beat TP = 1 (median of the pairs above 1), in words."""
    rs = sorted((r for r in records if r["p"] == p), key=lambda r: r["hidden"])
    slower = [r["hidden"] for r in rs if r["speedup"] < 1]
    faster = [r["hidden"] for r in rs if r["speedup"] >= 1]
    if not rs:
        return f"no TP = {p} records"
    if not slower:
        return f"TP = {p} is faster than TP = 1 at every size measured (from d = {rs[0]['hidden']})"
    if not faster:
        return f"TP = {p} is slower than TP = 1 at every size measured (up to d = {rs[-1]['hidden']})"
    return (f"TP = {p} is slower than TP = 1 at d = {', '.join(map(str, slower))} and faster at "
            f"d = {', '.join(map(str, faster))}")


def table(records) -> str:
    """A Markdown table of the records."""
    lines = ["| TP p | hidden | tokens | step (ms) | compute (ms) | comm (ms) | comm % | speedup | quartiles | pairs "
             "| weights/rank (MiB) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|"]
    for r in sorted(records, key=lambda r: (-r["tokens"], r["mode"], r["hidden"], r["p"])):
        spread = f"{r['speedup_q1']:.2f}-{r['speedup_q3']:.2f}" if r["p"] > 1 else ""
        lines.append(f"| {r['p']} | {r['hidden']} | {r['tokens']} | {r['time_s'] * 1e3:.3f} | {r['compute_s'] * 1e3:.3f} | "
                     f"{r['comm_s'] * 1e3:.3f} | {100 * r['comm_s'] / r['time_s']:.0f} | {r['speedup']:.2f}x | {spread} | "
                     f"{r['pairs'] if r['p'] > 1 else ''} | {r['weight_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)
