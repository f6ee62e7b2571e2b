"""Tracing: what every rank did, when, and how many bytes it moved.

Every communication call of a :class:`~minipar.comm.Comm` and every named compute region
can record one event::

    Event(rank, kind, name, t_start, t_end, bytes, peer)

``rank`` and ``peer`` are *world* ranks (also inside sub-communicators), times are seconds
on the rank's own monotonic clock, ``bytes`` counts what this rank sent (for ``recv``: what it
received). When the tracer knows the ranks per node (``tracer.ranks_per_node``: ranks in blocks,
rank w on node w // R), each point-to-point event's ``link`` says whether its peer is on this
rank's node ("intra") or another ("inter"); :func:`link_bytes` sums them. The same events drive the pipeline timelines, the measured bubble, the
communication-volume tables and a Chrome trace that opens in https://ui.perfetto.dev.

Tracing off costs one attribute test per call: ``if tracer.enabled``. With ``tracer.origins``
also on (the lab grader turns it on around a learner's call), each point-to-point event also
records who made the call, its :func:`origin`: the frames from the code that called the
communicator out to the user's own line, so a message can be attributed to the code that sent it.

    comm.tracer.enabled = True
    with comm.region("forward"):          # a compute region
        y = x @ w
    events = merge(comm)                  # on every rank: all ranks' events, clocks aligned
    write_chrome_trace("trace.json", events)

Buffers, the arrays that carry partial results between ranks, are named where they are
allocated (:func:`buffer`) and counted per rank (:class:`Buffers`); while tracing, each one's
lifetime is a ``buffer`` event from its allocation to its free, on a lane of its own.
"""
from __future__ import annotations

import json
import os
import sys
import time
import weakref
from collections import defaultdict
from typing import NamedTuple

SEND_KINDS = ("send", "isend", "sendrecv")
_HERE = os.path.abspath(__file__)
_LIBRARY = os.path.dirname(_HERE)  # .../minipar
_COMM = os.path.join(_LIBRARY, "comm") + os.sep  # the communicator itself: never the origin


class Event(NamedTuple):
    rank: int
    kind: str  # send, recv, isend, irecv, sendrecv, barrier, builtin, collective, compute, buffer
    name: str
    t_start: float
    t_end: float
    bytes: int
    peer: int  # -1 when not a point-to-point event
    origin: tuple = ()  # who made the call, while tracer.origins is on: see origin()
    link: str = ""  # "intra" or "inter": the peer's node against mine (tracer.ranks_per_node); "" unknown

    @property
    def duration(self) -> float:
        return self.t_end - self.t_start


class Tracer:
    """The events of one process. Shared by a world communicator and its sub-communicators."""

    def __init__(self, rank: int, enabled: bool = False):
        self.rank = rank
        self.enabled = enabled
        self.origins = False  # also record each point-to-point call's origin() (costs a walk up the stack)
        self.events: list[Event] = []
        self.buffers = Buffers(self)
        self.ranks_per_node = None  # set (by the trainer, from --ranks-per-node): events get their link

    def record(self, kind, name, t_start, t_end, nbytes=0, peer=-1, origin=()):
        R, link = self.ranks_per_node, ""
        if R and peer >= 0:
            link = "intra" if peer // R == self.rank // R else "inter"
        self.events.append(Event(self.rank, kind, name, t_start, t_end, int(nbytes), int(peer), origin, link))

    def caller(self) -> tuple:
        """The :func:`origin` of the communication call being made, while tracing with origins."""
        return origin() if self.enabled and self.origins else ()

    def clear(self):
        self.events.clear()

    def region(self, name: str, kind: str = "compute"):
        """Context manager recording ``name`` as one event (a no-op while disabled)."""
        return _Region(self, name, kind) if self.enabled else _NULL


_ABSOLUTE: dict = {}  # co_filename -> absolute path


def origin(limit: int = 32) -> tuple:
    """Who is making the communication call in progress: ``(path, line, function)`` of each frame
    from the code that called the communicator outward, up to and including the first frame
    outside the minipar library (the user's code). ``(("/x/ex.py", 12, "ring_pass"),)`` is a
    send written in ex.py; ``(("/x/minipar/collectives.py", 88, "broadcast"), ("/x/ex.py", 12,
    "tree_broadcast"))`` is minipar's broadcast sending, called from ex.py."""
    frame, out = sys._getframe(1), []
    while frame is not None and len(out) < limit:
        name = frame.f_code.co_filename
        path = _ABSOLUTE.get(name) or _ABSOLUTE.setdefault(name, os.path.abspath(name))
        if not path.startswith(_COMM) and path != _HERE:
            out.append((path, frame.f_lineno, frame.f_code.co_name))
            if not in_library(path):
                break
        frame = frame.f_back
    return tuple(out)


def in_library(path: str) -> bool:
    """``path`` (absolute) is a file of the minipar library."""
    return path.startswith(_LIBRARY + os.sep)


def shown(path: str) -> str:
    """``path`` (absolute) as a user reads it: relative to the working directory when inside it."""
    return os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path


class _Region:
    __slots__ = ("tracer", "name", "kind", "t0")

    def __init__(self, tracer, name, kind):
        self.tracer, self.name, self.kind = tracer, name, kind

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.tracer.record(self.kind, self.name, self.t0, time.perf_counter())
        return False


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()


# ---------------------------------------------------------------- named buffers


def buffer(comm, kind: str, array, label: str = ""):
    """Name ``array`` as a buffer of this rank (``kind`` like "ring.recv", ``label`` like
    "bucket 0"); returns ``array`` unchanged. See :class:`Buffers`."""
    return comm.tracer.buffers.hold(kind, array, label)


class Buffers:
    """The named buffers of one rank: how many bytes of each kind are alive, the most alive at
    once, and how often each kind was allocated.

    A buffer holds partial results while ranks communicate: the ring's receive buffer, DDP's
    flat gradient buckets, ZeRO's flat parameter buffers and the layers ZeRO-3 gathers, the
    activations and the send buffers a pipeline keeps in flight. The code that allocates one
    names it::

        tmp = buffer(comm, "ring.recv", xp.empty((chunk,), like=buf))

    While ``enabled`` (or while tracing), a named buffer is counted from that line until its
    last reference goes (a weak reference tells: an array kept alive by accident still counts);
    while tracing, its lifetime is also one ``buffer`` event (allocation to free, its bytes) on
    the "buffers" lane of the Chrome trace. A buffer still alive is in :meth:`open_events`.
    Both off, naming a buffer costs two attribute tests. Shared by a communicator and its
    sub-communicators, like the tracer, and by the threads that use them (``minipar.torch``'s DDP
    runs its rings on one): what is alive is read from a copy.
    """

    def __init__(self, tracer):
        self.tracer = tracer
        self.enabled = False
        self.live = {}  # id(array) -> (kind, label, bytes, t_alloc, traced)
        self.reset()

    def reset(self):
        """Start counting afresh: allocations from now on; peaks from the bytes alive now."""
        self.allocations = defaultdict(int)  # kind -> buffers allocated since reset
        self.allocated = defaultdict(int)  # kind -> bytes allocated since reset
        self.peak = defaultdict(int, self.alive())  # kind -> most bytes alive at once
        self.peak_total = sum(self.peak.values())

    def hold(self, kind, array, label=""):
        if not (self.enabled or self.tracer.enabled) or id(array) in self.live:
            return array
        from .xp import nbytes

        n, traced = nbytes(array), self.tracer.enabled
        key = id(array)
        self.live[key] = (kind, label, n, time.perf_counter(), traced)
        weakref.finalize(array, self._free, key).atexit = False
        self.allocations[kind] += 1
        self.allocated[kind] += n
        now = self.alive()
        self.peak[kind] = max(self.peak[kind], now[kind])
        self.peak_total = max(self.peak_total, sum(now.values()))
        return array

    def _free(self, key):
        kind, label, n, t0, traced = self.live.pop(key)
        if traced and self.tracer.enabled:
            self.tracer.record("buffer", f"{kind} {label}".strip(), t0, time.perf_counter(), n)

    def alive(self) -> dict:
        """{kind: bytes} of the named buffers alive now."""
        out = defaultdict(int)
        for kind, _, n, _, _ in self.live.copy().values():  # a copy: a communication thread may add one meanwhile
            out[kind] += n
        return dict(out)

    def labels(self, kind) -> dict:
        """{label: bytes} of the buffers of ``kind`` alive now (one per unit, bucket, ...)."""
        return {label: n for k, label, n, _, _ in self.live.copy().values() if k == kind}

    def report(self) -> dict:
        """{kind: {"peak_bytes", "allocations", "allocated_bytes", "alive_bytes"}} since :meth:`reset`."""
        now = self.alive()
        return {k: {"peak_bytes": self.peak[k], "allocations": self.allocations[k],
                    "allocated_bytes": self.allocated[k], "alive_bytes": now.get(k, 0)}
                for k in sorted(set(self.peak) | set(self.allocations))}

    def open_events(self) -> list[Event]:
        """The traced buffers still alive, as events ending now."""
        t = time.perf_counter()
        return [Event(self.tracer.rank, "buffer", f"{kind} {label}".strip(), t0, t, n, -1)
                for kind, label, n, t0, traced in self.live.copy().values() if traced]


# ---------------------------------------------------------------- merging across ranks


def clock_offset(comm, rounds: int = 8) -> float:
    """Seconds to *add* to this rank's clock to express it on rank 0's clock.

    Rank 0 ping-pongs with every other rank (Cristian's algorithm): the reply carrying the
    peer's clock reading is assumed to have been taken halfway through the round trip; the
    round with the shortest round trip wins. On one host the clocks already agree (the offset
    comes out at a few microseconds); across hosts this is what lines the timelines up.
    """
    import numpy as np

    b = comm.builtin
    offset = 0.0
    for peer in range(1, comm.size):
        best_rtt, best = float("inf"), 0.0
        for _ in range(rounds):
            if comm.rank == 0:
                t0 = time.perf_counter()
                b.send_object(None, peer)
                t_peer = b.recv_object(peer)
                t1 = time.perf_counter()
                if t1 - t0 < best_rtt:
                    best_rtt, best = t1 - t0, (t0 + t1) / 2 - t_peer
            elif comm.rank == peer:
                b.recv_object(0)
                b.send_object(time.perf_counter(), 0)
        if comm.rank == 0:
            b.send_object(best, peer)
        elif comm.rank == peer:
            offset = b.recv_object(0)
    return float(np.float64(offset))


def merge(comm, events=None, align: bool = True) -> list[Event]:
    """All ranks' events on one time axis (rank 0's clock), sorted by start; on every rank.

    Collective over ``comm`` (call it on all ranks). ``events`` defaults to this rank's tracer
    (with the traced buffers still alive, as if freed now).
    """
    mine = list(comm.tracer.events + comm.tracer.buffers.open_events() if events is None else events)
    shift = clock_offset(comm) if align and comm.size > 1 else 0.0
    mine = [e._replace(t_start=e.t_start + shift, t_end=e.t_end + shift) for e in mine]
    everyone = comm.builtin.allgather_object(mine)
    return sorted((e for evs in everyone for e in evs), key=lambda e: (e.t_start, e.rank))


# ---------------------------------------------------------------- reading a trace


def bytes_sent(events, rank=None) -> dict[int, int] | int:
    """Bytes sent per rank (point-to-point sends only), or for one ``rank``."""
    out: dict[int, int] = defaultdict(int)
    for e in events:
        if e.kind in SEND_KINDS:
            out[e.rank] += e.bytes
    return out[rank] if rank is not None else dict(out)


def time_by_kind(events, rank=None) -> dict[str, float]:
    """Total seconds per event kind (optionally for one rank)."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if rank is None or e.rank == rank:
            out[e.kind] += e.duration
    return dict(out)


def count(events, kind=None, name=None, rank=None) -> int:
    """How many events match (``name`` matches by prefix)."""
    return sum(
        1
        for e in events
        if (kind is None or e.kind == kind)
        and (name is None or e.name.startswith(name))
        and (rank is None or e.rank == rank)
    )


def comm_lanes(events) -> dict:
    """{event index: lane name} by communicator: a point-to-point event goes to the lane of its
    communicator's family (the name before "(": "tp", "pp", "dp", ...); a collective to the lane
    of the first point-to-point event inside it on the same rank; compute to "compute"; a
    buffer's lifetime to "buffers"."""
    lanes, p2p = {}, defaultdict(list)
    for i, e in enumerate(events):
        if e.kind == "buffer":
            lanes[i] = "buffers"
        elif e.kind not in ("compute", "collective", "builtin"):
            lanes[i] = e.name.split("(")[0]
            p2p[e.rank].append(e)
    for i, e in enumerate(events):
        if e.kind == "compute":
            lanes[i] = "compute"
        elif e.kind in ("collective", "builtin"):
            inside = [q for q in p2p[e.rank] if e.t_start <= q.t_start and q.t_end <= e.t_end]
            lanes[i] = inside[0].name.split("(")[0] if inside else e.kind
    return lanes


LINK_COLOURS = {"intra": "good", "inter": "terrible"}  # the trace viewer's reserved colour names: green, red


def link_bytes(events, rank=None) -> dict:
    """{"intra": bytes, "inter": bytes} sent (``SEND_KINDS``) by ``rank`` (None: every rank),
    by the node of the peer; messages of unknown link are not counted."""
    out = {"intra": 0, "inter": 0}
    for e in events:
        if e.kind in SEND_KINDS and e.link in out and (rank is None or e.rank == rank):
            out[e.link] += e.bytes
    return out


def to_chrome_trace(events, lanes: str = "kind") -> dict:
    """Chrome trace-event JSON (opens in Perfetto / chrome://tracing): one row per rank.
    A message between nodes is drawn red, one inside a node green (``Event.link``).

    lanes="kind": compute and collectives on one lane, point-to-point on another, buffers'
    lifetimes on a third. lanes="comm": one lane per communicator family (:func:`comm_lanes`):
    with a process grid, TP collectives, PP sends and DP reductions each on their own lane.
    """
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(e.t_start for e in events)
    out = []
    for r in sorted({e.rank for e in events}):
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
    by_comm = comm_lanes(events) if lanes == "comm" else None
    names = sorted(set(by_comm.values())) if by_comm else []
    for r in sorted({e.rank for e in events}) if by_comm else []:
        out += [{"ph": "M", "name": "thread_name", "pid": r, "tid": k, "args": {"name": n}}
                for k, n in enumerate(names)]
    for r in sorted({e.rank for e in events if e.kind == "buffer"}) if not by_comm else []:
        out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 2, "args": {"name": "buffers"}})
    for i, e in enumerate(events):
        lane = names.index(by_comm[i]) if by_comm else \
            (0 if e.kind in ("compute", "collective") else 2 if e.kind == "buffer" else 1)
        out.append({
            "ph": "X", "pid": e.rank, "tid": lane, "cat": e.kind,
            "name": e.name if e.kind in ("compute", "collective", "buffer") else f"{e.kind} {e.name}",
            "ts": (e.t_start - t0) * 1e6, "dur": max(e.duration, 0.0) * 1e6,
            "args": {"bytes": e.bytes, "peer": e.peer, **({"link": e.link} if e.link else {})},
            **({"cname": LINK_COLOURS[e.link]} if e.link else {}),
        })
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(path, events, lanes: str = "kind") -> str:
    """Write ``events`` as a Chrome trace JSON file; returns the path."""
    with open(path, "w") as f:
        json.dump(to_chrome_trace(events, lanes), f)
    return str(path)
