"""Rank side of tests/test_torch_engines.py: each ``check_*`` runs one engine of minipar.torch
against one process, against torch's own, and by the bytes the trace saw, and returns rows
``{"check", "ok", "error", "tol"}`` (tol 0: bitwise). Launched as ``tests.torch_engines_ranks:NAME``.

Tolerances (float64): comparisons with one process take SGD with momentum and 1e-12 (only the
summation order differs; Adam would turn the rounding noise of gradients that are zero in exact
arithmetic, the first token's attention for one, into updates of lr * noise / eps). Comparisons
between engines whose sums are the same by construction take Adam and ask for bitwise equality:
on 2 ranks a sum of two terms does not depend on the order; on 3 they are held to 1e-12.
"""
from __future__ import annotations

import contextlib
import io
import time
from functools import partial

import torch

from minipar.trace import bytes_sent
from minipar.xp import chunk_bounds
from tests.torch_models import Block, Gate, batch, loss_fn, make

STEPS, LR = 2, 1e-2
TOL = 1e-12
SGD = partial(torch.optim.SGD, momentum=0.9)
ADAM = torch.optim.Adam


_MEMO: dict = {}


def memo(fn):
    """Each run once per process (the checks share their runs); runs of a planted bug are not kept."""
    def run(*args, **kwargs):
        if kwargs.get("engine") is not None:
            return fn(*args, **kwargs)
        key = (fn.__name__, args, tuple(sorted(kwargs.items())))
        if key not in _MEMO:
            _MEMO[key] = fn(*args, **kwargs)
        return _MEMO[key]
    return run


def row(check, error, tol=0.0, ok=None):
    error = float(error)
    return {"check": check, "ok": bool(error <= tol) if ok is None else bool(ok), "error": error, "tol": tol}


def rel(a, b):
    """max |a - b| / max |b| (0 for two empty tensors, inf for different shapes)."""
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    return (a - b).abs().max().item() / (b.abs().max().item() or 1.0)


def max_rel(a: dict, b: dict):
    """max over tensors of max |a - b|, over the largest |b| of them all (a gradient that is zero
    in exact arithmetic, a key bias's, is compared at the model's scale, not at its own noise)."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    scale = max((b[k].detach().double().abs().max().item() for k in b if b[k].numel()), default=0.0) or 1.0
    return max(((a[k].detach().double() - b[k].detach().double()).abs().max().item() / scale
                for k in a if a[k].numel()), default=0.0)


def params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def local(comm, t):
    a, b = chunk_bounds(t.shape[0], comm.size)[comm.rank]
    return t[a:b]


@memo
def dense_train(kind, opt=SGD, steps=STEPS):
    """The reference: one process, the whole batch."""
    model = make(kind)
    x, y = batch(kind)
    o = opt(model.parameters(), lr=LR)
    for _ in range(steps):
        o.zero_grad()
        loss_fn(kind, model(x), y).backward()
        o.step()
    return params(model)


def traced(comm, fn):
    """(fn(), bytes this rank sent while it ran, its trace events)."""
    comm.tracer.clear()
    comm.tracer.enabled = True
    try:
        out = fn()
    finally:
        comm.tracer.enabled = False
    events = list(comm.tracer.events)
    comm.tracer.clear()
    return out, bytes_sent(events, comm.world_rank(comm.rank)), events


def mark(comm, name):
    t = time.perf_counter()
    comm.tracer.record("compute", name, t, t)


# --------------------------------------------------------------------------- DDP


@memo
def ddp_train(comm, kind, bucket_size_mb=None, opt=SGD, engine=None, steps=STEPS):
    """minipar's DDP on this rank's share of the batch: (params, facts of the last step)."""
    from minipar.torch import DistributedDataParallel

    model = make(kind)
    ddp = (engine or DistributedDataParallel)(model, bucket_size_mb=bucket_size_mb, comm=comm)
    x, y = batch(kind)
    x, y = local(comm, x), local(comm, y)
    o = opt(model.parameters(), lr=LR)
    facts = {}
    for _ in range(steps):
        o.zero_grad()

        def step():
            loss = loss_fn(kind, ddp(x), y)
            loss.backward()
            mark(comm, "backward end")
            ddp.finish_gradient_synchronization()

        _, sent, events = traced(comm, step)
        facts = {"sent": sent, "predicted": ddp_bytes(comm, model, bucket_size_mb), "events": events,
                 "log": list(ddp.reducer.log),
                 "slots": [len(b.slots) for b in ddp.reducer.buckets]}
        o.step()
    return params(model), facts


def ddp_bytes(comm, model, bucket_size_mb):
    """The formula, from the model: a ring all-reduce per bucket, each trainable parameter in one."""
    from minipar.torch.ddp import make_buckets
    from minipar.torch.group import ring_bytes, unique_params

    size = None if bucket_size_mb is None else int(bucket_size_mb * 2 ** 20)
    return sum(ring_bytes(b.flat.numel(), comm.size, comm.rank, b.flat.element_size())
               for b in make_buckets(unique_params(model), size))


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


def check_ddp(comm, kinds=("gpt", "awkward"), engine=None):
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        dense = dense_train(kind)
        for mb in (None, 0.004):
            got, facts = ddp_train(comm, kind, mb, engine=engine)
            tag = f"DDP {kind} buckets={'per parameter' if mb is None else f'{mb} MiB'}"
            rows.append(row(f"{tag}: == one process", max_rel(got, dense), TOL))
            rows.append(row(f"{tag}: traffic == formula, each parameter once", facts["sent"] - facts["predicted"],
                            ok=facts["sent"] == facts["predicted"] and (facts["sent"] > 0 or comm.size == 1)))
            rows.append(row(f"{tag}: every bucket flushed after its last gradient", len(bucket_problems(facts))))
            if kind == "gpt" and comm.size > 1:  # awkward: the buckets behind the unused parameter wait for finish
                rows.append(row(f"{tag}: every bucket's send starts before the backward ends", len(late_buckets(facts))))
        if engine is None and comm.size > 1:
            ours = ddp_train(comm, kind, 0.004, opt=ADAM)[0]
            rows.append(row(f"DDP {kind}: == torch DistributedDataParallel", max_rel(ours, torch_ddp_train(comm, kind)),
                            0.0 if bitwise else TOL))
    return rows


def ddp_facts(comm):
    """After a step: the parameter no rank used has a zero gradient, the frozen one none; one slot
    per trainable parameter (the tied weight once)."""
    from minipar.torch import DistributedDataParallel

    model = make("awkward")
    ddp = DistributedDataParallel(model, comm=comm)
    x, y = batch("awkward")
    loss_fn("awkward", ddp(local(comm, x)), local(comm, y)).backward()
    ddp.finish_gradient_synchronization()
    return {"unused": model.unused.grad.abs().max().item(), "frozen_none": model.frozen.weight.grad is None,
            "slots": sum(len(b.slots) for b in ddp.reducer.buckets),
            "trainable": len({id(p) for p in model.parameters() if p.requires_grad})}


# --------------------------------------------------------------------------- ShardedOptimizer


def sharded_train(comm, kind, zero, opt, steps=STEPS):
    """(params, bytes sent by the last step(), predicted, the optimizer)."""
    from minipar.torch import DistributedDataParallel, ShardedOptimizer

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


def check_sharded(comm, kinds=("gpt", "awkward")):
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        dense = dense_train(kind)
        replicated = ddp_train(comm, kind, None, opt=ADAM)[0]  # DDP + the whole Adam on every rank
        for zero in (1, 2):
            tag = f"ShardedOptimizer {kind} zero={zero}"
            got, sent, predicted, o = sharded_train(comm, kind, zero, SGD)
            rows.append(row(f"{tag}: == one process", max_rel(got, dense), TOL))
            rows.append(row(f"{tag}: traffic == formula", sent - predicted, ok=sent == predicted))
            got, _, _, o = sharded_train(comm, kind, zero, ADAM)
            rows.append(row(f"{tag}: Adam == DDP + Adam on every parameter", max_rel(got, replicated),
                            0.0 if zero == 1 or bitwise else TOL))
            mine = sum(p.numel() for p in o.mine)
            state = o.state_bytes()
            k = 2 * 8  # Adam: m and v in float64, + a 4-byte step per parameter
            rows.append(row(f"{tag}: state only for my share", state - (k * mine + 4 * len(o.mine)),
                            ok=state == k * mine + 4 * len(o.mine)))
            loads = [sum(p.numel() for p, r in zip(o.params, o.owner) if r == q) for q in range(comm.size)]
            largest = max(p.numel() for p in o.params)
            rows.append(row(f"{tag}: shares balanced by size", max(loads) - min(loads), largest))
        if comm.size > 1:
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


# --------------------------------------------------------------------------- FSDP


UNITS = {"gpt": (Block,), "awkward": (Gate, torch.nn.Linear)}


@memo
def fsdp_train(comm, kind, units=None, compute_dtype=None, opt=SGD, engine=None, steps=STEPS, master=torch.float64):
    """minipar's FSDP: (full state dict, facts)."""
    from minipar.torch import FullyShardedDataParallel

    model = make(kind, dtype=master)
    fsdp = (engine or FullyShardedDataParallel)(model, units=units or UNITS[kind], compute_dtype=compute_dtype,
                                                comm=comm)
    x, y = batch(kind, dtype=master)
    x, y = local(comm, x), local(comm, y)
    o = opt(model.parameters(), lr=LR)
    facts = {"grad_mismatch": [], "alive_after_forward": 0}
    for _ in range(steps):
        o.zero_grad()

        def step():
            out = fsdp(x)
            facts["alive_after_forward"] = max(facts["alive_after_forward"], fsdp.transient.now()["params"])
            loss_fn(kind, out, y).backward()
            fsdp.finish_gradient_synchronization()

        _, facts["sent"], _ = traced(comm, step)
        facts["predicted"] = fsdp.bytes_per_step()
        facts["grad_mismatch"] = [n for n, p in model.named_parameters() if p.requires_grad and (
            p.grad is None or p.grad.shape != p.data.shape or p.grad.dtype != p.data.dtype)]
        o.step()
    adam = o.__class__ is torch.optim.Adam
    facts["memory"] = fsdp.memory(o)
    facts["predicted_memory"] = fsdp.predicted_memory(k=(2 if adam else 1) * master.itemsize, per_tensor=4 if adam else 0)
    facts["names"] = list(make(kind).state_dict())
    return fsdp.full_state_dict(), facts


@memo
def fsdp2_train(comm, kind, units, param_dtype=None, master=torch.float64, opt=ADAM):
    """torch's FSDP2: fully_shard on every unit and on the root; {name: full tensor}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from minipar.zero.torch_reference import fsdp2_reduction

    reduction = fsdp2_reduction(comm)
    model = make(kind, dtype=master)
    mesh = init_device_mesh("cpu", (comm.size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=master)
    for m in model.modules():
        if isinstance(m, units):
            fully_shard(m, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    x, y = batch(kind, dtype=master)
    x, y = local(comm, x), local(comm, y)
    o = opt(model.parameters(), lr=LR)
    for _ in range(STEPS):
        o.zero_grad()
        loss_fn(kind, model(x), y).backward()
        if reduction == "sum":
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(comm.size)
        o.step()
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


@memo
def dense_mixed_train(kind, dtype, master=torch.float32, opt=ADAM):
    from minipar.torch.fsdp import dense_mixed_forward

    model = make(kind, dtype=master)
    x, y = batch(kind, dtype=master)
    o = opt(model.parameters(), lr=LR)
    for _ in range(STEPS):
        o.zero_grad()
        loss_fn(kind, dense_mixed_forward(model, dtype, x), y).backward()
        o.step()
    return params(model)


def check_fsdp(comm, kinds=("gpt", "awkward"), engine=None, mixed=True):
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        tag = f"FSDP {kind}"
        got, facts = fsdp_train(comm, kind, engine=engine)
        rows.append(row(f"{tag}: == one process", max_rel({k: got[k] for k in params(make(kind))}, dense_train(kind)),
                        TOL))
        rows.append(row(f"{tag}: traffic == formula", facts["sent"] - facts["predicted"],
                        ok=facts["sent"] == facts["predicted"]))
        rows.append(row(f"{tag}: every .grad has its .data's shape and dtype", len(facts["grad_mismatch"])))
        rows.append(row(f"{tag}: gathered weights freed after each forward", facts["alive_after_forward"]))
        rows.append(row(f"{tag}: full_state_dict under the module's own names", 0,
                        ok=list(got) == facts["names"] and all(got[n].shape == v.shape for n, v in
                                                               make(kind).state_dict().items())))
        m, pm = facts["memory"], facts["predicted_memory"]
        for cat in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            rows.append(row(f"{tag}: {cat} == ZeRO-3 ledger + allowance", m[cat] - pm[cat], ok=m[cat] == pm[cat]))
        if engine is not None:
            continue
        ours = fsdp_train(comm, kind, opt=ADAM)[0]
        names = list(params(make(kind)))
        if comm.size > 1:
            ddp = ddp_train(comm, kind, None, opt=ADAM)[0]
            rows.append(row(f"{tag}: == minipar DDP", max_rel({k: ours[k] for k in names}, ddp), 0.0 if bitwise else TOL))
            fsdp_units = (Gate,) if kind == "awkward" else None  # FSDP2 cannot shard one weight in two modules
            theirs = fsdp2_train(comm, kind, fsdp_units or UNITS[kind])
            ours2 = fsdp_train(comm, kind, units=fsdp_units, opt=ADAM)[0]
            rows.append(row(f"{tag}: == torch FSDP2 fully_shard", max_rel({k: ours2[k] for k in names}, theirs),
                            0.0 if bitwise else TOL))
        if mixed and kind == "gpt":
            rows += check_fsdp_mixed(comm)
    return rows


def check_fsdp_mixed(comm, engine=None, kind="gpt"):
    """compute_dtype=bfloat16, fp32 master: grads' dtype, bytes, memory; against one process and FSDP2."""
    rows, tag, bf = [], f"FSDP {kind}", torch.bfloat16
    names = list(params(make(kind)))
    got, facts = fsdp_train(comm, kind, compute_dtype=bf, opt=ADAM, master=torch.float32, engine=engine)
    rows.append(row(f"{tag} bf16: every .grad has its .data's shape and dtype (fp32)", len(facts["grad_mismatch"])))
    rows.append(row(f"{tag} bf16: traffic == formula (gathers bf16, reduce-scatter fp32)",
                    facts["sent"] - facts["predicted"], ok=facts["sent"] == facts["predicted"]))
    m, pm = facts["memory"], facts["predicted_memory"]
    for cat in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        rows.append(row(f"{tag} bf16: {cat} == ZeRO-3 ledger + allowance", m[cat] - pm[cat], ok=m[cat] == pm[cat]))
    got = {k: got[k] for k in names}
    if comm.size > 1:  # the same split of the batch, the same casts: equal up to the order of the fp32 sums
        theirs = fsdp2_train(comm, kind, UNITS[kind], param_dtype=bf, master=torch.float32)
        rows.append(row(f"{tag} bf16: == torch FSDP2 MixedPrecisionPolicy(bf16, reduce fp32) (tol 1e-5)",
                        max_rel(got, theirs), 1e-5))
    if engine is None:  # the whole batch at once: bf16 rounds differently, SGD keeps it from growing
        sgd = fsdp_train(comm, kind, compute_dtype=bf, master=torch.float32)[0]
        rows.append(row(f"{tag} bf16: == one process with bf16 weights (tol 2e-2: bf16)",
                        max_rel({k: sgd[k] for k in names}, dense_mixed_train(kind, bf, opt=SGD)), 2e-2))
    return rows


# --------------------------------------------------------------------------- tensor parallelism


def gpt_plan(sequence=False, n_layer=2):
    plan = {}
    for i in range(n_layer):
        b = f"blocks.{i}"
        plan.update({f"{b}.attn.q": "colwise", f"{b}.attn.k": "colwise", f"{b}.attn.v": "colwise",
                     f"{b}.attn.o": "rowwise", f"{b}.mlp.fc": "colwise", f"{b}.mlp.proj": "rowwise"})
        if sequence:
            plan.update({f"{b}.ln_1": "sequence", f"{b}.ln_2": "sequence"})
    if sequence:
        plan["ln_f"] = "sequence"
    return plan


def tp_calls(comm, plan, B=6, T=6, C=24, item=8):
    """The collectives one step of the GPT under ``plan`` runs: (function, n, itemsize)."""
    n, sequence = B * T * C, "sequence" in plan.values()
    calls = []
    for style in plan.values():
        if style == "colwise":
            calls.append(("sp_gather" if sequence else "f", n, item))
        elif style == "rowwise":
            calls.append(("sp_scatter" if sequence else "g", n, item))
            calls += [("grad", C, item)] if sequence else []  # its bias, added to my tokens only
        else:
            calls += [("grad", C, item), ("grad", C, item)]  # a LayerNorm's weight and bias
    if sequence:
        calls += [("split_tokens", n, item), ("gather_tokens", n, item)]
    return calls


def tp_run(comm, plan, model=None, x=None):
    """(logits, {name: grad}, bytes sent) of one forward and backward of the GPT split by ``plan``."""
    from minipar.torch import parallelize
    from minipar.torch.tp import gather_tokens, split_tokens

    model = model or make("gpt")
    parallelize(model, plan, comm)
    if "sequence" in plan.values():
        model.drop.register_forward_hook(lambda m, i, o: split_tokens(comm, o))
        model.ln_f.register_forward_hook(lambda m, i, o: gather_tokens(comm, o))
    x, y = batch("gpt") if x is None else x

    def step():
        logits = model(x)
        loss_fn("gpt", logits, y).backward()
        return logits.detach()

    logits, sent, _ = traced(comm, step)
    return logits, {n: p.grad.detach().clone() for n, p in model.named_parameters()}, sent


def my_part(comm, name, grad, plan):
    """This rank's part of a dense gradient under ``plan``."""
    module, _, what = name.rpartition(".")
    style = plan.get(module)
    if style == "colwise":
        return grad.chunk(comm.size, 0)[comm.rank]
    if style == "rowwise" and what == "weight":
        return grad.chunk(comm.size, 1)[comm.rank]
    return grad


def dtensor_run(comm, plan, sequence_block=False):
    """torch's DTensor tensor parallelism on the same plan: (output, {name: local grad})."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    mesh = init_device_mesh("cpu", (comm.size,))
    seq = "sequence" in plan.values()
    styles = {"colwise": ColwiseParallel(input_layouts=Shard(1)) if seq else ColwiseParallel(),
              "rowwise": RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel(),
              "sequence": SequenceParallel()}
    model, x, y = block_case(comm) if sequence_block else (make("gpt"), *batch("gpt"))
    parallelize_module(model, mesh, {k: styles[v] for k, v in plan.items()})
    out = model(x)
    (out.sum() if sequence_block else loss_fn("gpt", out, y)).backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad
        grads[n] = (g.full_tensor() if g.placements[0].is_partial() else g.to_local()) if hasattr(g, "to_local") else g
    return out.detach(), grads


def block_case(comm):
    """One Block, sequence parallel: (block, this rank's tokens of x, None)."""
    torch.manual_seed(3)
    block = Block(24, 6, 6).double()
    x = torch.randn(2, 6, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    return block, x.chunk(comm.size, 1)[comm.rank].contiguous(), None


def check_tp(comm, sequences=(False, True), against_torch=True):
    rows = []
    model = make("gpt")
    x, y = batch("gpt")
    logits = model(x)
    loss_fn("gpt", logits, y).backward()
    dense = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for sequence in sequences:
        plan = gpt_plan(sequence)
        tag = f"TP gpt{' sequence parallel' if sequence else ''}"
        out, grads, sent = tp_run(comm, plan)
        rows.append(row(f"{tag}: logits == one process", rel(out, logits), TOL))
        rows.append(row(f"{tag}: gradients == one process (my shards)",
                        max_rel(grads, {n: my_part(comm, n, g, plan) for n, g in dense.items()}), TOL))
        from minipar.torch.tp import bytes_per_step

        predicted = bytes_per_step(comm, tp_calls(comm, plan))
        rows.append(row(f"{tag}: traffic == formula", sent - predicted, ok=sent == predicted))
        if comm.size > 1 and not sequence and against_torch:
            t_out, t_grads = dtensor_run(comm, plan)
            rows.append(row(f"{tag}: == torch DTensor ColwiseParallel/RowwiseParallel",
                            max(rel(out, t_out), max_rel(grads, t_grads)), TOL))
    if comm.size > 1 and against_torch:  # sequence parallelism against torch's, on one block
        plan = {"ln_1": "sequence", "ln_2": "sequence", "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
                "attn.o": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
        from minipar.torch import parallelize

        block, xl, _ = block_case(comm)
        parallelize(block, plan, comm)
        out = block(xl)
        out.sum().backward()
        grads = {n: p.grad for n, p in block.named_parameters()}
        t_out, t_grads = dtensor_run(comm, plan, sequence_block=True)
        t_out = t_out.to_local() if hasattr(t_out, "to_local") else t_out
        rows.append(row("TP block sequence parallel: == torch DTensor SequenceParallel",
                        max(rel(out, t_out), max_rel(grads, t_grads)), TOL))
    return rows


# --------------------------------------------------------------------------- world size 1


def check_world_of_one(comm):
    """Every engine on a one-rank communicator (each rank alone): the dense result, no bytes, one line."""
    from minipar.torch import FullyShardedDataParallel, ShardedOptimizer

    one = comm.split(comm.rank, name="alone")
    err = io.StringIO()
    rows = []
    with contextlib.redirect_stderr(err):
        got, facts = ddp_train(one, "gpt")
        rows.append(row("world of 1: DDP == one process, sends nothing", max_rel(got, dense_train("gpt")), TOL,
                        ok=facts["sent"] == 0 and max_rel(got, dense_train("gpt")) <= TOL))
        model = make("gpt")
        o = ShardedOptimizer(model.parameters(), torch.optim.SGD, comm=one, lr=LR)
        FullyShardedDataParallel(make("gpt"), units=(Block,), comm=one)
        ddp_train(one, "gpt", steps=1)
    said = err.getvalue().splitlines()
    rows.append(row("world of 1: each engine says 'a no-op' once", 0,
                    ok=len(said) == 3 and all("a no-op" in s for s in said) and o.optimizer is not None))
    return rows


# --------------------------------------------------------------------------- planted bugs


def planted(comm):
    """{bug: [the checks it fails]}, each bug planted in a subclass or patched in."""
    from minipar.torch import DistributedDataParallel, FullyShardedDataParallel, tp
    from minipar.torch.ddp import GradientReducer
    from minipar.torch.fsdp import Unit

    class TiedTwice(DistributedDataParallel):
        def params_of(self, module):  # a hook per *name*: the tied weight has two slots, two all-reduces
            return [p for _, p in module.named_parameters(remove_duplicate=False) if p.requires_grad]

    class EarlyFlush(GradientReducer):
        def full(self, bucket):  # the bucket starts while its last gradient is still to come
            return len(bucket.arrived) >= len(bucket.slots) - 1

    class EarlyDDP(DistributedDataParallel):
        reducer_class = EarlyFlush

    class FreedUnit(Unit):
        def backward_weights(self):  # freed after the forward, never gathered again: the memory is gone
            return torch.zeros(self.n_pad, dtype=self.compute, device=self.shard.device)

    class FreedFSDP(FullyShardedDataParallel):
        unit_class = FreedUnit

    class Fp16Unit(Unit):
        def full_gradient(self, grad):  # the gradient left in the compute dtype
            return grad.contiguous().clone()

    class Fp16FSDP(FullyShardedDataParallel):
        unit_class = Fp16Unit

    out = {"tied weight all-reduced twice": failing(check_ddp(comm, ("gpt",), engine=TiedTwice)),
           "bucket flushed before its last gradient": failing(check_ddp(comm, ("gpt",), engine=EarlyDDP)),
           "FSDP unit freed before its backward": failing(check_fsdp(comm, ("gpt",), engine=FreedFSDP, mixed=False))}
    out["gradient left in fp16"] = failing(check_fsdp_mixed(comm, engine=Fp16FSDP))
    good = tp.rowwise_forward
    tp.rowwise_forward = lambda module, comm, sequence, x: torch.nn.functional.linear(x, module.weight, module.bias)
    try:
        out["rowwise layer without its all-reduce"] = failing(check_tp(comm, (False,), against_torch=False))
    finally:
        tp.rowwise_forward = good
    return out


def failing(rows):
    return sorted({r["check"] for r in rows if not r["ok"]})


# --------------------------------------------------------------------------- one launch per world size


def battery(comm, engines=("ddp", "sharded", "fsdp", "tp", "one"), bugs=False):
    """Every check of ``engines`` at this world size: ({check: row}, facts, seconds per engine,
    and with ``bugs`` the planted bugs' failing checks and a tiny run of the overlap benchmark)."""
    checks = {"ddp": check_ddp, "sharded": check_sharded, "fsdp": check_fsdp, "tp": check_tp,
              "one": check_world_of_one}
    rows, seconds = {}, {}
    for name in engines:
        t = time.perf_counter()
        for r in checks[name](comm):
            rows[r["check"]] = r
        seconds[name] = time.perf_counter() - t
    t = time.perf_counter()
    caught = planted(comm) if bugs else {}
    seconds["planted bugs"] = time.perf_counter() - t
    facts = ddp_facts(comm)
    if bugs:
        from minipar.bench.torch_engines import overlap

        facts["bench"] = overlap(comm, layers=3, width=64, batch=8, steps=2)
    return rows, facts, seconds, caught




# --------------------------------------------------------------------------- a process group the script made


def user_group(rank, world, port, path):
    """What a user's script does under mp.spawn: its own dist.init_process_group("gloo"), no
    minipar.init, every engine with comm=None. Writes {check: row} to ``path``.rank."""
    import datetime
    import os
    import pickle

    import torch.distributed as dist

    from minipar.torch import DistributedDataParallel, FullyShardedDataParallel, ShardedOptimizer, parallelize

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    rows = []
    try:
        model = make("gpt")
        ddp = DistributedDataParallel(model, bucket_size_mb=0.004)
        o = ShardedOptimizer(model.parameters(), torch.optim.SGD, momentum=0.9, lr=LR)
        x, y = batch("gpt")
        comm = ddp.comm
        for _ in range(STEPS):
            o.zero_grad()
            loss_fn("gpt", ddp(local(comm, x)), local(comm, y)).backward()
            ddp.finish_gradient_synchronization()
            o.step()
        rows.append(row("user group: DDP + ShardedOptimizer == one process", max_rel(params(model), dense_train("gpt")),
                        TOL))
        rows.append(row("user group: one communicator over the default group", 0,
                        ok=o.comm is comm and comm.size == world and comm.group is None))
        model = make("gpt")
        fsdp = FullyShardedDataParallel(model, units=(Block,))
        sgd = SGD(model.parameters(), lr=LR)
        for _ in range(STEPS):
            sgd.zero_grad()
            loss_fn("gpt", fsdp(local(comm, x)), local(comm, y)).backward()
            fsdp.finish_gradient_synchronization()
            sgd.step()
        got = fsdp.full_state_dict()
        rows.append(row("user group: FSDP == one process", max_rel({k: got[k] for k in params(make("gpt"))},
                                                                   dense_train("gpt")), TOL))
        model = make("gpt")
        parallelize(model, gpt_plan(), None)
        rows.append(row("user group: parallelize == one process", rel(model(x), make("gpt")(x)), TOL))
    finally:
        dist.destroy_process_group()
    with open(f"{path}.{rank}", "wb") as f:
        pickle.dump(rows, f)
