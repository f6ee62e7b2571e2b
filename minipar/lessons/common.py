"""What every lesson driver shares: the error measure and the check rows.

A check row is ``{"what": str, "error": float, "tolerance": float, "ok": bool}``; every rank
returns its rows, ``merge_rows`` folds them into one row per check.
"""
from __future__ import annotations

import numpy as np

from ..xp import to_numpy


def rel_error(got, want) -> float:
    """max |got - want| / max |want| over all elements (inf when the shapes differ)."""
    got, want = to_numpy(got).astype(np.float64), to_numpy(want).astype(np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


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
