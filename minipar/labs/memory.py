"""What a learner's call holds: the bytes of the arrays it allocated and still holds, at their
peak, and which arrays those were (where memory is the point of a task, e.g. ZeRO-3's gather on
demand; the rule itself is ``minipar.labs.checks.held_at_most``).

Only array memory counts, on both backends, so one formula holds for both:

* NumPy: NumPy reports every array buffer to ``tracemalloc`` in a domain of its own
  (``numpy.lib.tracemalloc_domain``); the buffers of that domain allocated during the call and
  alive are summed between every two operations of the learner's code (each bytecode) and every
  two lines of minipar's (a ``sys.settrace`` hook; NumPy's and Python's own code runs whole
  between two looks).
* torch: every op's new output storage (a ``TorchDispatchMode`` sees each op; a storage that
  none of the op's inputs holds is new), alive until its storage is freed (``weakref.finalize``
  on the storage), summed at every op.

Python's own objects (the trace's events, caches) are left out: their bytes depend on the hash
seed, on when the cyclic collector runs and on the watchdog's thread, so a count that included
them (``tracemalloc``'s total) changed from run to run. So are the communicator's own buffers
(torch's host staging of a GPU tensor, a contiguous copy made to send): the transport's, not the
learner's. The count is then the same on both backends, and from run to run.

At each new peak, the arrays then alive are written down (:class:`Held`): bytes, dtype, shape,
the name that holds them (a local variable of a running function: ``w`` of ``zero3_forward``)
and where they were made (the learner's line, after minipar's line when minipar made them for it).
"""
from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
import sysconfig
import tracemalloc
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..trace import in_library, shown
from ..xp import is_torch, namespace

FRAMES = 8  # frames tracemalloc keeps per allocation: enough to reach the learner's line
_ENGINES = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                         for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_HERE = os.path.abspath(__file__)
_MINIPAR = os.path.dirname(os.path.dirname(_HERE))
_COMM = os.path.join(_MINIPAR, "comm") + os.sep
_BOOKKEEPING = (_COMM, os.path.join(_MINIPAR, "trace.py"),
                os.path.join(_MINIPAR, "xp.py"))  # no array is kept here: what they make shows in their caller


@functools.cache
def _kind(filename) -> str:
    """"user" (the learner's code), "minipar" (the library, the grader's own code aside) or
    "other" (Python's, NumPy's, torch's, a frozen module)."""
    path = os.path.abspath(filename)
    if filename.startswith("<") or path.startswith(_ENGINES):
        return "other"
    if in_library(path):
        return "other" if os.path.dirname(path) == os.path.dirname(_HERE) and not path.endswith(
            "_solution.py") else "minipar"
    return "user"


@functools.cache
def _bookkeeping(filename) -> bool:
    """minipar's communicator, tracer or array helpers: code that keeps no array of the learner's."""
    return os.path.abspath(filename).startswith(_BOOKKEEPING)


def _line(path, lineno) -> str:
    """``file:line: code`` as a learner reads it."""
    path = os.path.abspath(path)
    return f"{shown(path)}:{lineno}: {linecache.getline(path, lineno).strip()}"


@dataclass
class Held:
    """One array alive at the peak: its buffer's bytes, what it is, who holds it, where it was made."""
    nbytes: int
    what: str = ""  # "float64 (65, 61)"
    name: str = ""  # "w of zero3_forward"
    made: str = ""  # "at exercise.py:9: w = ...", or "in minipar/collectives.py:306, called at exercise.py:9: ..."

    def __str__(self):
        return ", ".join(s for s in (f"{self.nbytes} bytes", self.what, f"held by {self.name}" if self.name else "",
                                     f"made {self.made}" if self.made else "") if s)


def _made(frames) -> str:
    """Where an allocation was made, from its frames (innermost first: (path, line)): the
    learner's line, after the line of the minipar function the learner called when that made it."""
    called = None  # the outermost frame of minipar's below the learner's
    for path, line in frames:
        kind = _kind(path)
        if kind == "user":
            at = _line(path, line)
            return f"in {shown(os.path.abspath(called[0]))}:{called[1]}, called at {at}" if called else f"at {at}"
        if kind == "minipar":
            called = (path, line)
    return f"in {shown(os.path.abspath(called[0]))}:{called[1]}" if called else ""


@functools.lru_cache(maxsize=4096)
def _transport(frames) -> bool:
    """An allocation made by the communicator itself (frames innermost first): a buffer that carries
    a message (torch's host staging of a GPU tensor, a contiguous copy to send), the engine's,
    not the learner's."""
    inner = next((p for p, _ in frames if _kind(p) != "other"), None)
    return inner is not None and os.path.abspath(inner).startswith(_COMM)


def _stack(frame):
    """[(path, line)] of ``frame`` and its callers, innermost first."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def _owner(a):
    """The array that owns ``a``'s memory (NumPy: the end of ``.base``), or None for a non-array."""
    if isinstance(a, np.ndarray):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a
    return None


def _names(frame, key, traced):
    """{key(array): (name, the array)} for the arrays the running functions (the learner's and
    minipar's, its communicator and helpers aside) hold in a local variable (or in a list, tuple
    or dict there, ``shards[2]``), innermost function first.

    Before Python 3.13, reading a function's ``f_locals`` fills a dict on the frame with its
    locals as they are then, and the dict keeps them alive until it is read again: an array the
    function frees afterwards would stay alive in it. traced: read only the frames our trace
    function follows (NumPy), which reads their dicts again at each of their events; else each
    dict read is emptied and let go again (:func:`_forget`)."""
    out = {}
    while frame is not None:
        path = frame.f_code.co_filename
        if _kind(path) != "other" and not _bookkeeping(path) and (frame.f_trace is not None or not traced):
            where = frame.f_code.co_name
            local = frame.f_locals
            for name, value in list(local.items()):
                items = ([(f"{name}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, (list, tuple))
                         else [(f"{name}[{k!r}]", v) for k, v in value.items()] if isinstance(value, dict)
                         else [(name, value)])
                for label, v in items[:64]:
                    k = key(v)
                    if k is not None and k not in out:
                        out[k] = (f"{label} of {where}", v)
            if not traced and frame.f_code.co_flags & inspect.CO_OPTIMIZED and sys.version_info < (3, 13):
                _forget(frame, local)
        frame = frame.f_back
    return out


def _forget(frame, local):
    """Empty ``frame``'s ``f_locals`` dict, just read, and mark it unused (Python < 3.13).

    Python fills a used dict again at the next event of a profile or trace function (the lab
    grader's ``sys.setprofile``) and keeps it after, with the arrays in it; ``PyFrame_LocalsToFast``
    with clear=0 marks it unused, and writes nothing back from an empty dict."""
    import ctypes

    local.clear()
    to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
    to_fast.argtypes, to_fast.restype = [ctypes.py_object, ctypes.c_int], None
    to_fast(frame, 0)


def _describe(a) -> str:
    return f"{str(a.dtype).replace('torch.', '')} {tuple(a.shape)}"


class Memory:
    """Bytes of the arrays allocated during a call and still held, at their peak (``peak``), and
    the arrays alive then (``at_peak``, a list of :class:`Held`, largest first). Hand one to
    :func:`minipar.labs.checks.graded`, which enters it around the learner's call (and sets
    ``torch`` from the communicator's backend); ``paused()`` leaves the grader's own work inside
    the call (a callback the learner calls) out of the peak, while what it returns, and the
    learner keeps, counts from then on."""

    def __init__(self):
        self.peak, self.at_peak, self.active, self.torch = 0, [], False, False

    # ------------------------------------------------------------------ both backends
    def __enter__(self):
        self.peak, self.at_peak, self.active, self._paused = 0, [], True, False
        self._seen = []  # at the peak: [(bytes, name, what, frames innermost first)], written out at the end
        if self.torch:
            self._live, self._held, self._pending = {}, 0, False  # id(storage) -> (bytes, frames where made)
            self._mode = _storage_mode()(self)
            self._mode.__enter__()
        else:
            namespace(np.empty(1))  # array_api_compat imports its NumPy part lazily: not inside the call
            self.own = not tracemalloc.is_tracing()
            if self.own:
                tracemalloc.start(FRAMES)
            self.base = sum(size for size, _ in _numpy_buffers())
            self._last = None
            self._before = sys.gettrace()
            sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        if self.torch:
            self._mode.__exit__(*exc)
        else:
            sys.settrace(self._before)
            self._look(sys._getframe(1))
            if self.own:
                tracemalloc.stop()
        self.active = False
        held = [Held(n, what, name, _made(frames)) for n, name, what, frames in self._seen]
        self.at_peak = sorted(held, key=lambda h: -h.nbytes)

    @contextmanager
    def paused(self):
        if not self.active or self._paused:
            yield
            return
        frame = sys._getframe(2)
        self._look(frame)
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            self._look(frame)

    def _look(self, frame):
        """Count what is held now (torch keeps its count at every op) and write it down if it is a
        new peak."""
        if self.torch:
            self._peak_now(frame)
            return
        buffers = _numpy_buffers()
        held = sum(size for size, _ in buffers) - self.base
        if held > self.peak:
            self.peak, self._seen = held, self._numpy_seen(buffers, frame)

    # ------------------------------------------------------------------ NumPy: tracemalloc's NumPy domain
    def _call(self, frame, event, arg):
        """sys.settrace's hook for a new frame: look after every bytecode of the learner's code
        and every line of minipar's; Python's and NumPy's own functions (and minipar's
        communicator, tracer and array helpers, which keep no array) run whole between two looks."""
        kind = _kind(frame.f_code.co_filename)
        if kind == "other" or _bookkeeping(frame.f_code.co_filename):
            return None
        if kind == "user":
            frame.f_trace_opcodes = True
        return self._step

    def _step(self, frame, event, arg):
        """A look, when tracemalloc's total changed since the last one: every allocation changes it,
        so a look is skipped only where nothing was allocated (or, by chance, exactly as many
        bytes were freed as a new buffer holds)."""
        frame.f_locals  # the frame's dict, if a look read it, follows its variables (see _names)
        if not self._paused:
            now = tracemalloc.get_traced_memory()[0]
            if now != self._last:
                self._look(frame)
                self._last = tracemalloc.get_traced_memory()[0]
        return self._step

    def _numpy_seen(self, buffers, frame):
        """The NumPy buffers as [(bytes, name, what, frames)], each with the array that owns it
        when a running function holds one (matched by its bytes and the lines that made it)."""
        def key(v):
            o = _owner(v)
            tb = tracemalloc.get_object_traceback(o) if o is not None else None
            return (o.nbytes, tuple((f.filename, f.lineno) for f in reversed(tb))) if tb is not None else None

        named = {}
        for k, (name, a) in _names(frame, key, traced=True).items():
            named.setdefault(k, []).append((name, _describe(a)))
        out = []
        for size, frames in buffers:
            name, what = named[(size, frames)].pop(0) if named.get((size, frames)) else ("", "")
            out.append((size, name, what, frames))
        return out

    # ------------------------------------------------------------------ torch: every op's new storages
    def _born(self, out, inputs):
        """Note the storages of ``out`` (an op's result) that no input holds: new, alive until freed."""
        import torch
        from torch.utils._pytree import tree_leaves

        frame = sys._getframe(1)
        if self._pending and not self._paused:
            self._name_peak(frame)  # the arrays of the last peak, now that the code holding them has their names
        had = {id(t.untyped_storage()) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            k, n = id(s), s.nbytes()
            if n == 0 or k in had or k in self._live:
                continue
            frames = _stack(frame)
            if _transport(frames):
                continue
            self._live[k] = (n, frames)
            self._held += n
            self._pending = False
            weakref.finalize(s, self._freed, k)
        if not self._paused:
            self._peak_now(frame)

    def _freed(self, k):
        n, _ = self._live.pop(k, (0, ()))
        self._held -= n
        self._pending = False

    def _peak_now(self, frame):
        """A new peak: write down what is alive, and name it again at the next op (an op's result
        has no name yet: ``out = empty(...)`` is named once ``empty`` has returned)."""
        if self._held > self.peak:
            self.peak = self._held
            self._name_peak(frame)
            self._pending = True
        elif self._pending:
            self._name_peak(frame)

    def _name_peak(self, frame):
        names = _names(frame, lambda v: id(v.untyped_storage()) if is_torch(v) else None, traced=False)
        self._seen = []
        for k, (n, frames) in self._live.items():
            name, a = names.get(k, ("", None))
            self._seen.append((n, name, _describe(a) if a is not None else "", frames))
        self._pending = False


def _numpy_buffers():
    """[(bytes, frames innermost first)] of every NumPy buffer tracemalloc holds now (the
    communicator's own aside: :func:`_transport`).

    ``tracemalloc._get_traces`` is what ``take_snapshot`` reads: its raw (domain, size, frames,
    ...) tuples, filtered here at a tenth of the cost of ``Snapshot.filter_traces``."""
    domain = np.lib.tracemalloc_domain
    return [(t[1], t[2]) for t in tracemalloc._get_traces() if t[0] == domain and not _transport(t[2])]


@functools.cache
def _storage_mode():
    """The ``TorchDispatchMode`` that hands :class:`Memory` every op's result (made on first use:
    importing this module imports no torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Storages(TorchDispatchMode):
        def __init__(self, memory):
            super().__init__()
            self.memory = memory

        @classmethod
        def _should_skip_dynamo(cls):
            """No torch.compile runs under this mode: leave its __torch_dispatch__ as it is (the
            default wraps it in torch._dynamo.disable, whose first call imports torch._dynamo, and
            sympy with it: seconds, on every rank)."""
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            self.memory._born(out, (args, kwargs))
            return out

    return Storages


def alive_at_peak(held, most=6) -> str:
    """The arrays of ``held`` (:class:`Held`, largest first) for a message: the ``most`` largest,
    then how many more and their bytes."""
    if not held:
        return ""
    shown_ = "; ".join(str(h) for h in held[:most])
    rest = held[most:]
    more = f"; and {len(rest)} more ({sum(h.nbytes for h in rest)} bytes)" if rest else ""
    return f"alive at the peak: {shown_}{more}"
