"""``minipar bench train``: tokens/s of every grid, against one process, and MFU.

    minipar bench train --json docs/bench_train.json

One run measures, at the documented model size (``train.config.DEFAULT_MODEL``, the sorting
task, global batch 32 x 32 tokens):

- this machine's matmul rate: one BLAS thread, a (1024 x 256) x (256 x 1024) float64 product,
  best of several (the ceiling a rank can reach);
- the one-process baseline: the dense GPT, forward, backward and Adam, no communicator at all
  (``train.reference.dense_step``, the step of the one-process reference);
- every 8-rank factorization dp x pp x tp, and grids of 1, 2 and 4 ranks, each launched on
  its own (mpiexec), timed over ``--steps`` steps after one warm-up step;
- minor page faults per timed step (``resource.getrusage``, rank 0, after the warm-up): a rank
  whose temporaries get fresh pages every step faults each page in again (``minipar.comm.malloc``);
- MFU = model FLOPs per second / (matmul rate x cores the ranks can use), model FLOPs per
  step = 6 x parameters x tokens + 12 x layers x T^2 x C x batch (attention's two T x T
  products, forward and backward), recomputation not counted (as in the MFU of Chowdhery et
  al. 2022).

Ratios are taken within the run: every row's tokens/s over the baseline's. The two ratios the
trainer is held to (on one rank against the bare loop, and 2-rank DP against it) are taken again
in ``--rounds`` interleaved rounds, and their medians reported (``target_ratios``).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..records import write_json

GRIDS = [(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 4, 1), (2, 2, 2), (2, 1, 4), (1, 8, 1), (1, 4, 2), (1, 2, 4),
         (1, 1, 8), (1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 1, 1), (2, 2, 1), (1, 2, 2), (2, 1, 2)]


def train_config(dp, pp, tp, **kw):
    """The benchmark's configuration of a grid: ``minipar train``'s run (the documented GPT on the
    sorting task, ``TrainConfig``'s batch and lr unless given), 1f1b, m = 2 pp micro-batches."""
    from ..train.config import DEFAULT_MODEL, TrainConfig
    from ..train.model import GPTConfig

    kw.setdefault("microbatches", 2 * pp if pp > 1 else 1)
    return TrainConfig(GPTConfig(**DEFAULT_MODEL), dp=dp, pp=pp, tp=tp, data="sorting", **kw)


def matmul_rate(seconds=1.0) -> float:
    """FLOP/s of a float64 (1024 x 256) @ (256 x 1024) product on this thread, best of a few."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1024, 256)), rng.standard_normal((256, 1024))
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024 * 256 * 1024 / best


def model_flops(cfg) -> float:
    m = cfg.model
    tokens = cfg.batch * m.seq_len
    return 6 * m.num_params() * tokens + 12 * m.n_layers * m.seq_len * m.seq_len * m.d_model * cfg.batch


def minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def bench_rank(comm, cfg, steps, baseline=False, rate=False):
    """Seconds per step (the slowest rank's) over ``steps`` steps after one warm-up step; on one
    rank with ``baseline`` the dense GPT without any communicator; plus rank 0's minor page faults
    per timed step, and with ``rate`` (the baseline, once per run) this thread's matmul rate."""
    if baseline:
        from ..optim import Adam
        from ..train.model import GPT
        from ..train.config import make_data
        from ..train.reference import dense_step

        model, data = GPT(cfg.model, cfg.seed), make_data(cfg)
        opt = Adam([p for _, p in model.named_parameters()], lr=cfg.lr)
        times, f0 = [], 0
        for step in range(steps + 1):
            ids = data.batch(step, cfg.batch, cfg.model.seq_len)
            t0 = time.perf_counter()
            dense_step(model, opt, ids)
            times.append(time.perf_counter() - t0)
            if step == 0:
                f0 = minor_faults()  # after the warm-up step
        faults = (minor_faults() - f0) / steps  # before the matmul rate's own arrays
        return {"step_s": float(np.mean(times[1:])), "matmul_flops": matmul_rate() if rate else None,
                "faults_per_step": faults}
    from ..train.trainer import train

    warm = {}
    tr, _, times = train(comm, cfg.with_(steps=steps + 1),
                         report=lambda step, _: warm.setdefault("faults", minor_faults()))  # rank 0, after step 0
    faults = (minor_faults() - warm["faults"]) / steps if comm.rank == 0 else None
    peaks = comm.builtin.allgather_object(tr.peak_activations)
    return {"step_s": float(np.mean(times[1:])), "peak_activations": max(peaks),
            "faults_per_step": faults}


def recompute_table(base, steps, ranks=4):
    """Activation peak (measured and formula) and step time of each recompute mode on
    dp1 pp2 tp2 (1f1b, m=4): what each mode saves and what it costs."""
    from ..launcher import launch
    from ..train.accounting import activation_peak

    rows = []
    for mode in ("none", "selective", "full"):
        cfg = base.with_(pp=2, tp=2, microbatches=4, recompute=mode)
        r = launch(ranks, "minipar.bench.train:bench_rank", quiet=True, job_timeout=3600.0, cfg=cfg, steps=steps).results[0]
        want = max(activation_peak(cfg, (0, p, 0)) for p in range(cfg.pp))
        rows.append({"recompute": mode, "peak_activations": r["peak_activations"], "formula": want, "step_s": r["step_s"]})
        print(f"recompute {mode:<10} peak activations {r['peak_activations'] / 2**20:8.2f} MiB (formula "
              f"{want / 2**20:8.2f} MiB)  step {r['step_s'] * 1e3:8.1f} ms", flush=True)
    return rows


def target_ratios(base, steps, rounds, batch) -> dict:
    """The two ratios the trainer is held to, taken in ``rounds`` interleaved rounds of (the bare
    loop, the trainer on one rank, 2-rank DP), each job launched on its own, and the median of
    each ratio: the table above measures every grid once, in sequence, so a slow minute of the
    machine lands on one row only; here it lands on a whole round, and the median drops it."""
    from ..launcher import launch

    one, dp2 = [], []
    for i in range(rounds):
        runs = {}
        for name, n, cfg, baseline in (("bare", 1, base, True), ("one", 1, base, False),
                                       ("dp2", 2, train_config(2, 1, 1, batch=batch), False)):
            res = launch(n, "minipar.bench.train:bench_rank", quiet=True, job_timeout=3600.0, cfg=cfg, steps=steps,
                         baseline=baseline)
            runs[name] = max(r["step_s"] for r in res.results)  # the slowest rank's
        one.append(runs["bare"] / runs["one"])
        dp2.append(runs["bare"] / runs["dp2"])
        print(f"round {i + 1}/{rounds}: bare loop {runs['bare'] * 1e3:.1f} ms, trainer on one rank {runs['one'] * 1e3:.1f} ms "
              f"({one[-1]:.2f}x), 2-rank DP {runs['dp2'] * 1e3:.1f} ms ({dp2[-1]:.2f}x)", flush=True)
    out = {"rounds": rounds, "trainer_vs_bare": float(np.median(one)), "dp2_vs_bare": float(np.median(dp2)),
           "trainer_vs_bare_each": one, "dp2_vs_bare_each": dp2}
    print(f"\nthe trainer on one rank: {out['trainer_vs_bare']:.2f}x the bare loop (target >= 0.95x); 2-rank DP: "
          f"{out['dp2_vs_bare']:.2f}x the tokens/s of one process (target >= 1.6x); medians of {rounds} interleaved rounds\n")
    return out


def run(args, progress=lambda grids, **_: grids) -> int:
    """``minipar bench train``; ``progress`` wraps the grids (the CLI passes a bar over them)."""
    from ..launcher import launch
    from ..train.config import check_shapes

    base = train_config(1, 1, 1, batch=args.batch)
    m = base.model
    print(f"minipar bench train: GPT {m.num_params():,} parameters, batch {base.batch} x {m.seq_len} tokens, "
          f"{args.steps} timed steps after one warm-up; under mpiexec, one BLAS thread per rank", flush=True)
    out = launch(1, "minipar.bench.train:bench_rank", quiet=True, job_timeout=3600.0, cfg=base, steps=args.steps, baseline=True,
                 rate=True)
    b = out.results[0]
    rate, cores = b["matmul_flops"], os.cpu_count() or 1
    flops = model_flops(base)
    tokens = base.batch * m.seq_len
    rows = [{"grid": "one process (no communicator)", "ranks": 1, "tokens_per_s": tokens / b["step_s"],
             "step_s": b["step_s"], "speedup": 1.0, "mfu": flops / b["step_s"] / rate,
             "faults_per_step": b["faults_per_step"]}]
    print(f"matmul rate {rate / 1e9:.2f} GFLOP/s per thread, {cores} cores; model {flops / 1e9:.2f} GFLOP per step")
    print(f"{'grid':<34}{'ranks':>6}{'tokens/s':>11}{'step ms':>10}{'vs 1 process':>14}{'MFU':>8}{'faults/step':>13}")
    show = lambda r: print(f"{r['grid']:<34}{r['ranks']:>6}{r['tokens_per_s']:>11.0f}{r['step_s'] * 1e3:>10.1f}"  # noqa: E731
                           f"{r['speedup']:>13.2f}x{r['mfu'] * 100:>7.1f}%{r['faults_per_step']:>13.0f}", flush=True)
    show(rows[0])
    for dp, pp, tp in progress(GRIDS, desc="grids", total=len(GRIDS), unit="grid"):
        n = dp * pp * tp
        cfg = train_config(dp, pp, tp, batch=args.batch, schedule=args.schedule)
        mb = cfg.microbatches
        check_shapes(cfg, n)
        res = launch(n, "minipar.bench.train:bench_rank", quiet=True, job_timeout=3600.0, cfg=cfg, steps=args.steps)
        s = res.results[0]["step_s"]
        r = {"grid": f"dp{dp} pp{pp} tp{tp}" + (f" ({args.schedule} m={mb})" if pp > 1 else ""), "ranks": n,
             "tokens_per_s": tokens / s, "step_s": s, "speedup": b["step_s"] / s,
             "mfu": flops / s / (rate * min(n, cores)), "faults_per_step": res.results[0]["faults_per_step"]}
        rows.append(r)
        show(r)
    targets = target_ratios(base, args.steps, getattr(args, "rounds", 3), args.batch)
    recompute = recompute_table(base, args.steps)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="minipar-bench-") as directory:
        gen = launch(4, "minipar.lessons.train:check_generation", quiet=True, job_timeout=3600.0,
                     directory=directory, n_new=24, model=m.as_dict(), batch=1)
    decode = gen.results[0][-1]["times"]
    print("\ngreedy decoding, batch 1, KV cache: " + ", ".join(f"TP={k}: {v * 1e3:.2f} ms/token" for k, v in decode.items()))
    if args.json:
        write_json(args.json, {"model": m.as_dict(), "batch": base.batch, "steps": args.steps, "matmul_flops": rate,
                               "cores": cores, "rows": rows, "targets": targets, "recompute": recompute,
                               "decode_s_per_token": decode})
    return 0
