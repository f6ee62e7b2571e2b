"""A training problem and its configurations, as columns the models evaluate all at once.

    prob = Problem(model("gpt3-175b"), gpus=1024, gpus_per_node=8, hw=preset("a100-80gb"), batch=1536)
    cfgs = Configs.of([Config(tp=8, pp=16, dp=8, microbatches=192, schedule="interleaved", chunks=2,
                              recompute="selective", sequence_parallel=True)])
    cfgs.tp            # numpy array, one entry per configuration
    microbatch_size(prob, cfgs)   # b = B / (dp m): 1 sequence per micro-batch

A configuration is a ``minipar.layout.Layout``, the trainer's fields under the trainer's names:
m micro-batches per pipeline per step, from which the micro-batch size b follows (the papers and
``minipar plan --microbatch`` state b; the formulas use b).

Every formula in ``memory`` and ``timing`` is written on these columns with numpy operations, so
one call evaluates one configuration or a hundred thousand (the search) with the same code.

Placement (Megatron's order, fastest first: tp, cp, dp, pp): the tp ranks of a group are
neighbours, so a tp group stays inside a node when tp <= GPUs per node; the data-parallel group
(dp x cp ranks, stride tp) spans nodes once tp*cp*dp > GPUs per node.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..layout import FIELDS, Layout
from ..memory import Precision
from .hardware import Hardware
from .models import ModelSpec


# The engines' ZeRO-3 conventions (docs/planner.md, "ZeRO-3 / FSDP at scale"):
# - fsdp: PyTorch FSDP, one unit per transformer block (its flat parameter): the unit computing and
#   the one prefetched are live, gathered by NCCL rings that use every NIC of a node (the two-level
#   collective of ``timing.dp_collective``); the next unit's gather hides behind this one's compute;
# - deepspeed: DeepSpeed ZeRO-3, parameters fetched module by module (each Linear), at most
#   stage3_max_live_parameters of them live (its default 1e9), each rank's gather over its own
#   inter-node link (flat: every gathered byte crosses it); a prefetch only as far as that bound;
# - megatron: Megatron-LM's distributed optimizer, ZeRO-1 at most (no ZeRO-2/3).
ENGINES = ("fsdp", "deepspeed", "megatron")
DEEPSPEED_MAX_LIVE = 1e9  # stage3_max_live_parameters, DeepSpeed's default (its ZeRO config docs)
DEEPSPEED_REDUCE_BUCKET = 5e8  # reduce_bucket_size, DeepSpeed's default: gradient elements reduced at once


@dataclass(frozen=True)
class Problem:
    model: ModelSpec
    gpus: int
    gpus_per_node: int
    hw: Hardware
    batch: int  # global batch, sequences per step
    offload: bool = False  # ZeRO-Offload: optimizer state and step on the host
    overlap_dp: bool = True  # the gradient all-reduce overlaps the last backward (False: after it)
    precision: Precision | None = None  # Megatron's bytes per parameter; None: the ZeRO paper's (below)
    engine: str = "fsdp"  # whose ZeRO-3 conventions (ENGINES): what stays live, how the gathers travel

    def __post_init__(self):
        self.matmul_peak  # refuse a precision the hardware has no rate for (fp8 on an A100), now
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: choose one of {', '.join(ENGINES)}")

    @property
    def matmul_peak(self) -> float:
        """Dense FLOP/s of the matmuls: the hardware's rate in the precision's dtype (fp8 runs the
        matmuls at the fp8 rate, nothing else changes), or its 16-bit peak."""
        return self.hw.matmul_peak(self.precision.params if self.precision is not None else None)

    @property
    def ranks_on_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    @property
    def intra(self):
        """The intra-node link as these ranks see it (this machine, oversubscribed: slower)."""
        return self.hw.shared_link(self.hw.intra, self.ranks_on_node)

    @property
    def inter(self):
        return self.hw.shared_link(self.hw.inter, self.ranks_on_node)

    @property
    def capacity(self) -> float:
        return self.hw.capacity(self.ranks_on_node)

    def bytes_per_param(self):
        """(working param, gradient, optimizer K) bytes: mixed-precision Adam, or Adam in the
        training dtype (m and v) for a full-precision run such as minipar's float64 ranks; with a
        ``precision``, Megatron's convention for it (``minipar.memory.Precision``)."""
        if self.precision is not None:
            return self.precision.bytes
        if self.hw.mixed_precision:
            return 2, 2, 12
        e = self.hw.dtype_bytes
        return e, e, 2 * e


@dataclass(frozen=True)
class Config(Layout):
    """The planner's configuration: a layout, printed the way ``minipar plan`` lists it, and the
    expert-parallel ranks ``ep`` (a mixture of experts' experts split over ep of the dp ranks, as
    Megatron's expert_model_parallel_size; lesson 05's trainer splits them over all of dp, and a
    layout without ``ep`` is predicted with ep = 1)."""

    ep: int = 1

    def describe(self, batch: int) -> str:
        """One line, e.g. "tp=8 pp=16 dp=8 zero=1 mb=1 interleavedx2 recompute=selective sp" (mb:
        sequences per micro-batch when the global batch is ``batch``)."""
        s = f"tp={self.tp} pp={self.pp} dp={self.dp}"
        s += f" cp={self.cp}" if self.cp > 1 else ""
        s += f" ep={self.ep}" if self.ep > 1 else ""
        s += f" zero={self.zero} mb={self.microbatch_size(batch)}"
        if self.pp > 1:
            s += f" {self.schedule}" + (f"x{self.chunks}" if self.schedule == "interleaved" else "")
        s += f" recompute={self.recompute}" + (" sp" if self.sequence_parallel else "")
        return s


PLAN_FIELDS = (*FIELDS, "ep")  # a planner configuration's fields (the layout's, and ep)


class Configs:
    """Columns of configurations (numpy arrays, same length)."""

    def __init__(self, **cols):
        n = {len(v) for v in cols.values()}
        assert len(n) == 1, "columns of different lengths"
        self.cols = {k: np.asarray(v) for k, v in cols.items()}
        for k in PLAN_FIELDS:
            setattr(self, k, self.cols[k])

    @classmethod
    def of(cls, configs) -> "Configs":
        configs = list(configs)
        return cls(**{k: [getattr(c, k, 1) for c in configs] for k in PLAN_FIELDS})

    def __len__(self):
        return len(self.tp)

    def take(self, idx) -> "Configs":
        return Configs(**{k: v[idx] for k, v in self.cols.items()})

    def config(self, i: int) -> Config:
        return Config(**{k: self.cols[k][i].item() for k in PLAN_FIELDS})


def layers_per_rank(prob: Problem, pp):
    """Blocks on the busiest pipeline rank: ceil(L / pp) (Megatron needs L % pp == 0;
    DeepSpeed spreads the rest, one extra layer on some stages)."""
    return -(-prob.model.layers // np.asarray(pp))


def microbatch_size(prob: Problem, cfg: Configs):
    """b: sequences per micro-batch, B / (dp m) (``Layout.microbatch_size`` on the columns)."""
    return prob.batch // (cfg.dp * cfg.microbatches)

