"""The same training with PyTorch's own ZeRO: ``ZeroRedundancyOptimizer`` and FSDP2 ``fully_shard``.

    out = minipar.launch(2, "minipar.lessons.data_parallel:against_torch", backend="torch")

Runs inside a job started with ``backend="torch"`` (``minipar.init("torch")`` has initialised
torch's default process group, gloo on CPU). Each function copies a minipar model (Linear, GeLU)
into ``torch.nn`` (a Linear's weight is our ``w`` transposed), trains it on this rank's batch
with ``torch.optim.Adam`` and returns the parameters under minipar's names, as NumPy arrays.

FSDP2 on gloo: PyTorch issue #162338 reported gradients *summed* instead of averaged on gloo
(the AVG reduce-scatter was not honoured). ``fsdp2_reduction`` measures which one this torch
does, and ``train_fsdp2`` divides the gradients by N itself when it sums, so the comparison holds
either way (torch 2.13 averages).
"""
from __future__ import annotations

import numpy as np

from .. import nn


def to_torch(model):
    """A float64 ``torch.nn.Sequential`` with the same weights as minipar's Sequential ``model``."""
    import torch

    layers = []
    for layer in model.children().values():
        if isinstance(layer, nn.Linear):
            w = np.asarray(layer.params["w"])  # (d_in, d_out)
            t = torch.nn.Linear(*w.shape, bias="b" in layer.params, dtype=torch.float64)
            with torch.no_grad():
                t.weight.copy_(torch.from_numpy(w.T.copy()))  # (d_out, d_in)
                if "b" in layer.params:
                    t.bias.copy_(torch.from_numpy(np.asarray(layer.params["b"])))
            layers.append(t)
        elif isinstance(layer, nn.GeLU):
            layers.append(torch.nn.GELU(approximate="tanh"))
        else:
            raise TypeError(f"to_torch: no torch twin for {type(layer).__name__}")
    return torch.nn.Sequential(*layers)


def from_torch(tmodel, full=lambda p: p):
    """{minipar name: NumPy array} of a torch Sequential's parameters ("0.w" is weight.T)."""
    out = {}
    for i, layer in enumerate(tmodel):
        if hasattr(layer, "weight"):
            out[f"{i}.w"] = full(layer.weight).detach().numpy().T.copy()
            if layer.bias is not None:
                out[f"{i}.b"] = full(layer.bias).detach().numpy().copy()
    return out


def train_zero_redundancy(comm, model, x, y, steps, lr):
    """DDP (gradient averaging) + ZeroRedundancyOptimizer(Adam) (state sharded by parameter)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    tmodel = to_torch(model)
    ddp = DistributedDataParallel(tmodel)
    opt = ZeroRedundancyOptimizer(tmodel.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return from_torch(tmodel)


def fsdp2_reduction(comm):
    """"average" or "sum": what FSDP2's gradient reduce-scatter does on this backend.

    A bias-free Linear(1, 1) with weight 1 on input x = rank + 1: the local gradient of sum(y)
    is rank + 1, so the average over ranks is (N+1)/2 and the sum N(N+1)/2.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if comm.size == 1:
        return "average"
    lin = torch.nn.Linear(1, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    fully_shard(lin, mesh=init_device_mesh("cpu", (comm.size,)))
    lin(torch.full((1, 1), comm.rank + 1.0, dtype=torch.float64)).sum().backward()
    g = float(lin.weight.grad.full_tensor().item())
    return "average" if abs(g - (comm.size + 1) / 2) < 1e-9 else "sum"


def train_fsdp2(comm, model, x, y, steps, lr):
    """FSDP2: every Linear and the root wrapped with ``fully_shard`` (params are sharded DTensors,
    gathered per layer in forward and backward). Returns (params, "average" | "sum")."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    reduction = fsdp2_reduction(comm)
    tmodel = to_torch(model)
    mesh = init_device_mesh("cpu", (comm.size,))
    for layer in tmodel:
        if hasattr(layer, "weight"):
            fully_shard(layer, mesh=mesh)
    fully_shard(tmodel, mesh=mesh)
    opt = torch.optim.Adam(tmodel.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(tmodel(x), y).backward()
        if reduction == "sum":  # the gloo issue: compare against sum / N
            for p in tmodel.parameters():
                p.grad.div_(comm.size)
        opt.step()
    return from_torch(tmodel, full=lambda p: p.full_tensor()), reduction
