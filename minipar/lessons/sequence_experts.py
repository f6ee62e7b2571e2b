"""Lesson 6 on real ranks: long sequences (context parallelism) and many experts (expert parallelism).

    minipar run -n 4 context_parallel [--backend torch] [--dtype float32] [--trace t.json]
    minipar run -n 4 experts [--backend torch] [--dtype float32]
    from minipar import launch; launch(4, "minipar.lessons.sequence_experts:tour")

The checks themselves live in ``minipar.lessons.context_parallel`` (ring attention, Ulysses) and
``minipar.lessons.experts`` (the MoE layer, dispatch and combine, EP x DP training).
"""
from __future__ import annotations

from . import context_parallel, experts


def verify(comm, dtypes=("float64",), seed=0):
    """Both halves of the lesson, per dtype."""
    return context_parallel.verify(comm, dtypes, seed) + experts.verify(comm, dtypes, seed)


def tour(comm, seed=0):
    """Both halves of the lesson in float64."""
    return verify(comm, ("float64",), seed)
