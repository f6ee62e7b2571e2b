"""DistributedDataParallel for any ``torch.nn.Module``, on minipar's ring all-reduce.

    torchrun --standalone --nproc-per-node 2 train.py    # train.py calls dist.init_process_group("gloo")

    ddp = DistributedDataParallel(model, bucket_size_mb=1)  # weights and buffers from rank 0
    loss_fn(ddp(x_local), y_local).backward()   # each bucket's all-reduce starts inside the backward
    ddp.finish_gradient_synchronization()       # wait for the last ones: .grad is the average
    optimizer.step()

The dense reference is one process on the whole batch: :func:`dense_gradients`. Averaging the
ranks' mean-loss gradients gives exactly that gradient (up to rounding) when every rank holds
an equal share of the batch.

**When a gradient is sent.** Autograd calls ``register_post_accumulate_grad_hook``'s hook the
moment a parameter's ``.grad`` is complete: the last layer's first, while the backward goes on
with the layers before it. The hook copies the gradient into its bucket (a flat buffer); when
the bucket's last gradient is in, its ring all-reduce starts. Buckets start in order (bucket 0,
1, ...), as torch's Reducer starts them: every rank must begin the rings in the same order, and a
rank whose gradients arrive in another order (a parameter unused on one rank) would otherwise
pair its bucket 2 with another rank's bucket 3.

**Non-blocking sends *and* a communication thread, and why.** A ring all-reduce is 2(p-1)
steps, and each step's send needs the sum the previous step received: someone must wait for a
step and add, between steps. The hook *posts* the first step itself (``isend``/``irecv``, which
return at once; gloo moves the bytes on its own threads), so every bucket's first message leaves
during the backward, whatever happens next. But the hook must return for the backward to go on,
and autograd calls us again only at the next hook: with non-blocking sends alone the ring would
advance one step per hook (lesson 04's DDP advances it between layers that way), and whatever
was left would wait for the end of the backward. So a communication thread runs the rest of each
ring (``collectives.drain``): it waits for each step and adds while autograd computes, in C++
with the GIL released. The thread talks through its own copy of the communicator, whose watchdog
is off; the main thread waits for it under the real watchdog in
:meth:`~GradientReducer.finish`, so a ring that hangs is still reported.

**Tied weights, frozen and unused parameters.** A weight used twice is one parameter: autograd
accumulates both uses into one ``.grad`` and calls its hook once, so it is all-reduced once.
Parameters with ``requires_grad=False`` get no hook and no slot. A parameter that gets no
gradient in a step (unused on this rank, or on all of them) counts as a zero gradient: its slot
is zeroed when ``finish_gradient_synchronization`` closes the bucket, and afterwards its
``.grad`` is the average over the ranks, zero where no rank used it, on every rank alike.
torch's DDP needs ``find_unused_parameters=True`` for such a model (without it, the next
iteration raises "Expected to have finished reduction in the prior iteration"); with it, each
forward walks the graph to mark the unused parameters ready, and a parameter no rank used keeps
``.grad = None`` (an optimizer then skips it, where here it steps with a zero gradient).

Sent per rank per step: one ring all-reduce per bucket, ``ring_bytes(n_b, p, r, itemsize)``:
2 (p-1)/p of the gradient bytes (:meth:`DistributedDataParallel.bytes_per_step`).
"""
from __future__ import annotations

import queue
import threading
import time

import torch

from ..collectives import drain, ring_steps
from ..errors import UsageError
from .group import broadcast_state, communicator, need_params, ring_bytes, say_once

TAG = 3000  # + bucket index: the rings of one step's buckets may be in flight together


def dense_gradients(module, loss_fn, x, y):
    """The reference: ``{name: gradient}`` of ``loss_fn(module(x), y)`` on one process, the whole batch."""
    module.zero_grad(set_to_none=True)
    loss_fn(module(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def thread_comm(comm):
    """A copy of ``comm`` for a communication thread: the same group and tracer, its own watchdog
    (off). The watchdog follows one blocking call at a time, the main thread's."""
    from ..comm.torch_backend import TorchComm
    from ..comm.watchdog import Watchdog

    return TorchComm(comm.group, comm.device, comm.engine, comm.tracer,
                     Watchdog(comm.rank, comm.size, 0, None, None), comm.name)


class Bucket:
    """Some parameters' gradients in one flat buffer: ``slots[i] = (param, start, stop)``."""

    def __init__(self, index, params):
        self.index, self.slots, n = index, [], 0
        for p in params:
            self.slots.append((p, n, n + p.numel()))
            n += p.numel()
        self.flat = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)  # (n,)
        self.arrived: set = set()  # slot indices whose gradient is in
        self.ready = False

    @property
    def nbytes(self):
        return self.flat.numel() * self.flat.element_size()


def make_buckets(params, bucket_bytes):
    """Buckets of at most ``bucket_bytes`` (None: one per parameter), filled in the reverse order of
    registration (the order a backward usually completes them, torch's first guess as well); a
    parameter is never split, and a bucket holds one dtype and device."""
    groups, size = [], 0
    for p in reversed(params):
        nb = p.numel() * p.element_size()
        last = groups[-1][-1] if groups else None
        if (bucket_bytes is not None and groups and size + nb <= bucket_bytes
                and (last.dtype, last.device) == (p.dtype, p.device)):
            groups[-1].append(p)
            size += nb
        else:
            groups.append([p])
            size = nb
    return [Bucket(i, g) for i, g in enumerate(groups)]


class GradientReducer:
    """The hooks, the buckets and the communication thread: gradients averaged over ``comm``
    as the backward produces them. ``log`` holds the last step's (time, "ready", slot number),
    (time, "zero", bucket: a missing gradient zeroed) and (time, "launch", bucket), in order."""

    def __init__(self, comm, params, bucket_bytes=None):
        self.comm, self.p = comm, comm.size
        self.buckets = make_buckets(params, bucket_bytes)
        self.where = {}  # param slot number -> (bucket, index of the slot in it)
        self.hooks, self.log, self.next_bucket = [], [], 0
        for b in self.buckets:
            for i, (param, _, _) in enumerate(b.slots):
                k = len(self.where)
                self.where[k] = (b, i)
                self.hooks.append(param.register_post_accumulate_grad_hook(lambda prm, k=k: self.ready(k, prm)))
        self.queue, self.thread, self.error = queue.Queue(), None, None
        self.closed = False  # the last step is finished: the next gradient starts a new log
        self.talk = thread_comm(comm) if comm.size > 1 else comm

    # -- during the backward (autograd's thread)
    def ready(self, k, param):
        """Autograd has accumulated ``param.grad``: copy it into its slot; start full buckets."""
        if self.closed:
            self.log.clear()
            self.closed = False
        bucket, i = self.where[k]
        if i in bucket.arrived:
            raise UsageError("a second backward before finish_gradient_synchronization(): call it after "
                             "every backward (accumulating several backwards, torch's no_sync(), is left out)")
        _, a, b = bucket.slots[i]
        bucket.flat[a:b].copy_(param.grad.reshape(-1))
        bucket.arrived.add(i)
        self.log.append((time.perf_counter(), "ready", k))
        if self.full(bucket):
            bucket.ready = True
            self.launch_ready()

    def full(self, bucket):
        """A bucket is flushed once every one of its gradients is in."""
        return len(bucket.arrived) == len(bucket.slots)

    def launch_ready(self):
        """Start the ready buckets, in order: bucket i only after buckets 0 .. i-1."""
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].ready:
            self.launch(self.buckets[self.next_bucket])
            self.next_bucket += 1

    def launch(self, bucket):
        """Post the first ring step now (non-blocking); the thread runs the rest."""
        self.log.append((time.perf_counter(), "launch", bucket.index))
        if self.p == 1:
            return
        gen = ring_steps(self.talk, bucket.flat, tag=TAG + bucket.index, name=f"all_reduce:ring bucket {bucket.index}")
        next(gen, None)
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="minipar-ddp", daemon=True)
            self.thread.start()
        self.queue.put((bucket, gen))

    # -- the communication thread
    def run(self):
        while True:
            bucket, gen = self.queue.get()
            try:
                if bucket.flat.is_cuda:
                    torch.cuda.set_device(bucket.flat.device)
                drain(gen)  # the remaining ring steps: wait, add, post the next
                bucket.flat.div_(self.p)  # the sum over ranks -> the average
            except BaseException as err:  # reported by finish() on the main thread
                self.error = err
            finally:
                self.queue.task_done()

    # -- after the backward
    def finish(self):
        """Close the buckets still open (missing gradients count as zero), wait for every ring,
        and hand each parameter its averaged gradient."""
        for bucket in self.buckets:
            if not bucket.ready:
                for i, (_, a, b) in enumerate(bucket.slots):
                    if i not in bucket.arrived:
                        bucket.flat[a:b].zero_()
                        self.log.append((time.perf_counter(), "zero", bucket.index))
                bucket.ready = True
        self.launch_ready()
        self.comm.watchdog.call("waiting for the gradient all-reduces (communication thread)", self.queue.join)
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        with torch.no_grad():
            for bucket in self.buckets:
                for param, a, b in bucket.slots:
                    avg = bucket.flat[a:b].view_as(param)
                    if param.grad is None:
                        param.grad = avg.clone()
                    else:
                        param.grad.copy_(avg)
                bucket.arrived.clear()
                bucket.ready = False
        self.next_bucket, self.closed = 0, True

    def bytes_per_step(self, rank=None):
        """Bytes this rank (or ``rank``) sends per step: one ring all-reduce per bucket."""
        r = self.comm.rank if rank is None else rank
        return sum(ring_bytes(b.flat.numel(), self.p, r, b.flat.element_size()) for b in self.buckets)


class DistributedDataParallel(torch.nn.Module):
    """``module`` replicated on every rank of ``comm``; its gradients averaged during the backward.

    bucket_size_mb: None, one all-reduce per parameter; else buckets of at most that many MiB.
    comm: a minipar torch communicator; None takes minipar's world or the default process group.
    """

    reducer_class = GradientReducer

    def __init__(self, module, bucket_size_mb=None, comm=None):
        super().__init__()
        params = self.params_of(module)
        if bucket_size_mb is not None and not (isinstance(bucket_size_mb, (int, float)) and bucket_size_mb >= 0):
            raise UsageError(f"bucket_size_mb={bucket_size_mb!r}: expected a size in MiB >= 0, or None")
        self.module = module
        self.comm = communicator(comm, params[0], "DistributedDataParallel")
        say_once(self.comm, "DistributedDataParallel")
        broadcast_state(self.comm, module)
        size = None if bucket_size_mb is None else int(bucket_size_mb * 2 ** 20)
        self.reducer = self.reducer_class(self.comm, params, size)

    def params_of(self, module):
        """The parameters to synchronise: each trainable one once."""
        return need_params(module, "DistributedDataParallel")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Wait for every bucket's all-reduce (closing those a missing gradient kept open); then
        every trainable parameter's ``.grad`` is the average over the ranks. Before ``optimizer.step()``."""
        self.reducer.finish()

    def bytes_per_step(self, rank=None):
        """What the trace must show this rank sending per step (see the module docstring)."""
        return self.reducer.bytes_per_step(rank)
