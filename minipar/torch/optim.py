"""ShardedOptimizer: any ``torch.optim`` optimizer with its state split over the ranks (ZeRO-1, -2).

    ddp = DistributedDataParallel(model)                                   # zero=1: DDP averages
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(ddp(x), y).backward(); ddp.finish_gradient_synchronization(); opt.step()

    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, zero=2, lr=1e-3)  # no DDP:
    loss_fn(model(x), y).backward(); opt.step()                 # step() reduce-scatters the grads

Each parameter has one owner rank. Owners are chosen as torch's ZeroRedundancyOptimizer chooses
them: parameters by size, largest first, each to the rank that owns the fewest elements so far,
so every rank holds about 1/p of the state (one parameter more at most). The wrapped optimizer,
built on each rank with the parameters that rank owns, keeps their state (Adam's m and v) and
updates only them. Then every rank needs every updated parameter again:

    step, zero=1   the .grad are already averaged (DistributedDataParallel): update my parameters,
                   then all-gather every rank's updated parameters       (n - c_{r+1}) bytes
    step, zero=2   the .grad are this rank's own: first reduce-scatter them, so each owner
                   receives the sum of its parameters' gradients, divided by p (n - c_r) bytes;
                   the other parameters' .grad are dropped (set to None); update; all-gather

n: the bytes of the trainable parameters (per dtype), c_r: the bytes rank r owns. Parameters
are laid out owner by owner in one flat buffer per dtype, so "my parameters" is one chunk of the
ring and the ring's uneven chunks are the owners' shares (``ring_steps(bounds=...)``).

ZeRO-2 here drops the gradients it does not own after the backward: between steps a rank holds
1/p of them, but at the end of the backward autograd has written every ``.grad`` in full.
Reduce-scattering each gradient as autograd completes it (lesson 04's ZeRO2, or
:class:`~minipar.torch.fsdp.FullyShardedDataParallel`) is what lowers that peak.

The dense reference is the wrapped optimizer over every parameter on one process: every rank
runs it on its own parameters, so the step is the same arithmetic (bitwise, when the gradients are).
"""
from __future__ import annotations

import torch

from ..collectives import all_gather, drain, ring_steps
from ..errors import UsageError
from .group import communicator, ring_bytes, say_once

TAG = 3600


def owners(sizes, p):
    """Owner rank of each parameter (by ``sizes``, its number of elements): largest first, each to
    the rank owning the fewest elements so far (ties: the lowest rank). torch's rule as well."""
    load, out = [0] * p, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # stable: equal sizes keep their order
        r = min(range(p), key=lambda r: load[r])
        out[i] = r
        load[r] += sizes[i]
    return out


def check_optimizer_class(optimizer_cls):
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        shown = repr(optimizer_cls) if isinstance(optimizer_cls, (str, type)) else f"a {type(optimizer_cls).__name__} object"
        raise UsageError(f"optimizer_cls={shown} is not a torch.optim.Optimizer class "
                         f"(pass the class, e.g. torch.optim.Adam, and its arguments as keywords)")


class ShardedOptimizer:
    """``optimizer_cls(my parameters, **kwargs)`` on every rank; ``step`` shares the results.

    params: an iterable of tensors (param groups as dicts are left out). zero: 1 or 2.
    """

    def __init__(self, params, optimizer_cls, comm=None, zero=1, **kwargs):
        check_optimizer_class(optimizer_cls)
        if zero not in (1, 2):
            raise UsageError(f"zero={zero!r}: choose 1 (optimizer state sharded) or 2 (+ gradients reduce-scattered)")
        params = list(params)
        if any(isinstance(p, dict) for p in params):
            raise UsageError("ShardedOptimizer takes a list of parameters, not param groups (dicts)")
        seen, self.params = set(), []
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise UsageError(f"ShardedOptimizer: expected tensors, got {type(p).__name__}")
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise UsageError("ShardedOptimizer: no parameter that requires a gradient: nothing to optimize")
        self.comm = communicator(comm, self.params[0], "ShardedOptimizer")
        say_once(self.comm, "ShardedOptimizer")
        self.zero, self.p, self.rank = zero, self.comm.size, self.comm.rank
        self.owner = owners([q.numel() for q in self.params], self.p)
        self.index = {id(q): i for i, q in enumerate(self.params)}
        self.mine = [q for q, o in zip(self.params, self.owner) if o == self.rank]
        self.optimizer = optimizer_cls(self.mine, **kwargs) if self.mine else None  # torch refuses an empty list
        self.groups = {}  # (dtype, device) -> parameters in owner order (rank 0's, rank 1's, ...)
        for r in range(self.p):
            for q, o in zip(self.params, self.owner):
                if o == r:
                    self.groups.setdefault((q.dtype, q.device), []).append(q)

    # -- what torch code expects of an optimizer
    @property
    def param_groups(self):
        return self.optimizer.param_groups if self.optimizer else []

    @property
    def state(self):
        return self.optimizer.state if self.optimizer else {}

    def zero_grad(self, set_to_none=True):
        for q in self.params:
            if q.grad is not None:
                if set_to_none:
                    q.grad = None
                else:
                    q.grad.zero_()

    def counts(self, group):
        """Elements each rank owns in ``group`` (its chunk of the ring)."""
        out = [0] * self.p
        for q in group:
            out[self.owner[self.index[id(q)]]] += q.numel()
        return out

    def owns(self, q, rank=None):
        return self.owner[self.index[id(q)]] == (self.rank if rank is None else rank)

    # -- the step
    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise UsageError("ShardedOptimizer.step(closure): closures are left out")
        if self.zero == 2 and self.p > 1:
            self.reduce_scatter_grads()
        if self.optimizer is not None:
            self.optimizer.step()
        if self.p > 1:
            self.all_gather_params()

    def reduce_scatter_grads(self):
        """ZeRO-2: every rank's gradients summed into their owners (a ring reduce-scatter whose
        chunks are the owners' shares), divided by p; the gradients I do not own are dropped."""
        for gi, (key, group) in enumerate(sorted(self.groups.items(), key=lambda kv: str(kv[0]))):
            flat = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for q in group])
            counts, bounds, at = self.counts(group), [], 0
            for c in counts:
                bounds.append((at, at + c))
                at += c
            with self.comm.region("reduce_scatter:ring", "collective"):
                drain(ring_steps(self.comm, flat, bounds, TAG + gi, ("reduce-scatter",)))
            a, _ = bounds[self.rank]
            for q in group:
                if self.owns(q):
                    q.grad = (flat[a:a + q.numel()] / self.p).view_as(q)
                    a += q.numel()
                else:
                    q.grad = None

    def all_gather_params(self):
        """Every rank's updated parameters to every rank: one ring all-gather per dtype."""
        for key, group in sorted(self.groups.items(), key=lambda kv: str(kv[0])):
            counts = self.counts(group)
            mine = [q.reshape(-1) for q in group if self.owns(q)]
            x = torch.cat(mine) if mine else torch.empty(0, dtype=group[0].dtype, device=group[0].device)
            full = all_gather(self.comm, x, counts)  # (sum of numels,) in owner order
            at = 0
            for q in group:
                q.copy_(full[at:at + q.numel()].view_as(q))
                at += q.numel()

    # -- accounting
    def bytes_per_step(self, rank=None):
        """Bytes this rank (or ``rank``) sends per step (see the module docstring)."""
        r = self.rank if rank is None else rank
        out = 0
        for group in self.groups.values():
            counts, item = self.counts(group), group[0].element_size()
            out += ring_bytes(sum(counts), self.p, r, item, ("all-gather",), counts)
            if self.zero == 2:
                out += ring_bytes(sum(counts), self.p, r, item, ("reduce-scatter",), counts)
        return out

    def state_bytes(self):
        """Bytes of the optimizer state this rank holds (every tensor in ``state``)."""
        return sum(t.numel() * t.element_size() for s in self.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor))
