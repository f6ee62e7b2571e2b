"""Lesson 04's verbs: ``minipar run data_parallel``, ``minipar memory`` and ``minipar bench offload``.

    minipar run -n 4 data_parallel [--backend torch] [--offload-dir DIR]
    minipar memory --params 7.5B --dp 64 --stage 3           # the ZeRO paper's example: 1.9 GB (7.5B = 7.5e9)
    minipar bench offload -n 2 --offload-dir /mnt/nvme

The checks are ``minipar.lessons.data_parallel`` (with ``zero_infinity``), the formulas
``minipar.memory``, the offload benchmark ``minipar.bench.offload.bench_offload``.
"""
from __future__ import annotations

import argparse

from ..bench.offload import bench_offload
from ..memory import BYTES, CATEGORIES, GB, calculate
from ..records import write_json
from .common import bounded, lesson_run_parser, output_path, parameter_count, ranks, run_and_report, with_example


def add_verbs(verbs):
    r = lesson_run_parser(verbs.run, "data_parallel",
                          "DP, DDP (buckets, overlap), ZeRO-1/2/3 vs one process; NVMe offload, Memory-Centric Tiling",
                          "minipar run -n 3 data_parallel --backend torch\n  minipar run -n 2 data_parallel --offload-dir /mnt/nvme",
                          validate=_check_offload_dir)
    r.add_argument("--offload-dir", metavar="DIR", help="where NVMe offload keeps its state files (default: a temporary "
                                                        "directory, removed afterwards)")
    r.set_defaults(func=cmd_run)

    add_memory_command(verbs.top)

    p = verbs.bench.add_parser(
        "offload", help="ZeRO-2 step time with the optimizer state in memory, on the host, in a memory-mapped file",
        **with_example("minipar bench offload -n 2 --offload-dir /mnt/nvme"))
    p.add_argument("-n", type=ranks, default=2, help="ranks (default 2)")
    p.add_argument("--width", type=bounded(65536, "a layer held in this machine's memory"), default=1024, help="8 layers Linear(width, width) (default 1024)")
    p.add_argument("--steps", type=bounded(10**6, "steps"), default=5, help="timed steps each, medians (default 5)")
    p.add_argument("--mixed", action="store_true", help="mixed precision (float16 matmuls: slow in NumPy)")
    p.add_argument("--offload-dir", help="where the state files go (default: a temporary directory, removed after)")
    p.set_defaults(func=bench_offload)


# --------------------------------------------------------------------------- minipar run data_parallel


def _check_offload_dir(args):
    import os

    from ..errors import UsageError

    d = getattr(args, "offload_dir", None)
    if d is not None and not os.path.isdir(d):
        raise UsageError(f"--offload-dir {d}: not a directory")


def cmd_run(args):
    return run_and_report(args, "DP, DDP and ZeRO against one process", "minipar.lessons.data_parallel:tour",
                          offload_dir=getattr(args, "offload_dir", None))


# --------------------------------------------------------------------------- minipar memory


def add_memory_command(subparsers):
    """Add the ``memory`` verb to an argparse ``subparsers`` object."""
    p = subparsers.add_parser(
        "memory", help="bytes per rank of weights, gradients and optimizer state under ZeRO",
        description="Memory per data-parallel rank for ZeRO stage 0-3 (GB = 1e9 bytes).",
        epilog="example (the ZeRO paper's 7.5B model on 64 GPUs):\n"
               "  minipar memory --params 7.5e9 --dp 64 --stage 1\n"
               "  -> 31.4 GB per rank (120 GB without ZeRO, 16.6 GB stage 2, 1.9 GB stage 3)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=parameter_count, required=True, metavar="PSI",
                   help="number of parameters: 7.5e9, 7.5B or 350M (K, M, B, T = 10^3 ... 10^12)")
    p.add_argument("--dp", type=bounded(10**7, "data-parallel ranks of any cluster"), default=1, metavar="N", help="data-parallel ranks (default 1)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage (0 = plain DDP)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="adam (default) or sgd with momentum")
    p.add_argument("--precision", choices=("mixed", "fp32"), default="mixed",
                   help="mixed: fp16 weights/grads + fp32 master (default); fp32: everything in fp32")
    p.add_argument("--offload", action="store_true", help="ZeRO-Offload: optimizer state on the host")
    p.add_argument("--json", metavar="FILE", type=output_path, help="also write the numbers (bytes) as JSON")
    p.set_defaults(func=cmd_memory)


def describe(args) -> str:
    res = calculate(args.params, args.dp, args.stage, args.optimizer, args.precision, args.offload)
    bp, bg, k = BYTES[(args.optimizer, args.precision)]
    name = {0: "no ZeRO (plain DDP)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}[args.stage]
    lines = [f"{args.params:.4g} parameters, {args.dp} data-parallel ranks, {name}, "
             f"{args.optimizer} in {args.precision} precision ({bp} + {bg} + K={k} bytes/param)"
             + (", optimizer offloaded to the host" if args.offload else ""),
             "per rank:"]
    for c in CATEGORIES:
        lines.append(f"  {c:<10} {res[c + '_bytes'] / GB:10.3f} GB")
    lines.append(f"  {'total':<10} {res['total_bytes'] / GB:10.3f} GB   (+ activations, which grow with batch x sequence)")
    if args.offload:
        lines.append(f"  {'host':<10} {res['host_bytes'] / GB:10.3f} GB   (optimizer state in CPU memory)")
    lines.append(f"storing vs training: the fp32 weights alone are {4 * args.params / GB:.3g} GB to store; "
                 f"training one replica without ZeRO needs {(bp + bg + k) * args.params / GB:.3g} GB "
                 f"(weights {bp * args.params / GB:.3g} + grads {bg * args.params / GB:.3g} + "
                 f"optimizer {k * args.params / GB:.3g})")
    return "\n".join(lines)


def cmd_memory(args) -> int:
    if args.params <= 0 or args.dp < 1:
        print("minipar memory: --params must be > 0 and --dp >= 1")
        return 2
    print(describe(args))
    if args.json:
        res = calculate(args.params, args.dp, args.stage, args.optimizer, args.precision, args.offload)
        write_json(args.json, res)
    return 0
