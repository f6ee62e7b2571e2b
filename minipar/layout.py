"""How a training run is split over its ranks: the one layout the trainer runs and the planner predicts.

    lay = Layout(dp=2, pp=2, tp=2, schedule="interleaved", microbatches=4)   # chunks: 2
    lay.ranks                          # 8 = dp x pp x cp x tp
    lay.microbatch_size(batch=32)      # b = 32 / (dp x m) = 4 sequences per micro-batch

The trainer's configuration (``minipar.train.config.TrainConfig``) is a layout plus the model, the
data and the optimizer; the planner's (``minipar.plan.config.Config``) is a layout it can print. So
a configuration the trainer ran is one the planner can predict, field for field:
``predict(problem, train_config)``.

Which values are valid is each one's business: the trainer runs ZeRO-0 to 3 (``--reshard`` with 3)
and every schedule, the zero-bubble one included; the planner models ZeRO-0 to 3 and not the
zero-bubble schedule (``train.config.check_shapes``, ``plan.search``).

Each field's ``help`` (``dataclasses.fields(Layout)[i].metadata``) is the one text that says what it
means: ``minipar train``'s flags are made from the fields, their defaults and that text
(``minipar.cli.train``), so a flag cannot say another default than the field holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


def knob(default, help: str = "") -> field:
    """A field with its default and, for the command line, its help text (``{default}`` in it is
    replaced by the default as the command line shows it)."""
    return field(default=default, metadata={"help": help} if help else {})


@dataclass(frozen=True, kw_only=True)
class Layout:
    tp: int = knob(1, "tensor-parallel ranks")  # every layer's matrices split over them
    pp: int = knob(1, "pipeline stages (ranks)")  # ranks along the pipeline
    dp: int = knob(1, "data-parallel replicas")
    cp: int = knob(1, "context-parallel ranks: the sequence split over them (zigzag)")
    zero: int = knob(0, "0: DDP; 1: ZeRO-1 (Adam state sharded over dp x cp); 2: + the gradients, reduce-scattered "
                        "once per step after the flush; 3: + the weights, gathered once per step (FSDP, each TP "
                        "rank sharding its own TP shard)")  # the ZeRO stage of the data-parallel engine (0: DDP)
    microbatches: int = knob(1, "micro-batches per step and DP replica")  # m: the global batch / dp, cut m ways
    schedule: str = "1f1b"  # the pipeline schedule: "gpipe", "1f1b", "interleaved", "zb-h1"
    chunks: int = 0  # v: model chunks per pipeline rank; 0 means the schedule's own (interleaved 2, else 1)
    recompute: str = "none"  # activation recomputation: "none", "selective", "full"
    # outside the TP region the activations split over tp too
    sequence_parallel: bool = knob(False, "Megatron-SP: LayerNorms and residuals on T/tp tokens")

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
