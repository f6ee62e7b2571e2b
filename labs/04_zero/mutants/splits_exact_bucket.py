"""Planted bug: a bucket that exactly fills bucket_bytes is split

The packing test is `used + g.nbytes < bucket_bytes` where the rule is `<=`: a gradient that
would bring the bucket to exactly bucket_bytes starts a new bucket instead. The values are
right, and most caps never meet the edge; with bucket_bytes=160 the first three gradients
(80 + 24 + 56 bytes) fill one bucket exactly, and here they take two: one all-reduce more.

EXPECT_TASK: 4.2
EXPECT_MESSAGE: bucket_bytes=160: expected 3 calls of minipar.collectives.all_reduce for buckets [[0, 1, 2], [3], [4]]
EXPECT_MESSAGE: the trace shows 4: that is [[0, 1], [2], [3], [4]], where a bucket that exactly fills bucket_bytes is split
"""
from minipar.collectives import all_reduce
from minipar.labs.lab04_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import namespace, size


def bucketed_average(comm, grads, bucket_bytes):
    buckets, used = [], 0
    for i, g in enumerate(grads):
        if buckets and used + g.nbytes < bucket_bytes:  # BUG: a bucket may hold exactly bucket_bytes (<=)
            buckets[-1].append(i)
            used += g.nbytes
        else:
            buckets.append([i])
            used = g.nbytes
    out = [None] * len(grads)
    for bucket in buckets:
        flat = all_reduce(comm, namespace(grads[0]).concat([grads[i].reshape(-1) for i in bucket])) / comm.size
        at = 0
        for i in bucket:
            out[i] = flat[at:at + size(grads[i])].reshape(grads[i].shape)
            at += size(grads[i])
    return out
