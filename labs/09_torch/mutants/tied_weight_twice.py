"""Planted bug: a hook per name, so the tied weight is all-reduced twice

The buckets are built from module.named_parameters(remove_duplicate=False): the GPT's token
embedding, which is also its output head, has two names, two slots and two hooks, and its
gradient is sent twice. The averages are right; the bytes are not.

EXPECT_TASK: 9.1
EXPECT_MESSAGE: rank 0 sent
EXPECT_MESSAGE: one ring all-reduce per bucket, each trainable parameter in one bucket once
EXPECT_MESSAGE: a weight used in two places (the GPT's token embedding is its output head) is one parameter with one gradient: all-reduce it once
"""
import torch

from minipar.collectives import all_reduce


class GradientBuckets:
    def __init__(self, comm, module, bucket_bytes):
        self.comm = comm
        slots = [p for _, p in module.named_parameters(remove_duplicate=False) if p.requires_grad]  # BUG: per name
        self.buckets, size = [], 0
        for p in reversed(slots):
            nb = p.numel() * p.element_size()
            if self.buckets and size + nb <= bucket_bytes:
                self.buckets[-1]["params"].append(p)
                size += nb
            else:
                self.buckets.append({"params": [p]})
                size = nb
        for k, b in enumerate(self.buckets):
            b["flat"], b["count"], b["out"] = torch.zeros(sum(p.numel() for p in b["params"]), dtype=torch.float64), 0, None
            at = 0
            for p in b["params"]:
                p.register_post_accumulate_grad_hook(lambda q, b=b, at=at: self.hook(q, b, at))
                at += p.numel()

    def hook(self, param, bucket, at):
        bucket["flat"][at:at + param.numel()] = param.grad.reshape(-1)
        bucket["count"] += 1
        if bucket["count"] == len(bucket["params"]):
            bucket["out"] = all_reduce(self.comm, bucket["flat"]) / self.comm.size

    def finish(self):
        for b in self.buckets:
            at = 0
            for p in b["params"]:
                p.grad.copy_(b["out"][at:at + p.numel()].view_as(p))
                at += p.numel()
            b["count"], b["out"] = 0, None
