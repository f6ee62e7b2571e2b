"""Planted bug: the hooks only copy; every all-reduce waits for finish()

The buckets are right and each is all-reduced once, but nothing is sent until the backward is
over: the communication DDP hides behind the backward is all exposed.

EXPECT_TASK: 9.1
EXPECT_MESSAGE: had not started when loss.backward() returned
EXPECT_MESSAGE: DDP starts each bucket's all-reduce from the hook that completes it, during the backward; finish() only waits for them
"""
import torch

from minipar.collectives import all_reduce


class GradientBuckets:
    def __init__(self, comm, module, bucket_bytes):
        self.comm = comm
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets, size = [], 0
        for p in reversed(params):
            nb = p.numel() * p.element_size()
            if self.buckets and size + nb <= bucket_bytes:
                self.buckets[-1].append(p)
                size += nb
            else:
                self.buckets.append([p])
                size = nb
        self.flats = [torch.zeros(sum(p.numel() for p in b), dtype=torch.float64) for b in self.buckets]
        self.slot = {}
        for flat, b in zip(self.flats, self.buckets):
            at = 0
            for p in b:
                self.slot[id(p)] = (flat, at)
                at += p.numel()
        for p in params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        flat, at = self.slot[id(param)]
        flat[at:at + param.numel()] = param.grad.reshape(-1)

    def finish(self):
        for flat, b in zip(self.flats, self.buckets):
            out = all_reduce(self.comm, flat) / self.comm.size  # BUG: after the backward, not from the hooks
            at = 0
            for p in b:
                p.grad.copy_(out[at:at + p.numel()].view_as(p))
                at += p.numel()
