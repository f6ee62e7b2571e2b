"""The ZeRO engines, stages 1, 2, 3: each a small change to the one before it.

A ZeRO *stage* says how much is sharded (1: the optimizer state, 2: + the gradients, 3: + the
parameters); it has nothing to do with a pipeline's stages.

    opt = ZeRO1(comm, model, lr=1e-3, precision="fp16")   # or ZeRO2, ZeRO3 (prefetch=True), offload=True
    loss = opt.train_step(local_batch(comm, x), local_batch(comm, y))

Every unit (a top-level layer with weights) is one flat buffer padded to a multiple of N
(``Flat``); rank r owns the slice ``[r*S, (r+1)*S)`` of every unit (S = n_pad / N), as in the
picture of the backpackers: everyone carries a piece of every layer. Per unit and step:

    stage  holds                              sends (ring)                              per rank
    1      full params, full grads, 1/N state  reduce-scatter grads, all-gather params    2 (N-1)/N Psi
    2      full params, 1/N grads, 1/N state   the same, the reduce-scatter right after     2 (N-1)/N Psi
                                               the unit's backward (its full grad is freed)
    3      1/N of everything                   all-gather before forward, again before      3 (N-1)/N Psi
                                               backward, reduce-scatter after backward

What an engine holds, per unit ``u`` (dicts keyed by the unit's name):

    full_params[u]    the whole flat parameter buffer (n_pad,): stages 1, 2 always, 3 only while gathered
    param_shards[u]   this rank's shard of it (S,): stage 3 (stages 1, 2 read a view of full_params)
    full_grads[u]     the whole flat gradient buffer: stage 1 always, 2 and 3 only during u's backward
    grad_shards[u]    this rank's shard of the averaged gradient: stages 2, 3
    shard_bounds[u]   (start, stop) of this rank's shard in the flat buffers

The reduce-scatter adds in exactly the order of DDP's ring all-reduce on the same padded unit
(``DDP(bucket_bytes=0)``), and Adam is elementwise, so every stage is *bitwise* DDP.

Under a pipeline (lesson 05's trainer) the engine does not run the layers: the executor runs
every micro-batch's forward and backward, and the engine only brackets the step
(``whole_step=True``): ``zero_grad`` opens every unit's full gradient buffer (and, stage 3,
gathers every unit's weights), the micro-batches accumulate into them, and ``sync_grads``, once
after the flush, reduce-scatters each into the rank's shard and frees the full buffers (stage 3:
the gathered weights too). That is torchtitan's choice under PP (no reshard after forward): the
weights are gathered once per step, not once per micro-batch; the price is that, at the peak,
the rank holds every full gradient (and stage 3 every full weight) of its stage, as ZeRO-1 does.
``reshard=True`` (stage 3) leaves the gathering to the caller, one pipeline stage at a time around
every pipeline action (``gather_group``, ``free_group``; ``groups`` says which pipeline stage each
unit belongs to): the weights never whole for longer than an action, and gathered 2m times a step
instead of once.
"""
from __future__ import annotations

from .. import collectives as C
from ..collectives import drain, ring_steps
from ..data_parallel.engine import TAG, Engine, Flat
from ..memory import zero_bytes
from ..xp import copy, empty, nbytes, to_numpy, zeros

GATHER_TAG = TAG + 500  # + unit index: stage-3 gathers


class ZeRO1(Engine):
    """Optimizer state sharded: each rank keeps Adam's state for its shard of every unit only.

    After the backward: reduce-scatter each unit's gradient (rank r receives the sum of shard r),
    divide by N, update shard r of the parameters, all-gather the updated shards.
    """

    stage = 1

    def __init__(self, comm, model, **kw):
        super().__init__(comm, model, **kw)
        self.flats = {u: Flat([model.children()[u]], comm.size) for u in self.units}
        self.shard_bounds = {u: f.bounds(comm.rank) for u, f in self.flats.items()}  # (start, stop) of mine
        inits = {u: f.values(self.like, self.like.dtype) for u, f in self.flats.items()}  # full precision
        self.setup_params()
        self.setup_grads()
        self.opts = {u: self.optimizer(self.param_shard(u), copy(inits[u][slice(*self.shard_bounds[u])]))
                     for u in self.units}

    # -- parameters: full working copy on every rank (stages 1, 2)
    def setup_params(self):
        self.full_params = {}
        for u, f in self.flats.items():
            self.full_params[u] = f.values(self.like, self.dtype)  # (n_pad,)
            f.bind("params", self.full_params[u])
            self.ledger.track("params", self.full_params[u], name="zero.flat params", label=u)

    def param_shard(self, u):
        return self.full_params[u][slice(*self.shard_bounds[u])]  # (S,) view

    def after_update(self, u):
        """Everyone gets everyone's updated shard (ring all-gather, in place)."""
        drain(ring_steps(self.comm, self.full_params[u], tag=GATHER_TAG + self.index[u], phases=("all-gather",),
                         name="all_gather:ring"))

    # -- gradients: a full buffer per unit (stage 1)
    def setup_grads(self):
        self.full_grads = {}
        for u, f in self.flats.items():
            self.full_grads[u] = zeros((f.n_pad,), like=self.like, dtype=self.grad_dtype)
            f.bind("grads", self.full_grads[u])
            self.ledger.track("grads", self.full_grads[u], name="zero.flat grads", label=u)

    def zero_grad(self):
        for grad in self.full_grads.values():
            grad[...] = 0

    def after_backward(self, name):
        self.ledger.sample()

    def sync_grads(self):
        for u, grad in self.full_grads.items():
            shard = C.reduce_scatter(self.comm, grad)  # (S,) the sum of my shard over ranks
            shard /= self.comm.size
            grad[slice(*self.shard_bounds[u])] = shard  # only this slice of grad means anything now

    def grad_shard(self, u):
        return self.full_grads[u][slice(*self.shard_bounds[u])]

    def update(self):
        for u in self.units:
            self.opts[u].step(self.param_shard(u), self.grad_shard(u))
            self.after_update(u)

    def optimizer_parts(self):
        return [(self.flats[u], self.opts[u], self.shard_bounds[u]) for u in self.units]

    def grad_pieces(self):
        """My shard of each unit's averaged gradient (the only part of it that is averaged here),
        cut at the parameters' edges: the shards of the group cover every element once."""
        out = []
        for u in self.units:
            (lo, hi), shard = self.shard_bounds[u], self.grad_shard(u)
            for mod, name, _, a, b in self.flats[u].slots:
                if max(a, lo) < min(b, hi):
                    out.append((mod, name, shard[max(a, lo) - lo:min(b, hi) - lo]))
        return out

    # -- reading results and predicting memory
    def params_numpy(self):
        """{qualified name: NumPy copy} of the full parameters, on every rank."""
        return {n: to_numpy(copy(p)) for n, p in self.model.named_parameters()}

    def predicted_memory(self):
        pad = sum(f.n_pad for f in self.flats.values()) - self.psi
        return zero_bytes(self.psi, self.comm.size, self.stage, *self.bytes_per_param(),
                          self.adam["offload"], pad=pad, **self.extras())

    def extras(self):
        return {}


class ZeRO2(ZeRO1):
    """Gradients sharded too: right after a unit's backward, reduce-scatter its gradient into
    the rank's shard and free the full buffer. Only one unit's full gradient exists at a time.
    """

    stage = 2

    def __init__(self, comm, model, whole_step=False, **kw):
        self.whole_step = whole_step  # a pipeline's micro-batches accumulate; one reduce-scatter after the flush
        super().__init__(comm, model, **kw)

    def setup_grads(self):
        self.full_grads, self.grad_shards = {}, {}
        for u, f in self.flats.items():
            self.grad_shards[u] = zeros((f.shard,), like=self.like, dtype=self.grad_dtype)  # (S,) kept
            self.ledger.track("grads", self.grad_shards[u], name="zero.grad shard", label=u)
            f.unbind("grads")

    def zero_grad(self):
        """Each unit's full gradient buffer is new and zero for every backward; a whole step's
        (``whole_step``) are opened here, all of them, for every micro-batch to add into."""
        if self.whole_step:
            for u in self.units:
                self.open_grad(u)

    def open_grad(self, u):
        """A zero buffer for unit u's layers to accumulate into (bound to their ``grads``)."""
        self.full_grads[u] = zeros((self.flats[u].n_pad,), like=self.like, dtype=self.grad_dtype)
        self.flats[u].bind("grads", self.full_grads[u])
        self.ledger.track("grads", self.full_grads[u], name="zero.unit grad", label=u)  # new every backward

    def close_grad(self, u):
        """Reduce-scatter unit u's full gradient into my shard (the average) and free it."""
        self.ledger.sample()  # the peak: the full gradients open now + every shard
        shard = C.reduce_scatter(self.comm, self.full_grads.pop(u))
        shard /= self.comm.size
        self.grad_shards[u][...] = shard
        self.flats[u].unbind("grads")  # the full gradient is freed here

    def before_backward(self, name, ctx):
        if name in self.flats and name not in self.full_grads:
            self.open_grad(name)
        return ctx

    def after_backward(self, name):
        if name in self.flats and not self.whole_step:
            self.close_grad(name)

    def sync_grads(self):
        """Unit by unit during the backward; a whole step's here, once, after the flush."""
        for u in list(self.full_grads):
            self.close_grad(u)

    def grad_shard(self, u):
        return self.grad_shards[u]

    def step_grads(self):
        return list(self.grad_shards.values())  # the layers' gradients are unbound between backwards

    def extras(self):
        sizes = [f.n_pad for f in self.flats.values()]
        return {"unit_grad": sum(sizes) if self.whole_step else max(sizes)}


class _Weight:
    """Stands in an activation context for a gathered weight that has been freed."""

    __slots__ = ("unit", "i")

    def __init__(self, unit, i):
        self.unit, self.i = unit, i


def swap(ctx, table):
    """A copy of nested ctx (dicts, tuples, lists) with every object whose id is in table replaced."""
    if id(ctx) in table:
        return table[id(ctx)]
    if isinstance(ctx, dict):
        return {k: swap(v, table) for k, v in ctx.items()}
    if isinstance(ctx, (tuple, list)):
        items = [swap(v, table) for v in ctx]
        return type(ctx)(*items) if hasattr(ctx, "_fields") else type(ctx)(items)  # a NamedTuple takes fields
    return ctx


class ZeRO3(ZeRO2):
    """Parameters sharded too: a unit's weights exist in full only while it computes.

    Before a unit's forward (and again before its backward) its shards are all-gathered; right
    after, the full weights are freed, including from the activation context, where a
    placeholder (``_Weight``) takes their place until the backward gathers them again. With
    ``prefetch`` the gather of the next unit is started (one ring step posted) before this one
    computes, and advanced between layers.
    """

    stage = 3

    def __init__(self, comm, model, prefetch=True, reshard=False, groups=None, **kw):
        """``reshard`` (with ``whole_step``): the caller gathers and frees the units group by group
        around each pipeline action; ``groups``: {unit: its group}, the pipeline stage it belongs
        to (default: every unit a group of its own)."""
        self.prefetch, self.gathering = prefetch, {}  # unit -> (buffer, generator) in flight
        self.reshard = reshard
        super().__init__(comm, model, **kw)
        self.groups = {u: (groups or {}).get(u, u) for u in self.units}
        self.placeholders = {u: [_Weight(u, i) for i in range(len(f.slots))] for u, f in self.flats.items()}
        # reshard: the most elements gathered at once, the largest group (the prediction's "gathered")
        self.live = max((sum(self.flats[u].n_pad for u in self.group(g)) for g in set(self.groups.values())), default=0)

    def group(self, g):
        """The units of group ``g`` (a pipeline stage), in order."""
        return [u for u in self.units if self.groups[u] == g]

    def gather_group(self, g, ctx=None):
        """Gather every unit of group ``g`` (a collective over the engine's group); returns ``ctx``
        with their placeholders replaced by the gathered weights (None stays None)."""
        for u in self.group(g):
            self.gather(u)
            ctx = ctx if ctx is None else self.restore(u, ctx)
        return ctx

    def free_group(self, g, ctx=None):
        """Free every unit of group ``g``; returns ``ctx`` with their weights replaced by
        placeholders (so that it does not keep them alive)."""
        for u in self.group(g):
            ctx = ctx if ctx is None else self.hide(u, ctx)
            self.free(u)
        return ctx

    def setup_params(self):
        self.full_params, self.param_shards = {}, {}
        for u, f in self.flats.items():
            full = f.values(self.like, self.dtype)  # built once, dropped at the end of this loop
            self.param_shards[u] = copy(full[slice(*self.shard_bounds[u])])  # (S,) the only copy kept
            self.ledger.track("params", self.param_shards[u], name="zero.param shard", label=u)
            f.unbind("params")

    def param_shard(self, u):
        return self.param_shards[u]

    def zero_grad(self):
        """A whole step without ``reshard``: every unit gathered once, before the first micro-batch."""
        if self.whole_step and not self.reshard:
            for u in self.units:
                self.gather(u)
        super().zero_grad()

    def sync_grads(self):
        """A whole step: the gradients reduce-scattered after the flush, then the weights freed."""
        super().sync_grads()
        if self.whole_step:
            for u in list(self.full_params):
                self.free(u)

    def after_update(self, u):
        pass  # the next forward gathers the new shards

    # -- gathering on demand
    def start_gather(self, u):
        if u is None or u in self.gathering or u in self.full_params:
            return
        buf = empty((self.flats[u].n_pad,), like=self.param_shards[u])  # (n_pad,)
        buf[slice(*self.shard_bounds[u])] = self.param_shards[u]
        gen = ring_steps(self.comm, buf, tag=GATHER_TAG + self.index[u], phases=("all-gather",), name="all_gather:ring")
        next(gen, None)
        self.gathering[u] = (buf, gen)
        self.ledger.track("params", buf, name="zero3.gathered", label=u)  # at most 2 alive with prefetch

    def gather(self, u):
        self.start_gather(u)
        if u in self.gathering:
            buf, gen = self.gathering.pop(u)
            drain(gen)
            self.full_params[u] = buf
            self.flats[u].bind("params", buf)
            self.ledger.sample()  # every gathered buffer alive now counts (Memory-Centric Tiling's peak)

    def peak_gathered(self) -> int:
        """Bytes of full (gathered) units alive together at the peak: params' peak minus the shards."""
        return self.ledger.peak["params"] - sum(nbytes(s) for s in self.param_shards.values())

    def free(self, u):
        self.flats[u].unbind("params")
        del self.full_params[u]

    def neighbour(self, u, step):
        i = self.index[u] + step
        return self.units[i] if self.prefetch and 0 <= i < len(self.units) else None

    def progress(self):
        for u, (buf, gen) in list(self.gathering.items()):
            if next(gen, StopIteration) is StopIteration:  # done: keep the buffer, drop the generator
                self.gathering[u] = (buf, iter(()))

    def before_forward(self, name):
        if name in self.flats:
            self.gather(name)
            self.start_gather(self.neighbour(name, +1))

    def hide(self, u, ctx):
        """ctx with unit u's gathered weights replaced by placeholders (u must be gathered)."""
        return swap(ctx, {id(w): ph for w, ph in zip(self.flats[u].views("params"), self.placeholders[u])})

    def restore(self, u, ctx):
        """ctx with unit u's placeholders replaced by its weights, gathered again."""
        return swap(ctx, {id(ph): w for w, ph in zip(self.flats[u].views("params"), self.placeholders[u])})

    def after_forward(self, name, ctx):
        if name not in self.flats:
            return ctx
        self.ledger.sample()  # the peak of the forward: this unit + the next one in flight
        ctx = self.hide(name, ctx)  # the context must not keep the full weights alive
        self.free(name)
        return ctx

    def before_backward(self, name, ctx):
        if name not in self.flats:
            return ctx
        self.gather(name)
        self.start_gather(self.neighbour(name, -1))
        return super().before_backward(name, self.restore(name, ctx))

    def after_backward(self, name):
        super().after_backward(name)  # sample, reduce-scatter the gradient, free it
        if name in self.flats:
            self.free(name)

    def params_numpy(self):
        """Collective: every unit gathered once (blocking, not part of any training step)."""
        out = {}
        for u in self.units:
            self.gather(u)
            out.update({f"{u}.{n}": to_numpy(copy(p)) for n, p in self.model.children()[u].named_parameters()})
            self.free(u)
        return out

    def extras(self):
        sizes = [self.flats[u].n_pad for u in self.units]
        if self.whole_step:  # every unit's gradient open; every unit gathered, or (reshard) what the caller gathers
            return {"unit_grad": sum(sizes), "gathered": self.live if self.reshard else sum(sizes)}
        pairs = [a + b for a, b in zip(sizes, sizes[1:])] if self.prefetch and len(sizes) > 1 else sizes
        return {"unit_grad": max(sizes), "gathered": max(pairs)}
