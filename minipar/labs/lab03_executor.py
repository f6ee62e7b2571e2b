"""Lab 03, task 3.5 (core): the pipeline executor, written by the learner (the rest of the lab's
checks: ``minipar.labs.lab03``).

The learner's ``pipeline_step(comm, actions, stage, microbatches, loss)`` runs this rank's 1F1B
actions (minipar's schedule, one stage per rank) on real ranks: it receives each activation and
gradient, runs the stage's forward and backward, and sends what the next action elsewhere needs.
The grader hands it

* ``stage``: a small MLP stage of minipar's pipeline lesson (``build_stages``), seen through
  :class:`Stage`, which counts the forward contexts in flight (forward run, backward not yet):
  the activations this rank holds;
* ``loss(y, i)``: on the last stage, micro-batch i's share of the batch loss and its gradient.

and grades the step:

* **messages**: every send and receive is checked as it is *posted* (the communicator's
  primitives are watched on this rank during the call: peer, tag and bytes): exactly the messages
  1F1B's actions make, with the lab's tags (``act_tag``, ``grad_tag``). One that 1F1B does not
  make raises :class:`UnexpectedMessage` at once, on that rank, naming what it is and where it
  should have gone (instead of the hang a wrong peer or tag would cause); afterwards, a message
  never posted, and a send never completed (an ``isend`` not waited for), are named;
* **deadlock**: sends are synchronous on both backends (MPI's ``Ssend``; gloo's send waits for its
  receive as well, small messages included), so an order that can deadlock does, every time, and
  the watchdog's report says what each rank was blocked on;
* **values**: the loss and every gradient of the stage against the dense model on one process
  (float64, only the summation order of the batch differs: relative error <= 1e-12);
* **memory**: the activations held at once, counted from the forward contexts in flight, at most
  1F1B's bound, min(p - s, m) micro-batches on stage s (``memory_formula``, in bytes): running the
  forwards ahead of the schedule (GPipe's order) holds every micro-batch;
* **the learner's own messages**: none made by minipar's executor (``run_schedule``), which the
  grader also refuses to see called.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager

import numpy as np

from ..lessons.common import rel_error
from ..lessons.pipeline import TOLERANCE, _data
from ..nn import mse_loss
from ..pipeline import one_f_one_b
from ..pipeline.asynchronous import held_bytes, memory_formula
from ..pipeline.execute import act_tag, build_stages, grad_tag, reference_step
from ..xp import nbytes, to_numpy
from .checks import Graded, expect_traffic, graded, held_at_most, no_builtin, sent_by_learner, stop
from .memory import Held

LAYERS, WIDTH, ROWS = 8, 16, 3  # the model of minipar's pipeline lesson, and rows per micro-batch
FUNCTION = "pipeline_step"
INSTEAD = "comm.send / isend / recv / irecv"


def cases(p):
    """(p, m) of the steps graded on p ranks: a steady state (m > p), then m < p (a short warm-up)."""
    return list(dict.fromkeys([(p, p + 2), (p, max(1, p - 1))]))


class UnexpectedMessage(RuntimeError):
    """A send or receive that 1F1B's actions on this rank do not make, refused as it is posted."""


# ---------------------------------------------------------------- the stage, seen by the grader

class Saved:
    """What a forward keeps for its backward (the stage's ctx), for one micro-batch."""

    def __init__(self, ctx, microbatch):
        self.ctx, self.microbatch = ctx, microbatch


class Stage:
    """The stage handed to the learner: ``forward(x) -> (y, saved)`` and ``backward(dy, saved) -> dx``
    (gradients accumulate in the stage's weights) of a minipar module, counting the contexts in
    flight and their bytes at the peak. A context is spent by its backward (its arrays let go)."""

    def __init__(self, module, inputs):
        self.module, self.inputs = module, inputs  # inputs: the dense input of each micro-batch (NumPy)
        self.flight, self.peak, self.at_peak = [], 0, []

    def _which(self, x):
        """The micro-batch whose input ``x`` is (None when it is none of them)."""
        a = to_numpy(x)
        return next((i for i, want in enumerate(self.inputs) if a.shape == want.shape
                     and np.allclose(a, want, rtol=1e-9, atol=1e-12)), None)

    def forward(self, x):
        y, ctx = self.module.forward(x)
        saved = Saved(ctx, self._which(x))
        self.flight.append(weakref.ref(saved))
        self.flight = [s for s in self.flight if s() is not None and s().ctx is not None]
        held = [s() for s in self.flight]
        total = held_bytes(self.module, [s.ctx for s in held])["activations"]
        if total > self.peak:
            self.peak = total
            self.at_peak = [Held(held_bytes(self.module, [s.ctx])["activations"],
                                 f"the forward context of micro-batch {'?' if s.microbatch is None else s.microbatch}")
                            for s in held]
        return y, saved

    def backward(self, dy, saved):
        if not isinstance(saved, Saved):
            raise TypeError(f"stage.backward(dy, saved): saved must be what stage.forward returned beside y, got "
                            f"{type(saved).__name__}")
        if saved.ctx is None:
            raise ValueError(f"stage.backward: the context of micro-batch {saved.microbatch} was already spent by its "
                             f"backward: each micro-batch runs one backward")
        dx = self.module.backward(dy, saved.ctx)
        saved.ctx = None  # spent: its activations are let go
        return dx


# ---------------------------------------------------------------- the messages, checked as they are posted

def tag_meaning(tag, m, S):
    """What the lab's tag ``tag`` names in a step of m micro-batches over S stages."""
    k, i = divmod(tag // 2, m) if m else (0, 0)
    if tag >= 0 and tag % 2 == 0 and 0 < k < S:
        return f"the activation going into stage {k} for micro-batch {i} (act_tag({k}, {i}, m={m}))"
    if tag >= 0 and tag % 2 == 1 and 0 <= k < S - 1:
        return f"the gradient coming back into stage {k} for micro-batch {i} (grad_tag({k}, {i}, m={m}))"
    return "no message of this step (act_tag and grad_tag name each one)"


def due_messages(actions, m, S):
    """[(kind, peer, tag)] that ``actions`` (one stage per rank) post, in their order."""
    out = []
    for s, kind, i in actions:
        if kind == "F":
            out += [("recv", s - 1, act_tag(s, i, m))] if s > 0 else []
            out += [("send", s + 1, act_tag(s + 1, i, m))] if s < S - 1 else []
        elif kind == "B":
            out += [("recv", s + 1, grad_tag(s, i, m))] if s < S - 1 else []
            out += [("send", s - 1, grad_tag(s - 1, i, m))] if s > 0 else []
    return out


def _said(kind, peer, tag, n=None):
    return f"{'a send to' if kind == 'send' else 'a receive from'} rank {peer} with tag {tag}" + (
        f" ({n} bytes)" if n is not None else "")


class Messages:
    """The messages this rank must post in the step, checked as each one is (:meth:`post`)."""

    def __init__(self, comm, actions, m, S, size):
        self.r, self.m, self.S, self.size = comm.rank, m, S, size  # size: the bytes of every message
        self.due = due_messages(actions, m, S)
        self.left, self.posted, self.sends = list(self.due), [], 0

    def post(self, kind, peer, tag, n):
        key = (kind, peer, tag)
        self.posted.append((kind, peer, tag, n))
        self.sends += kind == "send"
        r, meaning = self.r, tag_meaning(tag, self.m, self.S)
        if key in self.left:
            if n != self.size:
                raise UnexpectedMessage(f"rank {r} posted {_said(kind, peer, tag, n)}: {meaning} is {self.size} "
                                        f"bytes, the shape and dtype of a micro-batch")
            self.left.remove(key)
            return
        if key in self.due:
            raise UnexpectedMessage(f"rank {r} posted {_said(kind, peer, tag)} a second time: {meaning} travels once "
                                    f"in the step")
        right = [d for d in self.due if d[0] == kind and d[2] == tag]
        if right:
            way = "goes to" if kind == "send" else "comes from"
            raise UnexpectedMessage(f"rank {r} posted {_said(kind, peer, tag)}: that tag is {meaning}, which {way} "
                                    f"rank {right[0][1]} (stage {right[0][1]} lives there), not rank {peer}")
        still = ", ".join(_said(*d) for d in self.left[:3]) or "nothing"
        raise UnexpectedMessage(f"rank {r} posted {_said(kind, peer, tag)}, {meaning}: no action of rank {r}'s 1F1B "
                                f"{'sends' if kind == 'send' else 'receives'} it. Still due on rank {r}, in the order "
                                f"of its actions: {still}")

    def missing(self):
        if not self.left:
            return []
        kind, peer, tag = self.left[0]
        return [f"rank {self.r} never posted {_said(kind, peer, tag)}, {tag_meaning(tag, self.m, self.S)}"
                + (f" (and {len(self.left) - 1} more of its 1F1B messages)" if len(self.left) > 1 else "")]


@contextmanager
def watched_messages(comm, messages: Messages):
    """Hand every send and receive this rank posts through ``comm``'s primitives to
    ``messages.post`` (peer, tag, bytes) before it goes out; the primitives run as before (their
    frames are gone before the trace records who made the call)."""
    names = ("_send", "_isend", "_recv", "_irecv", "_sendrecv")
    mine = {n: comm.__dict__[n] for n in names if n in comm.__dict__}  # an emulated link wraps them too
    inside = [0]  # a backend's sendrecv may post through its own isend and irecv: counted once

    def wrap(name, primitive):
        def posted(*args):
            if not inside[0]:
                if name == "_sendrecv":
                    x, dst, buf, src, sendtag, recvtag = args
                    messages.post("send", dst, sendtag, nbytes(x))
                    messages.post("recv", src, recvtag, nbytes(buf))
                else:
                    a, peer, tag = args
                    messages.post("send" if "send" in name else "recv", peer, tag, nbytes(a))
            inside[0] += 1
            try:
                return primitive(*args)
            finally:
                inside[0] -= 1
        return posted

    for n in names:
        setattr(comm, n, wrap(n, getattr(comm, n)))
    try:
        yield
    finally:
        for n in names:
            if n in mine:
                setattr(comm, n, mine[n])
            else:
                delattr(comm, n)


# ---------------------------------------------------------------- one graded step

def step(comm, fn, p, m):
    """One 1F1B step of the learner's ``fn`` on these ranks: (what graded saw, the Stage, the
    Messages, the loss the last rank returned, this rank's module, the dense reference stages,
    the dense loss)."""
    S, r = p, comm.rank
    x, t = _data(comm, m, ROWS, WIDTH, seed=5)
    like = comm.asarray(np.zeros(1))  # the backend's kind: NumPy arrays, or torch tensors
    module = build_stages(S, LAYERS, WIDTH, np.random.default_rng([5, 0]))[r].to(like)
    ref = build_stages(S, LAYERS, WIDTH, np.random.default_rng([5, 0]))
    inputs = [x[i * ROWS:(i + 1) * ROWS] for i in range(m)]
    for k in range(r):  # the dense input of this stage, per micro-batch
        inputs = [ref[k].forward(a)[0] for a in inputs]
    ref = build_stages(S, LAYERS, WIDTH, np.random.default_rng([5, 0]))
    ref_loss = reference_step(ref, x, t)
    stage = Stage(module, inputs)
    xs = [comm.asarray(x[i * ROWS:(i + 1) * ROWS]) for i in range(m)]
    ts = [comm.asarray(t[i * ROWS:(i + 1) * ROWS]) for i in range(m)]
    seen = []

    def loss(y, i):
        """Micro-batch i's share of the batch loss (the mean over the batch) and its gradient by y."""
        seen.append(i)
        value, dy = mse_loss(y, ts[i])
        return float(value) / m, dy / m

    actions = one_f_one_b(p, m).actions[r]
    messages = Messages(comm, actions, m, S, nbytes(xs[0]))
    with watched_messages(comm, messages):
        g = graded(comm, lambda: fn(comm, list(actions), stage, xs, loss))
    return g, stage, messages, seen, module, ref, ref_loss


def check_executor(comm, fn):
    p, r = comm.size, comm.rank
    for _, m in cases(p):
        g, stage, messages, seen, module, ref, ref_loss = step(comm, fn, p, m)
        case = f"1F1B p={p} m={m}"
        fails = no_builtin(comm, g, FUNCTION, INSTEAD) or messages.missing()
        if not fails and r == p - 1:
            if sorted(seen) != list(range(m)):
                fails = [f"rank {r} (the last stage) called loss(y, i) for micro-batches {seen}; each of the {m} once, "
                         f"after its forward ({case})"]
            elif g.out is None or not rel_error(np.float64(g.out), np.float64(ref_loss)) <= TOLERANCE:
                fails = [f"rank {r} (the last stage) returned the loss {g.out}, expected {ref_loss}: the sum of what "
                         f"loss(y, i) gave for the {m} micro-batches, the dense model's ({case})"]
        if not fails:
            want = dict(ref[r].named_grads())
            for name, grad in module.named_grads():
                e = rel_error(grad, want[name])
                if not e <= TOLERANCE:
                    fails = [f"rank {r}, stage {r} gradient {name}: relative error {e:.3g} against the dense model "
                             f"(tolerance {TOLERANCE:g}; {case})"]
                    break
        if not fails:
            bound = min(p - r, m)
            limit = memory_formula("1f1b", p, r, LAYERS, WIDTH, ROWS, m)["activations"]
            fails = held_at_most(comm, Graded(g.out, g.events, peak=stage.peak, at_peak=stage.at_peak), limit, FUNCTION,
                                 f"1F1B runs each backward where its actions put it, so stage {r} holds the "
                                 f"activations of min(p - s, m) = {bound} micro-batch{'es' if bound > 1 else ''} at "
                                 f"most ({case})")
        if not fails:
            done = sum(1 for e in g.events if e.kind in ("send", "isend", "sendrecv"))
            if done < messages.sends:
                fails = [f"rank {r} returned with {messages.sends - done} of its {messages.sends} sends not completed "
                         f"(an isend never waited for): wait for every request before returning; until then its "
                         f"array must stay as it is ({case})"]
        if not fails:
            fails = expect_traffic(comm, g, f"1F1B's messages ({case})", messages.sends * messages.size,
                                   messages.sends)
        fails = fails or sent_by_learner(comm, g, fn, FUNCTION, INSTEAD)
        if stop(comm, fails):  # every rank stops at the same case
            return fails
    return []
