"""``minipar bench gpu``: on a CUDA device, what the real allocator holds against minipar's ledgers,
and what splitting a matmul over TP ranks does to its time on one GPU.

    minipar bench gpu -n 2 --json gpu.json          # needs torch with CUDA

Memory (ranks share the GPU; each rank is a process with its own CUDA caching allocator):

- lesson 04's engines, ZeRO stages 0-3 (0 = DDP), on ``units`` Linear(width, width) layers;
- lesson 05's trainer, recompute none / selective / full, on a pp x tp grid.

Per rank, around one run: ``base`` = ``torch.cuda.memory_allocated()`` before the engine is
built (the data), ``peak`` = ``max_memory_allocated()`` over the steps, minus base, and
``kept`` = what is still allocated after the steps, minus base. The ledger counts the arrays
minipar tracks (parameters, gradients, optimizer state; the trainer adds its activation peak).
``kept`` is what lives from step to step and should equal the ledger's persistent state; ``peak``
adds what one step allocates and frees (activations, matmul outputs, Adam's temporaries, the
allocator's rounding to 512-byte blocks).

The matmul split (one process, no communication): ``X (tokens x d) @ W (d x 4d)`` against
``X @ W[:, :4d/t]``, the column shard one TP rank of t multiplies (Megatron's first MLP matmul).
``split speedup`` = time(full) / time(shard): t where the GPU is saturated, about 1 where the
product is too small to fill it (launch- and latency-bound). That is the width where TP's split
pays on a GPU; the all-reduce a real TP group adds (NVLink) is not measured here: one GPU.
"""
from __future__ import annotations

import statistics

from ..records import write_json


# ------------------------------------------------------------------ on every rank


def _cuda():
    from ..comm.torch_backend import require_gpu

    return require_gpu()


def _around(run):
    """(result of run(), {base, peak, kept, reserved} in bytes) as seen by this rank's allocator."""
    cuda = _cuda()
    cuda.synchronize()
    cuda.reset_peak_memory_stats()
    base = cuda.memory_allocated()
    result = run()
    cuda.synchronize()
    return result, {"peak": cuda.max_memory_allocated() - base, "kept": cuda.memory_allocated() - base,
                    "reserved": cuda.memory_reserved(), "base": base}


def zero_memory(comm, units=4, width=1024, batch=64, mixed=False, steps=2, seed=0):
    """ZeRO stages 0-3: the allocator's bytes against the engine's ledger and prediction, per stage."""
    from ..data_parallel.engine import local_batch
    from ..lessons.fixtures import make_data, uniform_model
    from ..zero import ZeRO

    x, y = make_data(comm, seed + 1, batch, width, width)
    x, y = x.float(), y.float()  # float32 activations (mixed: the engine's working copy is float16)
    out = []
    for stage in (0, 1, 2, 3):
        box = {}

        def run():
            box["engine"] = engine = ZeRO(comm, uniform_model(units, width, seed).to(x), stage,
                                          precision="fp16" if mixed else None)
            for _ in range(steps):
                engine.train_step(local_batch(comm, x), local_batch(comm, y))

        _, alloc = _around(run)
        engine = box["engine"]
        led = engine.measured_memory()
        out.append({"stage": stage, "rank": comm.rank, "alloc": alloc,
                    "ledger": {k: led[f"{k}_bytes"] for k in ("params", "grads", "optimizer")},
                    "predicted": engine.predicted_memory(), "psi": engine.psi,
                    "activations": units * (batch // comm.size) * width * x.element_size()})
        box.clear()
    return out


def train_memory(comm, pp=1, tp=2, recompute=("none", "selective", "full"), d_model=256, layers=4, seq_len=256,
                 batch=16, steps=2):
    """Lesson 05's trainer (float32) per recompute mode: the allocator's bytes against ``Trainer.memory``."""
    from ..train.config import DEFAULT_MODEL, TrainConfig
    from ..train.model import GPTConfig
    from ..train.trainer import Trainer

    dp = comm.size // (pp * tp)
    model = GPTConfig(vocab=DEFAULT_MODEL["vocab"], d_model=d_model, n_heads=max(4, d_model // 64), n_layers=layers,
                      seq_len=seq_len)
    out = []
    for mode in recompute:
        cfg = TrainConfig(model, dp=dp, pp=pp, tp=tp, microbatches=2 * pp, recompute=mode, steps=steps, batch=batch,
                          precision="fp32", data="sorting")
        box = {}

        def run():
            box["tr"] = tr = Trainer(comm, cfg)
            cuda = _cuda()
            box["built"] = cuda.max_memory_allocated() - cuda.memory_allocated()  # building's own transient
            for step in range(steps):
                tr.step(step)
                cuda.synchronize()
                box.setdefault("steps", []).append(cuda.max_memory_allocated())

        _, alloc = _around(run)
        alloc["built_transient"], alloc["peak_after_step"] = box["built"], [b - alloc["base"] for b in box["steps"]]
        out.append({"recompute": mode, "rank": comm.rank, "alloc": alloc, "ledger": box["tr"].memory()})
        box.clear()
    return out


# ------------------------------------------------------------------ one process


def matmul_split(widths=(256, 1024, 4096, 8192, 16384), parts=(1, 2, 4, 8), tokens=2048,
                 dtypes=("float32", "bfloat16"), reps=20):
    """Median time of X (tokens x d) @ W[:, :4d/t] per (dtype, d, t), timed with CUDA events."""
    import torch

    _cuda()
    rows = []
    for dtype in dtypes:
        dt = getattr(torch, dtype)
        for d in widths:
            x = torch.randn(tokens, d, device="cuda", dtype=dt)
            w = torch.randn(d, 4 * d, device="cuda", dtype=dt)
            full = None
            for t in parts:
                shard = w[:, : 4 * d // t].contiguous()
                times = []
                for i in range(reps + 3):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    x @ shard
                    b.record()
                    b.synchronize()
                    if i >= 3:  # three warm-ups
                        times.append(a.elapsed_time(b) * 1e-3)
                sec = statistics.median(times)
                full = sec if t == 1 else full
                flops = 2 * tokens * d * (4 * d // t)
                rows.append({"dtype": dtype, "d": d, "t": t, "seconds": sec, "tflops": flops / sec / 1e12,
                             "split_speedup": full / sec})
                del shard
            del x, w
    return rows


# ------------------------------------------------------------------ the command


def _mib(n):
    return f"{n / 2**20:9.2f}"


def run(args) -> int:
    from ..launcher import launch

    import torch

    name = _cuda().get_device_name(0)  # a UsageError (one line, exit 2) where there is no GPU
    print(f"device: {name}; {args.n} ranks share it (torch backend, gloo with host staging when ranks > GPUs)",
          flush=True)
    record = {"device": name, "torch": torch.__version__, "ranks": args.n}

    print(f"\nZeRO stages 0-3, {args.units} x Linear({args.width}, {args.width}), batch {args.batch}, "
          f"{'mixed (float16 + float32 master)' if args.mixed else 'float32'}: MiB per rank", flush=True)
    z = launch(args.n, "minipar.bench.gpu:zero_memory", backend="torch", device="cuda", quiet=True,
               units=args.units, width=args.width, batch=args.batch, mixed=args.mixed)
    rows = [r for per_rank in z.results for r in per_rank]
    print(f"{'stage':>5} {'rank':>4} {'ledger p+g+o':>13} {'predicted':>10} {'alloc kept':>11} {'kept-ledger':>12} "
          f"{'alloc peak':>11} {'peak-kept':>10}")
    for r in sorted(rows, key=lambda r: (r["stage"], r["rank"])):
        led = sum(r["ledger"].values())
        print(f"{r['stage']:>5} {r['rank']:>4} {_mib(led):>13} {_mib(r['predicted']['total_bytes']):>10} "
              f"{_mib(r['alloc']['kept']):>11} {_mib(r['alloc']['kept'] - led):>12} {_mib(r['alloc']['peak']):>11} "
              f"{_mib(r['alloc']['peak'] - r['alloc']['kept']):>10}")
    record["zero"] = rows

    print(f"\nlesson 05's trainer, float32, pp={args.pp} tp={args.tp}, recompute none/selective/full: MiB per rank",
          flush=True)
    t = launch(args.n, "minipar.bench.gpu:train_memory", backend="torch", device="cuda", quiet=True,
               pp=args.pp, tp=args.tp)
    rows = [r for per_rank in t.results for r in per_rank]
    print(f"{'recompute':>10} {'rank':>4} {'ledger p+g+o':>13} {'activations':>12} {'alloc kept':>11} "
          f"{'alloc peak':>11} {'peak-kept':>10}")
    for r in sorted(rows, key=lambda r: (r["recompute"], r["rank"])):
        led = r["ledger"]
        print(f"{r['recompute']:>10} {r['rank']:>4} {_mib(led['params'] + led['grads'] + led['optimizer']):>13} "
              f"{_mib(led['activations']):>12} {_mib(r['alloc']['kept']):>11} {_mib(r['alloc']['peak']):>11} "
              f"{_mib(r['alloc']['peak'] - r['alloc']['kept']):>10}")
    record["train"] = rows

    print("\nthe TP matmul split on one GPU: X (2048 x d) @ W[:, :4d/t]", flush=True)
    split = matmul_split()
    print(f"{'dtype':>9} {'d':>6} {'t':>2} {'ms':>9} {'TFLOP/s':>8} {'split speedup':>14}")
    for r in split:
        print(f"{r['dtype']:>9} {r['d']:>6} {r['t']:>2} {r['seconds'] * 1e3:9.4f} {r['tflops']:8.1f} "
              f"{r['split_speedup']:13.2f}x")
    record["matmul_split"] = split
    if args.json:
        write_json(args.json, record)
    return 0
