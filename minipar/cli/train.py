"""Lesson 05's verbs: ``minipar train`` and ``minipar generate`` (the lesson from the shell),
``minipar bench train`` and ``minipar run train`` (the lesson's checks).

    minipar train -n 8 --dp 2 --pp 2 --tp 2 --steps 300            # a progress line per step
    minipar train -n 8 --dp 2 --pp 2 --tp 2 --steps 5 --compare     # + the one-process run
    minipar train -n 4 --dp 1 --pp 2 --tp 2 --save ckpt/ --save-every 100
    minipar train -n 2 --dp 2 --resume ckpt/ --steps 400            # any other grid
    minipar train -n 8 --dp 2 --cp 2 --tp 2 --steps 5 --compare     # the sequence split over cp too
    minipar train -n 4 --dp 4 --experts 8 --top-k 2 --steps 5 --compare   # a mixture of experts over dp
    minipar train -n 4 --dp 2 --tp 2 --clip 1.0 --steps 5 --compare       # clipped by the global gradient norm
    minipar train -n 4 --dp 2 --tp 2 --precision bf16 --steps 5 --compare  # 16-bit weights, float32 gradients and master
    minipar train -n 4 --cp 2 --tp 2 --dropout 0.1 --steps 5 --compare    # dropout: one process's masks on any grid
    minipar generate --checkpoint ckpt/ -n 2 --tp 2 --prompt "41930>"
    minipar bench train --steps 3 --json bench_train.json                 # minipar.bench.train
    minipar bench gpu -n 2 --json gpu.json         # on a CUDA GPU: allocator vs ledgers (minipar.bench.gpu)
    minipar run -n 4 train                                                # minipar.lessons.train

Every shape is checked before a rank starts (``check_shapes``): a grid that does not fit is one
line naming the dimension, exit code 2.
"""
from __future__ import annotations

import math
import os
import sys

from ..errors import UsageError
from ..grid import ORDER
from ..launcher import LaunchError
from ..bench import gpu as gpu_bench, train as train_bench
from ..train.config import DEFAULT_MODEL
from ..train.model import GPTConfig
from ..train.precision import COMPUTE, LOSS_SCALES, PRECISIONS
from ..train.trainer import CP_ATTENTION, SCHEDULES, TrainConfig, check_shapes
from ..records import write_json
from .common import (MAX_RANKS, bounded, float_at_most, lesson_run_parser, output_path, positive_float, progress,
                     ranks, run_and_report, with_example)

# Bounds on the model's shape: the model is NumPy (or torch) on this machine, so a shape past
# these is a typo, not a plan; MAX_PARAMS is checked on the product (what the memory must hold).
MAX_PARAMS = 2 * 10**9
_SHAPE = "a model trained on this machine"
layers_type = bounded(4096, _SHAPE)
width_type = bounded(65536, _SHAPE)
seq_type = bounded(65536, _SHAPE)
batch_type = bounded(2**20, _SHAPE)
steps_type = bounded(10**9, "steps")



def _example(text):
    return with_example(text, heading="examples")


def add_grid_options(p):
    p.add_argument("-n", type=ranks, default=1, help="ranks (default 1); must equal dp x pp x cp x tp")
    p.add_argument("--dp", type=ranks, default=1, help="data-parallel replicas")
    p.add_argument("--pp", type=ranks, default=1, help="pipeline stages (ranks)")
    p.add_argument("--tp", type=ranks, default=1, help="tensor-parallel ranks")
    p.add_argument("--cp", type=ranks, default=1, help="context-parallel ranks: the sequence split over them (zigzag)")
    p.add_argument("--cp-attention", choices=CP_ATTENTION, default="ring", help="the attention core over cp (default ring)")
    p.add_argument("--experts", type=bounded(MAX_RANKS * 64, "experts", low=0), default=0, metavar="E",
                   help="E > 0: every MLP is a mixture of E experts, sharded over the dp ranks")
    p.add_argument("--top-k", type=bounded(MAX_RANKS * 64, "experts per token"), default=1, help="experts per token (default 1)")
    p.add_argument("--capacity-factor", type=float_at_most(1e3, "past E / k no token is ever dropped"), default=1.25, help="tokens an expert takes: f x k x N / E (default 1.25)")
    p.add_argument("--aux-weight", type=float_at_most(1e3, "a weight next to the loss", inclusive=True), default=0.01, help="weight of the load-balancing loss (default 0.01)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--microbatches", type=batch_type, default=1, help="micro-batches per step and DP replica")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron-SP: LayerNorms and residuals on T/tp tokens")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--zero", type=int, default=0,
                   help="0: DDP; 1: ZeRO-1 (Adam state sharded over dp x cp); 2: + the gradients, reduce-scattered "
                        "once per step after the flush; 3: + the weights, gathered once per step (FSDP, each TP "
                        "rank sharding its own TP shard)")
    p.add_argument("--reshard", action="store_true",
                   help="with --zero 3: gather a stage's weights before every pipeline action and free them after "
                        "(2m gathers a step instead of one; docs/train.md says when that pays)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="fp64 (default) or fp32: everything in it; bf16 or fp16: 16-bit weights and activations, "
                        "float32 gradients, master weights and Adam state (docs/train.md). With --resume: the "
                        "checkpoint's, and another only when said here")
    p.add_argument("--loss-scale", choices=LOSS_SCALES, default=None,
                   help="fp16 only: dynamic (the default, and the only one fp16 accepts): halve on an overflow, "
                        "that step skipped on every rank; double after --growth-interval clean steps")
    p.add_argument("--initial-scale", type=float_at_most(2.0**64, "fp32 gradients overflow long before"), default=None,
                   metavar="S", help="fp16: the first step's loss scale, a power of 2 (default 65536)")
    p.add_argument("--growth-interval", type=bounded(10**9, "steps"), default=None, metavar="K",
                   help="fp16: clean steps in a row before the loss scale doubles (default 2000)")
    p.add_argument("--ranks-per-node", type=bounded(MAX_RANKS, "ranks per node", low=0), default=0, metavar="R",
                   help="the ranks sit on nodes of R, in blocks (rank w on node w // R), as mpiexec's host list and "
                        "torchrun place them; one step is traced and the bytes sent between nodes are reported "
                        "(default 0: one node)")
    p.add_argument("--order", default=ORDER, metavar="AXES",
                   help=f"the grid's axes on the ranks, fastest first, as Megatron's order string (default {ORDER}: "
                        f"TP partners on neighbouring ranks, inside a node; dp-tp-cp-pp puts DP inside, TP across)")
    p.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="torch backend: where the ranks compute (cuda: NCCL with a GPU per rank, else gloo with host staging)")
    p.add_argument("--layers", type=layers_type, default=DEFAULT_MODEL["n_layers"])
    p.add_argument("--d-model", type=width_type, default=DEFAULT_MODEL["d_model"])
    p.add_argument("--heads", type=width_type, default=DEFAULT_MODEL["n_heads"])
    p.add_argument("--seq-len", type=seq_type, default=DEFAULT_MODEL["seq_len"])
    p.add_argument("--batch", type=batch_type, default=32, help="global batch in samples (default 32)")
    p.add_argument("--lr", type=float_at_most(10.0, "Adam diverges long before"), default=3e-3, help="learning rate, > 0 and at most 10 (default 3e-3)")
    p.add_argument("--clip", type=positive_float, metavar="NORM",
                   help="clip the gradients to this global L2 norm before Adam, every parameter counted once (default: no clipping)")
    p.add_argument("--clip-norm-type", choices=("2", "inf"), default="2",
                   help="the clip's norm: 2, the L2 norm (default), or inf, the largest |gradient element| over every rank")
    p.add_argument("--dropout", type=float, default=0.0, metavar="P",
                   help="drop activations with probability P in [0, 1) after the embedding, after attention, after the "
                        "MLP and in its hidden layer, and the attention probabilities; each mask is a function of the "
                        "element's global index: the same on every grid (default 0)")


def config_from(args) -> TrainConfig:
    model = GPTConfig(vocab=DEFAULT_MODEL["vocab"], d_model=args.d_model, n_heads=args.heads,
                      n_layers=args.layers, seq_len=args.seq_len, n_experts=args.experts, top_k=args.top_k,
                      capacity_factor=args.capacity_factor, aux_weight=args.aux_weight)
    return TrainConfig(model, dp=args.dp, pp=args.pp, tp=args.tp, schedule=args.schedule,
                       microbatches=args.microbatches, sequence_parallel=args.sequence_parallel,
                       recompute=args.recompute, zero=args.zero, steps=args.steps, batch=args.batch,
                       precision=args.precision or "fp64", lr=args.lr, data="sorting", cp=args.cp,
                       cp_attention=args.cp_attention, clip=args.clip, clip_norm_type=float(args.clip_norm_type),
                       dropout=args.dropout,
                       reshard=args.reshard, order=args.order, ranks_per_node=args.ranks_per_node,
                       **loss_scale_options(args))


def loss_scale_options(args) -> dict:
    """The loss-scale flags given, as TrainConfig fields; refused (one line) with a precision that
    scales nothing: bf16 has float32's exponent range, fp32 and fp64 are float32 and float64."""
    given = {k: getattr(args, k) for k in ("loss_scale", "initial_scale", "growth_interval")
             if getattr(args, k) is not None}
    if given and args.precision != "fp16":
        flag = "--" + next(iter(given)).replace("_", "-")
        why = ("bf16 has float32's exponent range: its gradients need no scale" if args.precision == "bf16"
               else f"{args.precision or 'fp64'} is no 16-bit precision")
        raise UsageError(f"{flag}: only --precision fp16 scales its loss ({why})")
    return given


def add_verbs(verbs):
    """``minipar train``, ``minipar generate``, ``minipar bench train`` and ``minipar run train``."""
    subparsers = verbs.top
    t = subparsers.add_parser("train", help="train the small GPT on a DP x PP x CP x TP grid (with experts over DP)",
                              **_example("minipar train -n 8 --dp 2 --pp 2 --tp 2 --microbatches 2 --steps 5 --compare"))
    add_grid_options(t)
    t.add_argument("--steps", type=steps_type, default=300, help="train until this step (default 300)")
    t.add_argument("--compare", action="store_true", help="also train in one process (float64) and compare the losses")
    t.add_argument("--json", metavar="FILE", type=output_path, help="losses, step times, tokens/s, memory per rank")
    t.add_argument("--trace", metavar="FILE", type=output_path, help="Chrome trace of the second step, a lane per group (tp, cp, pp, dp, emb, ep)")
    t.add_argument("--save", metavar="DIR", help="write sharded checkpoints here")
    t.add_argument("--save-every", type=bounded(10**9, "steps", low=0), default=0, metavar="K", help="checkpoint every K steps (and at the end)")
    t.add_argument("--resume", metavar="DIR", help="continue from this checkpoint, on any grid")
    t.set_defaults(func=cmd_train)
    t.set_defaults(defaults_of_train={flag: t.get_default(flag) for flag in FIXED_BY_CHECKPOINT})

    g = subparsers.add_parser("generate", help="greedy text from a checkpoint, with a KV cache, on TP ranks",
                              **_example('minipar generate --checkpoint ckpt/ -n 2 --tp 2 --prompt "41930>"'))
    g.add_argument("--checkpoint", required=True, metavar="DIR")
    g.add_argument("-n", type=ranks, default=1, help="ranks (= --tp)")
    g.add_argument("--tp", type=ranks, default=1)
    g.add_argument("--prompt", action="append", help="a prompt (repeatable; default: five sorting prompts)")
    g.add_argument("--tokens", type=seq_type, default=8, help="new tokens per prompt (default 8)")
    g.add_argument("--eval", type=bounded(10**6, "prompts", low=0), default=0, metavar="N", help="also N random sorting prompts (seeded), and the accuracy")
    g.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    g.set_defaults(func=cmd_generate)

    p = verbs.bench.add_parser("train", help="tokens/s and MFU of every grid vs one process",
                               description="One job per grid (18 grids of 1 to 8 ranks), the two target ratios in interleaved rounds, then "
                                           "recomputation and decoding: about 2 min on 2 cores with --steps 3.",
                               **with_example("minipar bench train --steps 3 --json bench_train.json"))
    p.add_argument("--steps", type=steps_type, default=3, help="timed steps per grid (after one warm-up)")
    p.add_argument("--batch", type=batch_type, default=32, help="global batch in samples (default 32)")
    p.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "zb-h1"))
    p.add_argument("--rounds", type=bounded(100, "rounds"), default=3,
                   help="interleaved rounds of the two target ratios, their median reported (default 3)")
    p.add_argument("--json", metavar="FILE", type=output_path)
    p.set_defaults(func=cmd_bench_train)

    gp = verbs.bench.add_parser("gpu", help="on a CUDA GPU: the allocator's bytes vs the ledgers, and the TP matmul split",
                                **with_example("minipar bench gpu -n 2 --json gpu.json"))
    gp.add_argument("-n", type=ranks, default=2, help="ranks sharing the GPU (default 2)")
    gp.add_argument("--units", type=bounded(64, "layers"), default=4, help="ZeRO model: Linear layers (default 4)")
    gp.add_argument("--width", type=width_type, default=1024, help="ZeRO model: layer width (default 1024)")
    gp.add_argument("--batch", type=batch_type, default=64, help="ZeRO model: global batch (default 64)")
    gp.add_argument("--mixed", action="store_true", help="ZeRO: float16 working copy + float32 master")
    gp.add_argument("--pp", type=ranks, default=1, help="trainer grid: pipeline stages (default 1)")
    gp.add_argument("--tp", type=ranks, default=2, help="trainer grid: tensor-parallel ranks (default 2)")
    gp.add_argument("--json", metavar="FILE", type=output_path)
    gp.set_defaults(func=gpu_bench.run)

    r = lesson_run_parser(verbs.run, "train", "a small GPT on a DP x PP x TP grid vs one process: losses, "
                          "replicas, activation peak and traffic vs the formulas",
                          "minipar run -n 4 train --backend torch")
    r.set_defaults(func=cmd_run)


def cmd_bench_train(args) -> int:
    return train_bench.run(args, progress=progress)


def cmd_run(args):
    """``minipar run -n 4 train``: the tour's checks of lesson 05 on n ranks (``minipar train``
    is the training run itself)."""
    return run_and_report(args, "3D-parallel GPT against one process", "minipar.lessons.train:tour")


# ----------------------------------------------------------------------------- train


def run_rank(comm, cfg, save=None, save_every=0, resume=None, traced=False):
    """What every rank runs for ``minipar train``: returns the run's record (rank 0's is used)."""
    from ..trace import merge
    from ..train.trainer import train

    start, tr = 0, None
    if resume:
        from ..train.checkpoint import resume as load

        tr, start = load(comm, cfg, resume)
        cfg = tr.cfg
    tokens = cfg.batch * cfg.model.seq_len

    def report(step, rec):
        peak = max(m["total"] for m in rec["memory"])
        print(f"step {step:5d}  loss {rec['loss']:.4f}  tokens/s {tokens / rec['time']:9.0f}  "
              f"step {rec['time'] * 1e3:8.1f} ms  peak/rank {peak / 2**20:7.2f} MiB" + expert_line(rec["experts"])
              + (f"  grad norm {rec['grad_norm']:.3g}" if rec["grad_norm"] is not None else "")
              + (f"  loss scale 2^{math.log2(rec['loss_scale']):.0f}" + (" (overflow: step skipped)" if rec["skipped"] else "")
                 if rec["loss_scale"] is not None else ""), flush=True)

    tr, losses, times = train(comm, cfg, report, trainer=tr, start=start, save=save, save_every=save_every,
                              trace_step=min(start + 1, cfg.steps - 1) if traced else None)
    events = merge(comm) if traced else []
    memory = comm.builtin.allgather_object(dict(tr.memory(), coords=tr.grid.coords, cp=tr.grid.cp_rank, rank=comm.rank))
    return {"start": start, "losses": losses, "step_times_s": times, "memory": memory, "trace": events,
            "unigram_entropy": tr.data.unigram_entropy(), "tokens_per_step": tokens, "experts": tr.history,
            "grad_norms": tr.grad_norms, "loss_scales": tr.scales, "skipped": tr.skipped}


def link_summary(events, n, ranks_per_node) -> dict:
    """Bytes a traced step sent between nodes and inside them (``trace.link_bytes``), all ranks
    together and between nodes per rank."""
    from ..trace import link_bytes

    return dict(link_bytes(events), inter_per_rank=[link_bytes(events, r)["inter"] for r in range(n)])


def expert_line(experts) -> str:
    """The progress line's MoE part: tokens per expert (fewest .. most, over every layer) and
    the tokens dropped (assignments over capacity, all layers)."""
    if not experts:
        return ""
    kept = [k for e in experts.values() for k in e["kept"]]
    routed = sum(sum(e["routed"]) for e in experts.values())
    dropped = routed - sum(kept)
    return f"  tokens/expert {min(kept)}..{max(kept)}  dropped {dropped} ({dropped / routed:.1%})"


# a flag of ``train`` that the checkpoint fixes: where its value is in the checkpoint's index
FIXED_BY_CHECKPOINT = {"d_model": ("model", "d_model"), "layers": ("model", "n_layers"), "heads": ("model", "n_heads"),
                       "seq_len": ("model", "seq_len"), "experts": ("model", "n_experts"), "top_k": ("model", "top_k"),
                       "batch": ("train", "batch"), "lr": ("train", "lr"), "clip": ("train", "clip")}


def contradicts(args, index):
    """Refuse a flag given with ``--resume`` that says otherwise than the checkpoint (the model and
    its training settings come from the checkpoint; silently ignoring the flag would train
    something else than asked). A flag left at its default, or equal to the checkpoint's, is fine."""
    defaults = args.defaults_of_train
    for flag, (part, key) in FIXED_BY_CHECKPOINT.items():
        given, saved = getattr(args, flag), index.get(part, {}).get(key)
        if saved is not None and given != defaults[flag] and given != saved:
            name = "--" + flag.replace("_", "-")
            raise UsageError(f"{name}={given}: the checkpoint {args.resume} was trained with {key}={saved}, and a resumed "
                             f"run continues it as it is; drop {name}, or start a new run without --resume")


def resumed_precision(args, index) -> str:
    """The precision a resumed run trains in: the checkpoint's, or another one said with
    ``--precision``; never another one by default (fp64 after a bf16 run would quietly change
    every number)."""
    saved = saved_precision(index)
    if args.precision is None and saved != "fp64":
        raise UsageError(f"{args.resume} was trained with --precision {saved}; say --precision {saved} to continue "
                         f"it, or another --precision to switch (the master weights carry over)")
    return args.precision or saved


def saved_precision(index) -> str:
    """A checkpoint's precision (written before --precision: its dtype's)."""
    train = index.get("train", {})
    return train.get("precision") or {dtype: p for p, dtype in COMPUTE.items()}.get(train.get("dtype"), "fp64")


def cmd_train(args) -> int:
    from ..launcher import launch
    from ..trace import write_chrome_trace

    try:
        cfg = config_from(args)
        if args.resume:
            from ..train.checkpoint import read_index

            _, index = read_index(args.resume)
            contradicts(args, index)
            cfg = cfg.with_(model=GPTConfig(**index["model"]), batch=index["train"]["batch"],
                            precision=resumed_precision(args, index))
            if args.steps <= index.get("step", 0):
                raise UsageError(f"--steps={args.steps}: the checkpoint is at step {index['step']}, so it trains "
                                 f"until a later step (--steps > {index['step']})")
        check_shapes(cfg, args.n)
        if cfg.model.num_params() > MAX_PARAMS:
            raise UsageError(f"the model has {cfg.model.num_params():,} parameters: at most {MAX_PARAMS:,} "
                             f"are trained on this machine (lower --layers / --d-model)")
        if args.save_every < 0:
            raise UsageError(f"--save-every={args.save_every}: must be >= 0")
        device = _device(args)
    except (UsageError, OSError) as err:
        print(f"minipar train: error: {err}", file=sys.stderr)
        return 2
    m = cfg.model
    moe = f", {m.n_experts} experts (top-{m.top_k}, capacity factor {m.capacity_factor})" if m.n_experts else ""
    cp = f" cp={cfg.cp} ({cfg.cp_attention})" if cfg.cp > 1 else ""
    print(f"minipar train: GPT {m.n_layers} layers x d={m.d_model} x {m.n_heads} heads, T={m.seq_len}{moe}, "
          f"{m.num_params():,} parameters; dp={cfg.dp} pp={cfg.pp}{cp} tp={cfg.tp} on {args.n} ranks "
          f"({args.backend}{', ' + (device or 'cpu') if args.backend == 'torch' else ''})",
          flush=True)
    try:
        out = launch(args.n, "minipar.cli.train:run_rank", backend=args.backend, device=device, quiet=False, cfg=cfg,
                     job_timeout=7 * 24 * 3600.0, save=args.save, save_every=args.save_every, resume=args.resume,
                     traced=bool(args.trace) or bool(cfg.ranks_per_node))
    except LaunchError as err:
        return launch_failed("train", err, echoed=True)
    rec = out.results[0]
    losses, times, start = rec["losses"], rec["step_times_s"], rec["start"]
    steady = times[1:] or times
    tps = rec["tokens_per_step"] * len(steady) / sum(steady)
    print(f"\n{'rank':>4} {'coords (dp,pp,tp)':>18} {'cp':>3} {'params':>10} {'grads':>10} {'optimizer':>10} "
          f"{'activations':>12} {'total MiB':>10}")
    for mem in rec["memory"]:
        print(f"{mem['rank']:>4} {str(tuple(mem['coords'])):>18} {mem['cp']:>3} " + " ".join(
            f"{mem[k] / 2**20:>{w}.3f}" for k, w in (("params", 10), ("grads", 10), ("optimizer", 10),
                                                     ("activations", 12), ("total", 10))))
    print(f"\nsteps {start}..{start + len(losses) - 1}: loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(unigram entropy {rec['unigram_entropy']:.3f}); {tps:,.0f} tokens/s after the first step")
    result = {"losses": losses, "step_times_s": times, "tokens_per_s": tps,
              "memory": [{k: v for k, v in mem.items()} for mem in rec["memory"]], "start_step": start,
              "config": {k: v for k, v in vars(cfg).items() if k != "model"} | {"model": cfg.model.as_dict()}}
    if rec["experts"]:  # per step: {MoE layer: tokens per expert}, and the tokens dropped (all layers)
        result["tokens_per_expert"] = [{k: e["kept"] for k, e in step.items()} for step in rec["experts"]]
        result["routed_per_expert"] = [{k: e["routed"] for k, e in step.items()} for step in rec["experts"]]
        result["dropped_tokens"] = [sum(sum(e["routed"]) - sum(e["kept"]) for e in step.values())
                                    for step in rec["experts"]]
    if cfg.clip is not None:  # per step: the global gradient norm before clipping
        result["grad_norms"] = rec["grad_norms"]
    if rec["loss_scales"]:  # fp16: per step, the loss scale it ran with; the steps every rank skipped
        result["loss_scales"], result["skipped_steps"] = rec["loss_scales"], rec["skipped"]
    if cfg.ranks_per_node:
        result["link_bytes"] = links = link_summary(rec["trace"], args.n, cfg.ranks_per_node)
        print(f"traced step {min(start + 1, cfg.steps - 1)} ({cfg.order} on nodes of {cfg.ranks_per_node}): "
              f"{links['inter']:,} bytes sent between nodes, {links['intra']:,} inside nodes, all ranks together; "
              f"between nodes, per rank: {' '.join(f'{b:,}' for b in links['inter_per_rank'])}")
    ok = True
    if args.compare:
        from ..train.reference import train_reference

        from ..train.precision import tolerances

        same, f64, _ = tolerances(cfg)
        refs = [("one process", cfg.with_(precision="fp64"), f64)]
        if cfg.precision != "fp64":  # and one process computing as the grid does
            refs.insert(0, (f"one process {cfg.precision}", cfg, same))
        runs = [(name, train_reference(c, steps=start + len(losses), progress=progress)[0][start:], tol)
                for name, c, tol in refs]
        print(f"\n{'step':>5} {'this grid':>20}" + "".join(f" {name:>20}" for name, *_ in runs))
        for i, a in enumerate(losses):
            print(f"{start + i:>5} {a:>20.15f}" + "".join(f" {ref[i]:>20.15f}" for _, ref, _ in runs))
        for name, ref, tol in runs:
            err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
            ok = ok and err <= tol
            print(f"max relative difference from {name}: {err:.1e} ({'ok' if err <= tol else 'FAIL'}, tolerance {tol:.0e})")
        result["reference_losses"] = runs[-1][1]  # float64
        if len(runs) > 1:
            result["reference_losses_same_precision"] = runs[0][1]
    if args.trace:
        print(f"trace: {write_chrome_trace(args.trace, rec['trace'], lanes='comm')} (step {start + 1}; "
              f"lanes: compute and one per group: tp, cp, pp, dp, emb, ep; open in https://ui.perfetto.dev)")
    if args.json:
        write_json(args.json, result)
    return 0 if ok else 1


def _device(args) -> str | None:
    """``--device``, checked before any rank starts: cuda needs the torch backend and a GPU."""
    from ..comm import check_backend

    if args.device == "cpu":
        return None
    check_backend(args.backend, args.device)
    from ..comm.torch_backend import require_gpu

    require_gpu()
    return args.device


def launch_failed(verb, err, echoed) -> int:
    """A job whose ranks failed: what they printed once (unless it was already echoed as it ran),
    then the one line saying what went wrong; exit 1. A rank's UsageError goes on to ``main``."""
    if err.usage:
        raise err
    if not echoed and err.output:
        print(err.output.rstrip("\n"), file=sys.stderr)
    print(f"minipar {verb}: error: {err.line}", file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------- generate

PROMPTS = ["41930>", "8812>", "70546>", "392>", "615073>"]


def generate_rank(comm, directory, prompts, tokens):
    from ..train.data import encode
    from ..train.generate import generate, load_model

    model, _ = load_model(comm, directory)
    out = []
    for text in prompts:
        ids, per_token = generate(comm, model, encode(text)[None, :], tokens)
        out.append((ids[0].tolist(), per_token))
    return out


def cmd_generate(args) -> int:
    from ..launcher import launch
    from ..train.checkpoint import read_index
    from ..train.data import decode

    try:
        try:
            _, index = read_index(args.checkpoint)
        except UsageError:
            if os.path.isdir(args.checkpoint) and os.listdir(args.checkpoint):
                raise  # something is there, but not a checkpoint: its own message says what
            raise UsageError(f"{args.checkpoint}: no checkpoint there yet; train one first: "
                             f"minipar train -n 1 --steps 300 --save {args.checkpoint}") from None
        m = GPTConfig(**index["model"])
        if args.n != args.tp:
            raise UsageError(f"-n {args.n}: generation runs on one TP group, so -n must equal --tp={args.tp}")
        for what, size in (("n_heads", m.n_heads), ("vocab", m.vocab), ("d_hidden", m.hidden)):
            if size % args.tp:
                raise UsageError(f"--tp={args.tp}: {what}={size} is not divisible by it")
        prompts = list(args.prompt or PROMPTS)
        if args.eval:
            import numpy as np

            rng = np.random.default_rng(12345)
            prompts += ["".join(map(str, rng.integers(0, 10, rng.integers(3, 7)))) + ">" for _ in range(args.eval)]
        total = max(len(p) for p in prompts) + args.tokens
        if total > m.seq_len:
            raise UsageError(f"--tokens={args.tokens}: prompt + tokens = {total} is longer than the model's seq_len={m.seq_len}")
        from ..train.data import encode

        for p in prompts:
            if not p:
                raise UsageError("--prompt '': a prompt needs at least one character (e.g. \"41930>\")")
            encode(p)
    except (UsageError, ValueError, OSError) as err:
        print(f"minipar generate: error: {err}", file=sys.stderr)
        return 2
    try:
        out = launch(args.n, "minipar.cli.train:generate_rank", backend=args.backend, quiet=True, job_timeout=3600.0,
                     directory=args.checkpoint, prompts=prompts, tokens=args.tokens)
    except LaunchError as err:
        return launch_failed("generate", err, echoed=False)
    right = 0
    for k, (text, (ids, per_token)) in enumerate(zip(prompts, out.results[0])):
        written = decode(ids)[len(text):].split("\n")[0]
        check = ""
        if text.endswith(">") and text[:-1].isdigit():
            good = written == "".join(sorted(text[:-1]))
            right += good
            check = "  (correct)" if good else f"  (wrong: {''.join(sorted(text[:-1]))})"
        if k < 20:
            print(f"{text}{written}{check}    {per_token * 1e3:.2f} ms/token")
    print(f"TP={args.tp}: {right} of {len(prompts)} sorted correctly")
    return 0
