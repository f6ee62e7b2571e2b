"""The planner against published training runs: every row, the prediction, the error.

    minipar bench published                      # the markdown tables of docs/planner_validation.md
    minipar bench published --only 0 1           # some rows

Each row fixes what its source states (model, GPUs, tp, pp, dp, batch, recomputation, and the
micro-batch or interleaving when stated) and lets the planner search the rest. Predictions use the
presets as they are: one calibration per preset, no per-row adjustment.

Sources (the numbers transcribed from the papers' tables):
- N21-T1: Narayanan et al. 2021 (arXiv:2104.04473), Table 1, weak scaling on Selene (A100 80GB,
  8 per node, 8 x HDR InfiniBand), full activation recomputation, TFLOP/s per GPU counting
  the recomputed forward (their eq. 3).
- N21-T2: the same paper, Table 2: PTD-P against ZeRO-3 (DeepSpeed, no model parallelism) for
  GPT-3 175B and the 530B model, micro-batch sizes given.
- K22-T5: Korthikanti et al. 2022 (arXiv:2205.05198), Table 5: seconds per iteration with full
  recomputation and with sequence parallelism + selective recomputation (Table 3's
  configurations: dp = 1, interleaving 3 for 175B and 530B).
- BLOOM: BigScience tr11-176B-ml chronicles (2022-03-18): 384 A100 80GB, tp 4, pp 12, dp 8,
  micro-batch 2, global batch 2048, ZeRO-1, 149-150 TFLOP/s per GPU, ~105 s per iteration.
  Its nodes had 4 x 100 Gb/s Omni-Path, not 8 x HDR: the preset's network is faster (the
  data-parallel traffic it carries is ~1% of the step either way).
- Llama3-T4: Llama Team 2024, *The Llama 3 Herd of Models* (arXiv:2407.21783), Table 4: Llama 3
  405B on 8192 and 16384 H100s, tp 8, pp 16, 8192-token sequences, 2048 per step, bf16 with fp32
  gradients: 430 and 400 TFLOP/s per GPU.
"""
from __future__ import annotations

import time
from dataclasses import replace

from ..memory import Precision
from .config import Config, Configs, Problem
from .hardware import preset
from .memory import layer_activations
from .models import executed_flops, layer_flops, model
from .search import consistency, search
from .timing import stage_times

ROWS = [
    # source, model, gpus, fixed choices, global batch, metric, published
    *[("N21-T1", name, g, dict(tp=t, pp=p, cp=1, recompute="full", zero=0, sequence_parallel=False), b, "tflops", pub)
      for name, t, p, g, b, pub in [
          ("megatron-1.7b", 1, 1, 32, 512, 137), ("megatron-3.6b", 2, 1, 64, 512, 138),
          ("megatron-7.5b", 4, 1, 128, 512, 142), ("megatron-18b", 8, 1, 256, 1024, 135),
          ("megatron-39b", 8, 2, 512, 1536, 138), ("megatron-76b", 8, 4, 1024, 1792, 140),
          ("megatron-145b", 8, 8, 1536, 2304, 148), ("megatron-310b", 8, 16, 1920, 2160, 155),
          ("megatron-530b", 8, 35, 2520, 2520, 163), ("megatron-1t", 8, 64, 3072, 3072, 163)]],
    *[("N21-T2 PTD-P", name, g, dict(tp=8, pp=p, cp=1, microbatch=1, recompute="full", zero=0, sequence_parallel=False), b,
       "tflops", pub)
      for name, p, b, g, pub in [("gpt3-175b", 12, 1536, 384, 153), ("gpt3-175b", 12, 1536, 768, 149),
                                 ("gpt3-175b", 12, 1536, 1536, 141), ("megatron-530b", 35, 2240, 560, 171),
                                 ("megatron-530b", 35, 2240, 1120, 167), ("megatron-530b", 35, 2240, 2240, 159)]],
    *[("N21-T2 ZeRO-3", name, g, dict(tp=t, pp=1, cp=1, zero=3, microbatch=mb, recompute="full", sequence_parallel=False), b, "tflops", pub)
      for name, t, b, g, mb, pub in [("gpt3-175b", 1, 1536, 384, 4, 144), ("gpt3-175b", 2, 1536, 768, 2, 88),
                                     ("gpt3-175b", 1, 1536, 1536, 1, 44), ("megatron-530b", 1, 2560, 640, 4, 138),
                                     ("megatron-530b", 2, 2240, 1120, 2, 98), ("megatron-530b", 1, 2240, 2240, 1, 48)]],
    *[("K22-T5 " + label, name, g, dict(tp=8, pp=p, dp=1, cp=1, microbatch=mb, recompute=rec, sequence_parallel=sp,
                                         **({"schedule": "interleaved", "chunks": v} if v > 1 else {})),
       b, "seconds", pub)
      for name, p, g, b, mb, v, full, sel in [("megatron-22b", 1, 8, 4, 4, 1, 1.42, 1.10),
                                              ("gpt3-175b", 8, 64, 64, 1, 3, 18.13, 13.75),
                                              ("megatron-530b", 35, 280, 280, 1, 3, 49.05, 37.83),
                                              ("megatron-1t", 64, 512, 512, 1, 1, 94.42, 71.49)]
      for label, rec, sp, pub in (("full recompute", "full", False, full), ("SP + selective", "selective", True, sel))],
    ("BLOOM", "bloom-176b", 384, dict(tp=4, pp=12, dp=8, cp=1, microbatch=2, schedule="1f1b", zero=1, recompute="full",
                                      sequence_parallel=False), 2048, "tflops", 150),
    # H100: Llama 3 405B pre-training (Llama Team 2024, Table 4), 8192-token sequences, 16M tokens per step
    *[("Llama3-T4", "llama3-405b", g, dict(tp=8, pp=16, dp=d, cp=1, zero=1), 2048, "tflops", pub)
      for g, d, pub in [(8192, 64, 430), (16384, 128, 400)]],
]


# What the sources state beside the number a row is checked on, as printed (the digits give the
# rounding): the model's size in billions, N21 Table 1's aggregate PFLOP/s and share of the 312
# TFLOP/s peak, BLOOM's seconds per iteration. ``row_problems`` checks that they add up.
STATED = {
    **{("N21-T1", name): dict(params=p, pflops=agg, peak_percent=pct) for name, p, agg, pct in [
        ("megatron-1.7b", "1.7", "4.4", "44"), ("megatron-3.6b", "3.6", "8.8", "44"),
        ("megatron-7.5b", "7.5", "18.2", "46"), ("megatron-18b", "18.4", "34.6", "43"),
        ("megatron-39b", "39.1", "70.8", "44"), ("megatron-76b", "76.1", "143.8", "45"),
        ("megatron-145b", "145.6", "227.1", "47"), ("megatron-310b", "310.1", "297.4", "50"),
        ("megatron-530b", "529.6", "410.2", "52"), ("megatron-1t", "1008.0", "502.0", "52")]},
    **{(src, name): dict(params=p) for src in ("N21-T2 PTD-P", "N21-T2 ZeRO-3")
       for name, p in (("gpt3-175b", "175"), ("megatron-530b", "530"))},
    ("BLOOM", "bloom-176b"): dict(params="176", seconds="105"),
}
PEAK = 312e12  # A100 dense BF16, the peak N21 Table 1's percentages are of


def _half_unit(text: str) -> float:
    """Half the last printed digit's unit: "4.4" -> 0.05, "44" -> 0.5."""
    return 0.5 * 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)


def row_problems(row) -> list[str]:
    """Every way a row's numbers disagree, one line each (empty: they add up): its layout with its
    GPUs and batch (``search.consistency``, what ``minipar plan`` checks), the stated model size
    against the shape's parameter count, and the redundant figures (aggregate = per GPU x GPUs,
    share of peak, FLOPs per step / seconds) within the rounding of the digits printed."""
    src, name, gpus, fixed, batch, metric, pub = row
    out = []
    bad = consistency(gpus, batch, fixed)
    if bad:
        out.append(f"{src} {name}: {bad}")
    stated = STATED.get((src, name), {})
    pub_s, tol = f"{pub:g}", _half_unit(f"{pub:g}")
    m = model(name)
    if "params" in stated and abs(m.params() / 1e9 - float(stated["params"])) > _half_unit(stated["params"]):
        out.append(f"{src} {name}: the shape has {m.params() / 1e9:.4g}e9 parameters, the source states {stated['params']}e9")
    if "pflops" in stated:
        lo, hi = (pub - tol) * gpus / 1e3, (pub + tol) * gpus / 1e3
        agg, h = float(stated["pflops"]), _half_unit(stated["pflops"])
        if hi < agg - h or lo > agg + h:
            out.append(f"{src} {name}: {pub_s} TFLOP/s x {gpus} GPUs = {pub * gpus / 1e3:.1f} PFLOP/s, "
                       f"the source states {stated['pflops']}")
    if "peak_percent" in stated:
        pct, h = float(stated["peak_percent"]), _half_unit(stated["peak_percent"])
        if abs(pub / PEAK * 1e14 - pct) > tol / PEAK * 1e14 + h:
            out.append(f"{src} {name}: {pub_s} TFLOP/s is {pub / PEAK * 1e14:.1f}% of 312, the source states {pct:g}%")
    if "seconds" in stated:
        recompute = fixed.get("recompute", "none")
        sec, h = float(stated["seconds"]), _half_unit(stated["seconds"])
        tflops = executed_flops(m, batch, recompute) / gpus / 1e12
        if not (tflops / (sec + h) <= pub + tol and tflops / (sec - h) >= pub - tol):
            out.append(f"{src} {name}: {tflops * gpus:.4g} TFLOP per step / {gpus} GPUs / {stated['seconds']} s = "
                       f"{tflops / sec:.1f} TFLOP/s, the source states {pub_s}")
    return out


def calibrate_matmul_fraction(hw_name: str = "a100-80gb") -> float:
    """The matmul share of peak with which our model spends Korthikanti et al.'s Table 4 time on one
    block of their 22B model (t=8, b=4, no recomputation): 7.7 + 11.9 = 19.6 ms forward + backward,
    minus what the model says the tensor-parallel all-reduces and memory-bound passes take."""
    hw = preset(hw_name)
    m = replace(model("megatron-22b"), layers=1)
    prob = Problem(m, 8, 8, hw, 4)
    mm, att = layer_flops(m, m.seq)
    flops = 3 * 4 * (mm + att) / 8  # forward + backward, micro-batch 4, split over tp = 8
    full, _ = layer_activations(prob, 4, 8, 1, False)
    memory_bound = 5 * float(full) / hw.hbm_bandwidth  # 2 passes forward, 3 backward
    tp = float(stage_times(prob, Configs.of([Config(tp=8, microbatches=1)]))["tp_comm"][0])  # b = 4
    return flops / (19.6e-3 - tp - memory_bound) / hw.peak_flops


# The hardware and precision of the H100-era rows (the others: a100-80gb, the ZeRO paper's bytes).
HARDWARE = {"Llama3-T4": "h100-80gb"}
PRECISION = {"Llama3-T4": Precision("bf16", "fp32")}  # bf16, fp32 gradient accumulation and reduce-scatter

# The engine each source ran (its ZeRO-3 conventions, ``config.ENGINES``): Megatron-LM, DeepSpeed's
# ZeRO-3 in N21 Table 2, Megatron-DeepSpeed for BLOOM.
ENGINE = {"N21-T2 ZeRO-3": "deepspeed", "BLOOM": "deepspeed"}


def reproduce(i: int, hw_name: str = "a100-80gb") -> dict:
    src, name, gpus, fixed, batch, metric, pub = ROWS[i]
    prob = Problem(model(name), gpus, 8, preset(HARDWARE.get(src, hw_name)), batch, engine=ENGINE.get(src, "megatron"),
                   precision=PRECISION.get(src))
    t0 = time.perf_counter()
    res = search(prob, fixed, top=1)
    w = res.ranked[0]
    pred = res.ev["tflops_per_gpu"][w] if metric == "tflops" else res.ev["step"][w]
    return dict(source=src, model=name, gpus=gpus, batch=batch, metric=metric, published=pub, predicted=float(pred),
                error=float(pred) / pub - 1, config=res.cfgs.config(w).describe(prob.batch), fits=bool(res.ev["mem"]["fits"][w]),
                memory_gb=float(res.ev["mem"]["total"][w]) / 1e9, seconds=time.perf_counter() - t0)


def throughput_error(r) -> float:
    """Predicted over published throughput, - 1 (for step times: published / predicted - 1)."""
    return r["predicted"] / r["published"] - 1 if r["metric"] == "tflops" else r["published"] / r["predicted"] - 1


def _err(e: float) -> str:
    return f"{e:+.1%}{'' if abs(e) <= 0.15 else ' **miss**'}"


def markdown(rows, before=None) -> str:
    """The table; ``before``: the same rows from an earlier run (``--json``), whose errors are
    shown beside the new ones."""
    old = "" if before is None else " error before |"
    out = ["| source | model | GPUs | batch | configuration (searched where the source is silent) | memory GB | "
           "published | predicted |" + old + " throughput error |", "|---|---|---|---|---|---|---|---|---|" + (
           "---|" if old else "")]
    old_rows = {(b["source"], b["model"], b["gpus"], b["batch"]): b for b in before or []}
    for r in rows:
        unit = "TFLOP/s" if r["metric"] == "tflops" else "s/iter"
        was = old_rows.get((r["source"], r["model"], r["gpus"], r["batch"]))
        prev = "" if before is None else f" {_err(throughput_error(was)) if was else '(new row)'} |"
        out.append(f"| {r['source']} | {r['model']} | {r['gpus']} | {r['batch']} | {r['config']} | "
                   f"{r['memory_gb']:.1f}{'' if r['fits'] else ' (over)'} | {r['published']:g} {unit} | "
                   f"{r['predicted']:.3g} {unit} |{prev} {_err(throughput_error(r))} |")
    return "\n".join(out)


def reproduce_rows(only=None, say=print) -> list[dict]:
    """Every row (or the indices ``only``), each reproduced and reported in one line as it ends."""
    rows = []
    for i in only or range(len(ROWS)):
        r = reproduce(i)
        rows.append(r)
        say(f"[{i}] {r['source']} {r['model']} {r['gpus']}: predicted {r['predicted']:.4g} published "
            f"{r['published']:g} (throughput {throughput_error(r):+.1%}) in {r['seconds']:.1f} s")
    return rows
