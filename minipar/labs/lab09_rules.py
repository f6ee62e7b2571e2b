"""Lab 09's rules beside ``minipar.labs.checks``: no engine, and running the learner's code.

While the learner's code runs (the checks drive torch's autograd through it: the forward, the
backward, autograd's hooks), :class:`EngineCalls` sees the first call into one of the engines
this lab rebuilds, however it was reached, and the task fails in one line naming the call:
torch's DistributedDataParallel, FSDP, DTensor and DeviceMesh, torch.distributed.nn's
differentiable collectives, and minipar's own engines (``minipar.torch``) and answers.
:func:`run_learner` wraps one call in it, with ``checks.graded``'s trace and builtin watch.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from ..comm.watchdog import user_line
from ..trace import SEND_KINDS
from .checks import graded, minipars, no_builtin

INSTEAD = "minipar.collectives (all_reduce, all_gather, reduce_scatter, ring_steps and drain: rings on send/recv)"


def learner_file(fn) -> str | None:
    """The file that defines ``fn`` (a function, or a class through its methods)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        for v in vars(fn).values() if isinstance(fn, type) else ():
            code = getattr(getattr(v, "__func__", v), "__code__", None)
            if code is not None:
                break
    return os.path.abspath(code.co_filename) if code is not None else None


# what the learner's code may not run: (module, what it is); a package stands for every file in it
ENGINES = (
    ("minipar.torch", "minipar's own engine"),
    ("minipar.labs.lab09_solution", "minipar's own answer"),
    ("torch.nn.parallel.distributed", "torch's own DistributedDataParallel"),
    ("torch.distributed.fsdp", "torch's own FSDP"),
    ("torch.distributed._composable", "torch's own FSDP"),
    ("torch.distributed.tensor", "torch's own DTensor"),
    ("torch.distributed.device_mesh", "torch's own DeviceMesh"),
    ("torch.distributed.nn", "torch's own differentiable collectives"),
    ("torch.distributed.optim", "torch's own sharded optimizer"),
)


def _where(module):
    """The file of ``module``, or its folder (ending in os.sep) when it is a package; None if absent."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    origin = os.path.abspath(spec.origin)
    return os.path.dirname(origin) + os.sep if spec.submodule_search_locations else origin


class EngineCalls:
    """While open, the first call into one of :data:`ENGINES` made with the learner's file on the
    stack (``sys.setprofile``, chained to the profile function already set: the grader's own watch
    on the answers goes on). ``refused(function)`` is the task's one-line verdict, or []."""

    def __init__(self, fn):
        self.learner = None if minipars(fn) else learner_file(fn)  # minipar's answer (--solution) is not watched
        self.places = [(w, label) for w, label in ((_where(m), label) for m, label in ENGINES) if w]
        self.seen, self._labels = None, {}

    def _label(self, code):
        path = code.co_filename
        if path not in self._labels:
            full = os.path.abspath(path)
            self._labels[path] = next((label for w, label in self.places
                                       if full == w or (w.endswith(os.sep) and full.startswith(w))), None)
        return self._labels[path]

    def _profile(self, frame, event, arg):
        if self._chain is not None:
            self._chain(frame, event, arg)
        if event != "call" or self.seen is not None or frame.f_code.co_name == "<module>":
            return  # an import running a module's body is not a call into it
        label = self._label(frame.f_code)
        if label is None:
            return
        caller = frame.f_back
        while caller is not None and os.path.abspath(caller.f_code.co_filename) != self.learner:
            if caller.f_code.co_filename.startswith("<frozen importlib"):
                return  # a module being imported runs its class bodies and decorators: not a call into it
            caller = caller.f_back
        if caller is not None:
            name = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"
            self.seen = (label, name, user_line(caller))

    def __enter__(self):
        self._before = sys.getprofile()
        self._chain = self._before if callable(self._before) else None  # a C profiler (cProfile) is not chained
        if self.learner:
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)
        return False

    def refused(self, function):
        if self.seen is None:
            return []
        label, name, line = self.seen
        return [f"{function} ran {label}, {name}" + (f" (called at {line})" if line else "")
                + f": this lab builds it from minipar's collectives: write {function} yourself"]


def run_learner(comm, fn, function, call, memory=None):
    """``graded(comm, call)`` with :class:`EngineCalls` open: (the Graded, failures). A call into
    an engine is the verdict even when the learner's code then raised (an engine used wrongly)."""
    with EngineCalls(fn) as engines:
        try:
            g = graded(comm, call) if memory is None else graded(comm, call, memory)
        except Exception:
            if engines.seen is None:
                raise
            return None, engines.refused(function)
    return g, engines.refused(function) or no_builtin(comm, g, function, INSTEAD)


def sends(events):
    """(start time, bytes) of every non-empty message this rank sent."""
    return [(e.t_start, e.bytes) for e in events if e.kind in SEND_KINDS and e.bytes]
