"""Figures of serving (lesson 07): why tensor parallelism makes decoding faster, measured and predicted.

    minipar figures --only planning
    minipar bench inference --json docs/inference.json     # remake the record they draw

inference_latency.png   lesson 05's GPT decoding on this machine: ms per token against the width d,
                        TP = 1 and 2, measured (solid), its CPU time (dotted) and predicted (dashed); beside it the weight
                        bytes each rank read per second, against the read probe its job's ranks
                        took at once around the token loop (the prediction's bandwidth) and STREAM
inference_roofline.png  the decode roofline: FLOP/s against FLOPs per byte read, min(peak,
                        bandwidth x intensity); this machine's measured decode steps at batch B and
                        prefills of T tokens (by the CPU clock when recorded: on a shared machine the
                        rates and times while the rank ran), and the A100 and H100 presets with Llama 2 7B's
                        decode at B = 1 ... 256 and a 128-token prefill, predicted

Both draw from the recorded run ``docs/inference.json`` (or ``records``).
"""
from __future__ import annotations

import json
import os

from . import pyplot, save

RUN = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "inference.json")


def latency(rec, path):
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    rows = rec["rows"]
    for tp in sorted({r["tp"] for r in rows}):
        rs = sorted((r for r in rows if r["tp"] == tp), key=lambda r: r["d"])
        ds = [r["d"] for r in rs]
        line = ax.plot(ds, [r["token_s"] * 1e3 for r in rs], marker="o", label=f"TP = {tp}, measured")
        ax.plot(ds, [r["predicted_token_s"] * 1e3 for r in rs], ls="--", color=line[0].get_color(),
                label=f"TP = {tp}, predicted (roofline on the job's read probe + all-reduce)")
        ax.plot(ds, [r["token_cpu_s"] * 1e3 for r in rs], ls=":", marker="^", color=line[0].get_color(),
                label=f"TP = {tp}, CPU time per token (waits for the scheduler excluded)")
        ax.plot(ds, [r["predicted_cpu_token_s"] * 1e3 for r in rs], ls="-.", color=line[0].get_color(),
                label=f"TP = {tp}, predicted from the CPU-clock read probe")
        bx.plot(ds, [r["achieved_bandwidth"] / 1e9 for r in rs], marker="o", color=line[0].get_color(),
                label=f"TP = {tp}: weight bytes read per rank / s")
        bx.plot(ds, [r["probe_bandwidth"] / 1e9 for r in rs], ls="--", marker="x", color=line[0].get_color(),
                label=f"read probe around the token loop, {tp} process{'es' if tp > 1 else ''} reading (per process)")
        bx.plot(ds, [r["read_bytes"] / r["token_cpu_s"] / 1e9 for r in rs], marker="^", ls="-.",
                color=line[0].get_color(), label=f"TP = {tp}: the same per CPU second")
        bx.plot(ds, [r["probe_cpu_bandwidth"] / 1e9 for r in rs], ls="-.", marker="1", color=line[0].get_color(),
                label=f"read probe per CPU second, {tp} process{'es' if tp > 1 else ''}")
        bx.plot(ds, [r["stream_bandwidth"] / 1e9 for r in rs], ls=":", marker="+", color=line[0].get_color(),
                label=f"STREAM of the machine table, {tp} process{'es' if tp > 1 else ''} (per process)")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel(f"width d ({rec['layers']} layers, float64; weights 12 L d^2 x 8 bytes)")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("ms per new token (batch 1)")
    ax.set_title("decode latency against width: cache-resident (left) to DRAM-bound (right)", fontsize=9)
    bx.set_ylabel("GB/s per rank")
    bx.set_title("weight bytes each rank reads per second, beside the read probe and STREAM", fontsize=9)
    loads = [x for x in (rec.get("load_average_start"), rec.get("load_average")) if x is not None]
    fig.suptitle(f"lesson 05's GPT on this machine ({rec['cores']} cores, load average "
                 f"{' at the start, '.join(f'{x:.1f}' for x in loads)}{' at the end' if len(loads) > 1 else ''})",
                 fontsize=10)
    return save(fig, path, tight=True)


def _roof(ax, peak, bw, label, color):
    import numpy as np

    x = np.logspace(-2, 4, 200)
    ax.plot(x, np.minimum(peak, bw * x), color=color, lw=1.5, label=label)
    ax.axvline(peak / bw, color=color, lw=0.6, ls=":")


def roofline(rec, path):
    from ..plan.hardware import preset
    from ..plan.inference import LLAMA2, decode_step, prefill

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    b = rec["batch"]
    # the CPU-clock view: rates and times while the rank ran, load's waits excluded; the bandwidth is the job's read probe
    peak, bw = b["cpu_clock"]["peak_flops"], b["cpu_clock"]["bandwidth"]
    clock = "CPU clock"
    _roof(ax, peak, bw, f"this machine, 1 rank ({clock}): {peak / 1e9:.1f} GFLOP/s, {bw / 1e9:.1f} GB/s", "k")
    from ..bench.inference import gpt_config
    from ..plan.models import minipar_gpt

    m = minipar_gpt(gpt_config(b["d"], 64))
    steps, pres = b["step_cpu_s"], b["prefill_cpu_s"]
    for kind, runs, marker in (("decode, batch B", steps, "o"), ("prefill, T tokens", pres, "s")):
        pts = []
        for k, s in sorted(runs.items(), key=lambda kv: int(kv[0])):
            flops, nbytes = _work(m, kind, int(k))
            pts.append((flops / nbytes, flops / s, k))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls="", label=f"measured {kind}")
        for x, y, k in pts:
            ax.annotate(f"{'B' if kind.startswith('decode') else 'T'}={k}", (x, y), fontsize=6, xytext=(3, -8),
                        textcoords="offset points")
    b_star = peak / bw * 8 / 2
    ax.set_title(f"this machine: lesson 05's GPT, d = {b['d']}, TP = 1, float64, {clock} (B* = {b_star:.1f})", fontsize=9)
    for (name, color) in (("a100-80gb", "tab:blue"), ("h100-80gb", "tab:red")):
        g = preset(name)
        peak = g.peak_flops * g.matmul_fraction
        _roof(bx, peak, g.hbm_bandwidth, f"{name}: {peak / 1e12:.0f} TFLOP/s usable, {g.hbm_bandwidth / 1e12:.2f} TB/s", color)
        lm = LLAMA2["llama2-7b"]
        steps = [decode_step(lm, g, 1, k, 1024) for k in (1, 4, 16, 64, 256)]
        bx.plot([s.intensity for s in steps], [s.flops / max(s.memory_s, s.compute_s) for s in steps], "o", color=color,
                label=f"Llama 2 7B decode, B = 1, 4, 16, 64, 256 ({name})")
        p = prefill(lm, g, 1, 1, 128)
        bx.plot([p.intensity], [p.flops / max(p.memory_s, p.compute_s)], "s", color=color, label=f"prefill of 128 tokens ({name})")
    bx.set_title("GPUs, 16-bit weights, context 1024: decode is memory-bound below B*", fontsize=9)
    for a in (ax, bx):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("arithmetic intensity (FLOPs per byte read)")
        a.set_ylabel("FLOP/s")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("the decode roofline: time = max(FLOPs / peak, bytes / bandwidth); dotted: the ridge point", fontsize=10)
    return save(fig, path, tight=True)


def _work(m, kind, k):
    """(FLOPs, bytes read) of a measured step: a decode step of k sequences, or a prefill of k tokens."""
    from ..plan.inference import decode_step, prefill
    from ..plan.hardware import preset

    hw = preset("a100-80gb")  # only the counts are used, not the times
    st = decode_step(m, hw, 1, k, 6, wbytes=8) if kind.startswith("decode") else prefill(m, hw, 1, 1, k, wbytes=8)
    return st.flops, st.weight_bytes + st.kv_bytes


def make(outdir, records=None, quick=False, **_):
    os.makedirs(outdir, exist_ok=True)
    if records is None:
        with open(RUN) as f:
            records = json.load(f)
    return [latency(records, os.path.join(outdir, "inference_latency.png")),
            roofline(records, os.path.join(outdir, "inference_roofline.png"))]
