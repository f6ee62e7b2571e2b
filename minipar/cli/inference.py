"""Lesson 07's serving verbs (added by ``minipar.cli.planning``): ``minipar infer`` and ``minipar bench inference``.

``minipar infer``: per-token decode latency, prefill time and throughput of a model against TP
(and PP), predicted from the memory-bandwidth roofline and the all-reduce's alpha-beta cost:

    minipar infer --model llama3-70b --hardware a100-80gb --tp 1 2 4 8
    minipar infer --layers 32 --hidden 4096 --heads 32 --vocab 32000 --hardware h100-80gb --batch 16 --pp 1 2
    minipar infer --published                  # the planner against published serving numbers

    minipar bench inference --json docs/inference.json     # lesson 05's decoding measured here, TP 1 and 2

See minipar/plan/inference.py and docs/inference.md.
"""
from __future__ import annotations

import argparse

from ..errors import UsageError
from ..plan.hardware import PRESET_NAMES, preset
from ..plan.models import MODELS, ModelSpec, model
from ..records import write_json
from .common import bounded, output_path, progress, with_example

COUNT = bounded(2**20, "a count")


def add_verbs(verbs):
    p = verbs.top.add_parser(
        "infer", help="serving: per-token decode latency, prefill and throughput against TP and PP, predicted",
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  minipar infer --model llama3-70b --hardware a100-80gb --tp 1 2 4 8\n"
               "  minipar infer --published")
    g = p.add_argument_group("model (a name, or its shape)")
    g.add_argument("--model", help=f"one of: {', '.join(MODELS)}")
    for k in ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn"):
        g.add_argument(f"--{k.replace('_', '-')}", type=COUNT)
    g = p.add_argument_group("serving")
    g.add_argument("--hardware", default="a100-80gb", choices=PRESET_NAMES, help="preset (default a100-80gb)")
    g.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="this-machine: the ranks' dtype")
    g.add_argument("--tp", type=COUNT, nargs="+", default=[1, 2, 4, 8], help="tensor-parallel sizes (default 1 2 4 8)")
    g.add_argument("--pp", type=COUNT, nargs="+", default=[1], help="pipeline stages (default 1)")
    g.add_argument("--batch", type=COUNT, default=1, help="sequences decoded together (default 1)")
    g.add_argument("--context", type=COUNT, default=1024, help="tokens already in the KV cache (default 1024)")
    g.add_argument("--prompt", type=COUNT, default=128, help="prompt tokens for the prefill (default 128)")
    g.add_argument("--algorithm", default="ring", choices=("ring", "recursive_doubling", "tree"),
                   help="the TP all-reduce's algorithm (default ring, lesson 01's)")
    g.add_argument("--published", action="store_true", help="the planner against published serving numbers (A100)")
    g.add_argument("--json", metavar="FILE", type=output_path, help="write the rows here")
    p.set_defaults(func=cmd_infer)

    b = verbs.bench.add_parser(
        "inference", help="decoding measured where it is memory-bound: lesson 05's GPT at TP 1 and 2, widths to 800 MB",
        description="Measures this machine's memory bandwidth (1 and 2 ranks), then decodes a random GPT of "
                    "widths 64 to 1024 at TP 1 and 2 and a batch sweep: a few minutes on 2 cores.",
        **with_example("minipar bench inference --json docs/inference.json   (then: minipar figures --only planning)"))
    b.add_argument("--quick", action="store_true", help="two small widths, two batches: seconds")
    b.add_argument("--tp", type=int, nargs="+", default=[1, 2], choices=(1, 2, 4),
                   help="TP sizes (default 1 2; 4 oversubscribes a 2-core machine)")
    b.add_argument("--json", metavar="FILE", type=output_path, help="write the record here")
    b.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from ..bench.inference import run

    return run(args, progress=progress)


def spec_from_args(a) -> ModelSpec:
    shape = {k: getattr(a, k) for k in ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn") if getattr(a, k) is not None}
    if a.model:
        from dataclasses import replace

        return replace(model(a.model), **shape)
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in shape]
    if missing:
        raise UsageError(f"give --model NAME or all of --layers --hidden --heads --vocab (missing --{missing[0]})")
    return ModelSpec(seq=4096, name="custom", **shape)


def cmd_infer(a) -> int:
    from ..plan import inference as I

    if a.published:
        hw = preset("a100-80gb")
        rows = I.against_published(hw, a.algorithm)
        print(f"the planner on {hw.name} ({a.algorithm} all-reduce) against {I.PUBLISHED_SOURCE}\n")
        print(f"{'model':<12}{'TP':>4}{'published ms/token':>20}{'predicted':>11}{'error':>8}{'GB/s per GPU read':>19}")
        for r in rows:
            print(f"{r['model']:<12}{r['tp']:>4}{r['published_ms']:>20.2f}{r['predicted_ms']:>11.2f}"
                  f"{r['error'] * 100:>7.0f}%{r['achieved_bandwidth'] / 1e9:>19.0f}")
        if a.json:
            write_json(a.json, {"source": I.PUBLISHED_SOURCE, "rows": rows})
        return 0
    m = spec_from_args(a)
    hw = preset(a.hardware, a.dtype)
    rows = I.table(m, hw, a.tp, a.pp, a.batch, a.context, a.prompt, a.algorithm)
    w = hw.dtype_bytes
    print(f"{m.name}: {m.params() / 1e9:.2f}B parameters, {w}-byte weights, on {hw.name} "
          f"({hw.hbm_bandwidth / 1e12:.2f} TB/s, {hw.peak_flops * hw.matmul_fraction / 1e12:.0f} TFLOP/s usable); "
          f"batch {a.batch}, context {a.context}, prompt {a.prompt}, {a.algorithm} all-reduce")
    print(f"decode turns compute-bound at batch B* = {I.critical_batch(hw):.0f}; KV cache "
          f"{I.kv_bytes_per_token(m, 1, w) / 2**10:.0f} KiB per token at TP = 1 (/t per rank)\n")
    print(f"{'tp':>3}{'pp':>4}{'ms/token':>10}{'read':>8}{'compute':>9}{'comm':>8}{'bound':>8}{'prefill ms':>12}"
          f"{'tokens/s':>10}{'batch fits':>12}")
    for s in rows:
        d = s.decode
        print(f"{s.tp:>3}{s.pp:>4}{s.token_s * 1e3:>10.2f}{d.memory_s * 1e3 * s.pp:>8.2f}{d.compute_s * 1e3 * s.pp:>9.2f}"
              f"{d.comm_s * 1e3 * s.pp:>8.2f}{d.bound:>8}{s.prefill_s * 1e3:>12.1f}{s.tokens_per_s:>10.0f}{s.fits_batch:>12}")
    stop = I.tp_stops_paying(m, hw, a.batch, a.context, a.algorithm, most=max(a.tp))
    for st in stop["steps"]:
        verdict = "pays" if st["pays"] else "does not pay"
        print(f"tp {st['from']} -> {st['to']}: saves {st['saved_per_layer_s'] * 1e6:.1f} us of reading per layer, adds "
              f"{st['added_per_layer_s'] * 1e6:.1f} us of all-reduce: {verdict}")
    print(f"fastest per token: tp = {stop['best']}")
    if a.json:
        write_json(a.json, {"model": m.name, "hardware": hw.name, "rows": [
            {"tp": s.tp, "pp": s.pp, "token_s": s.token_s, "prefill_s": s.prefill_s, "tokens_per_s": s.tokens_per_s,
             "fits_batch": s.fits_batch, "bound": s.decode.bound} for s in rows], "tp_stops_paying": stop})
    return 0
