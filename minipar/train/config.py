"""What a training run is: the grid, the schedule, the model, the data; and what fits.

    cfg = TrainConfig(GPTConfig(), dp=2, pp=2, tp=2, cp=2, schedule="1f1b", microbatches=4)
    check_shapes(cfg, world=16)     # pure: raises UsageError naming the first dimension that does not fit

A TrainConfig is a ``minipar.layout.Layout`` (dp, pp, tp, cp, schedule, micro-batches, chunks,
ZeRO, recomputation, sequence parallelism: the fields the planner predicts, under the same names)
plus the model, the data and the optimizer. Its defaults are the one set: ``minipar train``'s
flags are made from the fields (each field's default, and its help text, ``minipar.layout.knob``).
``check_shapes`` is called by ``parallelize`` (``minipar.train.parallelize``): by the command line
before launching any rank, by every rank again as it builds its trainer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import UsageError
from ..grid import ORDER, parse_order
from ..layout import Layout, knob
from ..nn.recompute import MODES as RECOMPUTE
from .data import VOCAB, Data
from .model import GPTConfig
from .precision import COMPUTE, PRECISIONS, check_loss_scale, policy  # noqa: F401 (PRECISIONS re-exported)

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
CP_ATTENTION = ("ring", "ulysses")
# the documented model of ``minipar train`` and ``minipar bench train``: the sorting task, ~400k
# parameters (docs/train.md)
DEFAULT_MODEL = dict(vocab=96, d_model=64, n_heads=8, n_layers=8, seq_len=32)


@dataclass(frozen=True)
class TrainConfig(Layout):
    """A training run: a layout, the model, the data, the optimizer and the precision. Its defaults
    are the one set: ``minipar train``'s flags are made from these fields (their defaults and help
    texts, ``minipar.cli.train``); the lessons' checks say their own small settings
    (``minipar.lessons.train.CHECKS``)."""

    model: GPTConfig = field(default_factory=GPTConfig)
    steps: int = knob(300, "train until this step (default {default})")
    batch: int = knob(32, "global batch in samples (default {default})")  # in samples of model.seq_len tokens
    precision: str = knob("fp64", "{default} (default) or fp32: everything in it; bf16 or fp16: 16-bit weights and "
                                  "activations, float32 gradients, master weights and Adam state (docs/train.md). "
                                  "With --resume: the checkpoint's, and another only when said here")  # PRECISIONS
    lr: float = knob(3e-3, "learning rate, > 0 and at most 10 (default {default})")
    seed: int = 0  # the model's initial weights
    data: str = "random"  # "random" (checks) or "sorting" (the task ``minipar train`` trains: it has no flag)
    data_seed: int = 1
    cp_attention: str = knob("ring", "the attention core over cp (default {default})")  # "ring" or "ulysses"
    clip: float | None = knob(None, "clip the gradients to this global L2 norm before Adam, every parameter counted "
                                    "once (default: no clipping)")
    # the clip's norm: 2.0 (L2) or inf (the largest |gradient element|), torch's norm_type
    clip_norm_type: float = knob(2.0, "the clip's norm: 2, the L2 norm (default), or inf, the largest |gradient "
                                      "element| over every rank")
    # p of every dropout site (minipar.nn.dropout: the same masks on every grid)
    dropout: float = knob(0.0, "drop activations with probability P in [0, 1) after the embedding, after attention, "
                               "after the MLP and in its hidden layer, and the attention probabilities; each mask is "
                               "a function of the element's global index: the same on every grid (default {default})")
    loss_scale: str = knob("dynamic", "fp16 only: {default} (the default, and the only one fp16 accepts): halve on an "
                                      "overflow, that step skipped on every rank; double after --growth-interval "
                                      "clean steps")  # or "static"
    # fp16: the loss scale of the first step (torch.amp.GradScaler's default)
    initial_scale: float = knob(2.0**16, "fp16: the first step's loss scale, a power of 2 (default {default})")
    growth_interval: int = knob(2000, "fp16: clean steps in a row before the loss scale doubles (default {default})")
    # ZeRO-3: gather a stage's weights around every pipeline action, not once per step
    reshard: bool = knob(False, "with --zero 3: gather a stage's weights before every pipeline action and free them "
                                "after (2m gathers a step instead of one; docs/train.md says when that pays)")
    # how the grid's axes are laid out on the ranks, fastest first (Megatron's order string)
    order: str = knob(ORDER, "the grid's axes on the ranks, fastest first, as Megatron's order string (default "
                             "{default}: TP partners on neighbouring ranks, inside a node; dp-tp-cp-pp puts DP inside, "
                             "TP across)")
    # ranks on each node, in blocks (0: one node); the trace marks messages between nodes
    ranks_per_node: int = knob(0, "the ranks sit on nodes of R, in blocks (rank w on node w // R), as mpiexec's host "
                                  "list and torchrun place them; one step is traced and the bytes sent between nodes "
                                  "are reported (default {default}: one node)")

    def with_(self, **kw) -> "TrainConfig":
        return replace(self, **kw)

    @property
    def dtype(self) -> str:
        """The compute dtype's name ("float64", "float32", "bfloat16", "float16"): the weights'
        and the activations' (read only; ``precision`` says it)."""
        return COMPUTE.get(self.precision, self.precision)


def make_data(cfg: TrainConfig) -> Data:
    if cfg.data == "sorting":
        return Data.sorting(cfg.data_seed)
    return Data.random(cfg.model.vocab, seed=cfg.data_seed)


def check_shapes(cfg: TrainConfig, world: int | None = None) -> None:
    """Raise UsageError naming the first dimension that does not fit the grid.

    Pure: ``parallelize`` calls it, the command line before launching, every rank again.
    """
    m = cfg.model
    for name in ("dp", "pp", "tp", "cp", "microbatches", "steps", "batch"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"--{name}={v!r}: must be a positive integer")
    if cfg.schedule not in SCHEDULES:
        raise UsageError(f"--schedule={cfg.schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if cfg.recompute not in RECOMPUTE:
        raise UsageError(f"--recompute={cfg.recompute!r}: choose one of {', '.join(RECOMPUTE)}")
    if isinstance(cfg.zero, bool) or cfg.zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero={cfg.zero!r}: choose 0 (DDP), 1, 2 or 3 (what ZeRO shards: optimizer state, "
                         f"+ gradients, + weights)")
    if cfg.reshard and cfg.zero != 3:
        raise UsageError(f"--reshard with --zero={cfg.zero}: only ZeRO-3 gathers weights to reshard")
    if cfg.clip is not None and (isinstance(cfg.clip, bool) or not isinstance(cfg.clip, (int, float))
                                 or not 0 < cfg.clip < float("inf")):
        raise UsageError(f"--clip={cfg.clip!r}: the largest global gradient norm, a number > 0")
    if cfg.clip_norm_type not in (2.0, float("inf")) or isinstance(cfg.clip_norm_type, bool):
        raise UsageError(f"--clip-norm-type={cfg.clip_norm_type!r}: choose 2 (the L2 norm) or inf (the largest element)")
    if isinstance(cfg.dropout, bool) or not isinstance(cfg.dropout, (int, float)) or not 0 <= cfg.dropout < 1:
        raise UsageError(f"--dropout={cfg.dropout!r}: the probability of dropping an activation, in [0, 1)")
    policy(cfg.precision)  # a UsageError for an unknown one
    try:
        parse_order(cfg.order)
    except ValueError as e:
        raise UsageError(f"--order: {e}") from None
    rpn = cfg.ranks_per_node
    if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 0 or (rpn and cfg.ranks % rpn):
        raise UsageError(f"--ranks-per-node={rpn!r}: must divide the {cfg.ranks} ranks (dp x pp x cp x tp) into "
                         f"nodes of equal size")
    check_loss_scale(cfg.precision, cfg.loss_scale, cfg.initial_scale, cfg.growth_interval)
    n = cfg.ranks
    if world is not None and n != world:
        cp = f" x cp={cfg.cp}" if cfg.cp > 1 else ""
        raise UsageError(f"-n {world}: the grid dp={cfg.dp} x pp={cfg.pp}{cp} x tp={cfg.tp} needs {n} ranks")
    if m.d_model % m.n_heads:
        raise UsageError(f"d_model={m.d_model} is not divisible by n_heads={m.n_heads}")
    for what, size in (("n_heads", m.n_heads), ("vocab", m.vocab), ("d_hidden", m.hidden)):
        if size % cfg.tp:
            raise UsageError(f"--tp={cfg.tp}: {what}={size} is not divisible by it")
    if cfg.cp_attention not in CP_ATTENTION:
        raise UsageError(f"--cp-attention={cfg.cp_attention!r}: choose one of {', '.join(CP_ATTENTION)}")
    if cfg.cp > 1 and m.seq_len % (2 * cfg.cp):
        raise UsageError(f"--cp={cfg.cp}: seq_len={m.seq_len} is not divisible by 2 x cp = {2 * cfg.cp} "
                         f"(zigzag: every rank holds two of 2cp equal chunks)")
    if cfg.cp > 1 and cfg.cp_attention == "ulysses" and (m.n_heads // cfg.tp) % cfg.cp:
        raise UsageError(f"--cp-attention=ulysses: the {m.n_heads // cfg.tp} heads of a TP rank "
                         f"(n_heads / tp) are not divisible by --cp={cfg.cp}")
    if cfg.sequence_parallel and (m.seq_len // cfg.cp) % cfg.tp:
        raise UsageError(f"--sequence-parallel: seq_len={m.seq_len}" + (f" / cp = {m.seq_len // cfg.cp}" if cfg.cp > 1 else "")
                         + f" is not divisible by --tp={cfg.tp}")
    check_experts(cfg)
    if (cfg.schedule == "interleaved") != (cfg.chunks > 1):
        raise UsageError(f"chunks={cfg.chunks} with --schedule={cfg.schedule}: the interleaved schedule runs 2 or "
                         f"more model chunks per pipeline rank, the others one")
    stages = cfg.pp * cfg.chunks
    if m.n_layers % stages:
        raise UsageError(f"--pp={cfg.pp}: n_layers={m.n_layers} is not divisible by pp x chunks = {stages}"
                         + (f" (interleaved: {cfg.chunks} chunks per rank)" if cfg.chunks > 1 else ""))
    if cfg.batch % (cfg.dp * cfg.microbatches):
        raise UsageError(f"--batch={cfg.batch} is not divisible by dp x microbatches = "
                         f"{cfg.dp} x {cfg.microbatches}")
    if cfg.schedule == "interleaved" and cfg.microbatches % cfg.pp:
        raise UsageError(f"--schedule=interleaved: --microbatches={cfg.microbatches} is not divisible by --pp={cfg.pp}")
    if cfg.data == "sorting" and m.vocab != VOCAB:
        raise UsageError(f"the sorting task has vocab {VOCAB}, the model {m.vocab}")


def check_experts(cfg: TrainConfig) -> None:
    """The mixture-of-experts options: E experts sharded over the dp group (ep = dp)."""
    m = cfg.model
    if not m.n_experts:
        return
    if not isinstance(m.n_experts, int) or m.n_experts < 1:
        raise UsageError(f"--experts={m.n_experts!r}: must be a positive integer")
    if m.n_experts % cfg.dp:
        raise UsageError(f"--experts={m.n_experts} is not divisible by --dp={cfg.dp} "
                         f"(the experts are sharded over the data-parallel ranks)")
    if not 1 <= m.top_k <= m.n_experts:
        raise UsageError(f"--top-k={m.top_k}: choose 1 <= k <= --experts={m.n_experts}")
    if not m.capacity_factor > 0:
        raise UsageError(f"--capacity-factor={m.capacity_factor}: must be > 0")
    if m.aux_weight < 0:
        raise UsageError(f"--aux-weight={m.aux_weight}: must be >= 0")
    if cfg.cp > 1:
        raise UsageError(f"--experts with --cp={cfg.cp}: not supported (a cp rank's tokens are not "
                         f"consecutive, so its capacity groups have no one-process equivalent)")
    if cfg.sequence_parallel:
        raise UsageError("--experts with --sequence-parallel: not supported (the experts would see "
                         "T/tp tokens per TP rank; run the MoE on replicated tokens)")
