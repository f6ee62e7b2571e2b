"""Lesson 06's verbs: ``minipar run context_parallel`` and ``minipar run experts``.

    minipar run -n 4 context_parallel [--backend torch] [--dtype float32] [--trace t.json]
    minipar run -n 4 experts [--backend torch] [--dtype float32]

The checks are ``minipar.lessons.context_parallel`` (ring attention, Ulysses) and
``minipar.lessons.experts`` (the MoE layer, dispatch and combine, EP x DP training).
"""
from __future__ import annotations

from .common import lesson_run_parser, run_and_report


def add_verbs(verbs):
    for name, func, help, example in (
            ("context_parallel", cmd_run_context_parallel,
             "ring attention, Ulysses vs dense attention: traffic, overlap, memory",
             "minipar run -n 4 context_parallel --trace cp.json"),
            ("experts", cmd_run_experts,
             "mixture of experts, experts sharded over ranks (all-to-all), EP x DP training",
             "minipar run -n 4 experts --backend torch --dtype float32")):
        r = lesson_run_parser(verbs.run, name, help, example)
        r.add_argument("--dtype", choices=("float64", "float32"), default="float64")
        r.set_defaults(func=func)


def cmd_run_context_parallel(args):
    return run_and_report(args, f"ring attention and Ulysses ({args.dtype}) against dense attention",
                          "minipar.lessons.context_parallel:verify", dtypes=(args.dtype,))


def cmd_run_experts(args):
    return run_and_report(args, f"expert parallelism ({args.dtype}) against one process",
                          "minipar.lessons.experts:verify", dtypes=(args.dtype,))
