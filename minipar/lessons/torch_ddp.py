"""Lesson 09 on real ranks, data parallelism: ``minipar.torch.DistributedDataParallel`` and
``ShardedOptimizer`` on torch modules, against one process, torch's own, and their bytes.

    from minipar import launch
    out = launch(2, "minipar.lessons.torch_ddp:check_ddp", backend="torch")       # check rows
    out = launch(3, "minipar.lessons.torch_ddp:check_sharded", backend="torch")
    out = launch(2, "minipar.lessons.torch_ddp:timeline", backend="torch")        # one traced step, rank 0

Tolerances (float64): against one process, SGD with momentum and 1e-12 (only the order of the
sums differs; Adam would turn the rounding noise of gradients that are zero in exact arithmetic,
a key bias's, into updates of lr * noise / eps). Between engines whose sums are the same by
construction, Adam and bitwise equality: on 2 ranks a sum of two terms does not depend on its
order; on 3 and more, 1e-12.
"""
from __future__ import annotations

from functools import partial

import torch

from ..trace import merge
from .torch_fixtures import (ADAM, LR, SGD, STEPS, TOL, batch, count_row, ddp_train, dense_train, local, loss_fn,
                             make, mark, max_rel, memo, params, row, traced)

# --------------------------------------------------------------------------- DDP


def bucket_problems(facts):
    """Buckets started before every one of their gradients was in (arrived, or zeroed as missing)."""
    owner = [b for b, n in enumerate(facts["slots"]) for _ in range(n)]
    filled, bad = [0] * len(facts["slots"]), []
    for _, what, k in facts["log"]:
        if what == "ready":
            filled[owner[k]] += 1
        elif what == "zero":
            filled[k] += 1
        elif filled[k] < facts["slots"][k]:
            bad.append(k)
    return bad


def late_buckets(facts):
    """Buckets whose ring did not start before loss.backward() returned."""
    ev = facts["events"]
    end = next(e.t_start for e in ev if e.name == "backward end")
    starts = {e.name: e.t_start for e in ev if e.kind == "collective"}
    return [b for b in range(len(facts["slots"])) if starts.get(f"all_reduce:ring bucket {b}", float("inf")) >= end]


@memo
def torch_ddp_train(comm, kind, opt=ADAM):
    """torch's DistributedDataParallel on the same module, seed and data: {name: parameter}."""
    model = make(kind)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=(kind == "awkward"))
    x, y = batch(kind)
    x, y = local(comm, x), local(comm, y)
    o = opt(model.parameters(), lr=LR)
    for _ in range(STEPS):
        o.zero_grad()
        loss_fn(kind, ddp(x), y).backward()
        o.step()
    return params(model)


def check_ddp(comm, kinds=("gpt", "awkward"), engine=None, against_torch=True):
    """DDP, one bucket per parameter and 4 KiB buckets: == one process, its bytes, each bucket
    flushed after its last gradient and (the GPT) started inside the backward; == torch's."""
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        dense = dense_train(kind)
        for mb in (None, 0.004):
            got, facts = ddp_train(comm, kind, mb, engine=engine)
            tag = f"DDP {kind} buckets={'per parameter' if mb is None else f'{mb} MiB'}"
            rows.append(row(f"{tag}: == one process", max_rel(got, dense), TOL))
            rows.append(row(f"{tag}: traffic == formula, each parameter once", abs(facts["sent"] - facts["predicted"]),
                            ok=facts["sent"] == facts["predicted"] and (facts["sent"] > 0 or comm.size == 1)))
            rows.append(row(f"{tag}: every bucket flushed after its last gradient", len(bucket_problems(facts))))
            if kind == "gpt" and comm.size > 1:  # awkward: the buckets behind the unused parameter wait for finish
                rows.append(row(f"{tag}: every bucket's send starts before the backward ends", len(late_buckets(facts))))
        if engine is None and comm.size > 1 and against_torch:
            ours = ddp_train(comm, kind, 0.004, opt=ADAM)[0]
            rows.append(row(f"DDP {kind}: == torch DistributedDataParallel", max_rel(ours, torch_ddp_train(comm, kind)),
                            0.0 if bitwise else TOL))
    return rows


def ddp_facts(comm):
    """After a step of the awkward model: the parameter no rank used has a zero gradient, the
    frozen one none; one slot per trainable parameter (the tied weight once)."""
    from ..torch import DistributedDataParallel

    model = make("awkward")
    ddp = DistributedDataParallel(model, comm=comm)
    x, y = batch("awkward")
    loss_fn("awkward", ddp(local(comm, x)), local(comm, y)).backward()
    ddp.finish_gradient_synchronization()
    return {"unused": model.unused.grad.abs().max().item(), "frozen_none": model.frozen.weight.grad is None,
            "slots": sum(len(b.slots) for b in ddp.reducer.buckets),
            "trainable": len({id(p) for p in model.parameters() if p.requires_grad})}


def check_ddp_parts(comm):
    """:func:`ddp_facts` as rows."""
    f = ddp_facts(comm)
    return [row("DDP awkward: a parameter no rank used gets a zero gradient", f["unused"]),
            row("DDP awkward: a frozen parameter gets no gradient", 0 if f["frozen_none"] else 1),
            count_row("DDP awkward: one bucket slot per trainable parameter (the tied weight once)",
                      f["slots"], f["trainable"])]


# --------------------------------------------------------------------------- ShardedOptimizer


def sharded_train(comm, kind, zero, opt, steps=STEPS):
    """(params, bytes sent by the last step(), predicted, the optimizer)."""
    from ..torch import DistributedDataParallel, ShardedOptimizer

    model = make(kind)
    run = DistributedDataParallel(model, comm=comm) if zero == 1 else model
    x, y = batch(kind)
    x, y = local(comm, x), local(comm, y)
    o = ShardedOptimizer(model.parameters(), opt.func if isinstance(opt, partial) else opt, comm=comm, zero=zero,
                         lr=LR, **(opt.keywords if isinstance(opt, partial) else {}))
    sent = 0
    for _ in range(steps):
        o.zero_grad()
        loss_fn(kind, run(x), y).backward()
        if zero == 1:
            run.finish_gradient_synchronization()
        _, sent, _ = traced(comm, o.step)
    return params(model), sent, o.bytes_per_step(), o


def zero_redundancy_train(comm, kind):
    """torch's ZeroRedundancyOptimizer (Adam) over torch's DDP: ({name: parameter}, the optimizer)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = make(kind)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=(kind == "awkward"))
    x, y = batch(kind)
    x, y = local(comm, x), local(comm, y)
    o = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=ADAM, lr=LR)
    for _ in range(STEPS):
        o.zero_grad()
        loss_fn(kind, ddp(x), y).backward()
        o.step()
    return params(model), o


def check_sharded(comm, kinds=("gpt", "awkward"), against_torch=True):
    """ZeRO-1 and -2: == one process, bytes, Adam == DDP + the whole Adam, state for my share
    only, shares balanced; == torch's ZeroRedundancyOptimizer, owners as its."""
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        dense = dense_train(kind)
        replicated = ddp_train(comm, kind, None, opt=ADAM)[0]  # DDP + the whole Adam on every rank
        for zero in (1, 2):
            tag = f"ShardedOptimizer {kind} zero={zero}"
            got, sent, predicted, o = sharded_train(comm, kind, zero, SGD)
            rows.append(row(f"{tag}: == one process", max_rel(got, dense), TOL))
            rows.append(count_row(f"{tag}: traffic == formula", sent, predicted))
            got, _, _, o = sharded_train(comm, kind, zero, ADAM)
            rows.append(row(f"{tag}: Adam == DDP + Adam on every parameter", max_rel(got, replicated),
                            0.0 if zero == 1 or bitwise else TOL))
            mine = sum(p.numel() for p in o.mine)
            k = 2 * 8  # Adam: m and v in float64, + a 4-byte step per parameter
            rows.append(count_row(f"{tag}: state only for my share", o.state_bytes(), k * mine + 4 * len(o.mine)))
            loads = [sum(p.numel() for p, r in zip(o.params, o.owner) if r == q) for q in range(comm.size)]
            largest = max(p.numel() for p in o.params)
            rows.append(row(f"{tag}: shares balanced by size (elements past the largest parameter)",
                            max(0, max(loads) - min(loads) - largest)))
        if comm.size > 1 and against_torch:
            theirs, zro = zero_redundancy_train(comm, kind)
            ours = sharded_train(comm, kind, 1, ADAM)[0]
            rows.append(row(f"ShardedOptimizer {kind}: == torch ZeroRedundancyOptimizer", max_rel(ours, theirs),
                            0.0 if bitwise else TOL))
            if kind == "gpt":  # no frozen parameter: torch partitions the same list
                o = sharded_train(comm, kind, 1, ADAM, steps=0)[3]
                torch_owned = [{id(p) for g in groups for p in g["params"]} for groups in zro._partition_parameters()]
                ours_owned = [{id(p) for p, r in zip(o.params, o.owner) if r == q} for q in range(comm.size)]
                same = [len(t) for t in torch_owned] == [len(s) for s in ours_owned]
                rows.append(row(f"ShardedOptimizer {kind}: owners as ZeroRedundancyOptimizer's", 0 if same else 1))
    return rows


# --------------------------------------------------------------------------- the overlap, for the timeline


def mlp(layers, width, seed=0, dtype=torch.float32):
    """``layers`` x (Linear(width, width), GELU): the model of ``minipar bench torch``."""
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods).to(dtype)


def timeline(comm, layers=6, width=256, batch_rows=128, bucket_size_mb=0.5, steps=3, seed=0):
    """A few DDP steps of an MLP, each traced, with a mark when each parameter's gradient is
    accumulated; the median step's events of every rank on rank 0's clock. Returns (on rank 0;
    None elsewhere) {"events", "buckets": [(name, bytes)], "ranks", "psi", ..., "rows"}: the rows
    check that every bucket's ring started before the backward ended on every rank."""
    import time

    from ..torch import DistributedDataParallel

    model = mlp(layers, width, seed)
    ddp = DistributedDataParallel(model, bucket_size_mb=bucket_size_mb, comm=comm)
    names = {id(p): n for n, p in model.named_parameters()}
    for p in model.parameters():  # registered after DDP's: runs right after the bucket's copy
        p.register_post_accumulate_grad_hook(lambda q: mark(comm, f"grad {names[id(q)]}"))
    g = torch.Generator().manual_seed(seed + 1 + comm.rank)
    x, y = torch.randn(batch_rows, width, generator=g), torch.randn(batch_rows, width, generator=g)
    runs = []
    for _ in range(steps + 1):  # the first one warms up
        model.zero_grad(set_to_none=True)
        comm.builtin.barrier()

        def step():
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            comm.tracer.record("compute", "forward", t0, time.perf_counter())
            t1 = time.perf_counter()
            loss.backward()
            comm.tracer.record("compute", "backward", t1, time.perf_counter())
            t2 = time.perf_counter()
            ddp.finish_gradient_synchronization()
            comm.tracer.record("compute", "wait for the buckets", t2, time.perf_counter())

        _, _, events = traced(comm, step)
        runs.append((max(comm.builtin.allgather_object(sum(e.t_end - e.t_start for e in events
                                                           if e.kind == "compute"))), events))
    runs = runs[1:]
    median = sorted(range(len(runs)), key=lambda i: runs[i][0])[len(runs) // 2]
    events = runs[median][1]
    late = [e.name for e in events if e.kind == "collective"
            and e.t_start >= next(b.t_end for b in events if b.name == "backward")]
    late_everywhere = sum(comm.builtin.allgather_object(len(late)))
    merged = merge(comm, events)
    if comm.rank:
        return None
    buckets = [(f"all_reduce:ring bucket {b.index}", b.nbytes) for b in ddp.reducer.buckets]
    return {"events": merged, "buckets": buckets, "ranks": comm.size, "layers": layers, "width": width,
            "batch": batch_rows, "bucket_size_mb": bucket_size_mb, "psi": sum(p.numel() for p in model.parameters()),
            "step_s": runs[median][0],
            "rows": [row(f"DDP timeline ({comm.size} ranks, {len(buckets)} buckets): every bucket's ring starts "
                         f"before the backward ends, on every rank", late_everywhere)]}
