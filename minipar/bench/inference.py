"""``minipar bench inference``: decoding measured where it is memory-bound, beside the roofline.

    minipar bench inference --json docs/inference.json          # a few minutes on 2 cores
    minipar bench inference --quick                              # seconds: two small widths

One run measures, on this machine, one BLAS thread per rank:

- the machine: ``plan.machine.measure`` on 1 rank and on 2 ranks at once (matmul rate, a
  STREAM-like ``c = a + b`` over arrays far larger than the last-level cache, ping-pong alpha
  and beta): the bandwidth one process gets alone, and each of two reading together; beside
  it the read probe below, on 1 and 2 ranks at once;
- lesson 05's greedy generation with a KV cache (``train.generate``) of a random GPT of width
  d (8 layers, 8 heads, float64) at TP = 1 and 2, each in its own job: the prompt's prefill,
  then seconds per new token (the median over the tokens of the slowest rank's; its CPU seconds
  beside), the weight bytes each rank holds (counted from its arrays) and reads per token, and
  the weight-read bandwidth that implies;
- around each token loop, just before and just after it, the **read probe** (``read_rate``): every
  rank of the job at once multiplies a vector by a 512 MB matrix, ``x @ w``, the vector-matrix
  product a decode step runs at batch 1, and the slowest rank's bytes per second count. It is the
  prediction's bandwidth (the harmonic mean of the two: the mean of the two predicted times).
  Why not STREAM: this machine's bandwidth drifts from job to job (a virtual machine), so the
  bandwidth must be taken in the same job; and one core's bandwidth depends on what it reads
  (the misses it keeps in flight): STREAM's c = a + b reads two arrays and writes a third, a
  decode step only reads, row after row of a matrix. STREAM stays in the machine table, and each row
  keeps the prediction from it (``predicted_stream_token_s``) to show what ignoring the probe costs;
- the batch: decode steps of B sequences at TP = 1 on one DRAM-bound width, and a prefill of
  T prompt tokens: where a step stops costing the same whatever B (memory-bound) and grows
  with B (compute-bound), against the roofline's B* = matmul rate / bandwidth x 8 / 2 (the
  bandwidth: the job's read probe, before and after its steps); beside
  it, the products a batched step could run (``products``): (B, 1, d) @ w as the lesson's
  layers run it, (B, d) @ w, and B matrix-vector products, on the probe's matrix.

Each (width, TP) job runs twice, the rounds interleaved, and the faster is kept. Every row carries
``plan.inference``'s prediction from the measured machine, plus the per-token overhead of its TP
(``with_overhead``: Python's and NumPy's cost per operation, measured on the smallest width, whose
weights sit in the cache). The record is what
``minipar.figures.inference`` draws and docs/inference.md quotes. Timings taken on a machine
shared with other jobs come out slow and noisy: the record keeps the load average.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..records import write_json

WIDTHS = (64, 256, 512, 1024)  # 8 layers: 3 MB, 50 MB, 200 MB, 800 MB of float64 weights
QUICK_WIDTHS = (64, 256)
LAYERS, HEADS, VOCAB = 8, 8, 64
BATCHES = (1, 2, 4, 8, 16, 32, 64)
QUICK_BATCHES = (1, 4)
STREAM_BYTES = 256 << 20  # per array: 3 x 256 MB, well past the 300 MB last-level cache of this machine
PROBE_BYTES = 512 << 20  # the read probe's matrix: one 512 MB array, past the last-level cache as the weights are
PROBE_ROWS = 1024  # its shape (1024, 65536): x (1024,) @ w, a d = 1024 layer's product, wider
PROBE_REPS = 5  # reads per probe, their median kept
PRODUCT_BATCHES = (1, 2, 4, 8, 16)


def gpt_config(d, seq_len=64):
    from ..train.model import GPTConfig

    return GPTConfig(vocab=VOCAB, d_model=d, n_heads=HEADS, n_layers=LAYERS, seq_len=seq_len)


def build(comm, cfg, seed=0):
    """Lesson 05's GPT on the TP group ``comm``, random weights (the dense model dropped once sliced)."""
    from ..train.model import GPT, build_stage

    dense = GPT(cfg, seed)
    model = build_stage(comm, dense, 0, 1)
    del dense
    return model


def held_bytes(model) -> int:
    """Bytes of the parameters this rank holds, counted from its arrays."""
    return int(sum(p.nbytes for _, p in model.named_parameters()))


def _slowest(comm, x):
    return max(comm.builtin.allgather_object(float(x)))


def probe_matrix(nbytes=PROBE_BYTES, xp=np):
    """The read probe's (PROBE_ROWS, n) matrix of ``nbytes`` (every page written: a page never
    written would be read from the kernel's one zero page, in cache) and its vector."""
    return xp.full((PROBE_ROWS, nbytes // 8 // PROBE_ROWS), 0.5), xp.ones(PROBE_ROWS)


def read_rate(w, x, reps=PROBE_REPS):
    """(wall, CPU) bytes per second of ``x @ w`` (w read once, x stays in cache), the median of
    ``reps`` by each clock: the rate a decode step at batch 1 reads its weights at. The median,
    as a token's time is the median of its tokens: this machine's bandwidth moves by a third
    from one second to the next, and a best-of-n would divide by its luckiest moment (every
    prediction low)."""
    x @ w  # warm-up
    walls, cpus = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        x @ w
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return w.nbytes / float(np.median(walls)), w.nbytes / float(np.median(cpus))


def probe(comm, w, x):
    """Every rank of ``comm`` runs ``read_rate`` at once: the slowest rank's (wall, CPU) rates."""
    comm.barrier()
    wall, cpu = read_rate(w, x)
    rates = comm.builtin.allgather_object((wall, cpu))
    return min(r[0] for r in rates), min(r[1] for r in rates)


def probe_rank(comm, probe_bytes=PROBE_BYTES):
    """Rank side: ``probe`` alone, every rank at once (the machine table's read rate beside STREAM)."""
    return probe(comm, *probe_matrix(probe_bytes))


def decode_rank(comm, d, prompt=4, n_new=12, batch=1, seed=0, probe_bytes=PROBE_BYTES):
    """Rank side: prefill seconds, seconds per new token (slowest rank) and bytes held, at width d;
    the read probe of every rank at once just before and just after the token loop (no probe
    with ``probe_bytes`` = 0)."""
    from ..train.generate import forward_cached, generate, greedy_token

    cfg = gpt_config(d, seq_len=prompt + n_new + 1)
    model = build(comm, cfg, seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab, (batch, prompt))
    lo = model.head.owner().vocab_start
    comm.barrier()
    t0 = time.perf_counter()
    logits = forward_cached(model, comm.asarray(ids), {}, 0)
    greedy_token(comm, logits[:, -1, :], lo)
    pre = time.perf_counter() - t0
    w, x = probe_matrix(probe_bytes) if probe_bytes else (None, None)
    before = probe(comm, w, x) if probe_bytes else (None, None)
    times = []
    out, per_token = generate(comm, model, ids, n_new, times=times)
    after = probe(comm, w, x) if probe_bytes else (None, None)
    wall = np.max(comm.builtin.allgather_object([t for t, _ in times]), axis=0)  # (n_new - 1,) slowest rank's
    cpu = np.max(comm.builtin.allgather_object([c for _, c in times]), axis=0)
    return {"d": d, "tp": comm.size, "batch": batch, "prompt": prompt, "n_new": n_new,
            "prefill_s": _slowest(comm, pre), "token_s": float(np.median(wall)), "token_mean_s": _slowest(comm, per_token),
            "token_best_s": float(wall.min()), "token_cpu_s": float(np.median(cpu)),
            "held_bytes": held_bytes(model), "tokens": out.tolist()[0][-3:],
            "probe_before": before[0], "probe_after": after[0], "probe_cpu_before": before[1], "probe_cpu_after": after[1]}


def probe_bandwidth(r, clock="wall"):
    """The bandwidth a row's prediction uses: the harmonic mean of its job's probes before and
    after the token loop (so the predicted time is the mean of the two), by ``clock``."""
    key = "probe" if clock == "wall" else "probe_cpu"
    return 2 / (1 / r[f"{key}_before"] + 1 / r[f"{key}_after"])


def products(w, batches=PRODUCT_BATCHES, reps=2):
    """Seconds (best of ``reps``) of the products a decode step of B sequences could run on the
    weight ``w`` (d, n), for each B: {"stacked": (B, 1, d) @ w, as the lesson's layers get it
    (NumPy's matmul loops over the stack), "rows": (B, d) @ w (one matrix-matrix product),
    "matvecs": B separate (d,) @ w}."""
    rng = np.random.default_rng(0)

    def best(f):
        f()
        out = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            f()
            out = min(out, time.perf_counter() - t)
        return out

    out = {"stacked": {}, "rows": {}, "matvecs": {}, "bytes": w.nbytes}
    for b in batches:
        x = rng.standard_normal((b, 1, w.shape[0]))  # (B, 1, d)
        out["stacked"][b] = best(lambda: x @ w)
        out["rows"][b] = best(lambda: x[:, 0] @ w)  # (B, d) @ (d, n)
        out["matvecs"][b] = best(lambda: [x[i, 0] @ w for i in range(b)])
    return out


def batch_rank(comm, d, batches, prompt=4, n_new=5, prefill_tokens=(16, 64), seed=0, probe_bytes=PROBE_BYTES,
               product_batches=PRODUCT_BATCHES):
    """Rank side (1 rank): a decode step of B sequences for each B, a prefill of T tokens for each T
    (median wall and CPU seconds), the read probe before and after them, this rank's matmul rate
    by the CPU clock (the roofline of the CPU-clock view), and ``products`` on the probe's matrix."""
    from ..plan.machine import matmul_rate
    from ..train.generate import forward_cached, generate

    w, x = probe_matrix(probe_bytes)
    before = read_rate(w, x)
    cfg = gpt_config(d, seq_len=max(prompt + n_new + 1, *prefill_tokens))
    model = build(comm, cfg, seed)
    rng = np.random.default_rng(seed)
    steps, steps_cpu = {}, {}
    for b in batches:
        times = []
        generate(comm, model, rng.integers(0, cfg.vocab, (b, prompt)), n_new, times=times)
        steps[b], steps_cpu[b] = (float(np.median([t[i] for t in times])) for i in (0, 1))
    pre, pre_cpu = {}, {}
    for t in prefill_tokens:
        ids = comm.asarray(rng.integers(0, cfg.vocab, (1, t)))
        forward_cached(model, ids, {}, 0)  # warm-up
        tw, tc = time.perf_counter(), time.process_time()
        forward_cached(model, ids, {}, 0)
        pre[t], pre_cpu[t] = time.perf_counter() - tw, time.process_time() - tc
    after = read_rate(w, x)
    r = {"probe_before": before[0], "probe_after": after[0], "probe_cpu_before": before[1], "probe_cpu_after": after[1]}
    cpu_clock = {"peak_flops": matmul_rate(1024, "float64", 5, time.process_time), "bandwidth": probe_bandwidth(r, "cpu")}
    return dict(r, d=d, step_s=steps, step_cpu_s=steps_cpu, prefill_s=pre, prefill_cpu_s=pre_cpu, cpu_clock=cpu_clock,
                products=products(w, product_batches))


def machine(n):
    """``plan.machine.measure`` on ``n`` ranks reading at once (far past the caches)."""
    from ..launcher import launch
    from ..plan.machine import measure

    return launch(n, measure, quiet=True, stream_bytes=STREAM_BYTES).results[0]


def hardware(one, two):
    """The planner's view of this machine from the two measurements: matmul rate of one rank,
    memory bandwidth per rank (alone: ``one``; two reading: ``two``), ping-pong alpha and beta."""
    from ..comm.link import Link
    from ..plan.hardware import Hardware

    lk = Link("shared memory", two["alpha"], 1.0 / max(two["beta"], 1e-30), "ping-pong (minipar bench inference)")
    return Hardware("this machine, measured now", peak_flops=one["matmul_flops"]["float64"],
                    memory_bytes=one["memory_bytes"], hbm_bandwidth=one["memory_bandwidth"], gpus_per_node=one["cores"],
                    intra=lk, inter=lk, host=lk, host_bandwidth=one["memory_bandwidth"], matmul_fraction=1.0,
                    link_fraction=1.0, cores=one["cores"], dtype_bytes=8, mixed_precision=False)


def predict_row(r, hw, stream):
    """``plan.inference``'s decode step and prefill for a measured row, on the bandwidth its own
    job's read probe measured around the token loop (``probe_bandwidth``, by each clock); and, to
    show what ignoring the probe costs, on ``stream``, the machine table's STREAM rate per rank."""
    from ..plan.inference import decode_step, prefill, weight_bytes
    from ..plan.models import minipar_gpt

    m = minipar_gpt(gpt_config(r["d"], r["prompt"] + r["n_new"] + 1))
    ctx = r["prompt"] + r["n_new"] // 2  # the middle of the generation
    bw, bw_cpu = probe_bandwidth(r), probe_bandwidth(r, "cpu")
    st = decode_step(m, hw, r["tp"], r["batch"], ctx, bandwidth=bw)
    read = weight_bytes(m, r["tp"], 8)
    return dict(r, probe_bandwidth=bw, probe_cpu_bandwidth=bw_cpu, stream_bandwidth=stream,
                predicted_token_s=st.seconds, predicted_memory_s=st.memory_s, predicted_compute_s=st.compute_s,
                predicted_comm_s=st.comm_s, bound=st.bound,
                predicted_cpu_token_s=decode_step(m, hw, r["tp"], r["batch"], ctx, bandwidth=bw_cpu).seconds,
                predicted_stream_token_s=decode_step(m, hw, r["tp"], r["batch"], ctx, bandwidth=stream).seconds,
                read_bytes=read, formula_held_bytes=read + m.seq * m.hidden * 8, achieved_bandwidth=read / r["token_s"],
                predicted_prefill_s=prefill(m, hw, r["tp"], r["batch"], r["prompt"], bandwidth=bw).seconds)


PREDICTED = ("predicted_token_s", "predicted_cpu_token_s", "predicted_stream_token_s")


def with_overhead(rows):
    """Each row's predictions plus the per-token overhead of its TP: the work of a decode step that
    neither reads weights nor moves bytes (Python's and NumPy's cost per operation, the same at
    every width), measured on the smallest width, whose weights sit in the cache: that row's
    measured time minus its roofline prediction. That row is the overhead's source, not a check of
    it (``overhead_source``); every other row at the same TP is predicted as roofline + overhead.
    The roofline alone stays in ``roofline_token_s`` (a GPU's kernels cost microseconds, not the
    milliseconds Python spends here, and the planner's GPU presets add none)."""
    small = {}
    for r in rows:
        if r["tp"] not in small or r["d"] < small[r["tp"]]["d"]:
            small[r["tp"]] = r
    over = {t: max(0.0, r["token_s"] - r["predicted_token_s"]) for t, r in small.items()}
    over_cpu = {t: max(0.0, r["token_cpu_s"] - r["predicted_cpu_token_s"]) for t, r in small.items()}
    out = []
    for r in rows:
        t = r["tp"]
        r = dict(r, roofline_token_s=r["predicted_token_s"], overhead_s=over[t], overhead_cpu_s=over_cpu[t],
                 overhead_source=r["d"] == small[t]["d"])
        for k in PREDICTED:
            r[k] += over_cpu[t] if k == "predicted_cpu_token_s" else over[t]
        out.append(r)
    return out


def collect(widths=WIDTHS, tps=(1, 2), batches=BATCHES, batch_width=None, n_new=16, rounds=2,
            progress=lambda xs, **_: xs):
    """Every measurement and prediction: {"machine", "rows", "batch", ...} (see the module docstring)."""
    from ..launcher import launch
    from ..plan.inference import critical_batch, decode_step, prefill, with_bandwidth
    from ..plan.models import minipar_gpt

    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    one, two = machine(1), machine(2)
    reads = {n: launch(n, probe_rank, quiet=True).results[0] for n in (1, 2)}  # (wall, CPU) bytes/s per rank
    hw = hardware(one, two)
    per_rank = {1: one["memory_bandwidth"], 2: two["memory_bandwidth"], 4: two["memory_bandwidth"] / 2}
    print(f"this machine: matmul {hw.peak_flops / 1e9:.2f} GFLOP/s float64 per rank; STREAM {one['memory_bandwidth'] / 1e9:.2f} "
          f"GB/s alone, {two['memory_bandwidth'] / 1e9:.2f} GB/s per rank with 2 reading ({2 * two['memory_bandwidth'] / 1e9:.2f} "
          f"together); read probe {reads[1][0] / 1e9:.2f} GB/s alone, {reads[2][0] / 1e9:.2f} per rank with 2 reading; "
          f"alpha {two['alpha'] * 1e6:.1f} us", flush=True)
    best = {}
    jobs = [(d, t) for _ in range(rounds) for d in widths for t in tps]  # rounds interleaved: the best of each kept
    print("each job as it ends (the roofline alone: the per-token overhead, measured on the smallest width, "
          "is added once every job has run, below)", flush=True)
    print(f"{'d':>6}{'TP':>4}{'MB/rank':>10}{'ms/token':>10}{'CPU ms':>8}{'roofline':>11}{'roof/meas':>10}"
          f"{'GB/s read':>11}{'probe before, after':>21}{'STREAM':>8}", flush=True)
    for d, t in progress(jobs, desc="widths x TP", total=len(jobs), unit="job"):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        r = launch(t, decode_rank, quiet=True, job_timeout=900.0, d=d, n_new=n_new).results[0]
        r = predict_row(dict(r, load_average=load), hw, per_rank[t])
        if (d, t) not in best or r["token_s"] < best[d, t]["token_s"]:
            best[d, t] = r
        print(f"{d:>6}{t:>4}{r['held_bytes'] / 1e6:>10.1f}{r['token_s'] * 1e3:>10.2f}{r['token_cpu_s'] * 1e3:>8.2f}"
              f"{r['predicted_token_s'] * 1e3:>11.2f}{r['predicted_token_s'] / r['token_s']:>10.2f}"
              f"{r['achieved_bandwidth'] / 1e9:>11.2f}{r['probe_before'] / 1e9:>14.2f}, {r['probe_after'] / 1e9:>5.2f}"
              f"{r['stream_bandwidth'] / 1e9:>8.2f}", flush=True)
    rows = with_overhead([best[k] for k in sorted(best)])
    for r in rows:
        print(f"d = {r['d']:>4}, TP = {r['tp']}: {r['token_s'] * 1e3:.2f} ms per token, predicted {r['predicted_token_s'] * 1e3:.2f} "
              f"(roofline {r['roofline_token_s'] * 1e3:.2f} + per-token overhead {r['overhead_s'] * 1e3:.2f}"
              f"{', measured here' if r['overhead_source'] else ''})", flush=True)
    bw = batch_width or max(widths)
    b = launch(1, batch_rank, quiet=True, job_timeout=900.0, d=bw, batches=tuple(batches),
               product_batches=tuple(k for k in batches if k <= max(PRODUCT_BATCHES))).results[0]
    m = minipar_gpt(gpt_config(bw, 64))
    probed = with_bandwidth(hw, probe_bandwidth(b))  # the wall-clock view, on the job's own probe
    b["predicted_step_s"] = {k: decode_step(m, probed, 1, k, 6).seconds for k in b["step_s"]}
    b["predicted_prefill_s"] = {k: prefill(m, probed, 1, 1, k).seconds for k in b["prefill_s"]}
    b["critical_batch"] = critical_batch(probed, 8)
    cpu_hw = with_bandwidth(hw, b["cpu_clock"]["bandwidth"], b["cpu_clock"]["peak_flops"])  # the CPU-clock view
    b["predicted_step_cpu_s"] = {k: decode_step(m, cpu_hw, 1, k, 6).seconds for k in b["step_s"]}
    b["predicted_prefill_cpu_s"] = {k: prefill(m, cpu_hw, 1, 1, k).seconds for k in b["prefill_s"]}
    b["critical_batch_cpu"] = critical_batch(cpu_hw, 8)
    print(f"batch at d = {bw}, TP = 1: " + ", ".join(f"B={k}: {v * 1e3:.1f} ms" for k, v in b["step_s"].items())
          + f"; roofline B* = {b['critical_batch']:.1f}", flush=True)
    pr = b["products"]
    print(f"products on a {pr['bytes'] / 1e6:.0f} MB matrix, ms: " + "; ".join(
        f"B={k}: (B,1,d)@w {pr['stacked'][k] * 1e3:.1f}, (B,d)@w {pr['rows'][k] * 1e3:.1f}, "
        f"B matvecs {pr['matvecs'][k] * 1e3:.1f}" for k in pr["stacked"]), flush=True)
    print("prefill: " + ", ".join(f"T={k}: {v * 1e3:.1f} ms ({k / v:.0f} tokens/s)" for k, v in b["prefill_s"].items()))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"machine": {"one": one, "two": two, "probe": {str(n): {"wall": w, "cpu": c} for n, (w, c) in reads.items()}},
            "hardware": {"peak_flops": hw.peak_flops, "alpha": hw.intra.alpha,
            "bandwidth_per_rank": {str(k): v for k, v in per_rank.items()}}, "rows": rows, "batch": b,
            "layers": LAYERS, "heads": HEADS, "vocab": VOCAB, "load_average": load, "load_average_start": load0, "cores": os.cpu_count(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S")}


def run(args, progress=lambda xs, **_: xs) -> int:
    """``minipar bench inference``."""
    quick = args.quick
    tps = tuple(args.tp)
    print(f"minipar bench inference: lesson 05's GPT ({LAYERS} layers, {HEADS} heads, float64) decoding at "
          f"TP = {', '.join(map(str, tps))}; one BLAS thread per rank" + (" (--quick)" if quick else ""), flush=True)
    if 4 in tps:
        print("note: TP = 4 runs 4 ranks on this machine's cores: oversubscribed where there are fewer than 4", flush=True)
    rec = collect(QUICK_WIDTHS if quick else WIDTHS, tps, QUICK_BATCHES if quick else BATCHES,
                  n_new=4 if quick else 16, rounds=1 if quick else 2, progress=progress)
    rec["command"] = "minipar bench inference" + (" --quick" if quick else "") + (f" --tp {' '.join(map(str, tps))}")
    print("\n" + markdown(rec), flush=True)  # the tables docs/inference.md quotes
    if args.json:
        write_json(args.json, rec)
    return 0


def markdown(rec) -> str:
    """The record's tables as docs/inference.md shows them: decode per width and TP, then the batch
    and the products beside it."""
    mc = rec["machine"]
    out = ["| ranks reading at once | STREAM c = a + b, GB/s per rank | read probe x @ w, GB/s per rank (wall) | (CPU clock) |",
           "|---:|---:|---:|---:|"]
    for n, key in (("1", "one"), ("2", "two")):
        out.append(f"| {n} | {mc[key]['memory_bandwidth'] / 1e9:.2f} | {mc['probe'][n]['wall'] / 1e9:.2f} | "
                   f"{mc['probe'][n]['cpu'] / 1e9:.2f} |")
    out += ["", "| d | weights per rank | TP | load | ms per token | predicted | error | weight GB/s read per rank "
           "| probe GB/s per rank, before / after | predicted from STREAM (GB/s) | error | CPU ms per token "
           "| predicted from the CPU-clock probe | error | prefill ms (4 tokens) | roofline ms + overhead ms |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rec["rows"], key=lambda r: (r["d"], r["tp"])):
        p, s, c = r["predicted_token_s"], r["predicted_stream_token_s"], r["predicted_cpu_token_s"]
        src = " (the overhead's source)" if r.get("overhead_source") else ""
        error = "n/a" if src else f"{p / r['token_s'] - 1:+.0%}"
        out.append(f"| {r['d']} | {r['held_bytes'] / 1e6:.1f} MB | {r['tp']} | {r['load_average']:.1f} | {r['token_s'] * 1e3:.2f} | "
                   f"{p * 1e3:.2f} | {error} | {r['achieved_bandwidth'] / 1e9:.2f} | "
                   f"{r['probe_before'] / 1e9:.2f} / {r['probe_after'] / 1e9:.2f} | {s * 1e3:.2f} ({r['stream_bandwidth'] / 1e9:.2f}) | "
                   f"{s / r['token_s'] - 1:+.0%} | {r['token_cpu_s'] * 1e3:.2f} | {c * 1e3:.2f} | {c / r['token_cpu_s'] - 1:+.0%} | "
                   f"{r['prefill_s'] * 1e3:.1f} | {r.get('roofline_token_s', p) * 1e3:.2f} + {r.get('overhead_s', 0) * 1e3:.2f}{src} |")
    b = rec["batch"]
    out += ["", f"Batch at d = {b['d']}, TP = 1 (read probe {b['probe_before'] / 1e9:.2f} GB/s before, "
            f"{b['probe_after'] / 1e9:.2f} after; roofline B* = {b['critical_batch']:.1f} by the wall clock, "
            f"{b['critical_batch_cpu']:.1f} by the CPU clock):", "",
            "| B | ms per decode step | predicted | CPU ms per step | predicted (CPU clock) | CPU ms per generated token |",
            "|---:|---:|---:|---:|---:|---:|"]
    for k, s in sorted(b["step_s"].items(), key=lambda kv: int(kv[0])):
        c = b["step_cpu_s"][k]
        out.append(f"| {k} | {s * 1e3:.1f} | {b['predicted_step_s'][k] * 1e3:.1f} | {c * 1e3:.1f} | "
                   f"{b['predicted_step_cpu_s'][k] * 1e3:.1f} | {c * 1e3 / int(k):.2f} |")
    pr = b["products"]
    out += ["", f"The products on the probe's {pr['bytes'] / 1e6:.0f} MB matrix w (d = {PROBE_ROWS} rows), one BLAS thread:", "",
            "| B | (B, 1, d) @ w ms (as the layers run it) | B matrix-vector products, ms | (B, d) @ w ms | (B, d) @ w: GB/s of w read |",
            "|---:|---:|---:|---:|---:|"]
    for k in sorted(pr["stacked"], key=int):
        out.append(f"| {k} | {pr['stacked'][k] * 1e3:.1f} | {pr['matvecs'][k] * 1e3:.1f} | {pr['rows'][k] * 1e3:.1f} | "
                   f"{pr['bytes'] / pr['rows'][k] / 1e9:.1f} |")
    out += ["", "| prefill T tokens | ms | predicted | CPU ms | predicted (CPU clock) | tokens per CPU second |",
            "|---:|---:|---:|---:|---:|---:|"]
    for k, s in sorted(b["prefill_s"].items(), key=lambda kv: int(kv[0])):
        c = b["prefill_cpu_s"][k]
        out.append(f"| {k} | {s * 1e3:.1f} | {b['predicted_prefill_s'][k] * 1e3:.1f} | {c * 1e3:.1f} | "
                   f"{b['predicted_prefill_cpu_s'][k] * 1e3:.1f} | {int(k) / c:.0f} |")
    return "\n".join(out)
