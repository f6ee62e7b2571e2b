"""Planted bug: a bucket flushed before its last gradient

The bucket's all-reduce starts when all but one of its gradients are in: the last slot is sent
as it was (zeros in the first step), and the gradient that arrives afterwards is never averaged.

EXPECT_TASK: 9.1
EXPECT_MESSAGE: started its all-reduce before its last gradient was in: a bucket is flushed once every one of its gradients is copied into it
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
                self.buckets[-1]["params"].append(p)
                size += nb
            else:
                self.buckets.append({"params": [p]})
                size = nb
        self.slot = {}
        for b in self.buckets:
            b["flat"], b["count"], b["out"] = torch.zeros(sum(p.numel() for p in b["params"]), dtype=torch.float64), 0, None
            at = 0
            for p in b["params"]:
                self.slot[id(p)] = (b, at)
                at += p.numel()
        for p in params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        b, at = self.slot[id(param)]
        b["flat"][at:at + param.numel()] = param.grad.reshape(-1)
        b["count"] += 1
        if b["out"] is None and b["count"] >= len(b["params"]) - 1:  # BUG: one gradient still to come
            b["out"] = all_reduce(self.comm, b["flat"]) / self.comm.size

    def finish(self):
        for b in self.buckets:
            at = 0
            for p in b["params"]:
                p.grad.copy_(b["out"][at:at + p.numel()].view_as(p))
                at += p.numel()
            b["count"], b["out"] = 0, None
