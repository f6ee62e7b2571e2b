"""The trainer's gradients after the flush: the global norm, the clip, and fp16's unscaling.

    norm = global_norm(comm, pieces, norm_type=2.0)   # one all-reduce over every rank
    scale(grads, clip_scale(norm, max_norm))           # torch's clip_grad_norm_, alike on every rank
    if found_inf(comm, grads): ...                      # one all-reduce (max): an inf or nan anywhere

The global norm counts every parameter of the model once. The pieces a rank brings are the
trainer's to choose (``Trainer.counted_here``: a TP shard on its rank, a parameter whole on every
TP rank on TP rank 0, the tied embedding on the first stage), inside what each engine says this
rank answers for (``Engine.grad_pieces``: one replica's average with DDP, every rank its shard with
ZeRO, each expert on its owner). The sum of their squares over every rank is one all-reduce; the
inf-norm's max, one all-reduce (max).

fp16's overflow is decided over the whole world: a tp, pp or ep peer's inf never reaches my own
gradients, so a flag over my group alone would let some ranks step and others skip.
"""
from __future__ import annotations

import math

import numpy as np

from ..collectives import all_reduce
from ..xp import namespace
from .precision import nonfinite


def sum_of_squares(pieces) -> float:
    """The sum of the squares of every element of ``pieces``: a float64 even when there are none."""
    return sum((float(namespace(g).sum(g * g)) for g in pieces), 0.0)


def largest(pieces) -> float:
    """The largest |element| of ``pieces`` (0 when there are none)."""
    return max((float(namespace(g).max(namespace(g).abs(g))) for g in pieces), default=0.0)


def global_norm(comm, pieces, norm_type: float = 2.0) -> float:
    """The norm over every rank of ``comm`` of the pieces each brings: the L2 norm, sqrt of the sum
    over the ranks of ``sum_of_squares``, one all-reduce; with ``norm_type`` inf the max over the
    ranks of ``largest``, one all-reduce (max)."""
    if norm_type == math.inf:
        mine = comm.asarray(np.array([largest(pieces)], dtype=np.float64))
        return float(all_reduce(comm, mine, op="max")[0])
    total = all_reduce(comm, comm.asarray(np.array([sum_of_squares(pieces)], dtype=np.float64)))  # (1,): the sum
    return math.sqrt(float(total[0]))


def scale(grads, factor: float) -> None:
    """Every one of ``grads`` times ``factor``, in place."""
    for g in grads:
        g *= factor


def found_inf(comm, grads) -> bool:
    """Whether any gradient of any rank of ``comm`` is inf or nan: my flag, all-reduced (max) with
    minipar's ring."""
    mine = np.array([1.0 if nonfinite(grads) else 0.0])
    return float(all_reduce(comm, comm.asarray(mine), op="max")[0]) > 0
