"""Lesson 09's verbs: ``minipar run torch_engines`` (the lesson's checks) and ``minipar bench torch``
(how much of DDP's gradient traffic leaves before the backward ends, minipar's and torch's).

    minipar run -n 3 torch_engines [--quick] [--json rows.json]
    minipar bench torch -n 2 [--layers 8 --width 1024 --batch 256 --bucket-mb 1 --steps 6 --json out.json]

Both run on the torch backend (torch.distributed, gloo on CPU): the lesson's engines wrap
``torch.nn.Module``s. The checks are ``minipar.lessons.torch_engines``, the benchmark
``minipar.bench.torch_engines.bench_torch``.
"""
from __future__ import annotations

import sys

from ..bench.torch_engines import bench_torch
from .common import bounded, lesson_run_parser, nonnegative_float, output_path, ranks, run_and_report, with_example


def add_verbs(verbs):
    """``minipar run torch_engines`` and ``minipar bench torch``."""
    r = lesson_run_parser(verbs.run, "torch_engines",
                          "DDP, ShardedOptimizer, FSDP and parallelize on torch modules vs one process and torch's own",
                          "minipar run -n 3 torch_engines\n  minipar run -n 4 torch_engines --quick")
    r.add_argument("--quick", action="store_true",
                   help="the tour's share: the GPT only, torch's DDP the only engine of torch's compared")
    r.set_defaults(func=cmd_run)

    p = verbs.bench.add_parser(
        "torch", help="DDP's overlap: the share of the gradient bytes sent before the backward ends, minipar vs torch",
        **with_example("minipar bench torch -n 2\n  minipar bench torch --layers 12 --bucket-mb 4 --json overlap.json"))
    p.add_argument("-n", type=ranks, default=2, help="ranks (default 2; at least 2)")
    p.add_argument("--layers", type=bounded(4096, "layers of one model on this machine"), default=8,
                   help="Linear(width, width) + GELU layers (default 8)")
    p.add_argument("--width", type=bounded(65536, "a layer held in this machine's memory"), default=1024,
                   help="features per layer (default 1024)")
    p.add_argument("--batch", type=bounded(10**6, "rows per rank"), default=256, help="rows per rank (default 256)")
    p.add_argument("--steps", type=bounded(10**4, "timed steps"), default=6,
                   help="timed steps of each engine, medians (default 6)")
    p.add_argument("--bucket-mb", dest="bucket_mb", type=nonnegative_float, default=1.0,
                   help="bucket size in MiB, both engines (default 1)")
    p.add_argument("--json", metavar="FILE", type=output_path, help="also write the records as JSON")
    p.set_defaults(func=bench_torch)


def cmd_run(args):
    if args.backend != "torch":  # lesson 09 has no MPI form: its engines hook into torch's autograd
        print("lesson 09 runs on the torch backend (its engines wrap torch.nn.Modules): --backend torch", file=sys.stderr)
        args.backend = "torch"
    target = "minipar.lessons.torch_engines:" + ("tour" if args.quick else "verify")
    return run_and_report(args, "minipar's engines on torch modules against one process and torch's own", target)
