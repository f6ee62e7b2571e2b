"""Lab 09's reference: DDP's gradient hooks, one FSDP unit, and Megatron's f and g, on torch
tensors with autograd, every message through minipar's collectives."""
import torch

from ..collectives import all_gather, all_reduce, drain, reduce_scatter, ring_steps

TAG = 900  # + the bucket's index: rings of several buckets may be in flight together


# --------------------------------------------------------------------------- 9.1 DDP's hooks


class GradientBuckets:
    """DDP's hooks and buckets: each bucket's ring starts from the hook that completes it."""

    def __init__(self, comm, module, bucket_bytes):
        self.comm = comm
        params = [p for p in module.parameters() if p.requires_grad]  # parameters() lists a tied weight once
        self.buckets, size = [], 0  # each: [params, flat buffer, gradients in, the ring or None]
        for p in reversed(params):  # the order the backward usually completes them
            nb = p.numel() * p.element_size()
            if self.buckets and size + nb <= bucket_bytes:
                self.buckets[-1][0].append(p)
                size += nb
            else:
                self.buckets.append([[p], None, 0, None])
                size = nb
        self.where = {}  # id(param) -> (bucket index, start, stop) in its flat buffer
        for i, bucket in enumerate(self.buckets):
            n = 0
            for p in bucket[0]:
                self.where[id(p)] = (i, n, n + p.numel())
                n += p.numel()
            bucket[1] = torch.zeros(n, dtype=bucket[0][0].dtype, device=bucket[0][0].device)  # (n,)
        for p in params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        i, a, b = self.where[id(param)]
        bucket = self.buckets[i]
        bucket[1][a:b] = param.grad.reshape(-1)
        bucket[2] += 1
        if bucket[2] == len(bucket[0]):  # its last gradient is in: post the ring's first step now
            bucket[3] = ring_steps(self.comm, bucket[1], tag=TAG + i)
            next(bucket[3], None)

    def finish(self):
        for params, flat, _, ring in self.buckets:
            drain(ring)  # the rest of the ring: wait, add, send on
            flat /= self.comm.size
            n = 0
            for p in params:
                p.grad.copy_(flat[n:n + p.numel()].view_as(p))
                n += p.numel()
        for bucket in self.buckets:
            bucket[2], bucket[3] = 0, None


# --------------------------------------------------------------------------- 9.2 one FSDP unit


def gathered(comm, shard, dtype):
    """The unit's padded flat weights (p x S,), every rank's shard in rank order, in ``dtype``."""
    return all_gather(comm, shard.detach().to(dtype))


def padded_grad(comm, dw, S):
    """The full flat gradient, zero-padded to p x S, in ``dw``'s dtype."""
    out = torch.zeros(comm.size * S, dtype=dw.dtype, device=dw.device)
    out[:dw.numel()] = dw.reshape(-1)
    return out


class GatheredUnit(torch.autograd.Function):
    """FSDP around ``layer``: all-gather before the forward, free after; gather again in the
    backward, reduce-scatter the gradient into the shard."""

    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        dtype = compute_dtype or shard.dtype
        w = gathered(comm, shard, dtype)[:n]  # (n,) the full weights, only while the unit runs
        y = layer(w, x.to(dtype))
        ctx.save_for_backward(shard, x)  # not w: it is freed when forward returns
        ctx.comm, ctx.layer, ctx.n, ctx.dtype = comm, layer, n, dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        shard, x = ctx.saved_tensors
        comm, dtype = ctx.comm, ctx.dtype
        w = gathered(comm, shard, dtype)[:ctx.n].requires_grad_()  # gathered again
        xd = x.detach().to(dtype).requires_grad_()
        with torch.enable_grad():
            dw, dx = torch.autograd.grad(ctx.layer(w, xd), (w, xd), dy)
        del w  # freed before the reduce-scatter
        g = padded_grad(comm, dw.to(shard.dtype), shard.numel())  # reduced in the master dtype
        return reduce_scatter(comm, g) / comm.size, dx.to(x.dtype), None, None, None, None


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)


# --------------------------------------------------------------------------- 9.3 f and g


class CopyToRanks(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return None, all_reduce(ctx.comm, dx.contiguous())


class SumFromRanks(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, comm, y):
        return all_reduce(comm, y.contiguous())

    @staticmethod
    def backward(ctx, dy):
        return None, dy


def f(comm, x):
    return CopyToRanks.apply(comm, x)


def g(comm, y):
    return SumFromRanks.apply(comm, y)


def tp_mlp(comm, x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(f(comm, x) @ w1.T + b1)  # (B, H/p): my hidden features
    return g(comm, h @ w2.T) + b2  # (B, C): the whole output on every rank
