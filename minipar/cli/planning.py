"""Lesson 07's verbs: ``minipar plan``, ``minipar run planning``, ``minipar bench machine``,
``minipar bench links`` and ``minipar bench plan``.

``minipar plan``: which dp x pp x tp (x cp, ZeRO, micro-batch, recompute) for my model and cluster?

    minipar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100-80gb --global-batch 1536
    minipar plan --layers 32 --hidden 4096 --heads 32 --seq 4096 --vocab 32000 \\
                 --gpus 16 --gpus-per-node 8 --hardware h100-80gb --global-batch 512 --top 10
    minipar plan ... --tp 8 --pp 4 --dp 4 --microbatch 1 --schedule interleaved --chunks 2 --recompute selective

Each of --tp --pp --dp --cp --ep --zero --microbatch --schedule --chunks --recompute
--sequence-parallel fixes that choice; the rest is searched. Conventions: GB = 1e9 bytes;
tflops_per_gpu counts the FLOPs executed (recomputation included); mfu counts the model's
FLOPs only, over the dense peak. See docs/planner.md.

    minipar run -n 4 planning                          # the lesson's checks (minipar.lessons.planning)
    minipar bench machine -n 2                         # measure this machine: the this-machine preset
    minipar bench links --slowdown 200                 # DDP and TP under emulated links vs the prediction
    minipar bench plan --steps 3 --json here.json      # the planner vs lesson 05's trainer here
"""
from __future__ import annotations

import argparse
import json

from ..bench import plan as bench_plan
from ..bench.links import bench_links
from ..bench.machine import cmd_machine
from ..comm.link import LINKS as EMULATED_LINKS
from ..errors import UsageError
from ..plan.config import ENGINES, Problem
from ..plan.hardware import LINKS, PRESET_NAMES, hardware_file, preset
from ..memory import DTYPE_BYTES, WEIGHT_DTYPES, Precision
from ..plan.models import MLPS, MODELS, NORMS, ModelSpec, model, with_overrides
from ..plan.report import report, to_json
from ..plan.search import search
from ..records import write_json
from .inference import add_verbs as add_inference_verbs
from .common import bounded, lesson_run_parser, output_path, positive_float, progress, ranks, run_and_report, with_example

# The planner enumerates every split of the GPUs (and of the batch) into dp x tp x pp x ...: past
# this it runs for minutes. The largest training runs published use about 10^5 GPUs.
MAX_GPUS = bounded(2**17, "GPUs: the planner enumerates every split of them")
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "zero", "microbatch", "schedule", "chunks", "recompute", "sequence_parallel")


def add_verbs(verbs):
    """``minipar plan``, ``minipar run planning``, ``minipar bench machine``, ``bench links`` and ``bench plan``."""
    p = verbs.top.add_parser(
        "plan", help="which parallel configuration for a model and cluster: memory, step time, why",
        description=__doc__.split("\n\n")[1],  # the docstring's paragraph on `minipar plan`
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  minipar plan --model gpt3-175b --gpus 1024 --gpus-per-node 8 --hardware a100-80gb "
               "--global-batch 1536\n  minipar plan --model gpt2 --gpus 2 --hardware this-machine --global-batch 8 --link pcie")
    add_plan_arguments(p)
    p.set_defaults(func=cmd_plan)

    r = lesson_run_parser(verbs.run, "planning", "the planner's tables checked; an emulated link on real ranks",
                          "minipar run -n 4 planning")
    r.set_defaults(func=cmd_run)

    m = verbs.bench.add_parser(
        "machine", help="measure this machine for the planner: matmul rate, memory bandwidth, alpha/beta, "
                   "lesson 05's GPT's operations",
        **with_example("minipar bench machine -n 2          # then: minipar plan --hardware this-machine ..."))
    m.add_argument("-n", type=ranks, default=2, help="ranks (default 2)")
    m.add_argument("--out", type=output_path, help="where to write the preset (default ~/.cache/minipar/this_machine.json, or under "
                        "$MINIPAR_CACHE_DIR; the committed minipar/plan/this_machine.json only when named here)")
    m.set_defaults(func=lambda args: cmd_machine(args, progress=progress))

    k = verbs.bench.add_parser(
        "links", help="DDP and TP under emulated links, measured vs the planner's prediction",
        description="One job runs every link, then prints a row per run: about 25 s on 2 cores.",
        **with_example("minipar bench machine && minipar bench links --slowdown 200"))
    k.add_argument("--links", nargs="+", default=["none", "nvlink", "pcie", "ethernet"],
                   choices=["none", *EMULATED_LINKS], help="links to emulate (none: the real transfer only)")
    k.add_argument("--slowdown", type=positive_float, default=200.0, help="stretch every emulated link this much (default 200)")
    k.add_argument("--steps", type=bounded(10**6, "steps"), default=5, help="measured steps per run, best taken (default 5)")
    k.add_argument("--json", type=output_path, help="write the rows here")
    k.set_defaults(func=bench_links)

    h = verbs.bench.add_parser(
        "plan", help="the planner vs lesson 05's trainer on this machine: every grid's step time and memory",
        description="Measures this machine, then trains lesson 05's GPT on every grid of 1, 2, 4 and 8 ranks, "
                    "one job each: a few minutes on 2 cores.",
        epilog="example:\n  minipar bench plan --steps 3 --json here.json   (or: python -m minipar.bench.plan)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_plan.add_arguments(h)
    h.set_defaults(func=cmd_bench_plan)

    add_inference_verbs(verbs)  # ``minipar infer``, ``minipar bench inference`` (serving: minipar/cli/inference.py)
    v = verbs.bench.add_parser(
        "published", help="the planner against published training runs: each row's prediction and error",
        description="Reproduces each published run of docs/planner_validation.md with the presets as they are: "
                    "about a minute for every row.",
        **with_example("minipar bench published --only 0 1\n"
                       "  minipar bench published --json new.json --before docs/planner_validation.json"))
    v.add_argument("--only", type=int, nargs="+", help="row indices")
    v.add_argument("--json", type=output_path, help="write the rows here")
    v.add_argument("--before", help="rows of an earlier run (its --json): their errors beside the new ones")
    v.set_defaults(func=cmd_bench_published)


def cmd_bench_published(args) -> int:
    from ..plan import validation

    before = None
    if args.before:
        try:
            with open(args.before) as f:
                before = json.load(f)
        except (OSError, ValueError) as err:
            raise UsageError(f"--before {args.before}: not the rows of an earlier --json ({err})") from None
    if args.only and not all(0 <= i < len(validation.ROWS) for i in args.only):
        raise UsageError(f"--only {' '.join(map(str, args.only))}: the rows are 0 ... {len(validation.ROWS) - 1}")
    rows = validation.reproduce_rows(args.only, say=lambda line: print(line, flush=True))
    print()
    print(validation.markdown(rows, before))
    if args.json:
        write_json(args.json, rows)
    return 0


def cmd_bench_plan(args) -> int:
    return bench_plan.cmd_here(args, progress=progress)


def cmd_run(args) -> int:
    return run_and_report(args, "lesson 07: the planner's tables and an emulated link", "minipar.lessons.planning:tour")


# --------------------------------------------------------------------------- minipar plan


SHAPE = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "head_dim", "mlp", "norm",
         "experts", "top_k", "shared_experts", "expert_ffn")


def problem_from_args(a) -> Problem:
    shape = {k: getattr(a, k) for k in SHAPE}
    shape["tied"] = False if a.untied else None
    shape["causal_flops"] = True if a.causal_flops else None
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
    if a.hardware_file and a.hardware:
        raise UsageError("give --hardware NAME or --hardware-file PATH, not both")
    hw = hardware_file(a.hardware_file) if a.hardware_file else preset(a.hardware or "a100-80gb", a.dtype)
    if a.link and a.hardware != "this-machine":
        raise UsageError("--link emulates a link on this machine's ranks; for GPUs use --intra-link / --inter-link")
    if a.link_slowdown <= 0:
        raise UsageError(f"--link-slowdown must be > 0, got {a.link_slowdown}")
    hw = hw.with_links(a.intra_link, a.inter_link, a.link, a.link_slowdown)
    gpn = a.gpus_per_node or (a.gpus if a.hardware == "this-machine" else hw.gpus_per_node)
    if gpn < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer, got {gpn}")
    if a.grad_dtype and not a.precision:
        raise UsageError("--grad-dtype needs --precision (without it: the ZeRO paper's 2 + 2 + 12 bytes per parameter)")
    precision = Precision(a.precision, a.grad_dtype or "fp32") if a.precision else None
    return Problem(m, a.gpus, gpn, hw, a.global_batch, offload=a.offload, precision=precision, engine=a.engine)


def fixed_from_args(a) -> dict:
    fixed = {k: getattr(a, k) for k in FIXABLE if getattr(a, k) is not None}
    if "sequence_parallel" in fixed:
        fixed["sequence_parallel"] = fixed["sequence_parallel"] == "on"
    if a.distributed_optimizer:  # Megatron's distributed optimizer shards the optimizer state: ZeRO-1
        if fixed.get("zero", 1) != 1:
            raise UsageError(f"--distributed-optimizer is ZeRO-1 (the optimizer state sharded over dp); not --zero {fixed['zero']}")
        fixed["zero"] = 1
    return fixed


def cmd_plan(a) -> int:
    try:
        if a.top < 1:
            raise UsageError(f"--top must be >= 1, got {a.top}")
        prob = problem_from_args(a)
        fixed = fixed_from_args(a)
        res = search(prob, fixed, top=a.top, allow_cross_node_tp=a.allow_cross_node_tp)
        text = report(res)
    except UsageError as err:
        print(f"minipar plan: error: {err}")
        return 2
    print(text)
    if a.json:
        print()
        write_json(a.json, to_json(res))
    return 0


def add_plan_arguments(p):
    g = p.add_argument_group("model (a name, or its shape)")
    g.add_argument("--model", help=f"one of: {', '.join(MODELS)}")
    for k in ("layers", "hidden", "heads", "seq", "vocab", "ffn"):
        g.add_argument(f"--{k}", type=int, help="MLP width (default 4 x hidden)" if k == "ffn" else None)
    g.add_argument("--kv-heads", type=int, help="K and V heads: grouped-query attention (default --heads)")
    g.add_argument("--head-dim", type=int, help="width of a head (default hidden / heads)")
    g.add_argument("--mlp", choices=MLPS, help="gelu: 2 matrices; swiglu: 3 (gate, up, down)")
    g.add_argument("--norm", choices=NORMS, help="layernorm (2h parameters) or rmsnorm (h)")
    g.add_argument("--untied", action="store_true", help="a separate output matrix V x h (not the embedding)")
    g.add_argument("--experts", type=int, help="mixture of experts in every layer: routed experts")
    g.add_argument("--top-k", type=int, help="experts a token visits")
    g.add_argument("--shared-experts", type=int, help="experts every token visits")
    g.add_argument("--expert-ffn", type=int, help="an expert's MLP width (default --ffn)")
    g.add_argument("--causal-flops", action="store_true", help="count half the attention-score FLOPs (the causal mask)")
    g = p.add_argument_group("precision (default: 16-bit weights and gradients, fp32 Adam: 2 + 2 + 12 bytes per parameter)")
    g.add_argument("--precision", choices=WEIGHT_DTYPES, help="weights' dtype, Megatron's convention (fp32 master "
                   "copy of 16-bit weights): bf16 18 bytes per parameter with fp32 gradients; fp8: bf16's bytes, "
                   "the matmuls at the hardware's fp8 rate")
    g.add_argument("--grad-dtype", choices=tuple(DTYPE_BYTES), help="gradients' dtype (default fp32; 16-bit: 20 bytes)")
    g.add_argument("--distributed-optimizer", action="store_true", help="Megatron's: the optimizer state sharded over dp (ZeRO-1)")
    g.add_argument("--engine", choices=ENGINES, default="fsdp", help="whose ZeRO-3: fsdp (default: two blocks live, "
                   "NCCL rings over every NIC), deepspeed (module by module, stage3_max_live_parameters 1e9, each "
                   "rank's own link), megatron (its distributed optimizer: ZeRO-1 at most)")
    g = p.add_argument_group("cluster and batch")
    g.add_argument("--gpus", type=MAX_GPUS, required=True, help="GPUs (ranks) in all")
    g.add_argument("--gpus-per-node", type=MAX_GPUS, help="default: the preset's (8), or --gpus on this-machine")
    g.add_argument("--hardware", choices=PRESET_NAMES, help="preset (default a100-80gb)")
    g.add_argument("--hardware-file", metavar="PATH", help="your own cluster, JSON or TOML (.toml): peak_flops "
                   "{dtype: FLOP/s}, memory_bytes, hbm_bandwidth, gpus_per_node, intra and inter {bandwidth, latency}; "
                   "see docs/planner.md")
    g.add_argument("--global-batch", type=bounded(2**30, "sequences per step"), required=True, help="sequences per optimizer step")
    g.add_argument("--dtype", default="float64", choices=("float64", "float32"), help="this-machine: the ranks' dtype")
    g.add_argument("--intra-link", choices=list(LINKS), help="replace the intra-node link (pcie: 'without NVLink')")
    g.add_argument("--inter-link", choices=list(LINKS), help="replace the inter-node link")
    g.add_argument("--link", choices=list(LINKS), help="this-machine: predict for ranks run with this emulated link")
    g.add_argument("--link-slowdown", type=positive_float, default=1.0, help="the emulated link's slowdown (MINIPAR_LINK_SLOWDOWN)")
    g = p.add_argument_group("fix a choice (the rest is searched)")
    for k in ("tp", "pp", "dp", "cp", "microbatch", "chunks"):
        g.add_argument(f"--{k}", type=int)
    g.add_argument("--ep", type=int, help="expert-parallel ranks (models with experts): the experts split over ep "
                   "of the dp ranks")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    g.add_argument("--schedule", choices=("1f1b", "interleaved", "gpipe"))
    g.add_argument("--recompute", choices=("none", "selective", "full"))
    g.add_argument("--sequence-parallel", nargs="?", const="on", choices=("on", "off"))
    g = p.add_argument_group("output")
    g.add_argument("--top", type=bounded(10**6, "rows"), default=5, help="configurations to list (default 5)")
    g.add_argument("--json", metavar="FILE", type=output_path, help='write {"configs": [...]} best first')
    g.add_argument("--offload", action="store_true", help="ZeRO-Offload: optimizer state and step on the host")
    g.add_argument("--allow-cross-node-tp", action="store_true", help="let tp exceed the GPUs per node")
