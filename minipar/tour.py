"""``minipar tour``: every lesson on real ranks, checked against its reference on the spot.

For each lesson in ``minipar.course.LESSONS``: launch its driver on n ranks (mpiexec
underneath), collect the check rows (what ran, max error vs the reference, tolerance), then
draw its figures from quick real runs. One table at the end.
"""
from __future__ import annotations

import importlib
import os
import time

from .course import LESSONS, lesson
from .launcher import LaunchError, launch
from .lessons.common import merge_rows


def resolve_device(backend, device):
    if backend != "torch":
        return None
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def main(args) -> int:
    lessons = [lesson(args.only)] if args.only else LESSONS
    device = resolve_device(args.backend, args.device)
    where = f"{args.backend}" + (f" on {device}" if device else "")
    os.makedirs(args.out, exist_ok=True)
    print(f"minipar tour: {len(lessons)} lesson(s) on {args.n} ranks ({where}); figures go to {args.out}/", flush=True)
    table, figures, ok = [], [], True
    for i, ls in enumerate(lessons, 1):
        print(f"[{i}/{len(lessons)}] {ls.key} {ls.name}: running on {args.n} ranks ...", flush=True)
        t0 = time.perf_counter()
        try:
            out = launch(args.n, ls.driver, backend=args.backend, device=device, quiet=True)
            rows = merge_rows(out.results)
        except LaunchError as err:
            rows = [{"what": "the lesson's run", "error": float("nan"), "tolerance": 0.0, "ok": False}]
            print(err.output[-3000:])
        ran = time.perf_counter() - t0
        print(f"      checked {len(rows)} results in {ran:.1f} s; drawing figures ...", flush=True)
        for module in ls.figures_modules:
            figures += importlib.import_module(module).make(args.out, quick=True, backend=args.backend, device=device)
        took = time.perf_counter() - t0
        for j, r in enumerate(rows):
            table.append((ls.key + " " + ls.name if j == 0 else "", r, took if j == 0 else None))
        ok &= all(r["ok"] for r in rows)
    print()
    w = min(max(len(r["what"]) for _, r, _ in table) + 2, 78)
    print(f"{'lesson':<20}{'what ran':<{w}}{'check (max rel. error)':<28}{'time':>7}")
    print("-" * (20 + w + 35))
    for name, r, took in table:
        check = f"{'ok  ' if r['ok'] else 'FAIL'} {r['error']:.1e} <= {r['tolerance']:.0e}"
        what = r["what"] if len(r["what"]) < w else r["what"][: w - 4] + "..."
        print(f"{name:<20}{what:<{w}}{check:<28}{'' if took is None else f'{took:6.1f}s':>7}")
    print()
    print("figures:")
    for p in figures:
        print(f"  {p}")
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1
