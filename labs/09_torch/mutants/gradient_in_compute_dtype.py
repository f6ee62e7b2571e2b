"""Planted bug: the gradient left in the compute dtype

The unit's gradient, computed in bfloat16, is reduce-scattered in bfloat16 and only then cast
to the shards' float32: half the bytes, and every sum rounded to bfloat16's 8 bits.

EXPECT_TASK: 9.2
EXPECT_MESSAGE: rank 0 sent
EXPECT_MESSAGE: a reduce-scatter of the gradient in float32 (2 ranks, shards float32, computing in bfloat16)
EXPECT_MESSAGE: reduce the gradient in the shards' dtype (the master copy's), never in the compute dtype
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
        w = all_gather(comm, shard.detach().to(ctx.dtype))[:ctx.n].requires_grad_()
        xd = x.detach().to(ctx.dtype).requires_grad_()
        with torch.enable_grad():
            dw, dx = torch.autograd.grad(ctx.layer(w, xd), (w, xd), dy)
        g = torch.zeros(comm.size * S, dtype=dw.dtype)  # BUG: the compute dtype, not shard.dtype
        g[:ctx.n] = dw
        return (reduce_scatter(comm, g) / comm.size).to(shard.dtype), dx.to(x.dtype), None, None, None, None


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)
