"""Adam on one flat 1-D array, in full or mixed precision, optionally offloaded to the host.

    opt = FlatAdam(param, init, lr=1e-3, mixed=True)   # param: float16 working copy (a shard)
    opt.step(param, grad)                               # grad (float16) -> fp32 Adam -> param

What DDP and every ZeRO stage run on the parameters they own: DDP on whole flat buckets, ZeRO on
one rank's shard of each flat layer. Adam is elementwise, so the shard of an update is the
update of the shard, bit for bit.

Bytes per parameter (the ZeRO paper's notation: 2 + 2 + K):

    precision  working params  grads  optimizer state (K)
    full       itemsize        itemsize  m, v in the param dtype: 2 x itemsize (16 for float64)
    mixed      2 (float16)     2      fp32 master + fp32 m + fp32 v = 4 + 4 + 4 = 12

Mixed precision: forward and backward run on the float16 working copy; the update happens on
the float32 master weights (a small update added to a float16 weight would round away), and
the new master is rounded back into the working copy. Real trainers add loss scaling against
float16 gradient underflow; our gradients are O(0.1), so it is left out. (bfloat16 would need
no scaling but NumPy has no bfloat16.)

Offload (ZeRO-Offload): master, m and v live on the host as NumPy arrays; each step copies the
gradient shard to the host, updates there, and copies the new working values back. With the
MPI backend everything is already on the host, so this only moves the bookkeeping; with torch
on CUDA it moves 12 bytes per owned parameter off the GPU.
"""
from __future__ import annotations

import numpy as np

from .optim import adam_step
from .xp import copy, from_numpy, namespace, to_numpy

LOW = "float16"  # the working dtype of mixed precision
MASTER = "float32"


def working_dtype(like, mixed: bool):
    """The dtype forward/backward run in: float16 when mixed, else the dtype of ``like``."""
    return getattr(namespace(like), LOW) if mixed else like.dtype


def astype(x, dtype):
    return namespace(x).astype(x, dtype)


class FlatAdam:
    """Adam state for one 1-D array: (master,) m, v. ``init`` holds the starting values in full
    precision (the master starts from them, not from their float16 rounding).
    """

    def __init__(self, param, init=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 mixed=False, offload=False):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.mixed, self.offload, self.steps = mixed, offload, 0
        init = param if init is None else init
        if offload:  # host NumPy arrays, float32 when mixed
            dt = MASTER if mixed else to_numpy(param).dtype
            self.master = np.array(to_numpy(init), dtype=dt)  # (n,) on the host
            self.m, self.v = np.zeros_like(self.master), np.zeros_like(self.master)
        elif mixed:
            f32 = getattr(namespace(param), MASTER)
            self.master = astype(copy(init), f32)  # (n,) fp32 master weights
            self.m, self.v = namespace(param).zeros_like(self.master), namespace(param).zeros_like(self.master)
        else:  # full precision: the working array is its own master
            self.master = None
            self.m, self.v = namespace(param).zeros_like(param), namespace(param).zeros_like(param)

    def arrays(self):
        """The arrays this optimizer holds (for the memory ledger)."""
        return [a for a in (self.master, self.m, self.v) if a is not None]

    def step(self, param, grad):
        """One update: ``param`` (the working array, written in place) from ``grad`` (same shape)."""
        self.steps += 1
        hp = (self.steps, self.lr, self.betas, self.eps, self.weight_decay)
        if self.offload:
            g = np.asarray(to_numpy(grad), dtype=self.master.dtype)  # device -> host
            adam_step(self.master, g, self.m, self.v, *hp)
            param[...] = from_numpy(self.master, like=param)  # host -> device, rounded to param's dtype
        elif self.master is not None:
            adam_step(self.master, astype(grad, self.master.dtype), self.m, self.v, *hp)
            param[...] = astype(self.master, param.dtype)  # round the new master into the working copy
        else:
            adam_step(param, grad, self.m, self.v, *hp)
