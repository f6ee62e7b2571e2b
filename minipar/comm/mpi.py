"""The MPI backend: NumPy buffers over mpi4py.

Launch with ``mpiexec -n 4 python -m mpi4py script.py`` (the ``-m mpi4py`` runner aborts every
rank when one raises). Buffers travel with the buffer protocol (``Send``/``Recv`` with capital
letters): no pickling, no copies of contiguous arrays.

``send`` is *synchronous* (``MPI_Ssend``): it returns only once the receiver has started
receiving. A plain ``MPI_Send`` may return at once for small messages ("eager" protocol), so a
send without its recv, or a send-send deadlock, would appear only for large messages. Making
every send synchronous makes those bugs appear every time, which is what a learner needs.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .base import Comm, message_size_error
from ..xp import dtype_named, is_torch

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def wire(x):
    """What MPI is handed for ``x``: ``x`` itself, or for a dtype MPI has no datatype for (ml_dtypes'
    bfloat16) a view of the same bytes as uint8. Point-to-point moves bytes: nothing is converted."""
    return x.view(np.uint8) if x.dtype.kind == "V" else x


def mpi_op(op: str):
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"op={op!r}: choose one of {sorted(_OPS)}") from None


class MPIComm(Comm):
    backend = "mpi"

    def __init__(self, mpicomm, tracer, watchdog, name="world"):
        world = MPI.COMM_WORLD.Get_group()
        ranks = mpicomm.Get_group().Translate_ranks(list(range(mpicomm.size)), world)
        super().__init__(mpicomm.rank, mpicomm.size, ranks, tracer, watchdog, name)
        self.mpi = mpicomm
        self.builtin = MPIBuiltin(self)

    def _check_array(self, x, what, writable=False):
        if is_torch(x):
            raise TypeError(f"{what}: the mpi backend works on NumPy arrays, got a torch tensor; "
                            f"use minipar.init(backend='torch') for tensors")
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{what}: expected a numpy array, got {type(x).__name__}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: array must be C-contiguous (a slice along axis 0 is; use np.ascontiguousarray)")
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: array is read-only")
        return x

    def _checked(self, op, peer, buf, status):
        got = status.Get_count(MPI.BYTE)
        if got != buf.nbytes:
            raise message_size_error(self, op, peer, buf.nbytes, got)
        return buf

    def _truncated(self, op, peer, buf, err):
        if err.Get_error_class() == MPI.ERR_TRUNCATE:
            return ValueError(f"{op}: the message from rank {self.world_rank(peer)} is larger than "
                              f"buf ({buf.nbytes} bytes, shape {buf.shape}, {buf.dtype})")
        return err

    def _send(self, x, dst, tag):
        self.mpi.Ssend(wire(x), dst, tag)

    def _recv(self, buf, src, tag):
        status = MPI.Status()
        try:
            self.mpi.Recv(wire(buf), src, tag, status)
        except MPI.Exception as err:
            raise self._truncated("recv", src, buf, err) from None
        return self._checked("recv", src, buf, status)

    def _isend(self, x, dst, tag):
        req = self.mpi.Issend(wire(x), dst, tag)
        return req.Wait, req.Test

    def _irecv(self, buf, src, tag):
        req, status = self.mpi.Irecv(wire(buf), src, tag), MPI.Status()

        def complete(call):
            try:
                done = call(status)
            except MPI.Exception as err:
                raise self._truncated("irecv", src, buf, err) from None
            if done is not False:
                self._checked("irecv", src, buf, status)
            return done is not False

        return (lambda: complete(req.Wait)), (lambda: complete(req.Test))

    def _sendrecv(self, x, dst, buf, src, sendtag, recvtag):
        status = MPI.Status()
        try:
            self.mpi.Sendrecv(wire(x), dst, sendtag, wire(buf), src, recvtag, status)
        except MPI.Exception as err:
            raise self._truncated("sendrecv", src, buf, err) from None
        return self._checked("sendrecv", src, buf, status)

    def _barrier(self):
        self.mpi.Barrier()

    def _split(self, color, key, name):
        sub = self.mpi.Split(MPI.UNDEFINED if color is None else color, key)
        return None if sub == MPI.COMM_NULL else MPIComm(sub, self.tracer, self.watchdog, name)

    def empty(self, shape, dtype="float64"):
        return np.empty(shape, dtype=dtype_named(dtype))

    def asarray(self, a):
        return np.ascontiguousarray(a)


class MPIBuiltin:
    """MPI's own collectives: the reference our from-scratch algorithms are checked against."""

    def __init__(self, comm: MPIComm):
        self.comm, self.mpi = comm, comm.mpi

    def _run(self, name, fn, *args):
        c = self.comm
        return c.watchdog.call(f"builtin {name} on {c.name}", fn, *args)

    def all_reduce(self, x, op="sum"):
        out = np.empty_like(x)
        self._run("all_reduce", self.mpi.Allreduce, np.ascontiguousarray(x), out, mpi_op(op))
        return out

    def broadcast(self, x, root=0):
        self._run("broadcast", self.mpi.Bcast, x, root)
        return x

    def reduce(self, x, root=0, op="sum"):
        out = np.empty_like(x) if self.comm.rank == root else None
        self._run("reduce", self.mpi.Reduce, np.ascontiguousarray(x), out, mpi_op(op), root)
        return out

    def all_gather(self, x):
        """Concatenation along axis 0 of every rank's ``x`` (axis-0 lengths may differ)."""
        x = np.ascontiguousarray(x)
        rows = self._run("allgather", self.mpi.allgather, x.shape[0])
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        out = np.empty((sum(rows),) + x.shape[1:], dtype=x.dtype)
        self._run("all_gather", self.mpi.Allgatherv, x, [out, [r * row for r in rows]])
        return out

    def reduce_scatter(self, x, op="sum"):
        """This rank's chunk (``xp.chunk_bounds`` along axis 0) of the elementwise reduction."""
        from ..xp import chunk_bounds

        x = np.ascontiguousarray(x)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        counts = [(b - a) * row for a, b in chunk_bounds(x.shape[0], self.comm.size)]
        a, b = chunk_bounds(x.shape[0], self.comm.size)[self.comm.rank]
        out = np.empty((b - a,) + x.shape[1:], dtype=x.dtype)
        self._run("reduce_scatter", self.mpi.Reduce_scatter, x, out, counts, mpi_op(op))
        return out

    def all_to_all(self, x):
        out = np.empty_like(x)
        self._run("all_to_all", self.mpi.Alltoall, np.ascontiguousarray(x), out)
        return out

    def all_to_all_v(self, x, send_counts):
        """(rows received, recv_counts), like ``collectives.all_to_all_v`` (MPI_Alltoallv)."""
        x = np.ascontiguousarray(x)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        recv_counts = self._run("alltoall", self.mpi.alltoall, [int(c) for c in send_counts])
        out = np.empty((sum(recv_counts),) + x.shape[1:], dtype=x.dtype)
        self._run("all_to_all_v", self.mpi.Alltoallv, [x, [c * row for c in send_counts]],
                  [out, [c * row for c in recv_counts]])
        return out, recv_counts

    def barrier(self):
        self._run("barrier", self.mpi.Barrier)

    # pickled Python objects (results, metadata, trace events)
    def bcast_object(self, obj, root=0):
        return self._run("bcast_object", self.mpi.bcast, obj, root)

    def gather_object(self, obj, root=0):
        return self._run("gather_object", self.mpi.gather, obj, root)

    def allgather_object(self, obj):
        return self._run("allgather_object", self.mpi.allgather, obj)

    def send_object(self, obj, dst, tag=77):
        self._run("send_object", self.mpi.send, obj, dst, tag)

    def recv_object(self, src, tag=77):
        return self._run("recv_object", self.mpi.recv, None, src, tag)
