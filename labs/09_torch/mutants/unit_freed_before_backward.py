"""Planted bug: an FSDP unit freed before its backward, and never gathered again

The forward gathers the weights and frees them, as it should; but the backward computes with
what this rank still has, its own shard with zeros where the other ranks' pieces were, instead
of gathering the weights again.

EXPECT_TASK: 9.2
EXPECT_MESSAGE: the backward of 2 units: per unit an all-gather of the shards in float64 and a reduce-scatter of the gradient in float64
EXPECT_MESSAGE: the weights were freed after the forward: gather them again for the backward
"""
import torch

from minipar.collectives import all_gather, reduce_scatter


class GatheredUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        dtype = compute_dtype or shard.dtype
        y = layer(all_gather(comm, shard.detach().to(dtype))[:n], x.to(dtype))
        ctx.save_for_backward(shard, x)
        ctx.comm, ctx.layer, ctx.n, ctx.dtype = comm, layer, n, dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        shard, x = ctx.saved_tensors
        comm, S = ctx.comm, shard.numel()
        full = torch.zeros(comm.size * S, dtype=ctx.dtype)  # BUG: what is left: my shard, zeros elsewhere
        full[comm.rank * S:(comm.rank + 1) * S] = shard.detach()
        w = full[:ctx.n].requires_grad_()
        xd = x.detach().to(ctx.dtype).requires_grad_()
        with torch.enable_grad():
            dw, dx = torch.autograd.grad(ctx.layer(w, xd), (w, xd), dy)
        g = torch.zeros(comm.size * S, dtype=shard.dtype)
        g[:ctx.n] = dw
        return reduce_scatter(comm, g) / comm.size, dx.to(x.dtype), None, None, None, None


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)
