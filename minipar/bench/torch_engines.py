"""Benchmark: how much of DDP's gradient traffic leaves before the backward ends, minipar's
``minipar.torch.DistributedDataParallel`` beside torch's own.

    minipar bench torch                          # 2 ranks, 8 x Linear(1024, 1024) + GELU, 1 MiB buckets
    minipar bench torch -n 2 --layers 12 --width 1024 --bucket-mb 4 --json overlap.json
    from minipar import launch
    out = launch(2, "minipar.bench.torch_engines:overlap", backend="torch")   # records, rank 0 first

The backward ends, for both engines alike, when autograd has accumulated the last gradient (a
``register_post_accumulate_grad_hook`` on every parameter records the time): torch's
``loss.backward()`` itself returns only after its Reducer has waited for every all-reduce, so
its return says nothing about overlap. Then, per step:

* ``started``, ``done``: the share of the gradient bytes (each bucket weighed by its size) whose
  all-reduce had started, and had completed, by then. minipar: from the trace (each bucket's
  ring is one ``collective`` event, from its first posted step to its last). torch: a
  communication hook (``register_comm_hook``: the default all-reduce, then a division by the
  world size) records when each bucket's all-reduce starts and when its future completes;
* ``messages`` (minipar only): the share of the bytes of the ring's messages (``isend``) posted
  by then. The hook posts a ring's first step; the thread posts the others as each completes,
  so on 2 ranks a bucket started at the very end has sent half its bytes, not all of them.

Both engines take turns step by step with the same bucket size, so a shared machine's load hits
them alike; the records hold the medians over the steps (the first one warms up) of the slowest
rank's step time, of ``exposed_s`` (from the backward's end until the gradients are averaged:
the communication the backward did not hide) and of the two shares on rank 0.
"""
from __future__ import annotations

import os
import time

import numpy as np

ENGINES = ("minipar", "torch")


def mlp(layers, width, seed):
    import torch

    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def _clock(model):
    """A list that every parameter's post-accumulate hook appends its time to."""
    times = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _, times=times: times.append(time.perf_counter()))
    return times


def _torch_ddp(model, bucket_size_mb, world):
    import torch
    import torch.distributed as dist

    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb)
    buckets = []  # (start, done, bytes) of this step's buckets

    def hook(state, bucket):
        t0, buf = time.perf_counter(), bucket.buffer()
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            buckets.append((t0, time.perf_counter(), buf.numel() * buf.element_size()))
            return f.value()[0].div_(world)

        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    return ddp, buckets


def overlap(comm, layers=8, width=1024, batch=256, steps=6, bucket_size_mb=1.0, seed=0):
    """Rank side: the two engines step by step; one record per engine (see the module docstring)."""
    import torch

    from ..torch import DistributedDataParallel
    from ..trace import SEND_KINDS

    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 1 + comm.rank))
    y = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed + 101 + comm.rank))
    ours_model, theirs_model = mlp(layers, width, seed), mlp(layers, width, seed)
    ours = DistributedDataParallel(ours_model, bucket_size_mb=bucket_size_mb, comm=comm)
    theirs, buckets = _torch_ddp(theirs_model, bucket_size_mb, comm.size)
    clocks = {"minipar": _clock(ours_model), "torch": _clock(theirs_model)}
    models = {"minipar": ours, "torch": theirs}
    samples = {e: [] for e in ENGINES}
    for step in range(steps + 1):
        for name in ENGINES:
            clocks[name].clear()
            buckets.clear()
            comm.tracer.clear()
            comm.tracer.enabled = name == "minipar"
            comm.builtin.barrier()
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(models[name](x), y)
            loss.backward()
            if name == "minipar":
                ours.finish_gradient_synchronization()
            t_end = time.perf_counter()
            comm.tracer.enabled = False
            bw_end = max(clocks[name])
            if name == "minipar":
                sizes = {f"all_reduce:ring bucket {b.index}": b.nbytes for b in ours.reducer.buckets}
                runs = [(e.t_start, e.t_end, sizes[e.name]) for e in comm.tracer.events if e.name in sizes]
                sends = [(e.t_start, e.bytes) for e in comm.tracer.events if e.kind in SEND_KINDS]
            else:
                runs, sends = list(buckets), []
            total = sum(b for _, _, b in runs) or 1
            s = {"started": sum(b for t, _, b in runs if t < bw_end) / total,
                 "done": sum(b for _, t, b in runs if t <= bw_end) / total,
                 "messages": sum(b for t, b in sends if t < bw_end) / (sum(b for _, b in sends) or 1),
                 "exposed_s": t_end - bw_end}
            s["step_s"] = max(comm.builtin.allgather_object(t_end - t0))
            s["exposed_s"] = max(comm.builtin.allgather_object(s["exposed_s"]))
            if step:  # the first round warms up
                samples[name].append(s)
            ours_model.zero_grad(set_to_none=True)
            theirs_model.zero_grad(set_to_none=True)
    comm.tracer.clear()
    psi = sum(p.numel() for p in ours_model.parameters())
    return [{"engine": name, "ranks": comm.size, "layers": layers, "width": width, "batch": batch, "psi": psi,
             "bucket_size_mb": bucket_size_mb, "steps": steps,
             **{k: float(np.median([s[k] for s in samples[name]]))
                for k in ("started", "done", "messages", "step_s", "exposed_s")}}
            for name in ENGINES]


def collect(n=2, **kwargs):
    """The records of :func:`overlap` on ``n`` ranks (rank 0's)."""
    from ..launcher import launch

    return launch(n, "minipar.bench.torch_engines:overlap", backend="torch", quiet=True, **kwargs).results[0]


def table(records) -> str:
    rows = [f"{'engine':<9}{'all-reduce started':>20}{'done':>7}{'messages posted':>17}{'step ms':>10}{'exposed ms':>12}"]
    for r in records:
        msgs = f"{r['messages']:>16.0%}" if r["engine"] == "minipar" else f"{'-':>16}"
        rows.append(f"{r['engine']:<9}{r['started']:>19.0%} {r['done']:>6.0%} {msgs}{r['step_s'] * 1e3:>10.1f}"
                    f"{r['exposed_s'] * 1e3:>12.1f}")
    return "\n".join(rows)


def bench_torch(args) -> int:
    """``minipar bench torch``: args.n, .layers, .width, .batch, .steps, .bucket_mb, .json."""
    from ..errors import UsageError
    from ..records import write_json

    if args.n < 2 or min(args.layers, args.width, args.batch, args.steps) < 1 or args.bucket_mb < 0:
        raise UsageError("-n must be >= 2; --layers, --width, --batch and --steps >= 1; --bucket-mb >= 0")
    records = collect(args.n, layers=args.layers, width=args.width, batch=args.batch, steps=args.steps,
                      bucket_size_mb=args.bucket_mb)
    r = records[0]
    print(f"DDP on {args.n} ranks (gloo), {args.layers} x Linear({args.width}, {args.width}) + GELU, float32, "
          f"batch {args.batch} per rank, Psi = {r['psi']:,}, buckets of {args.bucket_mb} MiB: the share of the "
          f"gradient bytes whose all-reduce started / was done before the backward ended (its last gradient "
          f"accumulated); medians of {args.steps} steps (load average {os.getloadavg()[0]:.1f})")
    print(table(records))
    if args.json:
        write_json(args.json, records, label="records:")
    return 0
