"""The verbs of the whole course: ``minipar tour``, ``lessons``, ``check`` and ``figures``, and
the ``minipar run`` / ``minipar bench`` groups every lesson adds its own verbs to.

``minipar tour``: every lesson on real ranks, checked against its reference on the spot. For
each lesson in ``minipar.course.LESSONS``: launch its driver on n ranks (mpiexec underneath),
collect the check rows (what ran, max error vs the reference, tolerance), then draw its figures
from quick real runs. One table at the end.

``minipar figures``: regenerate every lesson's figures from real runs and the models.
"""
from __future__ import annotations

import argparse
import importlib
import os
import time

from ..course import LESSONS, lesson
from ..launcher import LaunchError, launch
from ..lessons.common import merge_rows
from ..errors import UsageError
from .common import Parser, Verbs, nonnegative_float, ranks, run_options, with_example

VERBS = ("tour", "lessons", "check", "figures")  # beside the groups `run` and `bench`, which the lessons fill


def add_verbs(top) -> Verbs:
    """Add the course's verbs to ``top`` (``minipar``'s subparsers); return where the lessons add theirs."""
    t = top.add_parser("tour", help="run every lesson on real ranks and check it", **with_example("minipar tour --backend torch"))
    t.add_argument("-n", type=ranks, default=4, help="ranks (default 4)")
    t.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    t.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="torch backend: cuda when available (auto), or force cpu/cuda")
    t.add_argument("--out", default="tour-output", help="where the lesson figures go (default tour-output/)")
    t.add_argument("--only", help="run just this lesson (key or name)")
    t.set_defaults(func=cmd_tour)

    ls = top.add_parser("lessons", help="list the lessons", **with_example("minipar lessons"))
    ls.set_defaults(func=cmd_lessons)

    r = top.add_parser("run", help="run a lesson on real ranks", **with_example("minipar run -n 4 collectives --trace trace.json"))
    run_options(r)
    run = r.add_subparsers(dest="lesson", metavar="LESSON", required=True)

    c = top.add_parser("check", help="grade a lab exercise", **with_example("minipar check 01 --task 1.3 --file labs/01_collectives/exercise.py"))
    c.add_argument("lab", help="lab number, e.g. 01 (the labs: `minipar lessons`)")
    c.add_argument("--task", action="append", help="grade only this task (repeatable), e.g. 1.3")
    c.add_argument("--file", help="the exercise file to grade (default: the lab's exercise.py)")
    c.add_argument("--solution", action="store_true", help="grade minipar's own implementation (must pass)")
    c.add_argument("--timeout", type=nonnegative_float, default=20.0, help="watchdog seconds per graded run (default 20)")
    c.add_argument("-v", "--verbose", action="store_true", help="show every failing check of a task, not only the first")
    c.set_defaults(func=cmd_check)

    b = top.add_parser("bench", help="benchmarks: ours vs the engine's own", **with_example("minipar bench collectives -n 4 --json bench.json"))
    bench = b.add_subparsers(dest="bench", metavar="BENCH", required=True)

    f = top.add_parser("figures", help="regenerate every figure from real runs and the models", **with_example("minipar figures --only collectives"))
    f.add_argument("--out", default="figures")
    f.add_argument("--only", help="one lesson (key or name)")
    f.add_argument("--quick", action="store_true", help="smaller runs (for tests)")
    f.set_defaults(func=cmd_figures)
    return Verbs(top=top, run=run, bench=bench)


# --------------------------------------------------------------------------- minipar run 06


def run_by_lesson(argv: list[str]) -> list[str]:
    """``argv`` with ``minipar run 06`` (a lesson's key, or its name from ``minipar lessons``) made
    ``minipar run context_parallel`` (the name its ``run`` verb has), from the registry. A lesson
    with two ``run`` verbs (06: context_parallel and experts) is refused with both named."""
    if "run" not in argv:
        return argv
    at = argv.index("run") + 1
    shared = Parser(add_help=False, exit_on_error=False)
    run_options(shared)
    try:
        _, rest = shared.parse_known_args(argv[at:])  # the options before the lesson (-n 4 ...) set aside
    except argparse.ArgumentError:
        return argv  # a bad -n or --backend: the real parser says so
    named = next((a for a in rest if not a.startswith("-")), None)
    taken = {name for ls in LESSONS for name in ls.runs}
    ls = next((ls for ls in LESSONS if named in (ls.key, ls.name) and named not in taken), None)
    if ls is None:
        return argv
    if len(ls.runs) != 1:
        raise UsageError(f"run {named}: lesson {ls.key} ({ls.name}) has {len(ls.runs)} runs, choose one: "
                         + ", ".join(f"minipar run {r}" for r in ls.runs))
    i = at + argv[at:].index(named)
    return argv[:i] + [ls.runs[0]] + argv[i + 1:]


# --------------------------------------------------------------------------- minipar lessons


def cmd_lessons(args):
    for ls in LESSONS:
        print(f"{ls.key}  {ls.name:<18} {ls.title}")
        print(f"    library: {', '.join(ls.packages)}   run: minipar run {ls.run}")
        print(f"    checks: {', '.join(ls.drivers)}   (the tour runs {ls.driver})")
        print(f"    lab: {ls.lab + f'   (minipar check {ls.key}; graded by {ls.grader})' if ls.lab else 'none'}   "
              f"notebook: {ls.notebook or 'none'}")
        print(f"    figures: {', '.join('figures/' + f for f in ls.figures) or 'none'}   "
              f"(drawn by {', '.join(ls.figures_modules) or 'none'})")
        print(f"    verbs: {', '.join('minipar ' + v for v in ls.verbs) or 'none'}   ({ls.cli})")
    return 0


# --------------------------------------------------------------------------- minipar check


def cmd_check(args):
    from ..labs import grader

    return grader.main(args)


# --------------------------------------------------------------------------- minipar tour


def resolve_device(backend, device):
    if backend != "torch":
        return None
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def cmd_tour(args) -> int:
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


# --------------------------------------------------------------------------- minipar figures


def cmd_figures(args) -> int:
    lessons = [lesson(args.only)] if args.only else LESSONS
    for ls in (ls for ls in lessons if ls.figures_modules):
        t0 = time.perf_counter()
        print(f"{ls.key} {ls.name}: drawing figures ...", flush=True)
        for module in ls.figures_modules:
            for path in importlib.import_module(module).make(args.out, quick=args.quick):
                print(f"  wrote {path}", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0
