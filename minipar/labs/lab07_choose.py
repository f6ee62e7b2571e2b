"""Lab 07, task 7.4 (choose a configuration for a cluster) and the exercise's demo.

The learner searches a small space (tp within a node, pp, dp, micro-batch, recompute; 1F1B, no
ZeRO, no context parallelism, sequence parallelism with tp > 1) with ``predict``, the planner's
memory and step time of one configuration, handed in (the one door to the planner: a call into
``minipar.plan`` is refused, see ``lab07_reference.Watch``). The choice must be a valid configuration, fit
in a GPU's memory (one that does not is rejected however fast it would be), and be within 1% of
the best step of the space that fits. The space is computed once per case from the planner's
search columns, every pipeline simulated.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..pipeline import gpipe, interleaved_1f1b, one_f_one_b, zero_bubble_h1
from ..pipeline.schedules import inflight_profile
from .checks import attempt
from .lab07_reference import Watch, call_watched, reference_activation_bytes, refused


Estimate = namedtuple("Estimate", "memory_bytes step_s")
KEYS = ("tp", "pp", "dp", "microbatch", "recompute")
RECOMPUTE = ("none", "selective", "full")
CHOOSE_CASES = [  # (label, model, GPUs, GPUs per node, hardware, global batch)
    ("a 1.7B model on one node of 8 A100 40GB", "megatron-1.7b", 8, 8, "a100-40gb", 16),
    ("a 7.5B model on one node of 8 A100 40GB", "megatron-7.5b", 8, 8, "a100-40gb", 32),
    ("an 18B model on 4 nodes of 8 A100 80GB", "megatron-18b", 32, 8, "a100-80gb", 64),
]
TOLERANCE = 0.01  # the choice's step may be at most 1% slower than the best in the space


def job_of(model_name, gpus, per_node, hw_name, batch):
    """The planner's Problem and the job as the learner sees it (a dict)."""
    from ..plan import Problem, model, preset

    prob = Problem(model(model_name), gpus, per_node, preset(hw_name), batch)
    m = prob.model
    return prob, dict(gpus=gpus, gpus_per_node=per_node, layers=m.layers, heads=m.heads, ffn=m.f, batch=batch,
                      capacity_bytes=prob.capacity)


def space(prob) -> dict:
    """{(tp, pp, dp, microbatch, recompute): Estimate} of every configuration of the lab's space
    (1F1B, no ZeRO, no context parallelism, sequence parallelism with tp > 1; tp within a node),
    from the planner's search columns, every pipeline simulated."""
    from ..plan.config import microbatch_size
    from ..plan.search import evaluated, simulate_rows

    res = evaluated(prob, dict(cp=1, zero=0, schedule="1f1b", chunks=1))
    c = res.cfgs
    rows = np.flatnonzero(res.eligible & (c.sequence_parallel == (c.tp > 1)))
    simulate_rows(res, rows)
    cols = dict(c.cols, microbatch=microbatch_size(prob, c))  # the lab's microbatch: the size b, not the count
    return {tuple(cols[k][i].item() for k in KEYS): Estimate(float(res.ev["mem"]["total"][i]), float(res.ev["step"][i]))
            for i in rows}


def invalid(job, tp, pp, dp, microbatch, recompute) -> str | None:
    """Why (tp, pp, dp, microbatch, recompute) is not a configuration of this job, or None."""
    vals = dict(tp=tp, pp=pp, dp=dp, microbatch=microbatch)
    bad = [f"{k}={v!r}" for k, v in vals.items() if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1]
    if bad:
        return f"{', '.join(bad)}: tp, pp, dp and microbatch are positive integers"
    if recompute not in RECOMPUTE:
        return f"recompute={recompute!r}: one of {', '.join(map(repr, RECOMPUTE))}"
    if tp * pp * dp != job["gpus"]:
        return f"tp x pp x dp = {tp * pp * dp}, not the {job['gpus']} GPUs"
    if tp > job["gpus_per_node"]:
        return f"tp={tp} crosses the node ({job['gpus_per_node']} GPUs per node): tensor parallelism stays inside one"
    if job["heads"] % tp or job["ffn"] % tp:
        return f"tp={tp} does not divide the {job['heads']} heads and the MLP width {job['ffn']}"
    if job["layers"] % pp:
        return f"pp={pp} does not divide the {job['layers']} layers"
    if job["batch"] % (dp * microbatch):
        return f"dp x microbatch = {dp * microbatch} does not divide the global batch {job['batch']}"
    return None


_SPACES = {}


def case(i):
    """(label, job, {config: Estimate}) of CHOOSE_CASES[i], the space computed once per process."""
    label, *spec = CHOOSE_CASES[i]
    if i not in _SPACES:
        prob, job = job_of(*spec)
        _SPACES[i] = (job, space(prob))
    job, table = _SPACES[i]
    return label, dict(job), table


def predictor(job, table, watch, log):
    """The ``predict`` handed to the learner: the planner's Estimate of one configuration."""
    def predict(tp, pp, dp, microbatch, recompute):
        with watch.paused():
            why = invalid(job, tp, pp, dp, microbatch, recompute)
            if why:
                raise ValueError(f"predict(tp={tp}, pp={pp}, dp={dp}, microbatch={microbatch}, recompute={recompute!r}): "
                                 f"not a configuration of this job: {why}")
            log.append((tp, pp, dp, microbatch, recompute))
            return table[int(tp), int(pp), int(dp), int(microbatch), recompute]
    return predict


def describe(cfg) -> str:
    return " ".join(f"{k}={cfg[i]}" for i, k in enumerate(KEYS))


def check_choose_config(comm, fn):
    for i in range(len(CHOOSE_CASES)):
        label, job, table = case(i)
        watch, log = Watch(), []
        got, calls = call_watched(fn, dict(job), predictor(job, table, watch, log), watch=watch)
        if calls:
            return refused("choose_config", calls, "search the space yourself, with the predict you are handed")
        if not isinstance(got, dict) or set(KEYS) - set(got):
            return [f"choose_config for {label} returned {got!r}; expected a dict with the keys {', '.join(KEYS)}"]
        cfg = tuple(got[k] for k in KEYS)
        why = invalid(job, *cfg)
        if why:
            return [f"choose_config for {label} chose {describe(cfg)}: not a valid configuration: {why}"]
        est = table[tuple(int(x) if k != "recompute" else x for k, x in zip(KEYS, cfg))]
        cap = job["capacity_bytes"]
        fitting = {c: e for c, e in table.items() if e.memory_bytes <= cap}
        best = min(fitting, key=lambda c: (fitting[c].step_s, fitting[c].memory_bytes))
        if est.memory_bytes > cap:
            return [f"choose_config for {label} chose {describe(cfg)}: it needs {est.memory_bytes / 1e9:.1f} GB per GPU "
                    f"> the {cap / 1e9:.1f} GB a GPU holds, so it cannot run, however fast ({est.step_s:.3g} s/step "
                    f"predicted); compare every candidate's memory_bytes with job['capacity_bytes'] (the best that "
                    f"fits: {describe(best)}, {fitting[best].step_s:.4g} s/step)"]
        slower = est.step_s / fitting[best].step_s - 1
        if slower > TOLERANCE:
            tried = (f"predict was called for {len(set(log))} of the {len(table)} configurations"
                     if log else "predict was never called")
            return [f"choose_config for {label} chose {describe(cfg)}: {est.step_s:.4g} s/step, {slower:.1%} slower "
                    f"than the best that fits, {describe(best)} at {fitting[best].step_s:.4g} s/step (tolerance "
                    f"{TOLERANCE:.0%}); {tried}: try every tp, pp, dp, micro-batch and recompute the rules allow"]
    return []


# ---------------------------------------------------------------- the exercise's demo

def demo(comm, activation_fn, inflight_fn, time_fn, choose_fn, per_node=2, slowdown=20.0):
    """What ``mpiexec -n P python -m mpi4py labs/07_planning/exercise.py`` shows, yours beside the
    planner's: a GPT-3 block's activations under each strategy; the activations in flight per rank
    of four schedules on P stages; a configuration for a 7.5B model on one node; and on P ranks
    taken as nodes of ``per_node`` (P >= 4), the two-level all-reduce measured with emulated links
    (NVLink inside a node, Ethernet between, ``slowdown`` times slower) against your prediction."""
    from ..lessons.planning import two_level_predicted, two_level_runs

    p = max(comm.size, 2)
    if comm.rank == 0:
        s, b, h, a, t = 2048, 1, 12288, 96, 8
        print(f"== one GPT-3 block's activations per micro-batch (s={s}, b={b}, h={h}, a={a}), MB: yours | planner's")
        for label, tt, sp, rec in (("no parallelism", 1, False, "none"), ("TP=8", t, False, "none"),
                                   ("TP=8 + SP", t, True, "none"), ("TP=8 + SP + selective", t, True, "selective"),
                                   ("TP=8 + SP + full recompute", t, True, "full")):
            got, why = attempt(lambda: activation_fn(s, b, h, a, tt, sp, rec))
            want = reference_activation_bytes(s, b, h, a, tt, sp, rec)
            print(f"  {label:<28} {why or f'{got / 1e6:10.1f}'} | {want / 1e6:10.1f}")
        print(f"\n== activations in flight per rank, p={p} stages, m={2 * p} micro-batches: yours | the schedule's")
        for sched in (gpipe(p, 2 * p), one_f_one_b(p, 2 * p), interleaved_1f1b(p, 2 * p, 2), zero_bubble_h1(p, 2 * p)):
            got, why = attempt(lambda: inflight_fn([list(ops) for ops in sched.actions]))
            want = [max(inflight_profile(ops)) for ops in sched.actions]
            print(f"  {sched.name:<12} v={sched.chunks}  {why or got} | {want}")
        label, job, table = case(1)
        got, why = attempt(lambda: choose_fn(dict(job), predictor(job, table, Watch(), [])))
        fitting = {c: e for c, e in table.items() if e.memory_bytes <= job["capacity_bytes"]}
        best = min(fitting, key=lambda c: fitting[c].step_s)
        print(f"\n== a configuration for {label}: yours {why or got}\n   the planner's best: {describe(best)} "
              f"({fitting[best].step_s:.3g} s/step, {fitting[best].memory_bytes / 1e9:.1f} GB per GPU)", flush=True)
    if comm.size < 4 or comm.size % per_node:
        if comm.rank == 0:
            print(f"\n(run on 4 ranks or more, a multiple of {per_node}, to measure the two-level all-reduce)")
        return
    nbytes = 1 << 23
    measured = two_level_runs(comm, per_node, nbytes, slowdown=slowdown)
    if comm.rank == 0:
        pred = two_level_predicted(comm.size, per_node, nbytes, slowdown=slowdown)
        yours, why = attempt(lambda: time_fn(nbytes, comm.size, per_node, pred["intra"], pred["inter"]))
        print(f"\n== all-reduce of {nbytes / 2**20:.0f} MiB on {comm.size} ranks as nodes of {per_node}, links "
              f"emulated {slowdown:g}x slower (nvlink inside, ethernet between), ms:\n"
              f"  two-level: measured {measured['two-level'] * 1e3:.1f}, yours "
              f"{why or f'{yours * 1e3:.1f}'}, planner's {pred['two-level'] * 1e3:.1f}\n"
              f"  flat ring: measured {measured['flat ring'] * 1e3:.1f}, planner's {pred['flat ring'] * 1e3:.1f}\n"
              f"now grade it: minipar check 07", flush=True)
