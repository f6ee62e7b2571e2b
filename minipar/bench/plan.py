"""Benchmark: the planner against lesson 05's trainer on this machine, step time and memory of every grid.

    python -m minipar.bench.plan                    # measure the machine, run every grid, compare
    python -m minipar.bench.plan --machine FILE     # a preset measured before (minipar bench machine)
    python -m minipar.bench.plan --again RUN.json   # a recorded run predicted again by today's planner
    minipar bench plan --steps 3 --json here.json   # the same

One run, so that every ratio is taken under the same conditions:

1. this machine is measured as ``minipar bench machine`` measures it (matmul rate, memory
   bandwidth, alpha/beta between two ranks, and alpha/beta of a ring step with 2 and 4 ranks per
   core), unless ``--machine`` names a preset file;
2. every grid of ``minipar bench train`` (``minipar.bench.train.GRIDS``: every 8-rank
   factorization, and 1, 2 and 4 ranks) trains the documented GPT for ``--steps`` steps after a
   warm-up, each grid its own mpiexec job, ``--rounds`` times (default 3, the rounds
   interleaved); a launch's step time is the slowest rank's mean, the grid's the median of its
   launches. In each round, just before the grids of k ranks, lesson 05's GPT's operations are
   probed on k ranks (``plan.machine.op_probe``); the machine record keeps each operation's
   median over the rounds;
3. ``minipar.plan.predict.predict_run`` predicts each grid from that record alone: nothing is
   fitted to the runs. It is printed twice: with the oversubscription model (the operations and
   the TP collectives as measured with k ranks on the cores) and without it (every rank its own
   core, the two-rank ping-pong's alpha).

Memory: the trainer counts the bytes every rank holds (its engine's ledger, the activations
between pipeline actions); the planner's model applied to the same GPT (``models.minipar_gpt``)
must give the same bytes at both ends of the pipeline, to the byte, except the block that full
recomputation rebuilds inside a backward (``transient``), which the trainer does not see
(``minipar.plan.predict.memory_errors``; lesson 07's checks hold it on a few grids).

The ranking: Spearman's rho and Kendall's tau between predicted and measured step times, over
all grids and over the 8-rank ones, and the three fastest of each.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from ..records import output_problem, write_json
from ..plan.predict import MEMORY_KEYS, memory_errors, predict_run
from .train import GRIDS, train_config


# --------------------------------------------------------------------------- on the ranks


def run_grid(comm, cfg, steps: int) -> dict:
    """Train ``cfg`` for one warm-up step and ``steps`` timed ones; the slowest rank's mean step
    time and every rank's counted memory (by grid coordinates)."""
    from ..train.trainer import train

    tr, _, times = train(comm, cfg.with_(steps=steps + 1))
    everyone = comm.builtin.allgather_object((tr.grid.coords, tr.memory()))
    return {"step_s": float(np.mean(times[1:])), "memory": [(list(c), m) for c, m in everyone]}


# --------------------------------------------------------------------------- ranking


def ranks_of(x) -> np.ndarray:
    """Ranks 1..n of x, ties sharing the mean of their ranks."""
    x = np.asarray(x, float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def spearman(a, b) -> float:
    ra, rb = ranks_of(a), ranks_of(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def kendall(a, b) -> float:
    """Kendall's tau-a: (concordant - discordant) pairs / all pairs."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    i, j = np.triu_indices(len(a), 1)
    return float(np.sum(np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])) / len(i))


def ranking(rows, key="predicted_s") -> dict:
    meas = [r["measured_s"] for r in rows]
    pred = [r[key] for r in rows]
    top = lambda v: [rows[i]["grid"] for i in np.argsort(v, kind="stable")[:3]]  # noqa: E731
    return {"spearman": spearman(meas, pred), "kendall": kendall(meas, pred), "top3_measured": top(meas),
            "top3_predicted": top(pred), "grids": len(rows)}


def within(rows, key="predicted_s", tolerance=0.25) -> int:
    """How many of ``rows`` are predicted within +-``tolerance`` of the measured step time."""
    return sum(abs(r[key] / r["measured_s"] - 1) <= tolerance for r in rows)


def unsteady(rows, tolerance=0.25) -> int | None:
    """How many of ``rows`` had a launch outside +-``tolerance`` of their own median: grids whose
    measurement alone spreads wider than the prediction is asked to be right. None where a row
    was launched once (no ``measured_range``: nothing to compare)."""
    if not rows or any("measured_range" not in r for r in rows):
        return None
    return sum(r["measured_range"][0] < (1 - tolerance) * r["measured_s"] or r["measured_range"][1] > (1 + tolerance) * r["measured_s"]
               for r in rows)


PART_NAMES = {"compute": "compute", "tp_comm": "tp comm", "pp_bubble": "pp bubble", "dp_comm": "dp comm",
              "optimizer": "optimizer"}


def table(res: dict) -> str:
    """The tables of docs/planner_validation.md's section on this machine, from a recorded run
    (``--json``): a row per grid, then the ranking."""
    lines = ["| grid | ranks | measured s/step | its launches, min-max | predicted | pred/meas | large-matmul rate pred/meas | "
             "no-oversub pred/meas | predicted parts (s) | memory, worst rank (MiB) | memory exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        m = r["measured_s"]
        launches = "{:.3f}-{:.3f}".format(*r["measured_range"]) if "measured_range" in r else "one launch"
        parts = ", ".join(f"{PART_NAMES[k]} {r['parts'][k]:.3f}" for k in PART_NAMES if r["parts"].get(k, 0) >= 5e-4)
        lines.append(f"| {r['grid']} | {r['ranks']} | {m:.3f} | {launches} | {r['predicted_s']:.3f} | {r['predicted_s'] / m:.2f} | "
                     f"{r['peak_rate_s'] / m:.2f} | {r['no_oversubscription_s'] / m:.2f} | {parts} | "
                     f"{r['memory_measured'] / 2**20:.2f} | {'yes' if r['memory_exact'] else 'NO'} |")
    lines += ["", "| grids | within +-25% (large-matmul rate) | median abs error | Spearman | Kendall | "
              "without the oversubscription model (rho / tau) | three fastest, measured | three fastest, predicted | "
              "a launch outside +-25% of its own median |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, s in res["summary"].items():
        label = f"all {s['model']['grids']}" if name == "all grids" else f"the {s['model']['grids']} with 8 ranks"
        lines.append(f"| {label} | {s['within_25']} ({s['peak_rate_within_25']}) | {s['median_abs_error']:.0%} | "
                     f"{s['model']['spearman']:.2f} | {s['model']['kendall']:.2f} | "
                     f"{s['no_oversubscription']['spearman']:.2f} / {s['no_oversubscription']['kendall']:.2f} | "
                     f"{', '.join(s['model']['top3_measured'])} | {', '.join(s['model']['top3_predicted'])} | "
                     f"{'n/a (one launch a grid)' if s.get('unsteady') is None else s['unsteady']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def measure_machine(path: str, grids=None, progress=lambda jobs, **_: jobs, with_ops=True) -> dict:
    """What ``minipar bench machine`` writes, measured now, into ``path`` (the operations at
    ``grids``' shapes, unless not ``with_ops``); returns it."""
    from .machine import measure_and_report

    return measure_and_report(2, path, grids, progress, with_ops)


def predictions(dp, pp, tp, presets):
    """(the row's fields, the model's ``Prediction``): the planner's three predictions of a grid
    from ``presets`` (the model, the model without oversubscription, the large matmul's rate:
    ``presets_from``), and the model's parts."""
    cfg = train_config(dp, pp, tp)
    p, q, old = (predict_run(cfg, hw) for hw in presets)
    return {"predicted_s": p.step_time_s, "no_oversubscription_s": q.step_time_s, "peak_rate_s": old.step_time_s,
            "parts": p.parts}, p


def grid_row(dp, pp, tp, runs, presets, out=print) -> dict:
    """One grid's row: the median of its launches' step times (``runs``: ``run_grid``'s results),
    the three predictions, and the memory check (the first launch's count: every launch holds the
    same bytes). ``measured_range``: the fastest and slowest launch, where there were several."""
    n = dp * pp * tp
    steps = sorted(r["step_s"] for r in runs)
    fields, p = predictions(dp, pp, tp, presets)
    errs = memory_errors(train_config(dp, pp, tp), p, runs[0]["memory"])
    worst = max(sum(m[k] for k in MEMORY_KEYS) for _, m in runs[0]["memory"])
    r = {"grid": f"dp{dp} pp{pp} tp{tp}", "ranks": n, "measured_s": float(np.median(steps)),
         **({"measured_range": [steps[0], steps[-1]]} if len(steps) > 1 else {}), **fields, "memory_measured": worst,
         "memory_predicted": p.memory_bytes["total"] - p.memory_bytes["transient"],
         "memory_exact": all(e == 0 for e in errs.values()), "memory_errors": errs}
    spread = f"{steps[0]:.3f}-{steps[-1]:.3f}" if len(steps) > 1 else ""
    out(f"{r['grid']:<16}{n:>6}{r['measured_s']:>12.3f}{spread:>13}{r['predicted_s']:>13.3f}{r['predicted_s'] / r['measured_s']:>10.2f}"
        f"{r['no_oversubscription_s'] / r['measured_s']:>11.2f}  {worst / 2**20:8.2f} MiB vs {r['memory_predicted'] / 2**20:7.2f}"
        f"{'yes' if r['memory_exact'] else 'NO':>6}")
    return r


def presets_from(record: dict, measured_now=False):
    """(the model, the model without oversubscription, the large matmul's rate) from a machine
    record: the three presets every row is predicted with."""
    from dataclasses import replace

    from ..plan.hardware import this_machine

    hw = this_machine("float64", record=record)
    if measured_now:
        hw = replace(hw, sources={"measured": "measured at the start of this run (as minipar bench machine -n 2 does)"})
    naive = replace(hw, oversubscription=False)
    peak = replace(hw, ops={})  # the model before the operations were measured: FLOPs / the large matmul's rate
    return hw, naive, peak


def summarize(rows, out=print) -> dict:
    """The ranking and the errors over all grids and over the 8-rank ones, printed and returned."""
    summary = {}
    for name, sel in (("all grids", rows), ("8 ranks", [r for r in rows if r["ranks"] == 8])):
        if len(sel) < 2:
            continue
        with_, without = ranking(sel), ranking(sel, "no_oversubscription_s")
        errs = [r["predicted_s"] / r["measured_s"] - 1 for r in sel]
        s = summary[name] = {"model": with_, "no_oversubscription": without, "median_abs_error": float(np.median(np.abs(errs))),
                             "within_25": within(sel), "peak_rate_within_25": within(sel, "peak_rate_s"),
                             "unsteady": unsteady(sel)}
        out(f"\n{name} ({len(sel)}): Spearman {with_['spearman']:.2f} (without the oversubscription model "
            f"{without['spearman']:.2f}), Kendall {with_['kendall']:.2f} ({without['kendall']:.2f}); "
            f"median |error| {s['median_abs_error']:.0%}; within +-25%: {s['within_25']} "
            f"(the large matmul's rate: {s['peak_rate_within_25']})"
            + ("" if s["unsteady"] is None else f"; a launch outside +-25% of its grid's median: {s['unsteady']}"))
        out(f"  fastest measured:  {', '.join(with_['top3_measured'])}")
        out(f"  fastest predicted: {', '.join(with_['top3_predicted'])}"
            f"   (without the model: {', '.join(without['top3_predicted'])})")
    return summary


def again(res: dict, out=print) -> dict:
    """A recorded run (``--json``) predicted again by today's planner from its own machine record:
    the measured steps and memory as recorded, every prediction and the summary recomputed."""
    presets = presets_from(res["machine"])
    rows = [dict(r, **predictions(*(int(x[2:]) for x in r["grid"].split()), presets)[0]) for r in res["rows"]]
    return dict(res, rows=rows, summary=summarize(rows, out))


def validate(steps=2, machine=None, grids=None, out=print, progress=lambda grids, **_: grids, rounds=1) -> dict:
    """Every grid trained on this machine beside the planner's prediction; ``progress`` wraps the
    launches (the CLI passes a bar over them). ``rounds``: each grid launched that many times, the
    rounds interleaved; its measured step is the median of its launches, their spread kept
    (``measured_range``): with more ranks than cores, which ranks the scheduler runs together is
    decided anew in every launch, and one grid's step moves by up to 2x between launches.

    Measuring the machine now (no ``machine`` file), the GPT's operations are probed on k ranks
    in every round just before that round's grids of k ranks, and each number is the median of
    its rounds: the probe and the runs it predicts are taken minutes apart at most, not the whole
    run apart, on a machine whose speed drifts."""
    from ..launcher import launch
    from ..plan.machine import OP_SECONDS, load, merged_ops, probe_launch
    from .machine import lesson05_ops, report_ops

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    grids = grids or GRIDS
    model, shapes = lesson05_ops(grids)
    measuring = machine is None
    if measuring:  # measured now, into a file of its own (the user's cached preset stays)
        fd, tmp = tempfile.mkstemp(prefix="minipar-machine-", suffix=".json")
        os.close(fd)
        try:
            record = measure_machine(tmp, grids, progress, with_ops=False)
        finally:
            os.remove(tmp)
    else:
        record = load(machine)
    ranks = sorted({dp * pp * tp for dp, pp, tp in grids})
    jobs = [job for _ in range(rounds) for k in ranks
            for job in ([("probe", k)] if measuring else []) + [("grid", g) for g in grids if np.prod(g) == k]]
    runs, probes, probe_s = {}, {}, 0.0
    for kind, x in progress(jobs, desc="probes and grids" if measuring else "grids", total=len(jobs), unit="launch"):
        if kind == "probe":
            t0 = time.perf_counter()
            probes.setdefault(x, []).append(probe_launch(x, model, shapes, OP_SECONDS))
            probe_s += time.perf_counter() - t0
        else:
            dp, pp, tp = x
            runs.setdefault(x, []).append(launch(dp * pp * tp, "minipar.bench.plan:run_grid", quiet=True, job_timeout=3600.0,
                                                 cfg=train_config(dp, pp, tp), steps=steps).results[0])
    if measuring:
        record["ops"] = merged_ops(model, probes, OP_SECONDS, probe_s)
        report_ops(record)
    hw, naive, peak = presets = presets_from(record, measured_now=measuring)
    busy = ", ".join(f"{n} ranks {lk.alpha * 1e6:.0f} us" for n, lk in hw.busy)
    out(f"preset: {hw.peak_flops / 1e9:.2f} GFLOP/s per core, {hw.hbm_bandwidth / 1e9:.2f} GB/s, {hw.cores} cores, "
        f"alpha {hw.intra.alpha * 1e6:.0f} us ({busy or 'no oversubscribed alpha measured'}); {hw.sources['measured']}")
    out(f"{'grid':<16}{'ranks':>6}{'measured s':>12}{'launches':>13}{'predicted s':>13}{'pred/meas':>10}{'no-oversub':>11}"
        f"{'  memory (worst rank)':<24}{'exact':>6}")
    rows = [grid_row(*g, runs[g], presets, out) for g in grids]
    summary = summarize(rows, out)
    exact = sum(r["memory_exact"] for r in rows)
    out(f"\nmemory: the planner's bytes equal the trainer's count on every rank in {exact} of {len(rows)} grids")
    return {"preset": {"peak_flops": hw.peak_flops, "memory_bandwidth": hw.hbm_bandwidth, "alpha": hw.intra.alpha,
                       "beta": hw.intra.beta(), "busy": {n: [lk.alpha, lk.beta()] for n, lk in hw.busy},
                       "source": hw.sources["measured"]},
            "machine": {k: v for k, v in record.items() if k != "path"},  # the whole measured record: predict again from it
            "steps": steps, "rounds": rounds, "load_average": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
            "rows": rows, "summary": summary}


def cmd_here(args, progress=lambda grids, **_: grids) -> int:
    from ..errors import UsageError

    problem = args.json and output_problem(args.json)
    if problem:  # before any work
        raise UsageError(f"--json {problem}")
    if args.table and args.json:
        raise UsageError("--table prints a recorded run's tables and writes nothing: drop --json (or use --again FILE --json OUT)")
    if args.table or args.again:
        flag, path = ("--table", args.table) if args.table else ("--again", args.again)
        try:
            with open(path) as f:
                res = json.load(f)
            if args.again:
                res = again(res)
                print()
            text = table(res)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"{flag} {path}: not a run `minipar bench plan --json` wrote ({err})") from None
        print(text)
        if args.again and args.json:
            write_json(args.json, res)
        return 0
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    if args.machine and not os.path.exists(args.machine):
        raise UsageError(f"--machine {args.machine}: no such file (write one with `minipar bench machine --out FILE`)")
    res = validate(args.steps, args.machine, progress=progress, rounds=args.rounds)
    if args.json:
        write_json(args.json, res)
    return 0


def add_arguments(p):
    p.add_argument("--steps", type=int, default=2, help="timed steps per grid, after one warm-up (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="launches of each grid, interleaved; the median is kept "
                                                       "(default 3)")
    p.add_argument("--machine", help="a preset file (minipar bench machine --out FILE) instead of measuring now")
    p.add_argument("--json", metavar="FILE", help="write the rows, the ranking and the measured machine record")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--table", metavar="FILE", help="print docs/planner_validation.md's tables from a run --json wrote; "
                                                   "nothing is run")
    g.add_argument("--again", metavar="FILE", help="predict a run --json wrote again with today's planner, from its own "
                                                   "machine record, and print its tables (--json OUT keeps it); nothing is run")


def main(argv=None) -> int:
    from ..errors import UsageError

    p = argparse.ArgumentParser(prog="python -m minipar.bench.plan", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    try:
        return cmd_here(p.parse_args(argv))
    except UsageError as err:
        print(f"{p.prog}: error: {err}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
