"""Synchronous (flush) vs asynchronous (PipeDream) pipeline training, side by side.

    from minipar import launch
    out = launch(3, "minipar.lessons.pipeline:train_sync_async", steps=200)
    out.results[0]["sync"], out.results[0]["async"]      # loss per step (m micro-batches)

**Synchronous, with a flush** (GPipe, 1F1B, interleaved, ZB-H1): every step pushes m
micro-batches through the pipeline, lets it drain, and only then updates the weights with
the gradient summed over the m micro-batches. Every forward and backward of a step sees the
same weights, so the gradient is *exactly* the full-batch gradient: the math of training on
one device (:func:`train_dense`), only summed in another order. :func:`train_flush` checks
it. The price is the bubble at each flush.

**Asynchronous** (PipeDream, Narayanan et al. 2019): 1F1B that never flushes. Micro-batches
stream in; each stage updates its weights right after the backward of every micro-batch, so
no rank ever waits for a drain. But on stage s, between the forward of micro-batch i and its
backward, ``p - 1 - s`` other backwards have updated the weights (stage 0 is the stalest):

- **without weight stashing** the backward of i uses the *current* weights while the saved
  activations came from the old ones: the "gradient" is not the gradient of any function
  (not even a stale one), and training can degrade or diverge;
- **with weight stashing** each stage keeps a copy of the weights its forward of i used and
  runs the backward of i with that copy: the gradient is the exact gradient of the loss at
  those (stale) weights -- checked by :func:`stashed_gradient_error` against a dense forward
  and backward with the same stashed versions. Still stale: the update lands on weights that
  moved since, and stages disagree about *which* version a micro-batch saw (stage 0 older
  than stage p-1), so it is not the same math as single-device SGD.

Why production training uses flush schedules: exact gradients (same math as single-device
training, so hyper-parameters, convergence results and debugging carry over), bitwise
reproducible runs that do not depend on pipeline depth, no stale weights, no extra weight
copies (stashing holds up to p versions on stage 0). Asynchronous pipelines trade
convergence for throughput (no bubble); with zero-bubble and interleaved schedules shrinking
the flush's cost, that trade rarely pays.

Here ``mod.forward`` saves the weight arrays it used in its ctx (``minipar.nn``): forwarding
with a *copy* of the weights and keeping the ctx *is* the stash; forwarding with the live
arrays, which the optimizer updates in place, is "no stashing".
"""
from __future__ import annotations

import numpy as np

from ..nn import mse_loss
from ..optim import sgd_step
from ..xp import copy, to_numpy
from .execute import act_tag, grad_tag, reference_step, run_schedule
from .schedules import one_f_one_b

__all__ = ["teacher_data", "train_dense", "train_flush", "train_async", "stashed_gradient_error"]


def teacher_data(n_micro: int, b: int, width: int, seed: int = 0):
    """A stream of ``n_micro`` micro-batches (x, target) of a random linear teacher:
    x ~ N(0, 1) of shape (b, width), target = x @ A with A ~ N(0, 1/width)."""
    rng = np.random.default_rng([seed, 7])
    A = rng.standard_normal((width, width)) / np.sqrt(width)
    xs = [rng.standard_normal((b, width)) for _ in range(n_micro)]
    return xs, [x @ A for x in xs]


def _leaves(mod):
    """Every module inside ``mod`` (itself included); the ones with weights hold ``params``."""
    yield mod
    for child in mod.children().values():
        yield from _leaves(child)


def _sgd(mod, lr):
    for (_, p), (_, g) in zip(mod.named_parameters(), mod.named_grads()):
        sgd_step(p, g, lr)


def train_dense(stages, xs, ts, m: int, lr: float) -> list[float]:
    """Single-device SGD: every step the full batch of m micro-batches, one update.
    Returns the loss of every step (before its update)."""
    cat = np.concatenate
    losses = []
    for k in range(len(xs) // m):
        for mod in stages:
            mod.zero_grad()
        losses.append(reference_step(stages, cat(xs[k * m:(k + 1) * m]), cat(ts[k * m:(k + 1) * m])))
        for mod in stages:
            _sgd(mod, lr)
    return losses


def train_flush(comm, stage, xs, ts, m: int, lr: float) -> list[float]:
    """Synchronous pipeline training: per step one 1F1B schedule over m micro-batches (a
    flush at its end), then every stage applies its summed gradient. ``stage``: this rank's
    module (stage == rank). Returns the loss per step (on every rank)."""
    sched = one_f_one_b(comm.size, m)
    losses = []
    for k in range(len(xs) // m):
        stage.zero_grad()
        out = run_schedule(comm, sched, {comm.rank: stage}, xs[k * m:(k + 1) * m],
                           ts[k * m:(k + 1) * m], check=(k == 0))
        losses.append(out["loss"])
        _sgd(stage, lr)
    return comm.builtin.bcast_object(losses, root=comm.size - 1)


def train_async(comm, stage, xs, ts, lr: float, stash: bool = True, record: bool = False):
    """PipeDream: 1F1B over the whole stream (no flush), an SGD update after every backward.

    stash=True: each forward runs on a copy of the weights and the backward reuses it (through
    the ctx). stash=False: forward and backward on the live weights. Returns {"losses": loss of
    every micro-batch (at its forward, on every rank), and with record=True "versions" (the
    weights each micro-batch's forward used on this stage, as NumPy) and "grads" (the gradient
    applied for it)}. Inputs are not scaled: each micro-batch is its own mini-batch.
    """
    p, me, n = comm.size, comm.rank, len(xs)
    sched = one_f_one_b(p, n)              # validated by the tests; its order is the async order
    ctxs, dys, pending, losses = {}, {}, [], []
    versions, grads = {}, {}
    dtype = str(xs[0].dtype).replace("torch.", "")
    for s, kind, i in sched.actions[me]:
        if kind == "F":
            x = xs[i] if s == 0 else comm.recv(comm.empty(tuple(xs[i].shape), dtype), s - 1, act_tag(s, i, n))
            leaves = list(_leaves(stage))
            live = [m.params for m in leaves]
            used = [{k: copy(a) for k, a in d.items()} for d in live] if stash else live
            for mod, d in zip(leaves, used):  # forward with `used`; its ctx keeps those arrays
                mod.params = d
            y, ctxs[i] = stage.forward(x)
            for mod, d in zip(leaves, live):  # back to the live weights the optimizer updates
                mod.params = d
            if record:
                versions[i] = [(name, to_numpy(a).copy()) for name, a in stage.named_parameters()]
            if s == p - 1:
                value, dys[i] = mse_loss(y, ts[i])
                losses.append(float(value))
            else:
                pending.append(comm.isend(y, s + 1, act_tag(s + 1, i, n)))
        else:                                   # B, then this stage's update for micro-batch i
            dy = dys.pop(i) if s == p - 1 else comm.recv(comm.empty(tuple(xs[i].shape), dtype), s + 1,
                                                         grad_tag(s, i, n))
            stage.zero_grad()
            dx = stage.backward(dy, ctxs.pop(i))
            if s > 0:
                pending.append(comm.isend(dx, s - 1, grad_tag(s - 1, i, n)))
            if record:
                grads[i] = [(name, to_numpy(g).copy()) for name, g in stage.named_grads()]
            _sgd(stage, lr)
    for req in pending:
        req.wait()
    out = {"losses": comm.builtin.bcast_object(losses, root=p - 1)}
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
        reference_step(stages_like, to_numpy(xs[i]), to_numpy(ts[i]))
        for s, mod in enumerate(stages_like):
            got = dict(everyone[s][1][i])
            for name, want in mod.named_grads():
                err = np.max(np.abs(got[name] - want)) / max(np.max(np.abs(want)), 1e-300)
                worst = max(worst, float(err))
    return worst
