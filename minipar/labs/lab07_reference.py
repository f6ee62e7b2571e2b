"""Lab 07's reference and its watch: the planner answers, and a graded function may not call it.

The planner is the grader's reference, not the learner's tool: :class:`Watch` records every call
into ``minipar.plan``, the pipeline's in-flight counters or the lab's reference solution while a
graded function runs (``sys.setprofile``), and :func:`refused` turns those calls into the message.
The tasks (``lab07``) and the configuration search (``lab07_choose``) both use them.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import numpy as np

_MINIPAR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FORBIDDEN_DIRS = (os.path.join(_MINIPAR, "plan") + os.sep,)
_FORBIDDEN_FILES = {os.path.join(_MINIPAR, "pipeline", "simulate.py"), os.path.join(_MINIPAR, "labs", "lab07_solution.py")}
_FORBIDDEN_FUNCTIONS = {(os.path.join(_MINIPAR, "pipeline", "schedules.py"), "inflight_profile"),
                        (os.path.join(_MINIPAR, "lessons", "planning.py"), "hierarchical_time"),
                        (os.path.join(_MINIPAR, "lessons", "planning.py"), "two_level_predicted")}


def _forbidden(path, name) -> bool:
    return path.startswith(_FORBIDDEN_DIRS) or path in _FORBIDDEN_FILES or (path, name) in _FORBIDDEN_FUNCTIONS


class Watch:
    """Records every call into the planner (and the other answers of this lab) while a graded
    function runs, as (name, called directly from outside minipar); ``paused()`` lets the
    grader's own ``predict`` through."""

    def __init__(self):
        self.calls = []

    def _hook(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not code.co_name.startswith("<") and _forbidden(code.co_filename, code.co_name):
            caller = frame.f_back.f_code.co_filename if frame.f_back else ""
            name = f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"
            self.calls.append((name, not caller.startswith((_MINIPAR + os.sep, "<"))))  # "<string>": generated code

    @contextmanager
    def on(self):
        old = sys.getprofile()
        sys.setprofile(self._hook)
        try:
            yield self
        finally:
            sys.setprofile(old)

    @contextmanager
    def paused(self):
        old = sys.getprofile()
        sys.setprofile(None)
        try:
            yield
        finally:
            sys.setprofile(old)


def is_reference(fn) -> bool:
    """minipar's own answer (``minipar check 07 --solution``) may call the planner: it is the planner."""
    return (getattr(fn, "__module__", None) or "").startswith("minipar.")


def call_watched(fn, *args, watch=None):
    """(fn(*args), [planner functions it called]); minipar's reference runs unwatched."""
    watch = watch or Watch()
    if is_reference(fn):
        return fn(*args), []
    with watch.on():
        out = fn(*args)
    return out, watch.calls


def refused(function, calls, what):
    """A message naming the planner's functions the learner's code called (those it called directly,
    if any; dunders only when nothing else), or []."""
    if not calls:
        return []
    names = [n for n, direct in calls if direct] or [n for n, _ in calls]
    named = list(dict.fromkeys(n for n in names if not n.rsplit(".", 1)[-1].startswith("__"))) or names[:1]
    return [f"{function} called {', '.join(named[:4])}{' ...' if len(named) > 4 else ''}: minipar's own answer (the "
            f"grader's reference) is not a tool for this task; {what}"]


def reference_activation_bytes(s, b, h, a, t, sp, recompute) -> float:
    """The planner's bytes: a Megatron GPT block, 16-bit activations, dropout masks, MLP width 4h."""
    from ..plan import ModelSpec, Problem, preset
    from ..plan.memory import stored_activations

    prob = Problem(ModelSpec(1, h, a, s, 0), 1, 1, preset("a100-80gb"), 1)
    return float(stored_activations(prob, b, t, 1, np.array(sp), np.array(recompute)))
