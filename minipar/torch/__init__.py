"""Lessons 02 and 04 for any ``torch.nn.Module``: DDP, a sharded optimizer, FSDP, a TP plan.

    import torch.distributed as dist
    from minipar.torch import DistributedDataParallel, ShardedOptimizer, FullyShardedDataParallel, parallelize

    dist.init_process_group("gloo")             # your script's own group (torchrun, mp.spawn)
    ddp = DistributedDataParallel(model, bucket_size_mb=1)

The engines take a ``torch.nn.Module`` trained with autograd and a ``torch.optim`` optimizer,
as torch's own do, and send every message through minipar's collectives (rings on send/recv)
on a minipar communicator: the trace sees each one, and each engine's ``bytes_per_step`` says
what it must send. ``comm=None`` takes ``minipar.init("torch")``'s world, else a communicator
over the default process group the script made (``group.communicator``). docs/torch.md
compares each engine with torch's.

    ddp.py    DistributedDataParallel: gradients all-reduced in buckets as autograd completes them
    optim.py  ShardedOptimizer: any torch.optim class, its state split over the ranks (ZeRO-1, -2)
    fsdp.py   FullyShardedDataParallel: units' weights sharded, gathered per unit (ZeRO-3), compute_dtype
    unit.py   one unit's flat shard: the gather / free / gather again / reduce-scatter around it
    tp.py     parallelize: Megatron's colwise / rowwise / sequence splits, f and g as autograd functions
    group.py  the communicator, the broadcast at construction, the ring's bytes
"""
from __future__ import annotations

from .ddp import DistributedDataParallel
from .fsdp import FullyShardedDataParallel
from .optim import ShardedOptimizer
from .tp import parallelize

__all__ = ["DistributedDataParallel", "ShardedOptimizer", "FullyShardedDataParallel", "parallelize"]
