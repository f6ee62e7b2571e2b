"""ZeRO: data parallelism without the redundancy. Adam (full or mixed precision) wrapped three ways.

    mpiexec -n 4 python -m mpi4py -c "import minipar; from minipar.lessons.data_parallel import zero_check; \
        print(zero_check(minipar.init()))"

    from minipar.zero import ZeRO
    engine = ZeRO(comm, model, stage=2, lr=1e-3, precision="fp16")   # stage 0 is plain DDP
    loss = engine.train_step(x_local, y_local)
    engine.measured_memory()    # peak bytes of params / grads / optimizer state this rank held
    engine.predicted_memory()   # the ZeRO paper's formula (+ padding, + the gathered layers)

Plain data parallelism (DDP) keeps on every one of N ranks the whole model: with mixed-precision
Adam 2 bytes of weights, 2 of gradients and K = 12 of optimizer state per parameter. ZeRO shards
them, like backpackers sharing one tent, one stove and one axe instead of each carrying all
three: every rank keeps 1/N of each piece and hands it over when someone needs it.

    stage 1  optimizer state     2 Psi + 2 Psi + K Psi/N      traffic 2 Psi per step (= DDP)
    stage 2  + gradients         2 Psi + (2 + K) Psi/N        traffic 2 Psi
    stage 3  + parameters        (2 + 2 + K) Psi/N            traffic 3 Psi (params gathered twice)
    offload  optimizer state and its update on the host (``offload="cpu"``), or in a memory-
             mapped file on disk (``offload="nvme"`` or ``NVMe(path)``, ZeRO-Infinity)

Traffic in parameter-sized units per rank, times the ring's (N-1)/N.

    engines.py          ZeRO1, ZeRO2, ZeRO3 (each subclasses the one before)
    tiling.py           Memory-Centric Tiling: a Linear too large to gather whole, tile by tile under ZeRO-3
    torch_reference.py  the same training with torch's ZeroRedundancyOptimizer and FSDP2
"""
from __future__ import annotations

from ..data_parallel.ddp import DDP
from ..mixed_precision import NVMe
from .engines import ZeRO1, ZeRO2, ZeRO3, swap
from .tiling import tiled_linear

__all__ = ["ZeRO", "ZeRO1", "ZeRO2", "ZeRO3", "STAGES", "engine_args", "swap", "NVMe", "tiled_linear"]

# The one map from a ZeRO stage to its engine. Stage 0 is DDP with one bucket per unit: the same
# padded units as the sharded stages, so its ring all-reduce adds in the order of their
# reduce-scatter, and every stage is bitwise stage 0 (lesson 04's and lesson 05's baseline alike).
STAGES = {0: DDP, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}


def engine_args(stage: int, pipelined: bool = False, reshard: bool = False, groups=None) -> dict:
    """The arguments that go with the engine of ZeRO ``stage`` (``STAGES[stage]``).

    stage 0      one bucket per unit (``bucket_bytes=0``): the bitwise baseline
    pipelined    the executor runs the micro-batches and the engine only brackets the step: stages
                 2 and 3 keep every unit's full gradient open until the flush (``whole_step``), and
                 stage 3 gathers every unit once per step (torchtitan's choice under PP), or with
                 ``reshard`` leaves the gathering to the caller, group by group (``groups``), with
                 no prefetch
    """
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage={stage!r}: choose 0 (DDP), 1, 2 or 3")
    if reshard and not (pipelined and stage == 3):
        raise ValueError(f"reshard with stage={stage}{'' if pipelined else ', not pipelined'}: only a pipelined "
                         f"ZeRO-3 gathers weights to reshard")
    if stage == 0:
        return {"bucket_bytes": 0}
    kw = {"whole_step": True} if pipelined and stage >= 2 else {}
    if pipelined and stage == 3:
        kw.update(reshard=reshard, prefetch=False, groups=groups)
    return kw


def ZeRO(comm, model, stage=1, pipelined=False, reshard=False, groups=None, prefetch=None, **kw):
    """The engine for ``stage`` (0 = DDP with one bucket per unit, the bitwise baseline), with the
    arguments ``engine_args`` gives it; ``prefetch`` (stage 3 alone; default on, off when pipelined)."""
    args = engine_args(stage, pipelined, reshard, groups)
    if stage == 3 and prefetch is not None:
        args["prefetch"] = prefetch
    return STAGES[stage](comm, model, **args, **kw)
