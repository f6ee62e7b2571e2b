"""One unit of :class:`~minipar.torch.fsdp.FullyShardedDataParallel`: a submodule's weights as one
flat buffer, sharded over the ranks, gathered around its forward and its backward.

    unit's forward    pre_forward: _Gather (all-gather), the full weights placed in their owners'
                      __dict__, saved tensors swapped for placeholders; post_forward: all dropped
    unit's backward   unpack: the first placeholder gathers the weights again (backward_weights);
                      _Gather.backward: the weights dropped, the full gradient reduce-scattered
                      into my grad shard (reduce_scatter), every parameter's .grad a view of it

Its parameters keep their ``Parameter`` objects; each one's ``.data`` is the piece of my shard
that holds it (``pieces``), so an optimizer updates the shard in place.
"""
from __future__ import annotations

import torch

from ..collectives import drain, ring_steps
from ..errors import UsageError
from .group import ring_bytes

TAG = 3700  # + unit index: gathers; + 100: reduce-scatters; 3699 and below: the replicated all-reduce


def cast_floats(obj, dtype):
    """``obj`` (tensors in tuples, lists, dicts) with every floating-point tensor cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    return obj


class _Saved:
    """What autograd keeps, instead of a tensor viewing a unit's gathered weights, between its
    forward and backward: where in the flat buffer it was."""

    __slots__ = ("unit", "offset", "shape", "stride")

    def __init__(self, unit, t):
        self.unit, self.offset, self.shape, self.stride = unit, t.storage_offset(), tuple(t.shape), t.stride()


class _Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards into its full flat weights. Backward: reduce-scatter
    the full flat gradient into the shards (the conjugate of a gather is a scatter)."""

    @staticmethod
    def forward(ctx, unit, *params):
        ctx.unit = unit
        return unit.gather()  # (n_pad,) in compute dtype

    @staticmethod
    def backward(ctx, grad):
        ctx.unit.reduce_scatter(grad)  # into the grad shard; the parameters' .grad view it
        return (None,) * (1 + len(ctx.unit.params))


class Unit:
    """One unit's flat buffer: this rank's shard of its weights and of their gradient."""

    def __init__(self, engine, index, name, module, slots):
        self.engine, self.index, self.name, self.module = engine, index, name, module
        self.comm, self.p, self.r = engine.comm, engine.comm.size, engine.comm.rank
        self.params, index = [], {}  # each parameter once (tied inside the unit: two slots, one parameter)
        for m, n, prm in slots:
            if id(prm) not in index:
                index[id(prm)] = len(self.params)
                self.params.append(prm)
        self.slots = [(m, n, index[id(prm)]) for m, n, prm in slots]  # (owner module, local name, parameter)
        dtypes = {prm.dtype for prm in self.params}
        if len(dtypes) > 1:
            raise UsageError(f"unit {name!r} mixes dtypes {sorted(map(str, dtypes))}: a unit's weights share one flat buffer")
        self.master = self.params[0].dtype
        self.compute = engine.compute_dtype or self.master
        self.shapes = [tuple(prm.shape) for prm in self.params]
        self.offsets, n = [], 0  # [a, b) of each parameter in the flat buffer
        for prm in self.params:
            self.offsets.append((n, n + prm.numel()))
            n += prm.numel()
        self.n, self.n_pad = n, -(-n // self.p) * self.p
        self.S = self.n_pad // self.p
        lo = self.r * self.S
        with torch.no_grad():
            full = torch.zeros(self.n_pad, dtype=self.master, device=self.params[0].device)  # built once
            for prm, (a, b) in zip(self.params, self.offsets):
                full[a:b] = prm.reshape(-1)
            self.shard = full[lo:lo + self.S].clone()  # (S,) the only copy kept
            self.grad_shard = torch.zeros_like(self.shard)  # (S,)
        del full
        self.pieces = [(min(max(a - lo, 0), self.S), min(max(b - lo, 0), self.S)) for a, b in self.offsets]
        for prm, (a, b) in zip(self.params, self.pieces):
            prm.data = self.shard[a:b]  # (b - a,) the part of it in my shard
        self.forward_full = self.backward_full = self.saving = None
        self.saves_weights = True  # did autograd save any of the gathered weights in the last forward?
        module.register_forward_pre_hook(self.pre_forward, with_kwargs=True)
        module.register_forward_hook(self.post_forward, with_kwargs=True, always_call=True)

    # -- gathering and freeing
    def gather(self, dtype=None):
        """The full flat weights (n_pad,): my shard into place, then a ring all-gather."""
        dtype = dtype or self.compute
        buf = torch.empty(self.n_pad, dtype=dtype, device=self.shard.device)  # (n_pad,)
        buf[self.r * self.S:(self.r + 1) * self.S] = self.shard
        if self.p > 1:
            drain(ring_steps(self.comm, buf, tag=TAG + self.index, phases=("all-gather",),
                             name=f"all_gather:ring {self.name}"))
        if dtype == self.compute:
            self.engine.transient.track("params", buf)
            self.engine.transient.sample()
        return buf

    def install(self, full):
        for m, n, i in self.slots:
            a, b = self.offsets[i]
            m.__dict__[n] = full[a:b].view(self.shapes[i])  # found before the registered shard

    def uninstall(self):
        for m, n, _ in self.slots:
            m.__dict__.pop(n, None)

    def pre_forward(self, module, args, kwargs):
        self.saves_weights = False
        full = _Gather.apply(self, *self.params)
        self.forward_full = full
        self.install(full)
        if torch.is_grad_enabled():
            self.saving = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            self.saving.__enter__()
        if self.compute != self.master:
            return cast_floats(args, self.compute), cast_floats(kwargs, self.compute)
        return None

    def post_forward(self, module, args, kwargs, output):
        if self.saving is not None:
            self.saving.__exit__(None, None, None)
            self.saving = None
        self.uninstall()
        self.forward_full = None  # freed: nothing else holds the gathered weights
        return output

    def pack(self, t):
        full = self.forward_full
        if (full is not None and t.device == full.device and t.layout == torch.strided
                and t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()):
            self.saves_weights = True
            return _Saved(self, t)
        return t

    def unpack(self, saved):
        if isinstance(saved, _Saved):
            return self.backward_weights().as_strided(saved.shape, saved.stride, saved.offset)
        return saved

    def backward_weights(self):
        """The full weights again for the backward: gathered at the first unpack, kept until
        the unit's gradient is reduce-scattered."""
        if self.backward_full is None:
            self.backward_full = self.gather()
        return self.backward_full

    # -- the gradient
    def full_gradient(self, grad):
        """The unit's full flat gradient in the master dtype: a copy the ring may work in."""
        return grad.to(self.master, copy=True).contiguous()  # (n_pad,)

    def reduce_scatter(self, grad):
        """Sum the ranks' full gradients into my shard (ring reduce-scatter), divide by p, add
        into the grad shard; the gathered weights of the backward are freed first."""
        self.backward_full = None
        g = self.full_gradient(grad)
        self.engine.transient.track("grads", g)
        self.engine.transient.sample()
        if self.p > 1:
            drain(ring_steps(self.comm, g, tag=TAG + 100 + self.index, phases=("reduce-scatter",),
                             name=f"reduce_scatter:ring {self.name}"))
        mine = g[self.r * self.S:(self.r + 1) * self.S]
        mine /= self.p
        with torch.no_grad():
            for prm, (a, b) in zip(self.params, self.pieces):  # .grad None: a new step starts from zero
                view = self.grad_shard[a:b]
                if prm.grad is None:
                    view.zero_()
                elif prm.grad.data_ptr() != view.data_ptr():
                    view.copy_(prm.grad)
            self.grad_shard += mine
            for prm, (a, b) in zip(self.params, self.pieces):
                prm.grad = self.grad_shard[a:b]

    def bytes_per_step(self, r):
        """Gathers in forward and, if autograd saved a weight, backward; one reduce-scatter."""
        gathers = 2 if self.saves_weights else 1
        return (gathers * ring_bytes(self.n_pad, self.p, r, self.compute.itemsize, ("all-gather",))
                + ring_bytes(self.n_pad, self.p, r, self.master.itemsize, ("reduce-scatter",)))
