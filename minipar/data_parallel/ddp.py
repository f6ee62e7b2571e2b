"""DDP: a replica and an optimizer on every rank; one all-reduce of the gradients, or one per bucket.

    ddp = DDP(comm, model, bucket_bytes=4096, overlap=True, lr=1e-3)
    loss = ddp.train_step(local_batch(comm, x), local_batch(comm, y))
"""
from __future__ import annotations

from .. import collectives as C
from ..memory import zero_bytes
from ..xp import copy, to_numpy, zeros
from ..collectives import drain, ring_steps
from .engine import TAG, Engine, Flat


# --------------------------------------------------------------------------- DDP


class DDP(Engine):
    """A full replica and a full optimizer on every rank; gradients averaged by all-reduce.

    bucket_bytes=None: one bucket holding every gradient, one all-reduce per step after the
    backward. bucket_bytes=B: units are packed, last first (the order the backward finishes them),
    into buckets of at most B bytes (a unit is never split; 0 = one bucket per unit). overlap:
    a bucket's all-reduce starts the moment the backward has finished every unit in it, and
    advances one ring step between layers (``collectives.ring_steps``, the one ring); what is left is drained after the
    backward. Sent per rank per step: 2(N-1)/N x the gradient bytes, with or without buckets.

    What overlap saves depends on who moves the bytes while the layers compute: gloo does it on
    its own threads, single-threaded MPI only inside MPI calls; NCCL on its own CUDA stream
    hides up to min(compute, communication). Each ring step is also a point where the ranks
    wait for each other, which costs when ranks outnumber free cores. Measured on 2 shared
    cores (docs/benchmarks_zero.md): the communication left after the backward drops 2-6x; the
    step itself came out anywhere from 40% faster to 50% slower, with the other jobs' load.
    """

    def __init__(self, comm, model, bucket_bytes=None, overlap=False, **kw):
        super().__init__(comm, model, **kw)
        self.overlap, self.inflight = overlap, []
        groups, size = [], 0  # lists of unit names, built from the last unit backwards
        for u in reversed(self.units):
            unit_bytes = model.children()[u].num_params() * self.b_work
            if groups and (bucket_bytes is None or size + unit_bytes <= bucket_bytes):
                groups[-1].insert(0, u)
                size += unit_bytes
            else:
                groups.append([u])
                size = unit_bytes
        self.buckets = []  # (units, Flat, params buffer, grads buffer, optimizer)
        self.ready = {}  # unit whose backward completes a bucket -> bucket index
        for i, units in enumerate(groups):
            flat = Flat([model.children()[u] for u in units], comm.size)
            init = flat.values(self.like, self.like.dtype)  # full-precision start for the master
            P, G = flat.values(self.like, self.dtype), zeros((flat.n_pad,), like=self.like, dtype=self.grad_dtype)
            flat.bind("params", P)
            flat.bind("grads", G)
            self.ledger.track("params", P, name="ddp.bucket params", label=str(i))  # (n_pad,) each, reused every step
            self.ledger.track("grads", G, name="ddp.bucket grads", label=str(i))
            self.buckets.append((units, flat, P, G, self.optimizer(P, init)))
            self.ready[units[0]] = i

    def zero_grad(self):
        for *_, G, _ in self.buckets:
            G[...] = 0

    def after_backward(self, name):
        if self.overlap and name in self.ready:  # start this bucket's all-reduce now
            i = self.ready[name]
            gen = ring_steps(self.comm, self.buckets[i][3], tag=TAG + i, name="all_reduce:ring")
            next(gen, None)
            self.inflight.append(gen)
        self.ledger.sample()

    def progress(self):
        self.inflight = [g for g in self.inflight if next(g, StopIteration) is not StopIteration]

    def sync_grads(self):
        if self.overlap:
            for gen in self.inflight:  # what the layers did not hide
                drain(gen)
            self.inflight = []
        for *_, G, _ in self.buckets:
            if not self.overlap:
                G[...] = C.all_reduce(self.comm, G, "ring")  # sum over ranks (one "ring.recv" each)
            G /= self.comm.size  # the average

    def update(self):
        for *_, P, G, opt in self.buckets:
            opt.step(P, G)

    def optimizer_parts(self):
        return [(flat, opt, (0, flat.n_pad)) for _, flat, _, _, opt in self.buckets]

    def grad_pieces(self):
        """Every replica holds the same average: group rank 0 answers for all of it, the others for none."""
        if self.comm.rank != 0:
            return []
        return [(mod, name, G[a:b]) for _, flat, _, G, _ in self.buckets for mod, name, _, a, b in flat.slots]

    def predicted_memory(self):
        pad = sum(f.n_pad for _, f, *_ in self.buckets) - self.psi
        return zero_bytes(self.psi, self.comm.size, 0, *self.bytes_per_param(), self.adam["offload"], pad=pad)

    def params_numpy(self):
        """{qualified name: NumPy copy} of the current parameters (identical on every rank)."""
        return {n: to_numpy(copy(p)) for n, p in self.model.named_parameters()}
