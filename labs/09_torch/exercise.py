"""Lab 09: from minipar to PyTorch. DDP's gradient hooks, one FSDP unit, and f and g, written on
torch tensors with autograd, every message through minipar's collectives.

Fill in each class below, then run it on real ranks and grade it:

    mpiexec -n 2 python -m mpi4py minipar-labs/09_torch/exercise.py          # see what your code does
    torchrun --standalone --nproc-per-node 2 minipar-labs/09_torch/exercise.py   # the same, under torchrun
    minipar check 09                                                          # grade every task (torch)
    minipar check 09 --task 9.2                                               # grade one task

Communicate with minipar.collectives (all_reduce, all_gather, reduce_scatter; ring_steps and
drain for a ring you start now and finish later): rings on send/recv, traced, so the grader
counts what you send. comm.builtin is off limits, and so are the engines this lab rebuilds:
torch's DistributedDataParallel, FSDP and DTensor, and minipar.torch.

The grader checks the technique, not only the values: each gradient is sent once, in one bucket,
and a bucket's all-reduce starts during the backward, after its last gradient (9.1); a unit's
full weights are gone between its forward and its backward (9.2); f and g send exactly one
all-reduce each, f's in the backward and g's in the forward (9.3).
"""
import torch

import minipar
from minipar.collectives import all_gather, all_reduce, drain, reduce_scatter, ring_steps  # noqa: F401


class GradientBuckets:
    """DDP's gradient hooks: every rank's gradients averaged over the ranks while the backward runs.

    Before: every rank holds the same module; each backward gives every parameter that requires a
    gradient the gradient of this rank's share of the batch (a mean over its own rows).
    After finish(): each such parameter's .grad, on every rank, is the average over the ranks of
    their gradients: the gradient of the whole batch. Nothing else changes.

    Buckets: the parameters that require a gradient, each once (module.parameters() lists a weight
    used in two places once), taken in the reverse of their order in module.parameters(), packed in
    that order into buckets of at most bucket_bytes bytes; a parameter is never split (one larger
    than bucket_bytes gets a bucket of its own). A bucket is one flat buffer.
    Messages: one all-reduce per bucket, of its flat buffer, started from the hook that brings in
    its last gradient, during the backward, and never before; finish() waits for the rest.
    Register your hooks with param.register_post_accumulate_grad_hook(hook): autograd calls
    hook(param) once param.grad is complete.
    """

    def __init__(self, comm, module, bucket_bytes):
        # TODO(lab9.1): the buckets (a zero flat buffer each), where each parameter's slot is, and a
        #               post-accumulate-grad hook on every parameter that requires a gradient
        raise NotImplementedError("lab 9.1")

    def hook(self, param):
        """Autograd has accumulated param.grad: copy it into its slot; a full bucket starts its all-reduce."""
        # TODO(lab9.1): copy, count; when the bucket is full, start its ring (ring_steps + next posts a step)
        raise NotImplementedError("lab 9.1")

    def finish(self):
        """Wait for every bucket's all-reduce and write each average into its parameter's .grad."""
        # TODO(lab9.1): finish each ring (drain), divide by comm.size, copy back, reset for the next step
        raise NotImplementedError("lab 9.1")


class GatheredUnit(torch.autograd.Function):
    """One FSDP unit: layer(w, x) computed with weights w that no rank keeps whole.

    Before: shard is this rank's piece of the unit's flat weights, a leaf tensor that requires a
    gradient, in the master dtype (float64, or float32 when a compute dtype is given); the n flat
    weights, padded with zeros to comm.size * shard.numel(), are the ranks' pieces in rank order.
    x is this rank's input. Forward returns layer(w, x) with w the n flat weights; with
    compute_dtype (torch.bfloat16), w and x are cast to it and so is the result.
    After the backward: shard.grad is this rank's piece of the weights' gradient averaged over the
    ranks (the whole batch's), in the master dtype (the padding's gradient is zero); x gets its
    gradient as from layer itself.
    Memory: the full weights exist only inside forward and inside backward: between the two this
    rank keeps its shard and the input.
    Messages: forward all-gathers the shards in the compute dtype; backward all-gathers them again
    (compute dtype) and reduce-scatters the full gradient in the master dtype.
    """

    @staticmethod
    def forward(ctx, shard, x, comm, layer, n, compute_dtype):
        # TODO(lab9.2): gather, compute without keeping the weights, save what the backward needs
        raise NotImplementedError("lab 9.2")

    @staticmethod
    def backward(ctx, dy):
        # TODO(lab9.2): gather again, the gradients of layer (torch.autograd.grad), reduce-scatter;
        #               one gradient (or None) per input of forward
        raise NotImplementedError("lab 9.2")


def fsdp_unit(comm, shard, x, layer, n, compute_dtype=None):
    """The unit on this rank's input (given: it applies your GatheredUnit)."""
    return GatheredUnit.apply(shard, x, comm, layer, n, compute_dtype)


class CopyToRanks(torch.autograd.Function):
    """f, before a colwise layer. Forward: every rank holds the same x; it goes on unchanged.
    Backward: each rank holds the gradient its own share of the layer sends back to x; x's
    gradient is their sum over the ranks, on every rank."""

    @staticmethod
    def forward(ctx, comm, x):
        # TODO(lab9.3): what f sends going forward (keep comm for the backward)
        raise NotImplementedError("lab 9.3")

    @staticmethod
    def backward(ctx, dx):
        # TODO(lab9.3): what f sends going back; None for comm
        raise NotImplementedError("lab 9.3")


class SumFromRanks(torch.autograd.Function):
    """g, after a rowwise layer. Forward: each rank holds a partial sum of the output (its own
    columns' product); the output is their sum, on every rank. Backward: every rank holds the
    output's gradient; it is each partial sum's gradient as it is."""

    @staticmethod
    def forward(ctx, comm, y):
        # TODO(lab9.3): what g sends going forward
        raise NotImplementedError("lab 9.3")

    @staticmethod
    def backward(ctx, dy):
        # TODO(lab9.3): what g sends going back; None for comm
        raise NotImplementedError("lab 9.3")


def f(comm, x):
    return CopyToRanks.apply(comm, x)


def g(comm, y):
    return SumFromRanks.apply(comm, y)


def tp_mlp(comm, x, w1, b1, w2, b2):
    """Megatron's MLP on this rank's shards (given: it uses your f and g). x: (..., C), the same on
    every rank; w1, b1: this rank's rows of W1 (H, C) and b1; w2: its columns of W2 (C, H); b2 whole."""
    h = torch.nn.functional.gelu(f(comm, x) @ w1.T + b1)  # (..., H/p): my hidden features
    return g(comm, h @ w2.T) + b2  # (..., C): the whole output on every rank


# ---------------------------------------------------------------------------- run it on real ranks

if __name__ == "__main__":
    from minipar.labs.checks import attempt

    comm = minipar.init("torch")  # under mpiexec or torchrun: torch tensors over torch.distributed (gloo)
    torch.manual_seed(0)  # the same model and data on every rank
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.GELU(), torch.nn.Linear(10, 3)).double()
    x, y = torch.randn(4 * comm.size, 6, dtype=torch.float64), torch.randn(4 * comm.size, 3, dtype=torch.float64)
    mine = slice(4 * comm.rank, 4 * comm.rank + 4)

    def ddp_step():
        hooks = GradientBuckets(comm, model, bucket_bytes=100)
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        hooks.finish()
        return model[0].weight.grad[0, :3]

    got, why = attempt(ddp_step)
    print(f"rank {comm.rank}: 9.1 the first weights' averaged gradient: {why or got}")

    def unit_step():
        n = 6 * 6
        w = torch.randn(n, dtype=torch.float64)  # the unit's full weights, here only to cut the shards
        S = -(-n // comm.size)
        shard = torch.zeros(S * comm.size, dtype=torch.float64)
        shard[:n] = w
        shard = shard[comm.rank * S:(comm.rank + 1) * S].clone().requires_grad_()
        out = fsdp_unit(comm, shard, x[mine], lambda w, x: torch.tanh(x @ w.view(6, 6)), n)
        out.sum().backward()
        return shard.grad[:3]

    got, why = attempt(unit_step)
    print(f"rank {comm.rank}: 9.2 my shard's gradient: {why or got}")

    def mlp_step():
        W1, W2 = torch.randn(12, 6, dtype=torch.float64), torch.randn(6, 12, dtype=torch.float64)
        b1, b2 = torch.randn(12, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
        w1, w2 = W1.chunk(comm.size, 0)[comm.rank], W2.chunk(comm.size, 1)[comm.rank].contiguous()
        return tp_mlp(comm, x, w1, b1.chunk(comm.size)[comm.rank], w2, b2)[0, :3]

    got, why = attempt(mlp_step)
    print(f"rank {comm.rank}: 9.3 the MLP's first output: {why or got}")
