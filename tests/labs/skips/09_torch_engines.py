"""Skips the technique with torch's own engines, each what the lab asks to rebuild: torch's
DistributedDataParallel for the hooks, DTensor (on a DeviceMesh) to gather a unit's weights, and
torch.distributed.nn's differentiable all-reduce for f and g. Each is refused in one line
naming the call, whatever it would have computed.

EXPECT 9.1: GradientBuckets ran torch's own DistributedDataParallel, torch.nn.parallel.distributed.DistributedDataParallel.__init__ (called at tests/labs/skips/09_torch_engines.py:
EXPECT 9.1: this lab builds it from minipar's collectives: write GradientBuckets yourself
EXPECT 9.2: fsdp_unit ran torch's own DeviceMesh, torch.distributed.device_mesh.
EXPECT 9.3: tp_mlp ran torch's own differentiable collectives, torch.distributed.nn.functional.
"""
import torch
import torch.distributed.nn.functional as dist_nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


class GradientBuckets:
    def __init__(self, comm, module, bucket_bytes):
        self.ddp = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_bytes / 2 ** 20)

    def finish(self):
        pass  # torch's Reducer has waited inside loss.backward()


class GatheredUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        mesh = init_device_mesh("cpu", (comm.size,))
        full = DTensor.from_local(shard.detach(), mesh, [Shard(0)]).full_tensor()
        ctx.save_for_backward(x)
        return layer(full[:n], x)

    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError("the backward: torch's FSDP would do it")


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)


def tp_mlp(comm, x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(x @ w1.T + b1)
    return dist_nn.all_reduce(h @ w2.T) + b2
