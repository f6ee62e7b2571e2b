"""ZeRO: data parallelism without the redundancy. Adam (full or mixed precision) wrapped three ways.

    mpiexec -n 4 python -m mpi4py -c "import minipar; from minipar.lessons.data_parallel import zero_check; \
        print(zero_check(minipar.init()))"

    from minipar.zero import ZeRO
    engine = ZeRO(comm, model, stage=2, lr=1e-3, mixed=True)   # stage 0 is plain DDP
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

from ..mixed_precision import NVMe
from .engines import STAGES, ZeRO1, ZeRO2, ZeRO3, swap
from .tiling import tiled_linear

__all__ = ["ZeRO", "ZeRO1", "ZeRO2", "ZeRO3", "STAGES", "swap", "NVMe", "tiled_linear"]


def ZeRO(comm, model, stage=1, **kw):
    """The engine for ``stage`` (0 = DDP with one bucket per unit, the bitwise baseline)."""
    if stage == 0:
        from ..data_parallel import DDP

        kw.pop("prefetch", None)
        return DDP(comm, model, bucket_bytes=0, **kw)
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: choose 0 (DDP), 1, 2 or 3")
    if stage != 3:
        kw.pop("prefetch", None)
    return STAGES[stage](comm, model, **kw)
