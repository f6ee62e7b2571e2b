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

import dataclasses
import os
import sys

from ..errors import UsageError
from ..launcher import LaunchError
from ..bench import gpu as gpu_bench, train as train_bench
from ..nn.recompute import MODES as RECOMPUTE
from ..train.config import DEFAULT_MODEL, TrainConfig
from ..train.model import GPTConfig
from ..train.parallelize import parallelize
from ..train.precision import LOSS_SCALES, PRECISIONS, check_scale_flags
from ..train.trainer import CP_ATTENTION, SCHEDULES
from ..records import write_json
from .common import (MAX_RANKS, add_field_flag, bounded, checked_device, float_at_most, launch_failed,
                     lesson_run_parser, output_path, positive_float, progress, ranks, run_and_report, shown,
                     with_example)

# Bounds on the model's shape: the model is NumPy (or torch) on this machine, so a shape past
# these is a typo, not a plan; MAX_PARAMS is checked on the product (what the memory must hold).
MAX_PARAMS = 2 * 10**9
_SHAPE = "a model trained on this machine"
layers_type = bounded(4096, _SHAPE)
width_type = bounded(65536, _SHAPE)
seq_type = bounded(65536, _SHAPE)
batch_type = bounded(2**20, _SHAPE)
steps_type = bounded(10**9, "steps")

# ``minipar train``'s flags made from TrainConfig's fields, in the order --help lists them: (flag,
# field, what the flag parses). The default and the help text are the field's (``minipar.layout.knob``;
# a model field's default is the documented model's, ``DEFAULT_MODEL``), so the two cannot differ.
# UNSET flags default to None, "not said": the field's default then, or with --resume the checkpoint's.
UNSET = None
GRID_FLAGS = (
    ("--dp", "dp", dict(type=ranks)),
    ("--pp", "pp", dict(type=ranks)),
    ("--tp", "tp", dict(type=ranks)),
    ("--cp", "cp", dict(type=ranks)),
    ("--cp-attention", "cp_attention", dict(choices=CP_ATTENTION)),
    ("--experts", "model.n_experts", dict(type=bounded(MAX_RANKS * 64, "experts", low=0), metavar="E")),
    ("--top-k", "model.top_k", dict(type=bounded(MAX_RANKS * 64, "experts per token"))),
    ("--capacity-factor", "model.capacity_factor", dict(type=float_at_most(1e3, "past E / k no token is ever dropped"))),
    ("--aux-weight", "model.aux_weight", dict(type=float_at_most(1e3, "a weight next to the loss", inclusive=True))),
    ("--schedule", "schedule", dict(choices=SCHEDULES)),
    ("--microbatches", "microbatches", dict(type=batch_type)),
    ("--sequence-parallel", "sequence_parallel", dict(action="store_true")),
    ("--recompute", "recompute", dict(choices=RECOMPUTE)),
    ("--zero", "zero", dict(type=int)),
    ("--reshard", "reshard", dict(action="store_true")),
    ("--precision", "precision", dict(choices=PRECISIONS, default=UNSET)),
    ("--loss-scale", "loss_scale", dict(choices=LOSS_SCALES, default=UNSET)),
    ("--initial-scale", "initial_scale", dict(type=float_at_most(2.0**64, "fp32 gradients overflow long before"),
                                              default=UNSET, metavar="S")),
    ("--growth-interval", "growth_interval", dict(type=bounded(10**9, "steps"), default=UNSET, metavar="K")),
    ("--ranks-per-node", "ranks_per_node", dict(type=bounded(MAX_RANKS, "ranks per node", low=0), metavar="R")),
    ("--order", "order", dict(metavar="AXES")),
)
MODEL_FLAGS = (
    ("--layers", "model.n_layers", dict(type=layers_type)),
    ("--d-model", "model.d_model", dict(type=width_type)),
    ("--heads", "model.n_heads", dict(type=width_type)),
    ("--seq-len", "model.seq_len", dict(type=seq_type)),
    ("--batch", "batch", dict(type=batch_type)),
    ("--lr", "lr", dict(type=float_at_most(10.0, "Adam diverges long before"))),
    ("--clip", "clip", dict(type=positive_float, metavar="NORM")),
    ("--clip-norm-type", "clip_norm_type", dict(choices=("2", "inf"))),
    ("--dropout", "dropout", dict(type=float, metavar="P")),
)
STEPS_FLAG = ("--steps", "steps", dict(type=steps_type))
FLAGS = (*GRID_FLAGS, *MODEL_FLAGS, STEPS_FLAG)


def _example(text):
    return with_example(text, heading="examples")


def field_of(name: str) -> dataclasses.Field:
    """The dataclass field called ``name`` in TrainConfig, or "model.x" in GPTConfig."""
    cls, key = (GPTConfig, name[6:]) if name.startswith("model.") else (TrainConfig, name)
    return next(f for f in dataclasses.fields(cls) if f.name == key)


def default_of(name: str):
    """The default of field ``name`` as ``minipar train`` runs it (a model field: the documented model's)."""
    if name.startswith("model.") and name[6:] in DEFAULT_MODEL:
        return DEFAULT_MODEL[name[6:]]
    return field_of(name).default


def flag_default(name: str, options: dict):
    """The value a flag for field ``name`` has when not given: UNSET where ``options`` says so, else
    the field's default (as a string where the flag chooses among strings: "2")."""
    if "default" in options:
        return options["default"]
    default = default_of(name)
    return shown(default) if "choices" in options and not isinstance(default, str) else default


def add_train_flag(p, flag: str, name: str, options: dict):
    """``flag`` made from field ``name``: ``add_field_flag`` with the default a run takes."""
    add_field_flag(p, flag, field_of(name), default_of(name), flag_default(name, options), options)


def add_grid_options(p):
    p.add_argument("-n", type=ranks, default=1, help="ranks (default 1); must equal dp x pp x cp x tp")
    for flag in GRID_FLAGS:
        add_train_flag(p, *flag)
    p.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="torch backend: where the ranks compute (cuda: NCCL with a GPU per rank, else gloo with host staging)")
    for flag in MODEL_FLAGS:
        add_train_flag(p, *flag)


def dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def config_from(args) -> TrainConfig:
    """The TrainConfig the flags say: every field flag's value (an UNSET one left to the field's
    default), the documented model's vocabulary, and the sorting task (``minipar train``'s, no flag)."""
    model, train = {"vocab": DEFAULT_MODEL["vocab"]}, {}
    for flag, name, options in FLAGS:
        value = getattr(args, dest(flag), UNSET)
        if value is UNSET and options.get("default", 0) is UNSET:
            continue
        if name == "clip_norm_type":
            value = float(value)
        if name.startswith("model."):
            model[name[6:]] = value
        else:
            train[name] = value
    check_scale_flags(args.precision or default_of("precision"),
                      {flag: train[name] for flag, name, _ in GRID_FLAGS if name in LOSS_SCALE_FIELDS and name in train})
    return TrainConfig(GPTConfig(**model), data="sorting", **train)


LOSS_SCALE_FIELDS = ("loss_scale", "initial_scale", "growth_interval")


def said_flags(args) -> dict:
    """{field: (flag, value)} of the field flags given with a value other than their default."""
    out = {}
    for flag, name, options in FLAGS:
        value = getattr(args, dest(flag), UNSET)
        if value != flag_default(name, options):
            out[name] = (flag, value)
    return out


def add_verbs(verbs):
    """``minipar train``, ``minipar generate``, ``minipar bench train`` and ``minipar run train``."""
    subparsers = verbs.top
    t = subparsers.add_parser("train", help="train the small GPT on a DP x PP x CP x TP grid (with experts over DP)",
                              **_example("minipar train -n 8 --dp 2 --pp 2 --tp 2 --microbatches 2 --steps 5 --compare"))
    add_grid_options(t)
    add_train_flag(t, *STEPS_FLAG)
    t.add_argument("--compare", action="store_true", help="also train in one process (float64) and compare the losses")
    t.add_argument("--json", metavar="FILE", type=output_path, help="losses, step times, tokens/s, memory per rank")
    t.add_argument("--trace", metavar="FILE", type=output_path, help="Chrome trace of the second step, a lane per group (tp, cp, pp, dp, emb, ep)")
    t.add_argument("--save", metavar="DIR", help="write sharded checkpoints here")
    t.add_argument("--save-every", type=bounded(10**9, "steps", low=0), default=0, metavar="K", help="checkpoint every K steps (and at the end)")
    t.add_argument("--resume", metavar="DIR", help="continue from this checkpoint, on any grid")
    t.set_defaults(func=cmd_train)

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
    add_train_flag(p, "--batch", "batch", dict(type=batch_type))
    add_train_flag(p, "--schedule", "schedule", dict(choices=("gpipe", "1f1b", "zb-h1")))
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


def cmd_train(args) -> int:
    from ..launcher import launch
    from ..trace import write_chrome_trace
    from ..train.run import link_summary

    try:
        cfg = config_from(args)
        if args.resume:
            from ..train import checkpoint

            _, index = checkpoint.read_index(args.resume)
            checkpoint.refuse_contradictions(said_flags(args), index, args.resume)
            cfg = cfg.with_(model=GPTConfig(**index["model"]), batch=index["train"]["batch"],
                            precision=checkpoint.resumed_precision(args.precision, index, args.resume))
            if args.steps <= index.get("step", 0):
                raise UsageError(f"--steps={args.steps}: the checkpoint is at step {index['step']}, so it trains "
                                 f"until a later step (--steps > {index['step']})")
        parallelize(cfg, args.n)  # every shape checked before a rank starts (the ranks read the same plan)
        if cfg.model.num_params() > MAX_PARAMS:
            raise UsageError(f"the model has {cfg.model.num_params():,} parameters: at most {MAX_PARAMS:,} "
                             f"are trained on this machine (lower --layers / --d-model)")
        if args.save_every < 0:
            raise UsageError(f"--save-every={args.save_every}: must be >= 0")
        device = checked_device(args)
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
        out = launch(args.n, "minipar.train.run:run_rank", backend=args.backend, device=device, quiet=False, cfg=cfg,
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
        from ..train.reference import train_dense

        from ..train.precision import tolerances

        same, f64, _ = tolerances(cfg)
        refs = [("one process", cfg.with_(precision="fp64"), f64)]
        if cfg.precision != "fp64":  # and one process computing as the grid does
            refs.insert(0, (f"one process {cfg.precision}", cfg, same))
        runs = [(name, train_dense(c, steps=start + len(losses), progress=progress)[0][start:], tol)
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


# ----------------------------------------------------------------------------- generate

PROMPTS = ["41930>", "8812>", "70546>", "392>", "615073>"]


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
        out = launch(args.n, "minipar.train.generate:generate_rank", backend=args.backend, quiet=True, job_timeout=3600.0,
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
