"""``minipar plan``: which dp x pp x tp (x cp, ZeRO, micro-batch, recompute) for my model and cluster?

    minipar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100-80gb --global-batch 1536
    minipar plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --vocab 32000 \\
                 --gpus 16 --gpus-per-node 8 --hardware h100-80gb --global-batch 512 --top 10
    minipar plan ... --tp 8 --pp 4 --dp 4 --microbatch 1 --schedule interleaved --chunks 2 --recompute selective

Each of --tp --pp --dp --cp --zero --microbatch --schedule --chunks --recompute
--sequence-parallel fixes that choice; the rest is searched. Conventions: GB = 1e9 bytes;
tflops_per_gpu counts the FLOPs executed (recomputation included); mfu counts the model's
FLOPs only, over the dense peak. See docs/planner.md.
"""
from __future__ import annotations

import argparse
import json

from ..errors import UsageError
from .advice import LABEL, compare_rule, gb, runners_up
from .config import Problem
from .hardware import LINKS, PRESET_NAMES, preset
from .models import MODELS, ModelSpec, model, with_overrides
from .search import search

FIXABLE = ("tp", "pp", "dp", "cp", "zero", "microbatch", "schedule", "chunks", "recompute", "sequence_parallel")


def problem_from_args(a) -> Problem:
    shape = dict(layers=a.layers, hidden=a.hidden, heads=a.heads, seq=a.seq, vocab=a.vocab, ffn=a.ffn)
    if a.model:
        m = with_overrides(model(a.model), **shape)
    else:
        missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if shape[k] is None]
        if missing:
            raise UsageError(f"give --model NAME or all of --layers --hidden --heads --seq --vocab (missing --{missing[0]})")
        m = ModelSpec(**{k: v for k, v in shape.items() if v is not None})
    if a.gpus is None or a.gpus < 1:
        raise UsageError(f"--gpus must be a positive integer, got {a.gpus!r}")
    if a.global_batch is None or a.global_batch < 1:
        raise UsageError(f"--global-batch must be a positive integer, got {a.global_batch!r}")
    hw = preset(a.hardware, a.dtype)
    if a.link and a.hardware != "this-machine":
        raise UsageError("--link emulates a link on this machine's ranks; for GPUs use --intra-link / --inter-link")
    if a.link_slowdown <= 0:
        raise UsageError(f"--link-slowdown must be > 0, got {a.link_slowdown}")
    hw = hw.with_links(a.intra_link, a.inter_link, a.link, a.link_slowdown)
    gpn = a.gpus_per_node or (a.gpus if a.hardware == "this-machine" else hw.gpus_per_node)
    if gpn < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer, got {gpn}")
    return Problem(m, a.gpus, gpn, hw, a.global_batch, offload=a.offload)


def fixed_from_args(a) -> dict:
    fixed = {k: getattr(a, k) for k in FIXABLE if getattr(a, k) is not None}
    if "sequence_parallel" in fixed:
        fixed["sequence_parallel"] = fixed["sequence_parallel"] == "on"
    return fixed


def _mem_cells(mem, i):
    return " ".join(f"{mem[k][i] / 1e9:7.1f}" for k in ("params", "grads", "optimizer", "activations", "total"))


def report(res) -> str:
    prob, ev, mem = res.prob, res.ev, res.ev["mem"]
    m = prob.model
    lines = [f"minipar plan: {m.name} ({m.params() / 1e9:.4g}e9 parameters, {m.layers} layers, hidden {m.hidden}, "
             f"{m.heads} heads, seq {m.seq}, vocab {m.vocab}) on {prob.gpus} x {prob.hw.name} "
             f"({prob.gpus_per_node} per node), global batch {prob.batch}",
             f"searched {res.stats['configs']} configurations in {res.seconds:.2f} s ({res.cpu_seconds:.2f} s CPU): "
             f"{res.stats['fit']} fit in "
             f"{gb(prob.capacity)} per GPU; {res.simulated} pipelines simulated (lesson 03's simulator)", ""]
    if not res.stats["fit"]:
        lines.append("NOTHING FITS: the smallest footprints are listed below")
    lines.append(f"{'#':>2} {'configuration':<64} {'step s':>8} {'TFLOP/s':>8} {'MFU':>6}   memory GB: "
                 f"{'params':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'total':>7}")
    for r, i in enumerate(res.ranked, 1):
        lines.append(f"{r:>2} {res.cfgs.config(i).describe(prob.batch):<64} {ev['step'][i]:8.3g} {ev['tflops_per_gpu'][i]:8.1f} "
                     f"{ev['mfu'][i]:6.1%}              {_mem_cells(mem, i)}" + ("" if mem["fits"][i] else "  (does not fit)"))
    w = res.ranked[0]
    parts = ", ".join(f"{LABEL[k]} {v[w]:.3g} s" for k, v in ev["parts"].items())
    lines += ["", f"best: {res.cfgs.config(w).describe(prob.batch)}",
              f"  memory per GPU: {gb(mem['total'][w])} of {gb(prob.capacity)} (params {gb(mem['params'][w])}, "
              f"grads {gb(mem['grads'][w])}, optimizer {gb(mem['optimizer'][w])}, activations {gb(mem['activations'][w])})"
              + (f"; host {gb(mem['host'][w])}" if prob.offload else ""),
              f"  step {ev['step'][w]:.4g} s = {parts}",
              f"  {ev['tflops_per_gpu'][w]:.1f} TFLOP/s per GPU (executed, recomputation included), "
              f"MFU {ev['mfu'][w]:.1%} (model FLOPs / dense peak {prob.hw.peak_flops / 1e12:.4g} TFLOP/s)"]
    why = runners_up(res)
    if why:
        lines += ["", "why the others lose:"] + [f"  {s}" for s in why]
    lines += [""] + compare_rule(res)
    return "\n".join(lines)


def to_json(res) -> dict:
    return {"configs": [res.row(i) for i in res.ranked]}


def cmd_plan(a) -> int:
    try:
        if a.top < 1:
            raise UsageError(f"--top must be >= 1, got {a.top}")
        prob = problem_from_args(a)
        res = search(prob, fixed_from_args(a), top=a.top, allow_cross_node_tp=a.allow_cross_node_tp)
        text = report(res)
    except UsageError as err:
        print(f"minipar plan: error: {err}")
        return 2
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(to_json(res), f, indent=1)
        print(f"\nwrote {a.json}")
    return 0


def add_arguments(p):
    g = p.add_argument_group("model (a name, or its shape)")
    g.add_argument("--model", help=f"one of: {', '.join(MODELS)}")
    for k in ("layers", "hidden", "heads", "seq", "vocab", "ffn"):
        g.add_argument(f"--{k}", type=int, help="MLP width (default 4 x hidden)" if k == "ffn" else None)
    g = p.add_argument_group("cluster and batch")
    g.add_argument("--gpus", type=int, required=True, help="GPUs (ranks) in all")
    g.add_argument("--gpus-per-node", type=int, help="default: the preset's (8), or --gpus on this-machine")
    g.add_argument("--hardware", default="a100-80gb", choices=PRESET_NAMES, help="preset (default a100-80gb)")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    g.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="this-machine: the ranks' dtype")
    g.add_argument("--intra-link", choices=list(LINKS), help="replace the intra-node link (pcie: 'without NVLink')")
    g.add_argument("--inter-link", choices=list(LINKS), help="replace the inter-node link")
    g.add_argument("--link", choices=list(LINKS), help="this-machine: predict for ranks run with this emulated link")
    g.add_argument("--link-slowdown", type=float, default=1.0, help="the emulated link's slowdown (MINIPAR_LINK_SLOWDOWN)")
    g = p.add_argument_group("fix a choice (the rest is searched)")
    for k in ("tp", "pp", "dp", "cp", "microbatch", "chunks"):
        g.add_argument(f"--{k}", type=int)
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    g.add_argument("--schedule", choices=("1f1b", "interleaved", "gpipe"))
    g.add_argument("--recompute", choices=("none", "selective", "full"))
    g.add_argument("--sequence-parallel", nargs="?", const="on", choices=("on", "off"))
    g = p.add_argument_group("output")
    g.add_argument("--top", type=int, default=5, help="configurations to list (default 5)")
    g.add_argument("--json", metavar="FILE", help='write {"configs": [...]} best first')
    g.add_argument("--offload", action="store_true", help="ZeRO-Offload: optimizer state and step on the host")
    g.add_argument("--allow-cross-node-tp", action="store_true", help="let tp exceed the GPUs per node")


def add_commands(subparsers):
    """The ``plan`` verb of minipar's CLI."""
    p = subparsers.add_parser(
        "plan", help="which parallel configuration for a model and cluster: memory, step time, why",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  minipar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100-80gb "
               "--global-batch 1536\n  minipar plan --model gpt2 --gpus 2 --hardware this-machine --global-batch 8 --link pcie")
    add_arguments(p)
    p.set_defaults(func=cmd_plan)


def add_bench_command(bench_subparsers):
    """``minipar bench machine`` (the this-machine preset), ``minipar bench links`` (a link you can
    feel) and ``minipar bench plan`` (the planner against the trainer's runs here)."""
    from ..bench import plan as here
    from ..bench.machine import add_bench_command as machine
    from ..lessons.planning import add_bench_command as links

    machine(bench_subparsers)
    links(bench_subparsers)
    p = bench_subparsers.add_parser(
        "plan", help="the planner vs lesson 05's trainer on this machine: every grid's step time and memory",
        epilog="example:\n  minipar bench plan --steps 3 --json here.json   (or: python -m minipar.bench.plan)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    here.add_arguments(p)
    p.set_defaults(func=here.cmd_here)


def add_run_command(run_subparsers):
    """``minipar run planning``: lesson 07's checks on real ranks."""
    from ..lessons.planning import add_run_command as run

    run(run_subparsers)
