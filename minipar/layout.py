"""How a training run is split over its ranks: the one layout the trainer runs and the planner predicts.

    lay = Layout(dp=2, pp=2, tp=2, schedule="interleaved", microbatches=4)   # chunks: 2
    lay.ranks                          # 8 = dp x pp x cp x tp
    lay.microbatch_size(batch=32)      # b = 32 / (dp x m) = 4 sequences per micro-batch

The trainer's configuration (``minipar.train.config.TrainConfig``) is a layout plus the model, the
data and the optimizer; the planner's (``minipar.plan.config.Config``) is a layout it can print. So
a configuration the trainer ran is one the planner can predict, field for field:
``predict(problem, train_config)``.

Which values are valid is each one's business: the trainer runs ZeRO-1 at most and the
zero-bubble schedule, the planner models ZeRO-1/2/3 and not the zero-bubble schedule
(``train.config.check_shapes``, ``plan.search``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class Layout:
    tp: int = 1  # tensor-parallel ranks: every layer's matrices split over them
    pp: int = 1  # pipeline stages (ranks along the pipeline)
    dp: int = 1  # data-parallel replicas
    cp: int = 1  # context-parallel ranks: every sequence split over them
    zero: int = 0  # ZeRO stage of the data-parallel engine (0: DDP)
    microbatches: int = 1  # m: micro-batches per pipeline per step (the global batch / dp, cut m ways)
    schedule: str = "1f1b"  # the pipeline schedule: "gpipe", "1f1b", "interleaved", "zb-h1"
    chunks: int = 0  # v: model chunks per pipeline rank; 0 means the schedule's own (interleaved 2, else 1)
    recompute: str = "none"  # activation recomputation: "none", "selective", "full"
    sequence_parallel: bool = False  # outside the TP region the activations split over tp too

    def __post_init__(self):
        if not self.chunks:
            object.__setattr__(self, "chunks", 2 if self.schedule == "interleaved" else 1)

    @property
    def ranks(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def microbatch_size(self, batch: int) -> int:
        """b: sequences per micro-batch when the global batch is ``batch`` sequences: B / (dp m)."""
        return batch // (self.dp * self.microbatches)


FIELDS = tuple(f.name for f in fields(Layout))  # what a layout is, in this order
