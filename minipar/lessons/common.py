"""The harness every lesson driver shares: the error measure, the check rows, and the helpers
that make a check.

A check row is ``{"what": str, "error": float, "tolerance": float, "ok": bool}``; every rank
returns its rows, ``merge_rows`` folds them into one row per check. ``Checks`` collects them
(``add`` compares with the dtype's tolerance, ``flag`` takes an error already measured);
``traced`` runs one call with tracing on and hands back its events; ``expect_error`` is a row
for a ValueError that must be raised; ``randomize`` draws the parameters that ``nn`` starts at
constants, so that no check runs on zeros or ones.

Tolerances (``TOLERANCE``): a float64 run against the float64 reference to 1e-12 (only the
order of the sums differs), float32 against the same reference to 1e-5.
"""
from __future__ import annotations

import numpy as np

from ..xp import to_numpy

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def rel_error(got, want) -> float:
    """max |got - want| / max |want| over all elements (inf when the shapes differ)."""
    got, want = to_numpy(got).astype(np.float64), to_numpy(want).astype(np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


class Checks:
    """Rows {"what", "error", "tolerance", "ok"} in the same order on every rank."""

    def __init__(self, comm, dtype):
        self.comm, self.dtype, self.rows = comm, dtype, []

    def add(self, what, got, want, tol=None):
        err = rel_error(got, want)
        self.flag(what, err, TOLERANCE[self.dtype] if tol is None else tol)

    def flag(self, what, error, tol=0.0):
        self.rows.append({"what": what, "error": float(error), "tolerance": tol,
                          "ok": bool(error <= tol), "dtype": self.dtype, "rank": self.comm.rank})


def traced(comm, fn, *args):
    """(fn(*args), the trace events it produced on this rank), tracing on just for this call."""
    tracer, was = comm.tracer, comm.tracer.enabled
    tracer.enabled, start = True, len(tracer.events)
    try:
        out = fn(*args)
    finally:
        tracer.enabled = was
    events = tracer.events[start:]
    if not was:
        del tracer.events[start:]
    return out, events


def randomize(module, rng):
    """Fresh draws for the parameters that nn initialises to constants (biases 0, gamma 1)."""
    for _, a in module.named_parameters():
        if a.ndim == 1:
            a += 0.5 * rng.standard_normal(a.shape)
    return module


def expect_error(ch, what, fn, *needles):
    """A row that is ok when fn() raises ValueError whose message holds every needle."""
    try:
        fn()
    except ValueError as err:
        missing = [n for n in needles if n not in str(err)]
        ch.flag(f"{what}: ValueError '{err}'" + (f" (missing {missing})" if missing else ""), len(missing))
        return
    ch.flag(f"{what}: no ValueError raised", 1.0)


def merge_rows(per_rank):
    """Rows from every rank -> one row per check ("what"), in first-seen order: the largest
    error of any rank, ok only if ok on every rank."""
    out = {}
    for rows in per_rank:
        for r in rows:
            m = out.setdefault(r["what"], dict(r))
            m["error"] = max(m["error"], r["error"])
            m["ok"] = m["ok"] and r["ok"]
    return list(out.values())


def format_rows(rows, prefix="") -> str:
    """The rows whose "what" starts with ``prefix``, as a small text table."""
    rows = [r for r in rows if r["what"].startswith(prefix)]
    width = max((len(r["what"]) for r in rows), default=0) + 2
    return "\n".join(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['what']:<{width}} max rel. error {r['error']:.1e} "
                     f"(tolerance {r['tolerance']:.0e})" for r in rows)
