"""Lesson 09 on real ranks, fully sharded: ``minipar.torch.FullyShardedDataParallel`` (ZeRO-3) on
torch modules, against one process, minipar's DDP, torch's FSDP2, its bytes and lesson 04's ledger.

    from minipar import launch
    out = launch(2, "minipar.lessons.torch_fsdp:check_fsdp", backend="torch")        # check rows
    out = launch(2, "minipar.lessons.torch_fsdp:memory_per_rank", backend="torch")   # DDP vs FSDP, counted

Tolerances: float64 as in ``minipar.lessons.torch_ddp`` (1e-12 against one process; bitwise
against minipar's DDP and FSDP2 on 2 ranks). bfloat16 compute with a float32 master: 1e-5
against FSDP2 (the same casts and split of the batch: only the order of the float32 sums
differs), 2e-2 against one process computing in bfloat16 (the whole batch at once rounds
differently; bfloat16 keeps 8 bits).
"""
from __future__ import annotations

import torch

from .torch_fixtures import (ADAM, LR, SGD, STEPS, TOL, Block, Gate, batch, count_row, ddp_train, dense_train, local,
                             loss_fn, make, max_rel, memo, params, row, traced)

UNITS = {"gpt": (Block,), "awkward": (Gate, torch.nn.Linear)}


@memo
def fsdp_train(comm, kind, units=None, compute_dtype=None, opt=SGD, engine=None, steps=STEPS, master=torch.float64):
    """minipar's FSDP: (full state dict, facts). ``engine``: a class to use instead (a planted bug)."""
    from ..torch import FullyShardedDataParallel

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

    from ..zero.torch_reference import fsdp2_reduction

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
    """One process, the whole batch, every weight cast to ``dtype`` for the forward and backward."""
    from ..torch.fsdp import dense_mixed_forward

    model = make(kind, dtype=master)
    x, y = batch(kind, dtype=master)
    o = opt(model.parameters(), lr=LR)
    for _ in range(STEPS):
        o.zero_grad()
        loss_fn(kind, dense_mixed_forward(model, dtype, x), y).backward()
        o.step()
    return params(model)


def check_fsdp(comm, kinds=("gpt", "awkward"), engine=None, mixed=True, against_torch=True):
    """FSDP in float64: == one process, bytes, .grad's shape and dtype, gathered weights freed,
    full_state_dict, memory == lesson 04's ZeRO-3 ledger; == minipar's DDP and torch's FSDP2."""
    rows, bitwise = [], comm.size <= 2
    for kind in kinds:
        tag = f"FSDP {kind}"
        got, facts = fsdp_train(comm, kind, engine=engine)
        rows.append(row(f"{tag}: == one process", max_rel({k: got[k] for k in params(make(kind))}, dense_train(kind)),
                        TOL))
        rows.append(count_row(f"{tag}: traffic == formula", facts["sent"], facts["predicted"]))
        rows.append(row(f"{tag}: every .grad has its .data's shape and dtype", len(facts["grad_mismatch"])))
        rows.append(row(f"{tag}: gathered weights freed after each forward", facts["alive_after_forward"]))
        rows.append(row(f"{tag}: full_state_dict under the module's own names", 0,
                        ok=list(got) == facts["names"] and all(got[n].shape == v.shape for n, v in
                                                               make(kind).state_dict().items())))
        m, pm = facts["memory"], facts["predicted_memory"]
        for cat in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            rows.append(count_row(f"{tag}: {cat} == ZeRO-3 ledger + allowance", m[cat], pm[cat]))
        if engine is not None:
            continue
        ours = fsdp_train(comm, kind, opt=ADAM)[0]
        names = list(params(make(kind)))
        if comm.size > 1:
            ddp = ddp_train(comm, kind, None, opt=ADAM)[0]
            rows.append(row(f"{tag}: == minipar DDP", max_rel({k: ours[k] for k in names}, ddp), 0.0 if bitwise else TOL))
        if comm.size > 1 and against_torch:
            fsdp_units = (Gate,) if kind == "awkward" else None  # FSDP2 cannot shard one weight in two modules
            theirs = fsdp2_train(comm, kind, fsdp_units or UNITS[kind])
            ours2 = fsdp_train(comm, kind, units=fsdp_units, opt=ADAM)[0]
            rows.append(row(f"{tag}: == torch FSDP2 fully_shard", max_rel({k: ours2[k] for k in names}, theirs),
                            0.0 if bitwise else TOL))
        if mixed and kind == "gpt":
            rows += check_fsdp_mixed(comm, against_torch=against_torch)
    return rows


def check_fsdp_mixed(comm, engine=None, kind="gpt", against_torch=True):
    """compute_dtype=bfloat16, fp32 master: grads' dtype, bytes, memory; against one process and FSDP2."""
    rows, tag, bf = [], f"FSDP {kind}", torch.bfloat16
    names = list(params(make(kind)))
    got, facts = fsdp_train(comm, kind, compute_dtype=bf, opt=ADAM, master=torch.float32, engine=engine)
    rows.append(row(f"{tag} bf16: every .grad has its .data's shape and dtype (fp32)", len(facts["grad_mismatch"])))
    rows.append(count_row(f"{tag} bf16: traffic == formula (gathers bf16, reduce-scatter fp32)",
                          facts["sent"], facts["predicted"]))
    m, pm = facts["memory"], facts["predicted_memory"]
    for cat in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        rows.append(count_row(f"{tag} bf16: {cat} == ZeRO-3 ledger + allowance", m[cat], pm[cat]))
    got = {k: got[k] for k in names}
    if comm.size > 1 and against_torch:  # the same split of the batch, the same casts: equal up to the fp32 sums' order
        theirs = fsdp2_train(comm, kind, UNITS[kind], param_dtype=bf, master=torch.float32)
        rows.append(row(f"{tag} bf16: == torch FSDP2 MixedPrecisionPolicy(bf16, reduce fp32) (tol 1e-5)",
                        max_rel(got, theirs), 1e-5))
    if engine is None:  # the whole batch at once: bf16 rounds differently, SGD keeps it from growing
        sgd = fsdp_train(comm, kind, compute_dtype=bf, master=torch.float32)[0]
        rows.append(row(f"{tag} bf16: == one process with bf16 weights (tol 2e-2: bf16)",
                        max_rel({k: sgd[k] for k in names}, dense_mixed_train(kind, bf, opt=SGD)), 2e-2))
    return rows


# --------------------------------------------------------------------------- memory per rank, for the figure


def memory_per_rank(comm, n_layer=6, master=torch.float32, steps=STEPS):
    """The bytes each rank holds after an Adam step of the lesson's GPT with ``n_layer`` blocks
    (float32), DDP against FSDP (units: its blocks), counted through lesson 04's ``Ledger`` beside
    the formula: {"records": every rank's [{"rank", "engine", "measured": {category: bytes},
    "predicted": {...}}], "rows": measured == predicted per engine, rank and category, ...} on
    rank 0 (None elsewhere). FSDP's params and grads include, at their peak, one gathered block
    and one block's full gradient (``gathered_bytes``, ``unit_grad_bytes``)."""
    from ..memory import Ledger, zero_bytes
    from ..torch import DistributedDataParallel, FullyShardedDataParallel
    from .torch_fixtures import GPT

    kind = "gpt"
    x, y = batch(kind, dtype=master)
    x, y = local(comm, x), local(comm, y)
    out = []
    for engine in ("DDP", "FSDP"):
        torch.manual_seed(0)
        model = GPT(n_layer=n_layer).to(master)
        wrapped = (DistributedDataParallel(model, comm=comm) if engine == "DDP"
                   else FullyShardedDataParallel(model, units=UNITS[kind], comm=comm))
        o = ADAM(model.parameters(), lr=LR)
        for _ in range(steps):
            o.zero_grad()
            loss_fn(kind, wrapped(x), y).backward()
            wrapped.finish_gradient_synchronization()
            o.step()
        if engine == "FSDP":
            measured = wrapped.memory(o)
            predicted = wrapped.predicted_memory(k=2 * master.itemsize, per_tensor=4)
            measured["buckets_bytes"] = predicted["buckets_bytes"] = 0
            transient = {k: int(measured[k]) for k in ("gathered_bytes", "unit_grad_bytes")}
        else:
            ledger = Ledger()
            trainable = [p for p in model.parameters() if p.requires_grad]
            unique = list({id(p): p for p in model.parameters()}.values())
            ledger.track("params", *unique)
            ledger.track("grads", *{id(p.grad): p.grad for p in trainable}.values())
            ledger.track("optimizer", *[t for s in o.state.values() for t in s.values() if isinstance(t, torch.Tensor)])
            now = ledger.now()
            buckets = sum(b.nbytes for b in wrapped.reducer.buckets)  # the flat copies the rings run on
            measured = {"params_bytes": now["params"], "grads_bytes": now["grads"], "optimizer_bytes": now["optimizer"],
                        "buckets_bytes": buckets}
            psi = sum(p.numel() for p in unique)
            z = zero_bytes(psi, comm.size, 0, master.itemsize, master.itemsize, 2 * master.itemsize)
            predicted = {"params_bytes": z["params_bytes"], "grads_bytes": z["grads_bytes"],
                         "optimizer_bytes": z["optimizer_bytes"] + 4 * len(unique), "buckets_bytes": psi * master.itemsize}
            transient = {"gathered_bytes": 0, "unit_grad_bytes": 0}
        measured = {k: int(v) for k, v in measured.items() if k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                                       "buckets_bytes")}
        predicted = {k: int(round(predicted[k])) for k in measured}
        out.append({"rank": comm.rank, "engine": engine, "measured": measured, "predicted": predicted,
                    "transient": transient, "psi": sum(q.numel() for q in {id(q): q for q in model.parameters()}.values())})
    everyone = comm.builtin.gather_object(out, 0)
    if comm.rank:
        return None
    records = [r for rank in everyone for r in rank]
    rows = [count_row(f"{r['engine']} rank {r['rank']}: {cat} == the formula", r["measured"][cat], r["predicted"][cat])
            for r in records for cat in r["measured"]]
    return {"records": records, "ranks": comm.size, "n_layer": n_layer, "dtype": str(master).replace("torch.", ""),
            "rows": rows}
