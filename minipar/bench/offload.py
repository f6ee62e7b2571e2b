"""Benchmark: the step time of ZeRO-2 with the optimizer state in memory, on the host ("cpu")
and in a memory-mapped file ("nvme"), ZeRO-Infinity's offload.

    minipar bench offload -n 2 [--offload-dir /mnt/nvme] [--width 1024] [--steps 5] [--mixed]
    from minipar import launch
    out = launch(2, "minipar.bench.offload:offload_cost")       # {home: step seconds, bytes where}

The three take turns step by step, so a shared machine's load hits them alike; the medians of
the slowest rank are reported with the bytes each keeps on the device, the host and the file.
That offloading is correct (bitwise, bytes where they belong) is checked by the lesson
(``minipar.lessons.zero_infinity:offload``).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..data_parallel import local_batch
from ..lessons.fixtures import make_data, uniform_model
from ..mixed_precision import NVMe
from ..zero import ZeRO


def offload_cost(comm, units=8, width=1024, batch=16, steps=5, seed=0, path=None, mixed=False):
    """Seconds per ZeRO-2 step with the state in memory, on the host, in a file: the three take
    turns step by step, so a shared machine's load hits them alike; medians of the slowest rank.
    Also the bytes each keeps where. Float64 by default: NumPy's float16 matmuls do not use BLAS
    and would hide the optimizer's cost behind seconds of compute."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    store = NVMe(path)
    xl, yl = local_batch(comm, x), local_batch(comm, y)
    engines = {name: ZeRO(comm, uniform_model(units, width, seed).to(x), 2, precision="fp16" if mixed else None, offload=off)
               for name, off in (("memory", False), ("cpu", "cpu"), ("nvme", store))}
    times = {name: [] for name in engines}
    for step in range(steps + 1):
        for name, e in engines.items():
            comm.builtin.barrier()
            t0 = time.perf_counter()
            e.train_step(xl, yl)
            dt = comm.builtin.all_reduce(comm.asarray(np.array([time.perf_counter() - t0])), "max")[0].item()
            if step:  # the first round warms up
                times[name].append(dt)
    out = {name: {"step_s": float(np.median(t)), "memory": e.measured_memory(), "psi": e.psi}
           for (name, e), t in zip(engines.items(), times.values())}
    store.close()
    return out


def bench_offload(args) -> int:
    from ..errors import UsageError
    from ..launcher import launch

    if args.n < 1 or args.width < 1 or args.steps < 1:
        raise UsageError("-n, --width and --steps must be >= 1")
    if args.offload_dir and not os.path.isdir(args.offload_dir):
        raise UsageError(f"--offload-dir {args.offload_dir}: not a directory")
    res = launch(args.n, "minipar.bench.offload:offload_cost", quiet=True, width=args.width, steps=args.steps,
                 path=args.offload_dir, mixed=args.mixed).results[0]
    base = res["memory"]["step_s"]
    print(f"ZeRO-2, {'mixed precision' if args.mixed else 'float64'}, {args.n} ranks, 8 x Linear({args.width}, {args.width}), "
          f"batch 16: "
          f"Psi = {res['memory']['psi']:,}; medians of {args.steps} steps (load average {os.getloadavg()[0]:.1f})")
    print(f"{'state in':<10}{'step ms':>10}{'vs memory':>11}   bytes per rank: device / host / file")
    for name, r in res.items():
        m = r["memory"]
        print(f"{name:<10}{r['step_s'] * 1e3:>10.1f}{r['step_s'] / base:>10.2f}x   "
              f"{m['params_bytes'] + m['grads_bytes'] + m['optimizer_bytes']:,} / {m['host_bytes']:,} / {m['file_bytes']:,}")
    return 0
