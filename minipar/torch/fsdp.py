"""FullyShardedDataParallel (ZeRO-3) for any ``torch.nn.Module``, on minipar's ring.

    fsdp = FullyShardedDataParallel(model, units=(Block,), compute_dtype=torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)    # the parameters are now shards
    loss_fn(fsdp(x_local), y_local).backward()
    fsdp.finish_gradient_synchronization()
    opt.step()
    weights = fsdp.full_state_dict()                        # {name: full tensor}, every rank

**Units.** Every submodule that ``units`` matches (a tuple of module classes, or a predicate
``units(module) -> bool``; the outermost match wins) is one unit: its trainable parameters are
laid end to end in one flat buffer, padded to a multiple of p, and each rank keeps one slice of
it, its shard (S = n_pad / p elements, in the parameters' own dtype: the master copy). Each
parameter object stays registered where it was, its ``.data`` now the 1-D piece of it that lies
in this rank's shard (possibly empty): ``model.parameters()`` hands an optimizer the shards, and
an elementwise optimizer (SGD, Adam, AdamW) on the shards is the optimizer on the full weights.

**What a unit sends** (``minipar.torch.unit``). Lesson 02's conjugate pair, as one autograd function (``_Gather``):

    before the unit's forward   all-gather the shards (cast to compute_dtype first)   (n_pad - S) c
    after it                    the full weights freed: autograd keeps placeholders for them
    in the unit's backward      all-gather again, the first time a placeholder is unpacked (a
                                unit whose weights autograd did not save, such as a first layer
                                whose input needs no gradient, is not gathered again)
    after the unit's backward   reduce-scatter the full gradient (in the master dtype) into the
                                shard, divided by p; the full weights and gradient freed (n_pad - S) m

c, m: bytes per element of the compute and master dtypes. The module computes with the gathered
weights because each one is placed in its owner's ``__dict__`` during the unit's forward (an
instance attribute is found before the registered parameter), and a ``saved_tensors_hooks``
pair swaps every tensor autograd saves from them for a placeholder (lesson 04's ``_Weight``),
gathered again on unpack.

**Outside the units.** A parameter of no unit (an embedding, a final norm), or one shared by two
places (a tied weight reaches a unit and the output head), stays whole on every rank:
replicated, its gradient all-reduced in :meth:`~FullyShardedDataParallel.finish_gradient_synchronization`
(missing gradients count as zero, as in :mod:`minipar.torch.ddp`). Frozen parameters stay whole too.

**compute_dtype** (float16, bfloat16): the gathered weights, the replicated weights (a
differentiable ``.to``) and the floating-point inputs of the model and of each unit are cast for
the forward and the backward; the shards stay the fp32 master, the gradients are reduced in fp32
and every ``.grad`` has its ``.data``'s shape and dtype. FSDP2's ``MixedPrecisionPolicy(param_dtype,
reduce_dtype=float32)`` is the same arrangement.

**Memory.** Per rank, by category (``memory()``, measured through lesson 04's ``Ledger``): the
shards, the grad shards, the replicated weights and gradients, the optimizer state; and, while
they live, one gathered unit and one unit's full gradient. ``predicted_memory`` is lesson 04's
ZeRO-3 formula (``zero_bytes`` at stage 3, with the padding, ``gathered`` and ``unit_grad``) plus
the replicated parameters at stage 0, and this allowance for torch's optimizer: no state for
the padding (-K per padding element of my shards) and a fixed size per parameter tensor (Adam's
``step``, a 4-byte 0-d tensor). Activations, autograd's own gradient of the gathered unit in the
compute dtype and the casts are not counted.

The dense reference is the module unwrapped on one process (``torch.Tensor.to`` casts its weights
for the forward when comparing in compute_dtype: :func:`dense_mixed_forward`).
"""
from __future__ import annotations

import torch

from ..collectives import drain, ring_steps
from ..errors import UsageError
from ..memory import Ledger, zero_bytes
from .group import broadcast_state, communicator, need_params, ring_bytes, say_once
from .unit import TAG, Unit, cast_floats

__all__ = ["FullyShardedDataParallel", "Unit", "find_units", "compute_dtype_of", "dense_mixed_forward"]


def compute_dtype_of(dtype):
    """``dtype`` (a torch dtype or its name) when it is a floating-point type, else a UsageError."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise UsageError(f"compute_dtype={dtype!r} is not a floating-point torch dtype "
                         f"(torch.float16, torch.bfloat16, torch.float32)")
    return dtype


def dense_mixed_forward(module, dtype, *args):
    """The reference in ``dtype``: ``module(*args)`` on one process with every weight cast by a
    differentiable ``.to`` (gradients arrive in the weights' own dtype)."""
    slots = [(m, n, p) for m in module.modules() for n, p in m._parameters.items() if p is not None]
    casts = {}
    for m, n, p in slots:
        m.__dict__[n] = casts.setdefault(id(p), p.to(dtype))
    try:
        return module(*cast_floats(args, dtype))
    finally:
        for m, n, _ in slots:
            m.__dict__.pop(n, None)


def find_units(module, units):
    """[(name, submodule)] of the outermost submodules ``units`` matches; a UsageError when none."""
    if isinstance(units, type):
        units = (units,)
    if isinstance(units, tuple) and units and all(isinstance(u, type) for u in units):
        match = lambda m: isinstance(m, units)  # noqa: E731
    elif callable(units) and not isinstance(units, tuple):
        match = units
    else:
        raise UsageError(f"units={units!r}: expected a tuple of module classes or a predicate units(module) -> bool")
    found = []
    for name, m in module.named_modules():
        if any(u == "" or name.startswith(u + ".") for u, _ in found):
            continue  # inside a unit already
        if match(m):
            found.append((name, m))
    if not found:
        raise UsageError(f"units={units!r} matches no submodule of {type(module).__name__}: nothing to shard")
    return found


def slots_of(module):
    """(owner module, local name, parameter) of every registered parameter under ``module``."""
    return [(m, n, p) for m in module.modules() for n, p in m._parameters.items() if p is not None]


class FullyShardedDataParallel(torch.nn.Module):
    """``module`` with every unit's weights sharded over ``comm`` (see the module docstring)."""

    unit_class = Unit

    def __init__(self, module, units, compute_dtype=None, comm=None):
        super().__init__()
        params = need_params(module, "FullyShardedDataParallel")
        self.compute_dtype = compute_dtype_of(compute_dtype)
        found = find_units(module, units)
        self.module = module
        self.comm = communicator(comm, params[0], "FullyShardedDataParallel")
        say_once(self.comm, "FullyShardedDataParallel")
        broadcast_state(self.comm, module)  # every rank shards the same weights
        self.ledger, self.transient = Ledger(self.comm.tracer.buffers), Ledger()
        places: dict = {}  # id(param) -> the units (or None: outside every unit) that use it
        inside = set()
        for i, (name, m) in enumerate(found):
            for owner, n, prm in slots_of(m):
                places.setdefault(id(prm), set()).add(i)
                inside.add(id(owner))
        for owner, n, prm in slots_of(module):
            if id(owner) not in inside:
                places.setdefault(id(prm), set()).add(None)
        sharded = {k for k, where in places.items() if len(where) == 1 and None not in where}
        self.units = []
        for i, (name, m) in enumerate(found):
            slots = [(o, n, prm) for o, n, prm in slots_of(m) if id(prm) in sharded and prm.requires_grad]
            if slots:
                self.units.append(self.unit_class(self, len(self.units), name or "<root>", m, slots))
        shard_ids = {id(prm) for u in self.units for prm in u.params}
        self.replicated_slots = [(o, n, prm) for o, n, prm in slots_of(module) if id(prm) not in shard_ids]
        self.replicated = []
        for _, _, prm in self.replicated_slots:
            if all(prm is not q for q in self.replicated):
                self.replicated.append(prm)
        for u in self.units:
            self.ledger.track("params", u.shard, name="fsdp.param shard", label=u.name)
            self.ledger.track("grads", u.grad_shard, name="fsdp.grad shard", label=u.name)
        for prm in self.replicated:
            self.ledger.track("params", prm)

    # -- the step
    def forward(self, *args, **kwargs):
        if self.compute_dtype is None:
            return self.module(*args, **kwargs)
        casts = {}
        for m, n, prm in self.replicated_slots:  # a differentiable cast: the gradient comes back in fp32
            m.__dict__[n] = casts.setdefault(id(prm), prm.to(self.compute_dtype))
        try:
            return self.module(*cast_floats(args, self.compute_dtype), **cast_floats(kwargs, self.compute_dtype))
        finally:
            for m, n, _ in self.replicated_slots:
                m.__dict__.pop(n, None)

    def finish_gradient_synchronization(self):
        """The units' gradients were reduce-scattered during the backward; all-reduce the
        replicated ones (missing ones count as zero). Then every parameter's ``.grad`` has its
        ``.data``'s shape and dtype. Before ``optimizer.step()``."""
        trainable = [prm for prm in self.replicated if prm.requires_grad]
        groups: dict = {}
        for prm in trainable:
            groups.setdefault((prm.dtype, prm.device), []).append(prm)
        with torch.no_grad():
            for gi, (_, ps) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
                flat = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for q in ps])
                if self.comm.size > 1:
                    with self.comm.region("all_reduce:ring replicated", "collective"):
                        drain(ring_steps(self.comm, flat, tag=TAG - 1 - gi))
                    flat /= self.comm.size
                at = 0
                for q in ps:
                    avg = flat[at:at + q.numel()].view_as(q)
                    at += q.numel()
                    if q.grad is None:
                        q.grad = avg.clone()
                    else:
                        q.grad.copy_(avg)
                    self.ledger.track("grads", q.grad)

    def full_state_dict(self):
        """{name: full tensor} under the module's own names (tied weights under each name), on
        every rank: each unit gathered once in the master dtype (collective: every rank calls it)."""
        names: dict = {}
        for name, prm in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(prm), []).append(name)
        full = {}
        for u in self.units:
            buf = u.gather(u.master)
            for prm, (a, b), shape in zip(u.params, u.offsets, u.shapes):
                for name in names.get(id(prm), []):
                    full[name] = buf[a:b].view(shape).clone()
        return {k: full[k] if k in full else v.detach().clone() for k, v in self.module.state_dict().items()}

    # -- accounting
    def bytes_per_step(self, rank=None):
        """Bytes this rank sends per step: per unit two all-gathers (compute dtype; one when the
        last forward saved none of its weights) and one reduce-scatter (master dtype); one
        all-reduce of the replicated gradients per dtype. Known once the forward has run."""
        r, p = (self.comm.rank if rank is None else rank), self.comm.size
        out = sum(u.bytes_per_step(r) for u in self.units)
        groups: dict = {}
        for prm in self.replicated:
            if prm.requires_grad:
                groups[prm.dtype] = groups.get(prm.dtype, 0) + prm.numel()
        return out + sum(ring_bytes(n, p, r, dt.itemsize) for dt, n in groups.items())

    def track_optimizer(self, optimizer):
        """Count ``optimizer``'s state tensors (after its first step) as this rank's optimizer bytes."""
        for s in optimizer.state.values():
            for t in s.values():
                if isinstance(t, torch.Tensor):
                    self.ledger.track("optimizer", t)

    def memory(self, optimizer=None) -> dict:
        """Bytes per category this rank holds now, plus the peaks of the gathered units and full unit
        gradients (``gathered_bytes``, ``unit_grad_bytes``, included in params and grads)."""
        if optimizer is not None:
            self.track_optimizer(optimizer)
        now, peak = self.ledger.now(), self.transient.peak
        out = {"params_bytes": now["params"] + peak["params"], "grads_bytes": now["grads"] + peak["grads"],
               "optimizer_bytes": now["optimizer"], "gathered_bytes": peak["params"], "unit_grad_bytes": peak["grads"]}
        out["total_bytes"] = out["params_bytes"] + out["grads_bytes"] + out["optimizer_bytes"]
        return out

    def predicted_memory(self, k=8, per_tensor=4) -> dict:
        """Lesson 04's ZeRO-3 bytes for the units, stage 0 for the replicated parameters, and the
        allowance for torch's optimizer (module docstring). ``k``: state bytes per element (Adam
        in fp32: m and v, 8); ``per_tensor``: fixed state bytes per parameter tensor (Adam's step)."""
        p, units = self.comm.size, self.units
        item = units[0].master.itemsize if units else 4
        psi = sum(u.n for u in units)
        pad = sum(u.n_pad - u.n for u in units)
        gathered = max((u.n_pad * u.compute.itemsize for u in units), default=0) / item
        unit_grad = max((u.n_pad * u.master.itemsize for u in units), default=0) / item
        z = zero_bytes(psi, p, 3, item, item, k, pad=pad, gathered=gathered, unit_grad=unit_grad)
        trainable = [q for q in self.replicated if q.requires_grad]
        rep = zero_bytes(sum(q.numel() for q in trainable), p, 0, item, item, k)
        frozen = sum(q.numel() * q.element_size() for q in self.replicated if not q.requires_grad)
        my_pad = sum(u.S - sum(b - a for a, b in u.pieces) for u in units)  # padding elements in my shards
        tensors = sum(len(u.params) for u in units) + len(trainable)
        out = {"params_bytes": z["params_bytes"] + rep["params_bytes"] + frozen,
               "grads_bytes": z["grads_bytes"] + rep["grads_bytes"],
               "optimizer_bytes": z["optimizer_bytes"] + rep["optimizer_bytes"] - k * my_pad + per_tensor * tensors}
        out["total_bytes"] = sum(out.values())
        return {key: int(round(v)) for key, v in out.items()}
