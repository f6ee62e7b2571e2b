"""The pieces every data-parallel engine shares: flat padded buffers, a non-blocking ring, the step.

    flat = Flat([layer], p)                 # where each weight of ``layer`` sits in one padded 1-D buffer
    Engine(comm, model).train_step(x, y)    # forward, backward, sync_grads, update, with hooks

DDP (``ddp.py``) and the ZeRO stages (``minipar.zero``) are ``Engine`` subclasses that fill in
the hooks; ``train_dense`` is the single-process reference they must all reproduce.
"""
from __future__ import annotations

from math import prod

from ..memory import Ledger
from ..mixed_precision import MASTER, FlatAdam, astype, policy, working_dtype
from ..nn import mse_loss
from ..optim import Adam
from ..xp import chunk_bounds, dtype_named, itemsize, namespace, zeros

TAG = 2000  # non-blocking rings: TAG + bucket (or unit) index


# --------------------------------------------------------------------------- the dense reference


def train_dense(model, x, y, steps=1, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, loss=mse_loss):
    """One process, the whole batch, torch.optim.Adam's update; ``steps`` times. Returns the losses."""
    opt = Adam([p for _, p in model.named_parameters()], lr, betas, eps, weight_decay)
    losses = []
    for _ in range(steps):
        model.zero_grad()
        pred, ctx = model.forward(x)
        value, dpred = loss(pred, y)
        model.backward(dpred, ctx)
        opt.step([g for _, g in model.named_grads()])
        losses.append(float(value))
    return losses


def local_batch(comm, x):
    """Rows ``chunk_bounds(B, N)[rank]`` of x: this rank's data shard.

    Averaging the ranks' mean-loss gradients gives the whole batch's gradient only when the
    shards are equal (N divides B); otherwise the samples of the shorter shards weigh more.
    """
    a, b = chunk_bounds(x.shape[0], comm.size)[comm.rank]
    return x[a:b]


# --------------------------------------------------------------------------- flat buffers


def param_slots(module):
    """(owning module, local name) of every parameter, in ``named_parameters()`` order."""
    for name in module.params:
        yield module, name
    for child in module.children().values():
        yield from param_slots(child)


class Flat:
    """Where each parameter of some layers sits in one 1-D buffer, padded to a multiple of p.

    n real elements, n_pad = n rounded up to a multiple of p; rank r's shard is
    ``bounds(r) = [r*S, (r+1)*S)``, S = n_pad / p. The module's ``params``/``grads`` entries can
    be *bound* to views of a buffer, so the layers read and accumulate straight into it.
    """

    def __init__(self, layers, p):
        self.slots, n = [], 0  # (module, name, shape, start, stop)
        for layer in layers:
            for mod, name in param_slots(layer):
                shape = tuple(mod.params[name].shape)
                self.slots.append((mod, name, shape, n, n + prod(shape)))
                n += prod(shape)
        self.n, self.p = n, p
        self.n_pad = -(-n // p) * p
        self.shard = self.n_pad // p

    def bounds(self, r):
        return r * self.shard, (r + 1) * self.shard

    def values(self, like, dtype):
        """A new (n_pad,) buffer holding the current parameter values, zero padding."""
        buf = zeros((self.n_pad,), like=like, dtype=dtype)
        for mod, name, _, a, b in self.slots:
            buf[a:b] = astype(namespace(like).reshape(mod.params[name], (-1,)), dtype)
        return buf

    def bind(self, which, buf):
        """Point ``module.params`` (or ``.grads``) at views of ``buf``."""
        for mod, name, shape, a, b in self.slots:
            getattr(mod, which)[name] = namespace(buf).reshape(buf[a:b], shape)

    def unbind(self, which):
        """Drop the module's references (ZeRO-2/3 between uses): a stray use fails loudly."""
        for mod, name, *_ in self.slots:
            getattr(mod, which)[name] = None

    def views(self, which):
        return [getattr(mod, which)[name] for mod, name, *_ in self.slots]


# --------------------------------------------------------------------------- the training step


class Engine:
    """One data-parallel training step with hooks where DDP and ZeRO communicate.

    forward:  for each layer: before_forward, layer.forward, after_forward (may rewrite its ctx)
    backward: for each layer, last first: before_backward, backward_input, backward_weight,
              after_backward; ``progress()`` between them advances non-blocking collectives
    then:     sync_grads (the averaging), optimizer_step (update, the optimizer; ledger.sample())

    ``train_step`` runs all of it over the model's own top-level layers. When someone else runs
    the forward and backward (the pipeline executor, micro-batch after micro-batch), the engine
    only brackets it: ``zero_grad()`` before, ``finish_step()`` (or its two halves, ``sync_grads``
    and ``optimizer_step``) after the last micro-batch, so the gradients are averaged once per
    step, not once per micro-batch.
    """

    stage = 0

    def __init__(self, comm, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 precision=None, offload=False, loss=mse_loss, main_grad=False):
        """``precision``: None, or a precision (a ``minipar.mixed_precision.Policy``, or its name:
        "fp64", "fp32", "bf16", "fp16"). A 16-bit one (bf16, fp16) makes the engine mixed: a
        working copy in its compute dtype, float32 master weights and Adam state; any other keeps
        everything in the parameters' dtype. ``main_grad``: mixed, the gradients are kept in float32
        (Megatron's main_grad: every micro-batch's gradient is added into them, and they are
        averaged in float32) instead of in the working dtype."""
        self.comm, self.model, self.loss = comm, model, loss
        self.layers = list(model.children().items())  # (name, module), run in this order
        self.units = [name for name, m in self.layers if m.num_params()]
        self.index = {u: i for i, u in enumerate(self.units)}
        # a one-element array with a parameter's dtype and device: holding the parameter itself would keep
        # a stale copy of it alive once the engine has moved the weights into its flat buffers
        self.like = zeros((1,), like=next(p for _, p in model.named_parameters()))
        self.precision = policy(precision) if precision is not None else None
        mixed = bool(self.precision and self.precision.mixed)
        self.dtype = working_dtype(self.like, self.precision)
        self.b_work = itemsize(zeros((1,), like=self.like, dtype=self.dtype))  # bytes per working param
        self.grad_dtype = dtype_named(MASTER, self.like) if mixed and main_grad else self.dtype
        self.b_grad = itemsize(zeros((1,), like=self.like, dtype=self.grad_dtype))
        self.adam = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, mixed=mixed, offload=offload)
        self.ledger = Ledger(comm.tracer.buffers)  # tracks the engine's arrays; names its buffers
        self.psi = model.num_params()

    def optimizer(self, param, init):
        opt = FlatAdam(param, init, **self.adam)
        self.ledger.track(opt.where, *opt.arrays())  # "optimizer", "host" (offload) or "file" (NVMe)
        return opt

    def train_step(self, x, y):
        """Forward, loss, backward, gradient averaging, update. x, y: this rank's batch. Returns the loss."""
        self.zero_grad()
        x, y = astype(x, self.dtype), astype(y, self.dtype)
        pred, ctxs = self.forward(x)
        value, dpred = self.loss(pred, y)
        self.backward(dpred, ctxs)
        self.finish_step()
        return float(value)

    def finish_step(self):
        """After every micro-batch's backward: average the gradients over the group, update."""
        self.sync_grads()
        self.optimizer_step()

    def optimizer_step(self):
        """The update with the averaged gradients (traced as "update"), then the ledger's sample."""
        with self.comm.region("update"):
            self.update()
        self.ledger.sample()

    def forward(self, x):
        ctxs = {}
        for name, layer in self.layers:
            self.before_forward(name)
            with self.comm.region(f"forward {name}"):
                x, ctx = layer.forward(x)
            ctxs[name] = self.after_forward(name, ctx)
            del ctx  # ZeRO-3: the context as the layer returned it holds the gathered weights
            self.progress()
        return x, ctxs

    def backward(self, dy, ctxs):
        for name, layer in reversed(self.layers):
            ctx = self.before_backward(name, ctxs.pop(name))
            with self.comm.region(f"backward {name}"):
                dx = layer.backward_input(dy, ctx)
            self.progress()
            with self.comm.region(f"backward_weight {name}"):
                layer.backward_weight(dy, ctx)
            self.after_backward(name)
            del ctx  # ZeRO-3: it holds the gathered weights, freed before the next unit is gathered
            self.progress()
            dy = dx

    # hooks: nothing by default
    def zero_grad(self): pass
    def before_forward(self, name): pass
    def after_forward(self, name, ctx): return ctx
    def before_backward(self, name, ctx): return ctx
    def after_backward(self, name): pass
    def progress(self): pass
    def sync_grads(self): pass
    def update(self): pass

    # optimizer state, piece by piece (checkpoints)
    def optimizer_parts(self):
        """[(Flat, FlatAdam, (a, b))]: each optimizer and the range [a, b) of its flat buffer it updates."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def grad_pieces(self):
        """[(module, name, view)]: after ``sync_grads``, the part of each averaged gradient this
        rank answers for, so that over the group every element is counted exactly once (a global
        gradient norm): all of it on one rank (DDP), each rank its shard (ZeRO)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def step_grads(self):
        """The gradient arrays the update reads, after ``sync_grads``: what unscaling, an
        overflow check or clipping must reach (the layers' own; ZeRO-2/3: the shards)."""
        return [g for _, g in self.model.named_grads()]

    def optimizer_pieces(self):
        """[(module, name, lo, hi, m, v)]: for each parameter this rank's optimizer updates (all of
        it, or with ZeRO a slice), the range [lo, hi) of the flattened parameter and views of
        Adam's m and v over it. Writing into m and v sets the state (resuming)."""
        return [(mod, name, lo, hi, opt.m[a:b], opt.v[a:b]) for mod, name, lo, hi, opt, a, b in self._pieces()]

    def master_pieces(self):
        """[(module, name, lo, hi, master)]: the same pieces of the float32 master weights (mixed
        precision; empty without, the weights are their own master). Writing into them sets them."""
        if not self.adam["mixed"]:
            return []
        return [(mod, name, lo, hi, opt.master[a:b]) for mod, name, lo, hi, opt, a, b in self._pieces()]

    def _pieces(self):
        if self.adam["offload"]:
            raise ValueError("optimizer_pieces: only on-device Adam state is exported")
        out = []
        for flat, opt, (a, b) in self.optimizer_parts():
            for mod, name, _, s, e in flat.slots:
                lo, hi = max(a, s), min(b, e)
                if lo < hi:
                    out.append((mod, name, lo - s, hi - s, opt, lo - a, hi - a))
        return out

    @property
    def steps(self):
        """Updates done so far (Adam's step count)."""
        return self.optimizer_parts()[0][1].steps

    @steps.setter
    def steps(self, n):
        for _, opt, _ in self.optimizer_parts():
            opt.steps = n

    def bytes_per_param(self):
        """(working param bytes, grad bytes, optimizer K) as this engine stores them."""
        state = 4 if self.adam["mixed"] else itemsize(self.like)
        master = self.adam["mixed"] or self.adam["offload"]  # offloaded: the host keeps its own copy of the weights
        return self.b_work, self.b_grad, (3 if master else 2) * state

    def measured_memory(self):
        return self.ledger.report()
