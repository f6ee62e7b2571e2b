"""The grading rules every lab shares: a check passes only work that uses the technique.

A lab's check runs the learner's function inside :func:`graded`, which watches the call, then
turns what it saw into failure messages that name the broken rule, the rank and the numbers:

* **values**      :func:`compare` (first differing element; NaN from a poisoned shard says so)
* **no builtin**  :func:`no_builtin`: ``comm.builtin`` (the engine's own collectives and object
  transport) is recorded during the call and refused; the check's own reference may use it
  outside the call.
* **traffic**     :func:`expect_traffic`: the bytes and messages this rank sent through ``comm``
  (from the trace), exactly what the technique sends (:func:`ring_traffic` for the ring). A
  solution that talks outside ``comm`` (mpi4py's ``Allreduce``, ``torch.distributed``) sends
  nothing through it, and the message says so.
* **own data**    :func:`poisoned` hands a rank the parts it does not own as NaN, so using them
  shows in the result; :func:`watched` arrays record every computation that touches more of
  the array than the rank owns (a local product cannot show poison: the full product sliced
  afterwards is right).
* **memory**      ``graded(..., memory=Memory())`` counts the bytes of the arrays allocated and
  still held at the peak of the call (NumPy's buffers through ``tracemalloc``, torch's storages
  through a dispatch mode: ``minipar.labs.memory``); :func:`held_at_most` compares them with the
  formula and names the arrays alive at the peak, with the lines that made them.
* **the learner's own messages**  :func:`sent_by_learner`: the trace records who made each send
  and receive (``Event.origin``); every one must come from the learner's code, directly or
  through what the task lets them call (``minipar.collectives``), never from minipar's own
  implementation of the technique (a broadcast that returns ``minipar.collectives.broadcast``
  sends the right messages, but the learner wrote none of them).
* **the learner's own code**  :class:`Answers`: while the learner's function runs, a call into
  minipar's answer to the task (the solution module's function for it, or a function such as
  ``minipar.pipeline.schedules.gpipe``) is seen however it was reached (an import under another
  name, an import inside the function); the grader refuses a task that ran one.

Checks run on every rank and often call collectives, so a rank that has failed must not leave
the loop alone: :func:`stop` makes all ranks leave together.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..comm.watchdog import user_line
from ..trace import SEND_KINDS, in_library, shown
from ..xp import chunk_bounds, is_torch, namespace, to_numpy
from .memory import Memory, alive_at_peak


# --------------------------------------------------------------------------- values

def compare(comm, got, want, what, case, tol=1e-12, offset=0, owns=None):
    """Failure messages for the first differing element (empty list when equal).

    owns: what this rank was handed un-poisoned (e.g. "columns 0:12 of w"); a NaN where the
    answer is a number is then reported as computing with another rank's data.
    """
    if got is None:
        return [f"rank {comm.rank} returned None for {what} ({case})"]
    g, w = to_numpy(got), to_numpy(want)
    if g.shape != w.shape:
        return [f"rank {comm.rank}: {what} has shape {g.shape}, expected {w.shape} ({case})"]
    bad = np.flatnonzero(~np.isclose(g.ravel(), w.ravel(), rtol=tol, atol=tol))
    if bad.size == 0:
        return []
    i = int(bad[0])
    at = f"element {i}" + (f" (global index {offset + i})" if offset else "")
    nan = np.isnan(g.ravel()).sum()
    if np.isnan(g.ravel()[i]) and not np.isnan(w.ravel()[i]):
        held = f"it holds only {owns}; " if owns else ""
        return [f"rank {comm.rank}: {what} is NaN at {at} ({nan} of {w.size} elements NaN): rank {comm.rank} "
                f"computed with data it does not own ({held}the grader hands every rank the other ranks' "
                f"shards as NaN) ({case})"]
    return [f"rank {comm.rank}: {what}, {at}: expected {w.ravel()[i]:.6g}, got {g.ravel()[i]:.6g} ({case}; "
            f"{bad.size} of {w.size} elements wrong)"]


def ranks(n) -> str:
    """"1 rank", "3 ranks": how many ranks a message speaks of."""
    return f"{n} rank{'s' if n != 1 else ''}"


def stop(comm, fails) -> bool:
    """True on every rank once any rank has failed: all ranks leave the loop together, so no
    rank is left waiting in the next case's collective."""
    return any(comm.builtin.allgather_object(bool(fails)))


# --------------------------------------------------------------------------- watching a call

@dataclass
class Graded:
    """What :func:`graded` saw of one call on this rank."""
    out: object
    events: list  # this rank's trace events during the call
    builtin: list = field(default_factory=list)  # names of comm.builtin methods called
    peak: int | None = None  # bytes of arrays allocated and held at the peak (with a Memory)
    at_peak: list = field(default_factory=list)  # the arrays alive then (minipar.labs.memory.Held)


@contextmanager
def _record_builtin(comm, log):
    """Record every call of a ``comm.builtin`` method (on this comm and any comm split from it:
    the methods are wrapped on the class) while the block runs; the calls still run, so no rank
    is left waiting."""
    cls = type(comm.builtin)
    names = [n for n in vars(cls) if not n.startswith("_") and callable(vars(cls)[n])]
    saved = {n: vars(cls)[n] for n in names}

    depth = [0]  # a builtin may call another (torch's reduce_scatter is its all_reduce): the outer one was called

    def wrap(name, method):
        def recorded(self, *args, **kwargs):
            if not depth[0]:
                log.append(name)
            depth[0] += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return recorded

    for n in names:
        setattr(cls, n, wrap(n, saved[n]))
    try:
        yield
    finally:
        for n, method in saved.items():
            setattr(cls, n, method)


def graded(comm, call, memory: Memory | None = None) -> Graded:
    """Run the learner's ``call()`` traced (each message with its origin), with ``comm.builtin``
    recorded, and (given a :class:`Memory`) its held bytes counted. The trace is on only during
    the call."""
    log = []
    comm.tracer.enabled = comm.tracer.origins = True
    comm.tracer.clear()
    try:
        with _record_builtin(comm, log):
            if memory is not None:
                memory.torch = comm.backend == "torch"  # torch's storages, or NumPy's buffers
                with memory:
                    out = call()
            else:
                out = call()
    finally:
        comm.tracer.enabled = comm.tracer.origins = False
    return Graded(out, list(comm.tracer.events), log, memory.peak if memory is not None else None,
                  memory.at_peak if memory is not None else [])


def traced(comm, call):
    """(call(), the trace events it recorded on this rank)."""
    g = graded(comm, call)
    return g.out, g.events


# --------------------------------------------------------------------------- the rules

def no_builtin(comm, g: Graded, function, instead):
    """The engine's own collectives are the grader's reference, never the learner's tool."""
    if not g.builtin:
        return []
    used = ", ".join(dict.fromkeys(f"comm.builtin.{n}" for n in g.builtin))
    return [f"rank {comm.rank} called {used} inside {function}: comm.builtin is the engine's own "
            f"collective (the grader's reference), off limits in a lab; use {instead}"]


def sent(comm, events):
    """(bytes, non-empty messages, peers as ranks of comm) this rank sent through ``comm``."""
    world = {comm.world_rank(r): r for r in range(comm.size)}
    msgs = [e for e in events if e.kind in SEND_KINDS]
    return (sum(e.bytes for e in msgs), sum(1 for e in msgs if e.bytes),
            sorted({world.get(e.peer, e.peer) for e in msgs if e.bytes}))


def ran(events) -> str:
    """The collectives of minipar the trace shows, e.g. 'all_gather:ring x2', for messages."""
    names = [e.name for e in events if e.kind == "collective"]
    if not names:
        return "no minipar collective, point-to-point messages only" if any(
            e.kind in SEND_KINDS for e in events) else "no message at all"
    return ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names))


def expect_traffic(comm, g: Graded, technique, nbytes, messages=None, to=None, hint=""):
    """Exactly ``nbytes`` (and ``messages`` non-empty messages, only to ranks ``to``) sent by
    this rank through ``comm`` during the call, as ``technique`` sends them."""
    b, n, peers = sent(comm, g.events)
    r, p = comm.rank, comm.size
    seen = f" (the trace shows {ran(g.events)})"
    if b == 0 and nbytes > 0:
        return [f"rank {r} sent 0 bytes through comm; {technique} on {ranks(p)} sends {nbytes}: did you use a "
                f"builtin collective (mpi4py's own, torch.distributed) instead of comm / minipar.collectives?"]
    if b != nbytes:
        return [f"rank {r} sent {b} bytes through comm; {technique} on {ranks(p)} sends exactly {nbytes}{seen}"
                + (f": {hint}" if hint else "")]
    if messages is not None and n != messages:
        return [f"rank {r} sent {n} messages; {technique} on {ranks(p)} sends exactly {messages}{seen}"
                + (f": {hint}" if hint else "")]
    if to is not None and not set(peers) <= set(to):
        return [f"rank {r} sent to ranks {peers}; {technique} sends only to rank{'s' if len(to) > 1 else ''} "
                f"{', '.join(map(str, sorted(to)))}"]
    return []


def ring_traffic(counts, rank, itemsize, phases=("reduce-scatter", "all-gather")):
    """(bytes, non-empty messages) rank ``rank`` sends in minipar's ring over chunks of
    ``counts`` elements: reduce-scatter sends every chunk but its own, all-gather every chunk
    but its right neighbour's (see ``minipar.collectives.ring_steps``)."""
    p = len(counts)
    skip = {"reduce-scatter": rank, "all-gather": (rank + 1) % p}
    out = [c for ph in phases for k, c in enumerate(counts) if k != skip[ph] and p > 1]
    return sum(out) * itemsize, sum(1 for c in out if c)


def chunk_counts(n, p):
    """Elements per rank under ``chunk_bounds(n, p)``."""
    return [b - a for a, b in chunk_bounds(n, p)]


_LABS = os.path.dirname(os.path.abspath(__file__))  # minipar/labs: the grader's own code and the answers


def minipars(fn) -> bool:
    """``fn`` is minipar's own (its reference answer, graded by ``minipar check --solution``)."""
    module = getattr(fn, "__module__", None) or ""
    return module == "minipar" or module.startswith("minipar.")


def _graders(path) -> bool:
    """``path`` is the grader's own code (a check module, whose callbacks the learner calls)."""
    return os.path.dirname(path) == _LABS and not path.endswith("_solution.py")


COLLECTIVES = ("minipar.collectives",)  # what a learner's messages go through, where a lab allows it


def sent_by_learner(comm, g: Graded, fn, function, instead, through=()):
    """Every send and receive of the call was made by the learner's code (any file outside the
    minipar library), directly or through the modules ``through`` names (what the task lets
    the learner call, e.g. ``("minipar.collectives",)``): never by minipar's own implementation
    of what the task teaches. A message made inside a callback the grader handed the learner
    (the pipeline in a training step) is the grader's. minipar's answer graded as the reference
    (``--solution``) is minipar's by design and passes."""
    if minipars(fn):
        return []
    allowed = {os.path.abspath(importlib.import_module(m).__file__) for m in through}
    for e in g.events:
        if not e.origin or not e.bytes or e.kind not in SEND_KINDS + ("recv", "irecv"):
            continue
        chain = [f for f in e.origin if f[0] not in allowed]
        inside = [f for f in chain if in_library(f[0])]
        if not inside or not in_library(chain[0][0]) or any(_graders(f[0]) for f in inside):
            continue
        path, line, name = chain[0]
        user = chain[-1] if not in_library(chain[-1][0]) else None
        way = "to" if e.kind in SEND_KINDS else "from"
        peer = {comm.world_rank(r): r for r in range(comm.size)}.get(e.peer, e.peer)
        return [f"rank {comm.rank}'s {e.kind} {way} rank {peer} ({e.bytes} bytes) was made by minipar's own code, "
                f"{shown(path)}:{line} in {name}()"
                + (f", called at {shown(user[0])}:{user[1]}" if user else "")
                + f": write {function}'s messages yourself, with {instead}"]
    return []


def held_at_most(comm, g: Graded, limit, function, rule):
    """The bytes of arrays held at the call's peak, at most ``limit`` (the formula, said in
    ``rule``); over it, the message lists the arrays alive at the peak and where each was made."""
    if g.peak is None or g.peak <= limit:
        return []
    alive = alive_at_peak(g.at_peak)
    return [f"rank {comm.rank} held {g.peak} bytes at once inside {function}; {rule}: at most {limit}"
            + (f". {alive[0].upper()}{alive[1:]}" if alive else "")]


# --------------------------------------------------------------------------- own data

def poisoned(a, keep):
    """A copy of ``a`` (a NumPy array or a torch tensor) with NaN everywhere except ``a[keep]``
    (what this rank owns)."""
    out = namespace(a).full_like(a, np.nan)
    out[keep] = a[keep]
    return out


_COMPUTE = {"dot", "vdot", "inner", "outer", "tensordot", "einsum", "matmul", "kron", "multi_dot"}


class Watched(np.ndarray):
    """An array (and every view of it) that records the most elements of it one computation
    used: a ufunc (``@``, ``+``, ``np.tanh``, a sum) or a product (``np.dot``, ``einsum``).
    Slicing, reshaping and copying a slice are not computations."""

    def __array_finalize__(self, obj):
        self.log = getattr(obj, "log", None)

    def _use(self, args):
        for a in args:
            if isinstance(a, Watched) and a.log is not None:
                a.log.append(a.size)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        self._use(inputs)
        plain = [a.view(np.ndarray) if isinstance(a, Watched) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Watched) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ not in _COMPUTE:
            return super().__array_function__(func, types, args, kwargs)
        self._use(args)
        return func(*(a.view(np.ndarray) if isinstance(a, Watched) else a for a in args), **kwargs)


def watched(a):
    """A :class:`Watched` copy of ``a`` (of a torch tensor: a :func:`watched_tensor` copy): hand it
    to the learner, read ``.log`` afterwards."""
    if is_torch(a):
        return watched_tensor(a)
    w = np.array(a).view(Watched)
    w.log = []
    return w


# What a torch tensor does without computing: indexing, views, copies, moves. Everything else that
# returns a tensor (``@``, ``+``, ``torch.tanh``, a sum, ``torch.einsum``) is a computation.
_PLACING = {"__getitem__", "__setitem__", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten",
            "squeeze", "unsqueeze", "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis", "t",
            "T", "mT", "H", "mH", "narrow", "select", "split", "chunk", "unbind", "expand", "expand_as",
            "as_strided", "contiguous", "clone", "detach", "to", "cpu", "cuda", "copy_"}


def _torch_op(func) -> str:
    """The name of what ``__torch_function__`` was handed: ``Tensor.T`` comes as its getter."""
    name = getattr(func, "__name__", "")
    return getattr(getattr(func, "__self__", None), "__name__", name) if name == "__get__" else name


def _items(*values):
    """The values, with each tuple or list among them opened one level (a function's tensors)."""
    return [t for v in values for t in (v if isinstance(v, (tuple, list)) else (v,))]


@functools.cache
def _watched_tensor_class():
    """:class:`Watched` for torch tensors: a ``torch.Tensor`` subclass whose ``__torch_function__``
    records, for every computation (a torch function or method returning a tensor, other than
    those of ``_PLACING``), the size of each watched tensor it read. Views and copies of a watched
    tensor share its log; what a computation returns is a plain tensor. Made on first use:
    importing this module imports no torch."""
    import torch
    from torch._C import DisableTorchFunctionSubclass

    class WatchedTensor(torch.Tensor):
        log = None

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            with DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
                if _torch_op(func) in _PLACING:  # a view or a copy of args[0]: watched as it is
                    return cls._as(args[0], out) if args else out
                if any(isinstance(o, torch.Tensor) for o in _items(out)):
                    for t in _items(*args, *kwargs.values()):
                        if isinstance(t, cls) and t.log is not None:
                            t.log.append(t.numel())
            return out

        @classmethod
        def _as(cls, src, out):
            """``out`` (a tensor, or a tuple or list of them) writing into the log of ``src``, when
            ``src`` is watched."""
            if not isinstance(src, cls):
                return out
            if isinstance(out, (tuple, list)):
                return type(out)(cls._as(src, o) for o in out)
            if not isinstance(out, torch.Tensor):
                return out
            w = out if isinstance(out, cls) else out.as_subclass(cls)
            w.log = src.log
            return w

    return WatchedTensor


def watched_tensor(t):
    """A watched copy of torch tensor ``t``, on its device: as with :class:`Watched`, its ``.log``
    lists how many of its elements each computation read (:func:`used_only_own` takes the most)."""
    w = t.detach().clone().as_subclass(_watched_tensor_class())
    w.log = []
    return w


def used_only_own(comm, arrays, function):
    """No computation touched more of an array than this rank owns.

    arrays: {name: (watched array, elements this rank owns, "what it owns")}."""
    for name, (w, own, where) in arrays.items():
        most = max(w.log, default=0)
        if comm.size > 1 and most > own:
            return [f"rank {comm.rank} computed with {most} elements of {name} at once inside {function}; it "
                    f"owns {where} ({own} elements): compute with your shard only, not the whole {name} "
                    f"(slice first, then multiply)"]
    return []


# --------------------------------------------------------------------------- minipar's answers

class Answers:
    """minipar's answers to one task, watched while a check runs the learner's function.

    ``names``: "package.module:function", e.g. ``minipar.pipeline.schedules:gpipe`` or the lab's
    solution module's function for the task, ``minipar.labs.lab03_solution:gpipe``; each is
    found by its file and name, without importing anything. ``learner``: the learner's file (None:
    nothing is watched). Inside ``with answers:`` a profiler (``sys.setprofile``) sees every call
    into these functions, however the learner reached them (``from minipar.pipeline import
    schedules as S``, an import inside the function), and keeps the first made while a function
    of the learner's file is on the stack (the check's own calls of the reference are not the
    learner's); :meth:`refused` turns it into the verdict."""

    def __init__(self, names, learner):
        self.learner, self.log, self._paths, self.watched = learner, [], {}, {}
        for name in names:
            module, _, function = name.partition(":")
            path = os.path.abspath(importlib.util.find_spec(module).origin)
            self.watched[(path, function.rsplit(".", 1)[-1])] = f"{module}.{function}"
        self.names = {function for _, function in self.watched}

    def _path(self, code):
        name = code.co_filename
        return self._paths.get(name) or self._paths.setdefault(name, os.path.abspath(name))

    def _seen(self, frame, event, arg):
        if event != "call" or self.log or frame.f_code.co_name not in self.names:
            return
        what = self.watched.get((self._path(frame.f_code), frame.f_code.co_name))
        if what is None:
            return
        caller = frame.f_back
        while caller is not None and self._path(caller.f_code) != self.learner:
            caller = caller.f_back
        if caller is not None:
            self.log.append((what, user_line(frame.f_back)))

    def __enter__(self):
        self._before = sys.getprofile()
        if self.learner and self.watched:
            sys.setprofile(self._seen)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)

    def refused(self, function):
        """The failure when the learner's function ran one of minipar's answers (the first seen)."""
        if not self.log:
            return []
        what, line = self.log[0]
        return [f"{function} ran minipar's own {what}" + (f" (called at {line})" if line else "")
                + f": write {function} yourself"]


# --------------------------------------------------------------------------- the exercises' demos

def draw(*shape, seed=0):
    """The same random array on every rank (seeded by the shape)."""
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


def attempt(call, invalid=None):
    """What a demo shows for one call of the learner's function: (its result, None), or (None,
    why): "not implemented yet (...)" while it raises NotImplementedError, or, for an exception
    of a type in ``invalid`` ({type: "not a valid schedule"}), that label and the error."""
    try:
        return call(), None
    except NotImplementedError as err:
        return None, f"not implemented yet ({err})"
    except tuple(invalid or ()) as err:
        label = next(label for kind, label in invalid.items() if isinstance(err, kind))
        return None, f"{label}:\n{err}"
