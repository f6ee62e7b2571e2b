"""The communicator interface every lesson is written against.

A ``Comm`` is a group of ranks that can talk point to point. Lessons receive one as their
first argument (``ring_all_reduce(comm, x)``), never from a global, so the same code runs on
the world, on a row of a process grid, or on ``COMM_SELF``.

Point to point (what the from-scratch collectives are built from)::

    comm.send(x, dst, tag=0)             # blocks until the receiver has started receiving
    buf = comm.recv(buf, src, tag=0)     # fills buf (same shape and dtype as the message)
    req = comm.isend(x, dst); req.wait() # non-blocking versions
    req = comm.irecv(buf, src); buf = req.wait()
    comm.sendrecv(x, dst, buf, src)      # both at once: the building block of every ring
    comm.barrier()
    sub = comm.split(color, key)         # sub-communicators, like MPI_Comm_split

``comm.builtin`` exposes the engine's own collectives (MPI_Allreduce, dist.all_reduce, ...)
and object transport: lessons never use it for their algorithm, tests and benchmarks use it
as the reference.

This base class validates arguments, keeps the watchdog informed and records trace events
(with, while ``tracer.origins`` is on, the origin of each point-to-point call: who sent it);
a backend implements only the underscored primitives.
"""
from __future__ import annotations

import time

from .. import xp
from ..trace import Tracer
from .link import install as install_link


class Request:
    """A pending non-blocking operation: ``wait()`` blocks until it is done, ``test()`` asks
    the engine without blocking."""

    def __init__(self, comm, op, peer, tag, nbytes, pending, result=None):
        self._comm, self._op, self._peer, self._tag, self._nbytes = comm, op, peer, tag, nbytes
        self._wait_fn, self._test_fn = pending  # the backend's (wait, test) pair
        self._result, self._done = result, False
        self._t0 = time.perf_counter()
        self._origin = comm.tracer.caller()  # who posted it (the wait may be elsewhere)

    def _finish(self):
        self._done = True
        c = self._comm
        if c.tracer.enabled:
            c.tracer.record(self._op, c.name, self._t0, time.perf_counter(), self._nbytes, c.world_rank(self._peer),
                            self._origin)

    def wait(self):
        """Block until done; an ``irecv`` returns its filled buffer."""
        if not self._done:
            c = self._comm
            where = "to" if self._op == "isend" else "from"
            c.watchdog.call(f"wait({self._op}) {where} rank {c.world_rank(self._peer)} tag {self._tag} "
                            f"({self._nbytes} bytes)", self._wait_fn)
            self._finish()
        return self._result

    def test(self) -> bool:
        """True once the operation has completed (an irecv's buffer is then filled)."""
        if not self._done and self._test_fn():
            self._finish()
        return self._done


def wait_all(requests):
    """Wait for every request; returns their results."""
    return [r.wait() for r in requests]


class Comm:
    """Interface + the shared checking/tracing wrapper. Backends subclass it."""

    backend = "abstract"

    def __init__(self, rank, size, world_ranks, tracer: Tracer, watchdog, name="world"):
        self.rank = rank
        self.size = size
        self.world_ranks = list(world_ranks)  # world rank of each rank of this comm
        self.tracer = tracer
        self.watchdog = watchdog
        self.name = name
        install_link(self)  # MINIPAR_LINK: every message also pays an emulated link (comm/link.py)

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} rank {self.rank}/{self.size}>"

    def world_rank(self, r: int) -> int:
        return self.world_ranks[r] if 0 <= r < self.size else r

    # --------------------------------------------------------------- argument checks
    def _check_peer(self, peer, what):
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise ValueError(f"{what}={peer!r} is not a rank of this communicator (size {self.size})")

    def _check_tag(self, tag):
        if not isinstance(tag, int) or tag < 0:
            raise ValueError(f"tag={tag!r} must be a non-negative int")

    def _check_array(self, x, what):
        """Backends accept their own array kind; say clearly when handed the other one."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _blocking(self, op, peer, nbytes, what, fn, *args):
        """Run ``fn(*args)`` as one blocking call, announced to the watchdog as ``what``, traced."""
        t0 = time.perf_counter()
        out = self.watchdog.call(what, fn, *args)
        if self.tracer.enabled:
            self.tracer.record(op, self.name, t0, time.perf_counter(), nbytes, self.world_rank(peer),
                               self.tracer.caller())
        return out

    # --------------------------------------------------------------- point to point
    def send(self, x, dst: int, tag: int = 0) -> None:
        """Send array ``x`` to rank ``dst``; returns once the receiver has started receiving."""
        self._check_peer(dst, "dst")
        self._check_tag(tag)
        x = self._check_array(x, "x")
        n = xp.nbytes(x)
        self._blocking("send", dst, n, f"send to rank {self.world_rank(dst)} tag {tag} ({n} bytes)",
                       self._send, x, dst, tag)

    def recv(self, buf, src: int, tag: int = 0):
        """Receive from rank ``src`` into ``buf`` (an array of the message's shape and dtype)."""
        self._check_peer(src, "src")
        self._check_tag(tag)
        buf = self._check_array(buf, "buf", writable=True)
        n = xp.nbytes(buf)
        return self._blocking("recv", src, n, f"recv from rank {self.world_rank(src)} tag {tag} ({n} bytes)",
                              self._recv, buf, src, tag)

    def isend(self, x, dst: int, tag: int = 0) -> Request:
        """Start sending ``x``; ``x`` must not be modified until ``wait()`` returns."""
        self._check_peer(dst, "dst")
        self._check_tag(tag)
        x = self._check_array(x, "x")
        return Request(self, "isend", dst, tag, xp.nbytes(x), self._isend(x, dst, tag))

    def irecv(self, buf, src: int, tag: int = 0) -> Request:
        """Start receiving into ``buf``; ``wait()`` returns it once filled."""
        self._check_peer(src, "src")
        self._check_tag(tag)
        buf = self._check_array(buf, "buf", writable=True)
        return Request(self, "irecv", src, tag, xp.nbytes(buf), self._irecv(buf, src, tag), buf)

    def sendrecv(self, x, dst: int, buf, src: int, sendtag: int = 0, recvtag: int | None = None):
        """Send ``x`` to ``dst`` and receive from ``src`` into ``buf`` at the same time.

        Never deadlocks on a ring, whatever the order the ranks call it in. Returns ``buf``.
        Traced as one event whose bytes are the bytes sent.
        """
        recvtag = sendtag if recvtag is None else recvtag
        self._check_peer(dst, "dst")
        self._check_peer(src, "src")
        self._check_tag(sendtag)
        self._check_tag(recvtag)
        x = self._check_array(x, "x")
        buf = self._check_array(buf, "buf", writable=True)
        n, m = xp.nbytes(x), xp.nbytes(buf)
        what = (f"sendrecv to rank {self.world_rank(dst)} tag {sendtag} ({n} bytes) "
                f"and from rank {self.world_rank(src)} tag {recvtag} ({m} bytes)")
        self._blocking("sendrecv", dst, n, what, self._sendrecv, x, dst, buf, src, sendtag, recvtag)
        return buf

    def barrier(self) -> None:
        """Wait until every rank of this communicator has called ``barrier``."""
        t0 = time.perf_counter()
        self.watchdog.call(f"barrier on {self.name}", self._barrier)
        if self.tracer.enabled:
            self.tracer.record("barrier", self.name, t0, time.perf_counter())

    def split(self, color: int | None, key: int = 0, name: str | None = None):
        """Sub-communicators: ranks with the same ``color`` form one, ordered by ``(key, rank)``.

        ``color=None`` gives ``None`` (the rank joins no sub-communicator). Collective: every
        rank of this communicator must call it.
        """
        if color is not None and (not isinstance(color, int) or color < 0):
            raise ValueError(f"color={color!r} must be a non-negative int or None")
        return self._split(color, key, name or f"{self.name}/{color}")

    def region(self, name: str, kind: str = "compute"):
        """Trace a named region of this rank's work: ``with comm.region("forward"): ...``."""
        return self.tracer.region(name, kind)

    # --------------------------------------------------------------- backend primitives
    def _send(self, x, dst, tag):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _recv(self, buf, src, tag):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _isend(self, x, dst, tag):
        """Start a send; return (wait, test) callables."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _irecv(self, buf, src, tag):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _sendrecv(self, x, dst, buf, src, sendtag, recvtag):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _barrier(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def _split(self, color, key, name):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def empty(self, shape, dtype="float64"):
        """A new uninitialised array of this backend's kind, on its compute device."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def asarray(self, a):
        """NumPy array ``a`` as this backend's kind (same dtype), on its compute device."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")


def message_size_error(comm, op, peer, expected, got):
    return ValueError(
        f"{op}: the message from rank {comm.world_rank(peer)} has {got} bytes but buf holds "
        f"{expected} bytes: buf must have the shape and dtype of what was sent"
    )
