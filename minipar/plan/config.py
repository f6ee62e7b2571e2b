"""A training problem and its configurations, as columns the models evaluate all at once.

    prob = Problem(model("gpt3-175b"), gpus=1024, gpus_per_node=8, hw=preset("a100-80gb"), batch=1536)
    cfgs = Configs.of([Config(tp=8, pp=16, dp=8, microbatch=1, schedule="interleaved", chunks=2,
                              recompute="selective", sequence_parallel=True)])
    cfgs.tp            # numpy array, one entry per configuration

Every formula in ``memory`` and ``timing`` is written on these columns with numpy operations, so
one call evaluates one configuration or a hundred thousand (the search) with the same code.

Placement (Megatron's order, fastest first: tp, cp, dp, pp): the tp ranks of a group are
neighbours, so a tp group stays inside a node when tp <= GPUs per node; the data-parallel group
(dp x cp ranks, stride tp) spans nodes once tp*cp*dp > GPUs per node.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .hardware import Hardware
from .models import ModelSpec

SCHEDULES = ("1f1b", "interleaved", "gpipe")
RECOMPUTE = ("none", "selective", "full")
KEYS = ("tp", "pp", "dp", "cp", "zero", "microbatch", "schedule", "chunks", "recompute", "sequence_parallel")


@dataclass(frozen=True)
class Problem:
    model: ModelSpec
    gpus: int
    gpus_per_node: int
    hw: Hardware
    batch: int  # global batch, sequences per step
    offload: bool = False  # ZeRO-Offload: optimizer state and step on the host
    overlap_dp: bool = True  # the gradient all-reduce overlaps the last backward (False: after it)

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
        training dtype (m and v) for a full-precision run such as minipar's float64 ranks."""
        if self.hw.mixed_precision:
            return 2, 2, 12
        e = self.hw.dtype_bytes
        return e, e, 2 * e


@dataclass(frozen=True)
class Config:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    zero: int = 0
    microbatch: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False

    def describe(self) -> str:
        s = f"tp={self.tp} pp={self.pp} dp={self.dp}"
        s += f" cp={self.cp}" if self.cp > 1 else ""
        s += f" zero={self.zero} mb={self.microbatch}"
        if self.pp > 1:
            s += f" {self.schedule}" + (f"x{self.chunks}" if self.schedule == "interleaved" else "")
        s += f" recompute={self.recompute}" + (" sp" if self.sequence_parallel else "")
        return s


class Configs:
    """Columns of configurations (numpy arrays, same length)."""

    def __init__(self, **cols):
        n = {len(v) for v in cols.values()}
        assert len(n) == 1, "columns of different lengths"
        self.cols = {k: np.asarray(v) for k, v in cols.items()}
        for k in KEYS:
            setattr(self, k, self.cols[k])

    @classmethod
    def of(cls, configs) -> "Configs":
        configs = list(configs)
        return cls(**{k: [getattr(c, k) for c in configs] for k in KEYS})

    def __len__(self):
        return len(self.tp)

    def take(self, idx) -> "Configs":
        return Configs(**{k: v[idx] for k, v in self.cols.items()})

    def config(self, i: int) -> Config:
        kw = {f.name: self.cols[f.name][i].item() for f in fields(Config)}
        return Config(**kw)


def layers_per_rank(prob: Problem, pp):
    """Blocks on the busiest pipeline rank: ceil(L / pp) (Megatron needs L % pp == 0;
    DeepSpeed spreads the rest, one extra layer on some stages)."""
    return -(-prob.model.layers // np.asarray(pp))


def microbatches(prob: Problem, cfg: Configs):
    """Micro-batches per pipeline per step: B / (dp * microbatch)."""
    return prob.batch // (cfg.dp * cfg.microbatch)

