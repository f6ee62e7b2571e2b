"""Search every valid configuration; rank by simulated step time among those that fit.

    res = search(prob, fixed={"tp": 8}, top=5)
    res.best, res.ranked            # Config, [row indices] best first
    res.ev["step"][i]               # after search: simulated rows only

``fixed`` holds choices by layout field (``minipar.layout.FIELDS``), or the micro-batch size as
``microbatch`` (sequences, as ``minipar plan --microbatch`` and the papers state it).

Validity (Megatron-LM's rules unless noted):

- tp divides the GPUs, the heads and the MLP width; tp <= GPUs per node unless asked
  (configurations with a cross-node tp are still evaluated, to say why they lose);
- cp: the sequence splits into 2 cp chunks (load-balanced causal attention), cp <= 64;
- pp divides the layers (any pp <= layers when given explicitly: DeepSpeed spreads the rest);
- dp = GPUs / (tp pp cp); the global batch divides by dp x the micro-batch size b, into m
  micro-batches per pipeline;
- interleaved: pp > 1, layers % (pp chunks) == 0, micro-batches % pp == 0;
- ZeRO-2/3 only without pipeline parallelism (DeepSpeed refuses them with its pipeline engine:
  gradients would be reduce-scattered every micro-batch); ZeRO needs dp x cp > 1;
- ep (models with experts): divides dp and the number of experts; the experts are split over ep
  of the dp ranks, everything else replicated over all of them (Megatron's expert parallelism);
- sequence parallelism needs tp > 1; GPipe only when asked (same bubble as 1F1B, more
  activations in flight: it never wins).

Speed: the memory and time formulas run on numpy columns over every configuration at once. The
pipeline simulator is slow for long pipelines, so it runs only where it can change the answer:
configurations are visited in the order of an estimate of their step (the textbook bubble plus
one micro-batch's point-to-point trips, ``pipeline.makespan_estimate``), and visiting stops
once the estimate exceeds the simulated time of the top-k found. The estimate is not a bound:
a configuration the simulation would have ranked higher can in principle be missed; the tests
check the estimate against the simulation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from .config import PLAN_FIELDS, Config, Configs, Problem, microbatch_size
from .pipeline import makespans
from .timing import PARTS, evaluate, finish


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def consistency(gpus: int, batch: int, fixed: dict) -> str | None:
    """The first way the numbers a user (or a paper) states disagree, in one line, or None:
    tp x pp x dp x cp must equal the GPUs (divide them while some are searched), and the global
    batch must split into dp x micro-batch size x micro-batches (dp known once given, or once
    tp, pp and cp are)."""
    names = [k for k in ("tp", "pp", "dp", "cp") if fixed.get(k)]
    prod = int(np.prod([fixed[k] for k in names]))
    said = " x ".join(f"--{k} {fixed[k]}" for k in names)
    if gpus % prod:
        return f"{said} = {prod} GPUs does not divide --gpus {gpus}"
    if {"tp", "pp", "dp"} <= set(names) and prod != gpus:  # cp not given: 1
        return f"{said} = {prod} GPUs, not --gpus {gpus}"
    dp = fixed.get("dp") or (gpus // prod if {"tp", "pp", "cp"} <= set(names) else None)
    mb, nmb = fixed.get("microbatch"), fixed.get("microbatches")
    parts = ([f"dp {dp}" + ("" if fixed.get("dp") else f" (--gpus {gpus} / {said})")] if dp else []) + \
            ([f"--microbatch {mb}"] if mb else []) + ([f"{nmb} micro-batches"] if nmb else [])
    per = (dp or 1) * (mb or 1) * (nmb or 1)
    if batch % per or (dp and mb and nmb and per != batch):
        return f"--global-batch {batch} is not {'' if dp and mb and nmb else 'a multiple of '}{' x '.join(parts)} = {per}"
    return None


def _check_fixed(prob: Problem, fixed: dict):
    m, G = prob.model, prob.gpus
    tp, pp, dp, cp = (fixed.get(k) for k in ("tp", "pp", "dp", "cp"))
    for k in ("tp", "pp", "dp", "cp", "ep", "microbatch", "microbatches", "chunks"):
        if k in fixed and (not isinstance(fixed[k], int) or fixed[k] < 1):
            raise UsageError(f"--{k} must be a positive integer, got {fixed[k]!r}")
    if tp and (G % tp or not m.tp_splits(tp)):
        raise UsageError(f"--tp {tp} must divide --gpus {G}, the {m.heads} heads, the {m.kv} KV heads and "
                         f"the MLP width {m.ef if m.experts else m.f}")
    ep = fixed.get("ep")
    if ep and ep > 1 and not m.experts:
        raise UsageError(f"--ep {ep}: {m.name} has no experts to split")
    if ep and m.experts and m.experts % ep:
        raise UsageError(f"--ep {ep} must divide the {m.experts} experts")
    if ep and dp and dp % ep:
        raise UsageError(f"--ep {ep} must divide --dp {dp}: the experts are split over ep of the data-parallel ranks")
    if pp and pp > m.layers:
        raise UsageError(f"--pp {pp} is more than the {m.layers} layers")
    if cp and cp > 1 and m.seq % (2 * cp):
        raise UsageError(f"--cp {cp}: the sequence {m.seq} must split into 2 x cp equal chunks")
    problem = consistency(G, prob.batch, fixed)
    if problem:
        raise UsageError(problem)
    if fixed.get("zero", 0) >= 2 and prob.engine == "megatron":
        raise UsageError(f"--zero {fixed['zero']} with --engine megatron: its distributed optimizer is ZeRO-1; "
                         "ZeRO-2/3 are --engine deepspeed or fsdp")
    if fixed.get("zero", 0) >= 2 and pp and pp > 1:
        raise UsageError(f"--zero {fixed['zero']} with --pp {pp}: ZeRO-2/3 do not combine with pipeline parallelism")
    if fixed.get("sequence_parallel") and tp == 1:
        raise UsageError("--sequence-parallel needs --tp > 1")
    if fixed.get("schedule") == "interleaved" and pp == 1:
        raise UsageError("--schedule interleaved needs --pp > 1")
    if fixed.get("chunks", 1) > 1 and fixed.get("schedule", "interleaved") != "interleaved":
        raise UsageError(f"--chunks {fixed['chunks']} needs --schedule interleaved")


def enumerate_configs(prob: Problem, fixed: dict | None = None, allow_cross_node_tp=False) -> tuple[Configs, np.ndarray]:
    """Every valid configuration (with ``fixed`` choices held), and which are eligible to win
    (cross-node tp only when asked). Raises UsageError when none is valid."""
    fixed = dict(fixed or {})
    _check_fixed(prob, fixed)
    m, G, gpn, B = prob.model, prob.gpus, prob.gpus_per_node, prob.batch

    def choices(key, default):
        return [fixed[key]] if key in fixed else default

    rows, eligible = [], []
    tps = choices("tp", [t for t in divisors(G) if m.tp_splits(t) and t <= max(gpn, 2 * gpn)])
    cps = choices("cp", [c for c in divisors(G) if c == 1 or (m.seq % (2 * c) == 0 and c <= 64)])
    for t in tps:
        for c in cps:
            if G % (t * c):
                continue
            pps = choices("pp", [p for p in divisors(G // (t * c)) if m.layers % p == 0])
            for p in pps:
                if G % (t * c * p):
                    continue
                d = G // (t * c * p)
                if "dp" in fixed and fixed["dp"] != d or B % d:
                    continue
                eps = [e for e in choices("ep", divisors(d)) if d % e == 0 and (m.experts or 1) % e == 0]
                if not eps:
                    continue
                for b in divisors(B // d):  # the micro-batch size, and m = B / (d b) micro-batches
                    nmb = B // (d * b)
                    if fixed.get("microbatch", b) != b or fixed.get("microbatches", nmb) != nmb:
                        continue
                    if p == 1:
                        scheds = [("1f1b", 1)]
                    else:
                        scheds = [("1f1b", 1)]
                        if m.layers % p == 0 and nmb % p == 0:
                            scheds += [("interleaved", v) for v in divisors(m.layers // p) if v >= 2]
                        if fixed.get("schedule") == "gpipe":
                            scheds = [("gpipe", 1)]
                    scheds = [s for s in scheds if s[0] == fixed.get("schedule", s[0])
                              and s[1] == fixed.get("chunks", s[1])]
                    zeros = choices("zero", [0] + ([1] if d * c > 1 else []) +
                                    ([2, 3] if d * c > 1 and p == 1 and prob.engine != "megatron" else []))
                    for z in zeros:
                        if z >= 2 and p > 1 or z > 0 and d * c == 1:
                            continue
                        for sched, v in scheds:
                            for rec in choices("recompute", ["none", "selective", "full"]):
                                for sp in choices("sequence_parallel", [False] + ([True] if t > 1 else [])):
                                    for e in eps:
                                        rows.append(dict(tp=t, pp=p, dp=d, cp=c, zero=z, microbatches=nmb, schedule=sched,
                                                         chunks=v, recompute=rec, sequence_parallel=sp, ep=e))
                                        eligible.append(t <= gpn or allow_cross_node_tp or "tp" in fixed)
    if not rows:
        raise UsageError(f"no valid configuration for {G} GPUs with {', '.join(f'--{k} {v}' for k, v in fixed.items()) or 'these choices'}"
                         f" (global batch {B}, {m.layers} layers, {m.heads} heads)")
    return Configs(**{k: [r[k] for r in rows] for k in PLAN_FIELDS}), np.array(eligible)


@dataclass
class Result:
    prob: Problem
    cfgs: Configs
    ev: dict  # evaluate() columns; "step" etc. filled for the simulated rows (nan elsewhere)
    eligible: np.ndarray
    ranked: list  # row indices, best first (fitting first)
    simulated: int
    seconds: float
    stats: dict = field(default_factory=dict)
    cpu_seconds: float = 0.0

    @property
    def best(self) -> Config:
        return self.cfgs.config(self.ranked[0])

    def row(self, i: int) -> dict:
        """One configuration's numbers (scalars), JSON-ready."""
        c = self.cfgs.config(i)
        mem = self.ev["mem"]
        out = {}
        for k in PLAN_FIELDS:  # the layout, with the micro-batch size for the count (as --microbatch takes it)
            if k == "microbatches":
                out["microbatch"] = c.microbatch_size(self.prob.batch)
            else:
                out[k] = getattr(c, k)
        out["fits"] = bool(mem["fits"][i])
        out["memory_gb"] = {k: float(mem[k][i]) / 1e9 for k in ("params", "grads", "optimizer", "activations", "total")}
        out["step_time_s"] = float(self.ev["step"][i])
        out["tflops_per_gpu"] = float(self.ev["tflops_per_gpu"][i])
        out["mfu"] = float(self.ev["mfu"][i])
        return out


def simulate_rows(res: Result, rows):
    """Fill step, parts, TFLOP/s and MFU for ``rows`` (simulating their pipelines)."""
    rows = [int(i) for i in rows if np.isnan(res.ev["step"][i])]
    if not rows:
        return
    ms = makespans(res.cfgs, res.ev, rows)
    sub = {k: (v[rows] if isinstance(v, np.ndarray) and v.shape == res.ev["F"].shape else v)
           for k, v in res.ev.items() if k != "mem"}
    done = finish(res.prob, res.cfgs.take(rows), sub, ms)
    for k in ("step", "tflops_per_gpu", "mfu", "makespan"):
        res.ev[k][rows] = done[k]
    for k, v in done["parts"].items():
        res.ev["parts"][k][rows] = v
    res.simulated += len(rows)


def evaluated(prob: Problem, fixed: dict | None = None, allow_cross_node_tp=False) -> Result:
    """Every valid configuration evaluated (memory, per-stage times, estimates); the simulated
    columns (step, parts, TFLOP/s, MFU) are NaN until ``simulate_rows`` fills them."""
    cfgs, eligible = enumerate_configs(prob, fixed, allow_cross_node_tp)
    ev = evaluate(prob, cfgs)
    n = len(cfgs)
    for k in ("step", "tflops_per_gpu", "mfu", "makespan"):
        ev[k] = np.full(n, np.nan)
    ev["parts"] = {k: np.full(n, np.nan) for k in PARTS}
    return Result(prob, cfgs, ev, eligible, [], 0, 0.0)


def search(prob: Problem, fixed: dict | None = None, top: int = 5, allow_cross_node_tp=False) -> Result:
    t0, c0 = time.perf_counter(), time.process_time()
    res = evaluated(prob, fixed, allow_cross_node_tp)
    ev, eligible = res.ev, res.eligible
    fits = ev["mem"]["fits"] & eligible
    est = ev["estimate"]
    if fits.any():
        order = np.flatnonzero(fits)[np.argsort(est[fits], kind="stable")]
        best = []  # simulated steps of the visited rows
        for i in order:  # visit by estimate; stop when it passes the k-th best simulated step
            if len(best) >= top and est[i] >= sorted(best)[top - 1]:
                break
            simulate_rows(res, [i])
            best.append(ev["step"][i])
        done = order[~np.isnan(ev["step"][order])]
        # ties (equal to 1e-9) go to the smaller memory footprint
        order = np.lexsort((ev["mem"]["total"][done], np.round(ev["step"][done] / ev["step"][done].min(), 9)))
        res.ranked = [int(i) for i in done[order][:top]]
    else:  # nothing fits: the smallest footprints, so the user sees how far off they are
        order = np.flatnonzero(eligible)[np.argsort(ev["mem"]["total"][eligible], kind="stable")][:top]
        simulate_rows(res, order)
        res.ranked = [int(i) for i in order]
    res.stats = dict(configs=len(res.cfgs), eligible=int(eligible.sum()), fit=int(fits.sum()))
    res.seconds, res.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return res


AXES = ("tp", "pp", "cp", "ep", "zero", "recompute", "schedule", "sequence_parallel", "microbatch")


def axis_column(res: Result, axis: str) -> np.ndarray:
    """The values of ``axis`` (an AXES name) over the configurations; "microbatch": the micro-batch size."""
    return microbatch_size(res.prob, res.cfgs) if axis == "microbatch" else res.cfgs.cols[axis]


def alternatives(res: Result, per_axis: int = 1) -> list[tuple[str, object, int]]:
    """(axis, value, row) of the best configuration for values of each axis other than the
    winner's: the closest fitting one (by estimate), else the smallest non-fitting one; each
    configuration once."""
    if not res.ranked:
        return []
    mem, lb = res.ev["mem"], res.ev["estimate"]
    out = []
    for axis in AXES:
        col = axis_column(res, axis)
        picks = []
        for val in np.unique(col):
            if val == col[res.ranked[0]]:
                continue
            sel = np.flatnonzero(col == val)
            ok = sel[mem["fits"][sel]]
            i = ok[np.argmin(lb[ok])] if len(ok) else sel[np.argmin(mem["total"][sel])]
            picks.append((0 if mem["fits"][i] else 1, float(lb[i]), axis, val.item(), int(i)))
        picks.sort()  # the strongest contenders of this axis first
        out += [(a, v, i) for _, _, a, v, i in picks if i not in {r for *_, r in out}][:per_axis]
    simulate_rows(res, [i for *_, i in out if res.ev["mem"]["fits"][i]])
    return _fastest_simulated(res, out)


def _fastest_simulated(res: Result, out):
    """``out`` with each fitting pick replaced by the fastest simulated configuration of its axis
    value, when the search simulated a faster one than the estimate chose (the table above the
    alternatives may rank it): the line then names the value's best known, not a slower one."""
    mem, step = res.ev["mem"], res.ev["step"]
    taken, better = {i for *_, i in out}, []
    for a, v, i in out:
        if mem["fits"][i]:
            col = axis_column(res, a)
            sim = np.flatnonzero((col == v) & mem["fits"] & res.eligible & ~np.isnan(step))
            sim = [int(j) for j in sim[np.argsort(step[sim], kind="stable")] if j == i or j not in taken]
            if sim and step[sim[0]] < step[i]:
                taken = (taken - {i}) | {sim[0]}
                i = sim[0]
        better.append((a, v, i))
    return better
