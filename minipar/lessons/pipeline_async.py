"""Synchronous (flush) vs asynchronous (PipeDream) pipelines, measured: convergence over a
learning-rate sweep, memory counted per rank, speed and bubble on real ranks.

    from minipar import launch
    out = launch(4, "minipar.lessons.pipeline_async:check_async")     # check rows
    rows = sweep(ps=(2, 4, 8))                    # one process: the dense runs, every lr and seed
    out = launch(4, "minipar.lessons.pipeline_async:measure", lrs=best_lrs(rows, 4))
    minipar figures --only pipeline               # all of it, drawn (minipar.figures.pipeline_async)

The task (:data:`TASK`): the pipeline lesson's model, 8 layers of Linear(32, 32) + GeLU
split into p = 2, 4 or 8 stages, fits a random one-hidden-layer GeLU teacher from a stream
of micro-batches of 16 rows (:func:`~minipar.pipeline.asynchronous.teacher_data`). The same
8 layers at every p: flush training does not depend on p at all, so whatever changes with p
is staleness. The depth is what makes staleness matter: a stage's gradient depends on the
weights of every later stage, so a stale stage meets fresher ones (a convex linear fit forgives
stale steps more); the teacher is nonlinear so that no linear shortcut solves the task.

Equal samples: every scheme sees the same stream. PipeDream and "sequential" (one device,
one SGD update per micro-batch: PipeDream without the staleness) update after every
micro-batch with ``lr``; the flush updates once per m micro-batches with ``m * lr`` on their
mean gradient (the same step per sample). The best loss of a scheme is the held-out loss of
its final weights at its best lr (mean over seeds).
"""
from __future__ import annotations

import time

import numpy as np

from ..pipeline import asynchronous as A
from ..pipeline import one_f_one_b, simulate
from ..pipeline.execute import build_stages, measured_bubble, measured_costs
from ..trace import merge
from ..xp import itemsize
from .common import rel_error

TASK = {"layers": 8, "width": 32, "b": 16, "m": 4}
LRS = (0.1, 0.2, 0.4, 0.8, 1.6)          # per micro-batch of b rows (the flush takes m x lr per step)
SCHEMES = ("flush", "sequential", "nostash", "stash")
TOLERANCE = 1e-12


def model(p, layers=8, width=32, seed=0):
    """The task's model cut into p stages (the same layers, the same weights, whatever p)."""
    return build_stages(p, layers, width, np.random.default_rng([seed, 3]))


def _mine(comm, layers, width, seed):
    like = comm.asarray(np.zeros(1))
    return model(comm.size, layers, width, seed)[comm.rank].to(like)


def _stream(comm, n_micro, b, width, seed):
    xs, ts = A.teacher_data(n_micro, b, width, seed)
    return [comm.asarray(x) for x in xs], [comm.asarray(t) for t in ts], xs, ts


def _per_step(losses, m):
    return [float(np.mean(losses[k * m:(k + 1) * m])) for k in range(len(losses) // m)]


def train_one(scheme, p, lr, n_micro, seed=0, layers=8, width=32, b=16, m=4, n_test=1024) -> dict:
    """One dense (one-process) run of ``scheme`` for p stages: {"curve": training loss per m
    micro-batches, "final": held-out loss of the final weights (inf if it diverged)}."""
    stages = model(p, layers, width, seed)
    xs, ts = A.teacher_data(n_micro, b, width, seed)
    with np.errstate(all="ignore"):
        if scheme == "flush":
            curve = A.train_dense(stages, xs, ts, m, m * lr)
        elif scheme == "sequential":
            curve = _per_step(A.train_dense(stages, xs, ts, 1, lr), m)
        else:
            curve = _per_step(A.train_async_dense(stages, xs, ts, lr, stash=(scheme == "stash")), m)
        xt, tt = A.teacher_data(1, n_test, width, seed, split="test")
        final = A.forward_loss(stages, xt[0], tt[0])
    return {"curve": curve, "final": final if np.isfinite(final) else float("inf")}


def sweep(ps=(2, 4, 8), lrs=LRS, seeds=(0, 1, 2), n_micro=1000, **task) -> list[dict]:
    """Every scheme at every lr and seed, on one process (the dense references, which the
    ranks reproduce: :func:`check_async`). Rows {"scheme", "p", "lr", "seed", "final", and for
    seed 0 "curve"}; flush and sequential do not depend on p and get p=None."""
    task = {**TASK, **task}
    rows = []
    for scheme in SCHEMES:
        for p in ((None,) if scheme in ("flush", "sequential") else ps):
            for lr in lrs:
                for seed in seeds:
                    r = train_one(scheme, p or max(ps), lr, n_micro, seed, **task)
                    rows.append({"scheme": scheme, "p": p, "lr": lr, "seed": seed, "final": r["final"],
                                 **({"curve": r["curve"]} if seed == seeds[0] else {})})
    return rows


def best(rows) -> dict:
    """{(scheme, p): {"lr", "loss" (mean over seeds), "low", "high" (over seeds)}} at each
    scheme's best lr; a diverged run counts as inf."""
    table = {}
    for r in rows:
        table.setdefault((r["scheme"], r["p"]), {}).setdefault(r["lr"], []).append(r["final"])
    out = {}
    for key, by_lr in table.items():
        lr = min(by_lr, key=lambda k: np.mean(by_lr[k]))
        out[key] = {"lr": lr, "loss": float(np.mean(by_lr[lr])), "low": min(by_lr[lr]), "high": max(by_lr[lr])}
    return out


def best_lrs(rows, p) -> dict:
    """{scheme: best lr} for p stages (flush's and sequential's do not depend on p)."""
    b = best(rows)
    return {s: b[(s, None if s in ("flush", "sequential") else p)]["lr"] for s in SCHEMES}


# ---------------------------------------------------------------- on real ranks


def check_async(comm, n_micro=10, m=4, b=4, width=8, layers=None, lr=0.3, seed=0) -> list[dict]:
    """Check rows (the same list on every rank) on ``layers`` (default 2 per rank) layers:

    - flush 1F1B training == one-device training (float64, summation order only: 1e-12);
    - PipeDream with and without stashing == :func:`~minipar.pipeline.asynchronous.train_async_dense`
      (every loss and my stage's final weights; the same operations on the same kind of arrays
      in the same order: bitwise);
    - the gradients PipeDream applied == the dense gradients at the weights each micro-batch's
      forwards used (1e-12; without stashing they are not: see :func:`async_gradient_errors`);
    - the staleness counted on each backward == min(i, p - 1 - s) (exact);
    - the bytes my stage held at its peak, counted, == :func:`memory_formula` for GPipe and
      1F1B flushes and PipeDream without and with stashing (to the byte).
    """
    p, me = comm.size, comm.rank
    layers = layers or 2 * p
    xs, ts, x64, t64 = _stream(comm, n_micro, b, width, seed)
    rows = []

    def row(what, err, tol):
        rows.append({"what": what, "error": float(err), "tolerance": tol, "ok": bool(err <= tol)})

    steps = n_micro // m
    flush = A.train_flush(comm, _mine(comm, layers, width, seed), xs, ts, m, lr)["losses"]
    dense = A.train_dense(model(p, layers, width, seed), x64, t64, m, lr)
    row(f"flush 1F1B training, {steps} SGD steps: loss curve vs one device", rel_error(np.array(flush), np.array(dense)),
        TOLERANCE)
    for stash in (False, True):
        name = "PipeDream " + ("with" if stash else "without") + " stashing"
        mod = _mine(comm, layers, width, seed)
        out = A.train_async(comm, mod, xs, ts, lr, stash=stash)
        ref = [st.to(xs[0]) for st in model(p, layers, width, seed)]      # same kind of arrays
        ref_losses = A.train_async_dense(ref, xs, ts, lr, stash=stash)
        err = max([rel_error(np.array(out["losses"]), np.array(ref_losses))] +
                  [rel_error(a, w) for (_, a), (_, w) in zip(mod.named_parameters(), ref[me].named_parameters())])
        row(f"{name} p={p}: losses and final weights vs its one-process reference", err, 0.0)
        want = [min(i, p - 1 - me) for i in range(n_micro)]
        row(f"{name} p={p}: updates between each forward and its backward == min(i, p-1-s)",
            max(abs(g - w) for g, w in zip(out["staleness"], want)), 0.0)
    gerr = async_gradient_errors(comm, n_micro, b, width, layers, lr, seed, stash=True)
    row(f"PipeDream with stashing p={p}: each gradient vs dense at its stashed weights", gerr, TOLERANCE)
    for scheme, err in memory_errors(comm, n_micro, m, b, width, layers, seed).items():
        row(f"{scheme} p={p}: bytes held by my stage at its peak, counted vs formula", err, 0.0)
    return rows


def async_gradient_errors(comm, n_micro=10, b=4, width=8, layers=None, lr=0.3, seed=0, stash=True) -> float:
    """Worst relative error of PipeDream's applied gradients against the dense gradients at
    the weights each micro-batch's forwards used (see asynchronous.stashed_gradient_error)."""
    layers = layers or 2 * comm.size
    xs, ts, _, _ = _stream(comm, n_micro, b, width, seed)
    rec = A.train_async(comm, _mine(comm, layers, width, seed), xs, ts, lr, stash=stash, record=True)
    return A.stashed_gradient_error(comm, model(comm.size, layers, width, seed), rec, xs, ts)


def held_memory(comm, n_micro, m, b, width, layers, seed, lr=1e-3) -> dict:
    """{scheme: {"counted": my stage's peak held_bytes, "formula": memory_formula}} for GPipe
    and 1F1B flushes (m micro-batches per step) and PipeDream without and with stashing."""
    xs, ts, _, _ = _stream(comm, n_micro, b, width, seed)
    out = {}
    for scheme in ("gpipe", "1f1b", "nostash", "stash"):
        mod = _mine(comm, layers, width, seed)
        if scheme in ("gpipe", "1f1b"):
            counted = A.train_flush(comm, mod, xs, ts, m, lr, schedule=scheme, memory=True)["memory"]
        else:
            counted = A.train_async(comm, mod, xs, ts, lr, stash=(scheme == "stash"), memory=True)["memory"]
        per = m if scheme in ("gpipe", "1f1b") else n_micro
        want = A.memory_formula(scheme, comm.size, comm.rank, layers, width, b, per, itemsize(xs[0]))
        out[scheme] = {"counted": counted, "formula": want}
    return out


def memory_errors(comm, n_micro, m, b, width, layers, seed) -> dict:
    """{scheme: largest |counted - formula| over the keys, relative to the formula's total}."""
    return {s: max(abs(v["counted"][k] - v["formula"][k]) for k in v["formula"]) / v["formula"]["total"]
            for s, v in held_memory(comm, n_micro, m, b, width, layers, seed).items()}


def measure(comm, lrs, n_micro=1000, seed=0, speed_kw=None, **task) -> dict | None:
    """On p = comm.size ranks: each scheme trained at its lr from ``lrs`` ({scheme: lr}) on
    the task (the loss curves, to compare with the dense sweep), the staleness counted per
    stage, the memory counted per rank vs the formula, and :func:`speed`. Rank 0 returns it."""
    task = {**TASK, **task}
    layers, width, b, m = task["layers"], task["width"], task["b"], task["m"]
    xs, ts, _, _ = _stream(comm, n_micro, b, width, seed)
    curves, stale = {}, {}
    with np.errstate(all="ignore"):
        curves["flush"] = A.train_flush(comm, _mine(comm, layers, width, seed), xs, ts, m, m * lrs["flush"])["losses"]
        for scheme in ("nostash", "stash"):
            out = A.train_async(comm, _mine(comm, layers, width, seed), xs, ts, lrs[scheme], stash=(scheme == "stash"))
            curves[scheme] = _per_step(out["losses"], m)
            s = out["staleness"]
            stale[scheme] = comm.builtin.allgather_object({"max": max(s), "mean": float(np.mean(s))})
    memory = comm.builtin.allgather_object(held_memory(comm, 2 * comm.size * m, m, b, width, layers, seed))
    fast = speed(comm, **(speed_kw or {}))
    if comm.rank:
        return None
    return {"p": comm.size, "lrs": dict(lrs), "curves": curves, "staleness": stale,
            "memory": memory, "speed": fast}


def speed(comm, n_micro=32, m=8, width=256, b=64, layers=8, repeats=2, seed=0) -> dict:
    """Micro-batches per second, measured (wall clock, the slowest rank), and the bubble
    (:func:`~minipar.pipeline.execute.measured_bubble` over the whole traced run) of the
    1F1B flush (m micro-batches per step) and of PipeDream without and with stashing, on
    the same ``n_micro`` micro-batches; each run ``repeats`` times, the last one kept. Also the
    same runs simulated with the costs measured in the flush's trace: {"flush"|"nostash"|
    "stash": {"per_s", "bubble", "sim_per_s", "sim_bubble"}}."""
    xs, ts, _, _ = _stream(comm, n_micro, b, width, seed)
    was, comm.tracer.enabled = comm.tracer.enabled, True
    out, costs = {}, None
    try:
        for scheme in ("flush", "nostash", "stash"):
            for _ in range(repeats):
                mod = _mine(comm, layers, width, seed)
                comm.builtin.barrier()
                comm.tracer.clear()
                t0 = time.perf_counter()
                if scheme == "flush":
                    A.train_flush(comm, mod, xs, ts, m, 1e-3)
                else:
                    A.train_async(comm, mod, xs, ts, 1e-3, stash=(scheme == "stash"))
                took = max(comm.builtin.allgather_object(time.perf_counter() - t0))
                events = merge(comm)
            out[scheme] = {"per_s": n_micro / took, "bubble": measured_bubble(events, comm.size)}
            if scheme == "flush":
                costs = measured_costs(events, one_f_one_b(comm.size, m))
    finally:
        comm.tracer.enabled = was
    step = simulate(one_f_one_b(comm.size, m), costs)
    stream = simulate(one_f_one_b(comm.size, n_micro), costs)
    out["config"] = {"n_micro": n_micro, "m": m, "width": width, "b": b, "layers": layers}
    out["flush"].update(sim_per_s=m / float(step.makespan), sim_bubble=float(step.bubble_fraction))
    for scheme in ("nostash", "stash"):
        out[scheme].update(sim_per_s=n_micro / float(stream.makespan), sim_bubble=float(stream.bubble_fraction))
    return out


# ---------------------------------------------------------------- as text


def format_best(rows) -> str:
    """The best lr and held-out loss of each scheme and p (mean and range over seeds)."""
    lines = [f"{'scheme':<11} {'p':>3}  {'best lr':>7}  {'held-out loss':>13}  {'range over seeds':>16}"]
    for (s, p), v in sorted(best(rows).items(), key=lambda kv: (SCHEMES.index(kv[0][0]), kv[0][1] or 0)):
        lines.append(f"{s:<11} {p or 'any':>3}  {v['lr']:>7g}  {v['loss']:>13.4f}  {v['low']:>7.4f} - {v['high']:.4f}")
    return "\n".join(lines)


def format_run(run) -> str:
    """One :func:`measure` result: staleness and bytes held per rank, speed and bubble."""
    schemes = list(run["memory"][0])
    lines = [f"p={run['p']}: staleness counted (largest, mean) and KiB held at the peak, counted "
             f"((!): not the formula's)",
             f"{'rank':>6} {'largest':>8} {'mean':>6}" + "".join(f"{s:>9}" for s in schemes)]
    for r in range(run["p"]):
        st, mem = run["staleness"]["stash"][r], run["memory"][r]
        lines.append(f"{r:>6} {st['max']:>8} {st['mean']:>6.2f}" + "".join(
            f"{mem[s]['counted']['total'] / 1024:>9.1f}" + ("" if mem[s]["counted"] == mem[s]["formula"] else "(!)")
            for s in schemes))
    for scheme, v in run["speed"].items():
        if scheme != "config":
            lines.append(f"{scheme:>8}: {v['per_s']:7.1f} micro-batches/s, bubble {v['bubble']:4.0%}   (simulated "
                         f"with the measured costs: {v['sim_per_s']:7.1f}/s, bubble {v['sim_bubble']:4.0%})")
    return "\n".join(lines)
