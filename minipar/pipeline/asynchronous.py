"""Synchronous (flush) vs asynchronous (PipeDream) pipeline training, side by side.

    from minipar import launch
    out = launch(4, "minipar.lessons.pipeline_async:check_async")    # every check below, as rows
    stages = build_stages(4, 8, 32, np.random.default_rng(0)); xs, ts = teacher_data(100, 16, 32)
    train_async_dense(stages, xs, ts, lr=0.4)      # PipeDream's arithmetic, on one process

**Synchronous, with a flush** (GPipe, 1F1B, interleaved, ZB-H1): every step pushes m
micro-batches through the pipeline, lets it drain, and only then updates the weights with
the gradient summed over the m micro-batches. Every forward and backward of a step sees the
same weights, so the gradient is *exactly* the full-batch gradient: the math of training on
one device (:func:`train_dense`), only summed in another order. :func:`train_flush` checks
it. The price is the bubble at each flush.

**Asynchronous** (PipeDream, Narayanan et al. 2019): 1F1B that never flushes. Micro-batches
stream in; each stage updates its weights right after the backward of every micro-batch, so
no rank ever waits for a drain. But on stage s, between the forward of micro-batch i and its
backward, ``p - 1 - s`` other backwards have updated the weights (stage 0 is the stalest;
:func:`train_async` counts it):

- **without weight stashing** the backward of i uses the *current* weights while the saved
  activations came from the old ones: the "gradient" is not the gradient of any function
  (not even a stale one), and training can degrade or diverge;
- **with weight stashing** each stage keeps a copy of the weights its forward of i used and
  runs the backward of i with that copy: the gradient is the exact gradient of the loss at
  those (stale) weights -- checked by :func:`stashed_gradient_error` against a dense forward
  and backward with the same stashed versions. Still stale: the update lands on weights that
  moved since, and stages disagree about *which* version a micro-batch saw (stage 0 older
  than stage p-1), so it is not the same math as single-device SGD.

:func:`train_async_dense` is PipeDream's arithmetic written as one loop on one process (the
version each stage's forward of i used is ``max(0, i - (p - 1 - s))`` updates old); the
distributed run must reproduce it bit for bit.

Memory, counted (:func:`held_bytes`, against :func:`memory_formula`): stage s holds its
weights and gradients, the activations its forwards saved for their backwards (GPipe: m
micro-batches; 1F1B and PipeDream: at most p - s), and, with stashing, one weight copy per
micro-batch in flight (p copies on stage 0). Asynchrony does not save memory; 1F1B's order
does, with or without a flush.

Here ``mod.forward`` saves the weight arrays it used in its ctx (``minipar.nn``): forwarding
with a *copy* of the weights and keeping the ctx *is* the stash; forwarding with the live
arrays, which the optimizer updates in place, is "no stashing".
"""
from __future__ import annotations

import numpy as np

from ..nn import Module, gelu_forward, mse_loss
from ..optim import sgd_step
from ..xp import chunk_bounds, copy, is_torch, nbytes, to_numpy
from .execute import act_tag, grad_tag, dense_step, run_schedule
from .schedules import make_schedule, one_f_one_b

__all__ = ["teacher_data", "forward_loss", "train_dense", "train_async_dense", "train_flush",
           "train_async", "stashed_gradient_error", "held_bytes", "peak_inflight", "memory_formula"]


def teacher_data(n_micro: int, b: int, width: int, seed: int = 0, split: str = "train"):
    """A stream of ``n_micro`` micro-batches (x, target) of a random nonlinear teacher:
    x ~ N(0, 1) of shape (b, width), target = GeLU(x @ A) @ B, scaled to unit variance (A, B ~
    N(0, 1/width)). The teacher depends on ``seed`` only; ``split="test"`` draws held-out
    inputs from another stream. A longer stream starts with the shorter one."""
    rng = np.random.default_rng([seed, 7])
    A, B = (rng.standard_normal((width, width)) / np.sqrt(width) for _ in range(2))
    probe = rng.standard_normal((4096, width))                 # fixes the output scale once
    scale = 1.0 / np.std(gelu_forward(probe @ A)[0] @ B)
    draw = np.random.default_rng([seed, 8, {"train": 0, "test": 1}[split]])
    xs = [draw.standard_normal((b, width)) for _ in range(n_micro)]
    return xs, [scale * (gelu_forward(x @ A)[0] @ B) for x in xs]


def forward_loss(stages, x, target) -> float:
    """The loss of ``stages`` (run in order on one process) on (x, target): no backward."""
    for mod in stages:
        x, _ = mod.forward(x)
    return float(mse_loss(x, target)[0])


def _leaves(mod):
    """Every module inside ``mod`` (itself included); the ones with weights hold ``params``."""
    yield mod
    for child in mod.children().values():
        yield from _leaves(child)


def _weights(mod):
    """The weights of ``mod`` as one dict per module inside it (the form a stash keeps)."""
    return [m.params for m in _leaves(mod)]


def _copy_of(weights):
    return [{k: copy(a) for k, a in d.items()} for d in weights]


def _forward_with(mod, weights, x):
    """``mod.forward(x)`` run with ``weights`` (as from :func:`_weights`) in place of the live
    ones, which are put back afterwards; the ctx keeps the arrays the forward used."""
    leaves, live = list(_leaves(mod)), _weights(mod)
    for m, d in zip(leaves, weights):
        m.params = d
    try:
        return mod.forward(x)
    finally:
        for m, d in zip(leaves, live):
            m.params = d


def _sgd(mod, lr):
    for (_, p), (_, g) in zip(mod.named_parameters(), mod.named_grads()):
        sgd_step(p, g, lr)


def train_dense(stages, xs, ts, m: int, lr: float) -> list[float]:
    """Single-device SGD: every step the full batch of m micro-batches, one update.
    Returns the loss of every step (before its update). With m=1 this is PipeDream's update
    rule (one update per micro-batch) without the staleness."""
    cat = np.concatenate
    losses = []
    for k in range(len(xs) // m):
        for mod in stages:
            mod.zero_grad()
        losses.append(dense_step(stages, cat(xs[k * m:(k + 1) * m]), cat(ts[k * m:(k + 1) * m])))
        for mod in stages:
            _sgd(mod, lr)
    return losses


def train_async_dense(stages, xs, ts, lr: float, stash: bool = True) -> list[float]:
    """PipeDream's arithmetic on one process, one micro-batch after the other, for p =
    len(stages) stages: what :func:`train_async` computes on p ranks.

    In 1F1B, stage s runs the forwards of p - s micro-batches before its first backward,
    then alternates; every backward is followed by an update. So when micro-batch i's forward
    reaches stage s, the backwards of the ``behind = min(i, p - 1 - s)`` micro-batches before
    it have not run yet there: the forward uses the weights of ``behind`` updates ago. With
    ``stash``, the backward of i uses those same weights; without, the saved activations meet
    the current weights (the ctx points at the live arrays, which moved on). Returns the
    loss of every micro-batch (at its forward)."""
    p = len(stages)
    history = [[_copy_of(_weights(mod))] for mod in stages]   # history[s][-1 - k]: k updates ago
    losses = []
    for i in range(len(xs)):
        x, ctxs, used = xs[i], [], []
        for s, mod in enumerate(stages):
            behind = min(i, p - 1 - s)
            used.append(_copy_of(history[s][-1 - behind]))
            x, ctx = _forward_with(mod, used[s], x)
            ctxs.append(ctx)
        value, dy = mse_loss(x, ts[i])
        losses.append(float(value))
        for s in reversed(range(p)):
            mod = stages[s]
            if not stash:              # the arrays in the ctx are the live ones: now at version i
                for d, live in zip(used[s], _weights(mod)):
                    for k in d:
                        d[k][...] = live[k]
            mod.zero_grad()
            dy = mod.backward(dy, ctxs[s])
            _sgd(mod, lr)
            history[s] = (history[s] + [_copy_of(_weights(mod))])[-p:]
    return losses


class _Held(Module):
    """A stage seen through :func:`run_schedule`: forward and backward pass through to it; it
    keeps each ctx from its forward to its backward (the executor holds the same objects for
    the same span) and the peak of :func:`held_bytes`, sampled after every forward."""

    def __init__(self, stage):
        super().__init__()
        self.stage, self.alive, self.peak = stage, {}, None

    def forward(self, x):
        y, ctx = self.stage.forward(x)
        self.alive[id(ctx)] = ctx
        self.peak = _larger(self.peak, held_bytes(self.stage, self.alive.values()))
        return y, ctx

    def backward(self, dy, ctx):
        dx = self.stage.backward(dy, ctx)
        del self.alive[id(ctx)]
        return dx


def train_flush(comm, stage, xs, ts, m: int, lr: float, schedule: str = "1f1b", memory: bool = False):
    """Synchronous pipeline training: per step one ``schedule`` ("1f1b" or "gpipe") over m
    micro-batches (a flush at its end), then every stage applies its summed gradient. ``stage``:
    this rank's module (stage == rank). Returns {"losses": loss per step (on every rank), and
    with ``memory`` "memory": this rank's peak :func:`held_bytes`}."""
    sched = make_schedule(schedule, comm.size, m)
    mod = _Held(stage) if memory else stage
    losses = []
    for k in range(len(xs) // m):
        mod.zero_grad()
        out = run_schedule(comm, sched, {comm.rank: mod}, xs[k * m:(k + 1) * m],
                           ts[k * m:(k + 1) * m], check=(k == 0))
        losses.append(out["loss"])
        _sgd(mod, lr)
    out = {"losses": comm.builtin.bcast_object(losses, root=comm.size - 1)}
    if memory:
        out["memory"] = mod.peak
    return out


def train_async(comm, stage, xs, ts, lr: float, stash: bool = True, record: bool = False,
                memory: bool = False) -> dict:
    """PipeDream: 1F1B over the whole stream (no flush), an SGD update after every backward.

    stash=True: each forward runs on a copy of the weights and the backward reuses it (through
    the ctx). stash=False: forward and backward on the live weights. Each action runs in
    ``comm.region("0F3")`` (its update inside its B), so a traced run gives the bubble.

    Returns {"losses": loss of every micro-batch (at its forward, on every rank), "staleness":
    for each backward on this rank, in order, the updates this stage made between the forward
    of that micro-batch and its backward; with memory=True "memory": this rank's peak
    :func:`held_bytes` (sampled after every forward); with record=True "versions" (the weights
    each micro-batch's forward used on this stage, as NumPy) and "grads" (the gradient applied
    for it)}. Inputs are not scaled: each micro-batch is its own mini-batch.
    """
    p, me, n = comm.size, comm.rank, len(xs)
    sched = one_f_one_b(p, n)              # validated by the tests; its order is the async order
    ctxs, stashes, dys, seen_at, pending = {}, {}, {}, {}, []
    losses, staleness, versions, grads = [], [], {}, {}
    updates, peak = 0, None
    dtype = str(xs[0].dtype).replace("torch.", "")
    for a in sched.actions[me]:
        s, kind, i = a
        if kind == "F":
            x = xs[i] if s == 0 else comm.recv(comm.empty(tuple(xs[i].shape), dtype), s - 1, act_tag(s, i, n))
            with comm.region(str(a)):
                used = _copy_of(_weights(stage)) if stash else _weights(stage)
                y, ctxs[i] = _forward_with(stage, used, x)
                if stash:
                    stashes[i] = used
                seen_at[i] = updates
                if memory:
                    peak = _larger(peak, held_bytes(stage, ctxs.values(), stashes.values()))
                if record:
                    versions[i] = [(name, to_numpy(w).copy()) for name, w in stage.named_parameters()]
                if s == p - 1:
                    value, dys[i] = mse_loss(y, ts[i])
                    losses.append(float(value))
                else:
                    pending.append(comm.isend(y, s + 1, act_tag(s + 1, i, n)))
        else:                                   # B, then this stage's update for micro-batch i
            dy = dys.pop(i) if s == p - 1 else comm.recv(comm.empty(tuple(xs[i].shape), dtype), s + 1,
                                                         grad_tag(s, i, n))
            with comm.region(str(a)):
                stage.zero_grad()
                dx = stage.backward(dy, ctxs.pop(i))
                stashes.pop(i, None)
                if s > 0:
                    pending.append(comm.isend(dx, s - 1, grad_tag(s - 1, i, n)))
                if record:
                    grads[i] = [(name, to_numpy(g).copy()) for name, g in stage.named_grads()]
                _sgd(stage, lr)
                staleness.append(updates - seen_at.pop(i))
                updates += 1
        pending = [req for req in pending if not req.test()]   # a send's buffer lives until it is done
    for req in pending:
        req.wait()
    out = {"losses": comm.builtin.bcast_object(losses, root=p - 1), "staleness": staleness}
    if memory:
        out["memory"] = peak
    if record:
        out.update(versions=versions, grads=grads)
    return out


def stashed_gradient_error(comm, stages_like, rec, xs, ts) -> float:
    """Worst relative error, over every micro-batch and parameter of every stage, between the
    gradient the async run applied and a dense forward + backward of that micro-batch through
    the weight versions its forwards used (gathered from every stage). ``stages_like``: the
    full list of stage modules (any weights: they are overwritten). Collective."""
    everyone = comm.builtin.allgather_object((rec["versions"], rec["grads"]))
    worst = 0.0
    for i in range(len(xs)):
        for s, mod in enumerate(stages_like):
            params = dict(everyone[s][0][i])
            for name, a in mod.named_parameters():
                a[...] = params[name]
            mod.zero_grad()
        dense_step(stages_like, to_numpy(xs[i]), to_numpy(ts[i]))
        for s, mod in enumerate(stages_like):
            got = dict(everyone[s][1][i])
            for name, want in mod.named_grads():
                err = np.max(np.abs(got[name] - want)) / max(np.max(np.abs(want)), 1e-300)
                worst = max(worst, float(err))
    return worst


# ---------------------------------------------------------------- memory: counted and predicted


def _arrays(obj):
    """Every array inside ``obj`` (nested tuples, lists and dicts, as a ctx is)."""
    if isinstance(obj, np.ndarray) or is_torch(obj):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _arrays(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _arrays(o)


def held_bytes(stage, ctxs, stashes=()) -> dict:
    """The bytes one stage holds, counted from its arrays, each array once (by identity):
    "weights" (the live ones), "grads", "stash" (weight copies kept for backwards still to
    come, from ``stashes``: one list of dicts per micro-batch), "activations" (every other array
    the ``ctxs`` keep for their backwards: a ctx also points at the weights its forward used,
    which are counted above, not here) and "total"."""
    seen = set()

    def once(arrays):
        total = 0
        for a in arrays:
            if id(a) not in seen:
                seen.add(id(a))
                total += nbytes(a)
        return total

    out = {"weights": once(a for _, a in stage.named_parameters()),
           "grads": once(g for _, g in stage.named_grads()),
           "stash": once(a for version in stashes for d in version for a in d.values()),
           "activations": once(_arrays(list(ctxs)))}
    out["total"] = sum(out.values())
    return out


def _larger(a, b):
    return b if a is None or b["total"] > a["total"] else a


def peak_inflight(scheme: str, p: int, s: int, m: int) -> int:
    """Micro-batches whose forward ran and backward did not yet, at the peak, on stage s:
    GPipe (all forwards first) m; 1F1B, flushed or not (PipeDream), min(p - s, m)."""
    return m if scheme == "gpipe" else min(p - s, m)


def memory_formula(scheme: str, p: int, s: int, layers: int, width: int, b: int, m: int,
                   itemsize: int = 8) -> dict:
    """The peak bytes stage s of ``build_stages(p, layers, width)`` holds, predicted, in the
    keys of :func:`held_bytes`. scheme: "gpipe" or "1f1b" (flush every m micro-batches),
    "nostash" or "stash" (PipeDream; m = the micro-batches in the stream).

    Per layer: w (width x width) and its bias; a forward of b rows keeps the Linear's input
    (b x width) and, except on the last layer of the model, the GeLU's input and tanh(u)
    (2 b x width), for each micro-batch in flight (:func:`peak_inflight`); stashing keeps one
    weight copy per micro-batch in flight."""
    lo, hi = chunk_bounds(layers, p)[s]
    params = (hi - lo) * (width * width + width) * itemsize
    saved = ((hi - lo) + 2 * (hi - lo - (hi == layers))) * b * width * itemsize
    inflight = peak_inflight(scheme, p, s, m)
    out = {"weights": params, "grads": params, "stash": inflight * params if scheme == "stash" else 0,
           "activations": inflight * saved}
    out["total"] = sum(out.values())
    return out
