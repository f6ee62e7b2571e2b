"""What the labs' checks share: pinpointed comparisons, tracing a call, stopping together.

Checks run on every rank and often call collectives, so a rank that has failed must not leave
the loop alone: ``stop`` makes all ranks leave together.
"""
from __future__ import annotations

import numpy as np

from ..xp import to_numpy


def compare(comm, got, want, what, case, tol=1e-12, offset=0):
    """Failure messages for the first differing element (empty list when equal)."""
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
    return [f"rank {comm.rank}: {what}, {at}: expected {w.ravel()[i]:.6g}, got {g.ravel()[i]:.6g} ({case}; "
            f"{bad.size} of {w.size} elements wrong)"]


def stop(comm, fails) -> bool:
    """True on every rank once any rank has failed: all ranks leave the loop together, so no
    rank is left waiting in the next case's collective."""
    return any(comm.builtin.allgather_object(bool(fails)))


def traced(comm, call):
    """(call(), the trace events it recorded on this rank)."""
    comm.tracer.enabled = True
    comm.tracer.clear()
    out = call()
    events = list(comm.tracer.events)
    comm.tracer.enabled = False
    return out, events
