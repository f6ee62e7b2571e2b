"""Planted bug: the gathered weights kept for the backward

The forward saves the full weights for the backward instead of gathering them again: the values
are right and one all-gather per unit is saved, but every unit's full weights stay alive from
its forward to its backward: the memory of plain data parallelism.

EXPECT_TASK: 9.2
EXPECT_MESSAGE: are still alive after the units' forward returned
EXPECT_MESSAGE: FSDP frees a unit's full weights when its forward ends and gathers them again in its backward
"""
import torch

from minipar.collectives import all_gather, reduce_scatter


class GatheredUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        dtype = compute_dtype or shard.dtype
        full = all_gather(comm, shard.detach().to(dtype))
        ctx.save_for_backward(shard, x, full)  # BUG: the full weights live on until the backward
        ctx.comm, ctx.layer, ctx.n, ctx.dtype = comm, layer, n, dtype
        return layer(full[:n], x.to(dtype))

    @staticmethod
    def backward(ctx, dy):
        shard, x, full = ctx.saved_tensors
        comm, S = ctx.comm, shard.numel()
        w = full[:ctx.n].detach().requires_grad_()
        xd = x.detach().to(ctx.dtype).requires_grad_()
        with torch.enable_grad():
            dw, dx = torch.autograd.grad(ctx.layer(w, xd), (w, xd), dy)
        g = torch.zeros(comm.size * S, dtype=shard.dtype)
        g[:ctx.n] = dw.to(shard.dtype)
        return reduce_scatter(comm, g) / comm.size, dx.to(x.dtype), None, None, None, None


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)
