"""Lab 09 solved as a learner would, with minipar.collectives only (no solution module, no
minipar.torch): each bucket's all-reduce runs to the end inside the hook that fills it (blocking:
simpler than posting a ring and finishing it later, and still inside the backward). Must pass
`minipar check 09 --file`."""
import torch

from minipar.collectives import all_gather, all_reduce, reduce_scatter


class Bucket:
    def __init__(self, params):
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat = torch.zeros(n, dtype=params[0].dtype)
        self.filled = 0
        self.result = None


class GradientBuckets:
    def __init__(self, comm, module, bucket_bytes):
        self.comm = comm
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.buckets, current, size = [], [], 0
        for p in trainable[::-1]:
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > bucket_bytes:
                self.buckets.append(Bucket(current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        self.buckets.append(Bucket(current))
        self.slot = {}
        for b in self.buckets:
            for p, at in zip(b.params, b.offsets):
                self.slot[p] = (b, at)
        for p in trainable:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        b, at = self.slot[param]
        b.flat[at:at + param.numel()] = param.grad.flatten()
        b.filled += 1
        if b.filled == len(b.params):
            b.result = all_reduce(self.comm, b.flat) / self.comm.size

    def finish(self):
        for b in self.buckets:
            for p, at in zip(b.params, b.offsets):
                p.grad.copy_(b.result[at:at + p.numel()].view(p.shape))
            b.filled, b.result = 0, None


class GatheredUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        dtype = compute_dtype if compute_dtype is not None else shard.dtype
        full = all_gather(comm, shard.detach().to(dtype))
        out = layer(full[:n], x.to(dtype))
        del full
        ctx.save_for_backward(shard, x)
        ctx.comm, ctx.layer, ctx.n, ctx.dtype = comm, layer, n, dtype
        return out

    @staticmethod
    def backward(ctx, dy):
        shard, x = ctx.saved_tensors
        full = all_gather(ctx.comm, shard.detach().to(ctx.dtype))
        with torch.enable_grad():
            w = full[:ctx.n].clone().requires_grad_()
            xx = x.detach().to(ctx.dtype).requires_grad_()
            dw, dx = torch.autograd.grad(ctx.layer(w, xx), [w, xx], dy)
        del full, w
        grad = torch.zeros(shard.numel() * ctx.comm.size, dtype=shard.dtype)
        grad[:ctx.n] = dw.to(shard.dtype)
        mine = reduce_scatter(ctx.comm, grad) / ctx.comm.size
        return mine, dx.to(x.dtype), None, None, None, None


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)


class CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return x.clone()

    @staticmethod
    def backward(ctx, dx):
        return None, all_reduce(ctx.comm, dx.contiguous())


class SumFromRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, comm, y):
        return all_reduce(comm, y.contiguous())

    @staticmethod
    def backward(ctx, dy):
        return None, dy


def tp_mlp(comm, x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(CopyToRanks.apply(comm, x) @ w1.T + b1)
    return SumFromRanks.apply(comm, h @ w2.T) + b2
