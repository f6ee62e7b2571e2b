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


def add_run_command(run_subparsers):
    """``minipar run -n 4 context_parallel`` and ``minipar run -n 4 experts``."""
    from ..cli import lesson_run_parser

    for name, module, help, example in (
            ("context_parallel", context_parallel, "ring attention, Ulysses vs dense attention: traffic, overlap, memory",
             "minipar run -n 4 context_parallel --trace cp.json"),
            ("experts", experts, "mixture of experts, experts sharded over ranks (all-to-all), EP x DP training",
             "minipar run -n 4 experts --backend torch --dtype float32")):
        r = lesson_run_parser(run_subparsers, name, help, example)
        r.add_argument("--dtype", choices=("float64", "float32"), default="float64")
        r.set_defaults(func=module.run_command)
