"""What failure looks like: small programs that go wrong on purpose.

    minipar.launch(4, "minipar.lessons.faults:send_without_recv", watchdog=3)   # -> LaunchError

Each one ends with a clear report instead of a hang. Drivers of lesson 01 (send and recv): the
tests run them, and a learner can run them to recognise the symptoms in their own code.
"""
from __future__ import annotations

import numpy as np


def raise_on(comm, rank=1):
    """Rank ``rank`` raises; the others wait for it in a barrier. The job must end at once."""
    if comm.rank == rank:
        raise RuntimeError(f"planted failure on rank {rank}")
    comm.barrier()
    return comm.rank


def send_without_recv(comm):
    """Rank 0 sends 4 doubles to rank 1, which never posts the receive."""
    if comm.rank == 0:
        comm.send(comm.asarray(np.arange(4.0)), 1, tag=7)
    return comm.rank


def head_to_head(comm):
    """Every rank sends to its right neighbour before receiving: a cycle of waits.

    With synchronous sends nobody's send can finish before its partner receives, so the ring
    deadlocks. ``sendrecv`` (or alternating the order on even/odd ranks) is the fix.
    """
    x, buf = comm.asarray(np.arange(4.0)), comm.asarray(np.empty(4))
    comm.send(x, (comm.rank + 1) % comm.size)
    comm.recv(buf, (comm.rank - 1) % comm.size)
    return comm.rank


def wrong_buffer(comm):
    """Rank 1 receives 3 doubles when 4 were sent: a clear size error, not silent garbage."""
    if comm.rank == 0:
        comm.send(comm.asarray(np.arange(4.0)), 1)
    elif comm.rank == 1:
        comm.recv(comm.asarray(np.empty(3)), 0)
    return comm.rank


def recv_without_send(comm):
    """Rank 1 waits for a message from rank 0 that is never sent."""
    if comm.rank == 1:
        comm.recv(comm.asarray(np.empty(4)), 0, tag=5)
    return comm.rank


def ring_without_rank_0(comm):
    """A ring of ``sendrecv`` (to the right, from the left; each message tagged 10 + its
    sender) that rank 0 skips.

    Rank 1 then waits on its *source*, rank 0, while its own send went through: the report
    must name both peers and both tags to show that.
    """
    if comm.rank != 0:
        x, buf = comm.asarray(np.arange(4.0)), comm.asarray(np.empty(4))
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        comm.sendrecv(x, right, buf, left, sendtag=10 + comm.rank, recvtag=10 + left)
    return comm.rank


def usage_error_on(comm, rank=1):
    """Rank ``rank`` finds a mistake in what it was asked (``UsageError``); the others wait."""
    from ..errors import UsageError

    if comm.rank == rank:
        raise UsageError(f"tp={comm.size + 1}: the tensor-parallel size must divide the world size {comm.size}")
    comm.barrier()
    return comm.rank


def past_its_budget(comm, seconds=1.0):
    """A stretch of work with a time budget (``comm.watchdog.within``) that rank 0 never finishes:
    it sleeps, outside any communication, while the others wait for it in a barrier. The
    watchdog ends the job at the budget, with the line rank 0 was running."""
    import time

    with comm.watchdog.within("the planted stretch", seconds):
        if comm.rank == 0:
            time.sleep(600)
        comm.barrier()
    return comm.rank
