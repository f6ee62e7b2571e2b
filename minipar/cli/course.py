"""The verbs of the whole course: ``minipar tour``, ``lessons``, ``check``, ``lab start`` /
``lab solution`` and ``figures``, and the ``minipar run`` / ``minipar bench`` groups every lesson
adds its own verbs to.

``minipar tour``: every lesson on real ranks, checked against its reference on the spot. For
each lesson in ``minipar.course.LESSONS``: launch its driver on n ranks (mpiexec underneath),
collect the check rows (what ran, max error vs the reference, tolerance), then draw its figures
from quick real runs. One table at the end.

``minipar figures``: regenerate every lesson's figures from real runs and the models.

``minipar lab start NN`` copies lab NN's skeleton into a workspace (``./minipar-labs/NN_topic/``),
which ``minipar check NN`` grades; ``minipar check NN --hint T`` gives task T's hints one stage at
a time; ``minipar lab solution NN --task T`` shows minipar's answer (``minipar/labs/workspace.py``).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import textwrap
import time
from pathlib import Path

from ..course import LESSONS, lesson
from ..errors import UsageError
from ..figures import DEFAULT_OUT as FIGURES_OUT
from ..labs import workspace
from ..launcher import LaunchError, launch
from ..lessons.common import merge_rows
from .common import Parser, Verbs, nonnegative_float, output_path, progress, ranks, run_options, with_example

VERBS = ("tour", "lessons", "check", "lab start", "lab solution", "figures", "notebook")  # beside the groups `run` and `bench`, which the lessons fill
FIGURES_MINUTES = 11  # every lesson's figures on a 2-core laptop (lesson 02: 4 minutes of it)


def add_verbs(top) -> Verbs:
    """Add the course's verbs to ``top`` (``minipar``'s subparsers); return where the lessons add theirs."""
    t = top.add_parser("tour", help="run every lesson on real ranks and check it", **with_example("minipar tour --backend torch"))
    t.add_argument("-n", type=ranks, default=4, help="ranks (default 4)")
    t.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    t.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="torch backend: cuda when available (auto), or force cpu/cuda")
    t.add_argument("--out", default="tour-output", help="where the lesson figures go (default tour-output/)")
    t.add_argument("--only", help="run just this lesson (key or name)")
    t.add_argument("--no-figures", dest="figures", action="store_false",
                   help="run the checks only and draw nothing (about a third of the time)")
    t.set_defaults(func=cmd_tour)

    ls = top.add_parser("lessons", help="list the lessons", **with_example("minipar lessons"))
    ls.set_defaults(func=cmd_lessons)

    r = top.add_parser("run", help="run a lesson on real ranks", **with_example("minipar run -n 4 collectives --trace trace.json"))
    run_options(r)
    run = r.add_subparsers(dest="lesson", metavar="LESSON", required=True)

    c = top.add_parser("check", help="grade a lab exercise (your workspace's), or show a hint",
                       **with_example("minipar check 01 --task 1.3\n  minipar check 01 --hint 1.3\n"
                                      "  minipar check 01 --task 1.5 --trace t.json   # then open t.json in ui.perfetto.dev"))
    c.add_argument("lab", help="lab number, e.g. 01 (the labs: `minipar lessons`)")
    c.add_argument("--task", action="append", help="grade only this task (repeatable), e.g. 1.3")
    c.add_argument("--file", help="the exercise file to grade (default: your workspace's, "
                                  "./minipar-labs/NN_topic/exercise.py, made by `minipar lab start NN`)")
    c.add_argument("--solution", action="store_true", help="grade minipar's own implementation (must pass)")
    c.add_argument("--backend", choices=("mpi", "torch"), default=None,
                   help="grade on NumPy arrays over MPI (the default) or on torch tensors over torch.distributed "
                        "(lab 09, about torch's engines, is graded on torch only, its default)")
    c.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="with --backend torch: the tensors' device (default cpu, gloo; cuda: NCCL)")
    c.add_argument("--timeout", type=nonnegative_float, default=20.0, help="seconds a rank may stay blocked in one call before its job is ended (default 20); each "
                        "task also has a time budget of its own (15 s for most), which usually ends a deadlock first")
    c.add_argument("-v", "--verbose", action="store_true", help="show every failing check of a task, not only the first")
    c.add_argument("--trace", metavar="FILE", type=output_path,
                   help="also write your graded run as a Chrome trace (open in https://ui.perfetto.dev): for each task, "
                        "the calls of your function it graded in its last run that finished (the largest world size, "
                        "4 ranks for most tasks; where a task fails, the run that failed it), one process per rank; "
                        "each graded call is a box named after its task, each message names its task and your line")
    c.add_argument("--hint", metavar="TASK", help="grade nothing: show TASK's next hint (each task has 2 or 3, "
                                                  "from a nudge to near-pseudocode; the stage reached is kept in the workspace)")
    c.add_argument("--stage", type=int, help="with --hint: show this stage (1 = the nudge)")
    c.set_defaults(func=cmd_check)

    lab = top.add_parser("lab", help="your copy of a lab to work in, and minipar's answers",
                         **with_example("minipar lab start 01\n  minipar lab solution 01 --task 1.3"))
    lab_verbs = lab.add_subparsers(dest="lab_verb", metavar="VERB", required=True)
    s = lab_verbs.add_parser("start", help="copy a lab's skeleton into a workspace that `minipar check` grades",
                             **with_example("minipar lab start 01          # -> ./minipar-labs/01_collectives/exercise.py"))
    s.add_argument("lab", help="lab number, e.g. 01")
    s.add_argument("dir", nargs="?", help="the workspace folder (default ./minipar-labs/NN_topic, which "
                                          "`minipar check NN` grades; elsewhere, check it with --file)")
    s.add_argument("--force", action="store_true", help="replace an exercise.py already there with the skeleton")
    s.set_defaults(func=cmd_lab_start)
    a = lab_verbs.add_parser("solution", help="print minipar's answer to a task (after the hints, not before)",
                             **with_example("minipar lab solution 01 --task 1.3"))
    a.add_argument("lab", help="lab number, e.g. 01")
    a.add_argument("--task", help="one task, e.g. 1.3 (default: every task of the lab)")
    a.set_defaults(func=cmd_lab_solution)

    b = top.add_parser("bench", help="benchmarks: ours vs the engine's own", **with_example("minipar bench collectives -n 4 --json bench.json"))
    bench = b.add_subparsers(dest="bench", metavar="BENCH", required=True)

    f = top.add_parser("figures", help="regenerate every figure from real runs and the models",
                       description=f"Draws every lesson's figures from real runs and the models: about {FIGURES_MINUTES} "
                                   f"minutes on 2 cores (lesson 02's TP benchmark alone about 4).",
                       **with_example("minipar figures --into figures                # the committed figures\n"
                                      "  minipar figures --only collectives --quick   # into figures-out/"))
    f.add_argument("--into", metavar="DIR", default=FIGURES_OUT,
                   help=f"where the figures go (default {FIGURES_OUT}/; the committed ones: --into figures)")
    f.add_argument("--only", help="one lesson (key or name)")
    f.add_argument("--quick", action="store_true", help="smaller runs (for tests)")
    f.set_defaults(func=cmd_figures)
    from .notebooks import add_verbs as add_notebook_verbs  # here: `python -m minipar.cli.notebooks` imports minipar.cli

    add_notebook_verbs(top)  # minipar notebook NN
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
        print(f"    library: {', '.join(ls.packages)}   run: minipar run {ls.run}"
              + (f"   (on {' and '.join(ls.backends)} only)" if len(ls.backends) == 1 else ""))
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

    if args.stage is not None and not args.hint:
        raise UsageError("--stage goes with --hint TASK")
    if args.hint:
        return cmd_hint(args)
    return grader.main(args)


def cmd_hint(args):
    ls, task, stage, total, text, memory, furthest = workspace.hint(args.lab, args.hint, args.stage, args.file)
    print(f"lab {ls.key}, task {task.key} ({task.title}): hint {stage} of {total}\n")
    print(textwrap.indent(text, "    ") + "\n")
    again = f"minipar check {ls.key} --hint {task.key}" + (f" --file {args.file}" if args.file else "")
    if stage < total:
        print(f"more: `{again}{'' if furthest and memory else f' --stage {stage + 1}'}` shows hint {stage + 1}")
    else:
        print(f"that was the last hint; the answer: `minipar lab solution {ls.key} --task {task.key}`")
    print(f"(the stages seen are kept in {memory})" if memory else
          f"(no workspace, so the stages seen are not kept: `minipar lab start {ls.key}`)")
    return 0


# --------------------------------------------------------------------------- minipar lab


def cmd_lab_start(args):
    ls, written = workspace.start(args.lab, args.dir, args.force)
    for path in written:
        print(f"wrote {path}  (lab {ls.key}'s skeleton: edit it there)")
    default = Path(args.dir or workspace.default_folder(ls)).resolve() == workspace.default_folder(ls).resolve()
    grade = f"minipar check {ls.key}" + ("" if default else f" --file {written[0]}")
    first = tasks_of(ls)[0]
    print(f"\nthe tasks: {workspace.skeleton(ls) / 'README.md'}\nnext, from {Path.cwd()}:")
    other = list(ls.backends[1:])  # lab 09 is graded on torch only: no other backend to offer
    for command, what in ((grade, "grade every task"), (f"{grade} --task {first}", "grade one task"),
                          *[(f"{grade} --backend {b}", "grade it on torch tensors") for b in other],
                          (f"{grade.replace(' --file', f' --hint {first} --file')}" if not default else
                           f"{grade} --hint {first}", "stuck? a hint, one stage at a time")):
        print(f"  {command:<44} # {what}" if len(command) < 44 else f"  {command}\n  {'':<44} # {what}")
    print(f"(after the last hint, `minipar lab solution {ls.key} --task T` shows minipar's own answer)")
    return 0


def tasks_of(ls):
    return [t.key for t in workspace.tasks(ls)[0]]


def cmd_lab_solution(args):
    ls, answers = workspace.solution(args.lab, args.task)
    what = f"task {args.task}" if args.task else f"every task of lab {ls.key}"
    print(f"you asked for the solution: minipar's own answer to {what} follows "
          f"(the hints come first: `minipar check {ls.key} --hint T`)\n")
    for task, (where, source), calls in answers:
        print(f"# ---- {task.key} {task.title}: {task.function}, {where}\n")
        print(source)
        for name, at, code in calls:
            if code is None:
                print(f"# it uses {name} ({at})\n")
            else:
                print(f"# it calls {name}, {at}:\n\n{code}")
    return 0


# --------------------------------------------------------------------------- minipar tour


def resolve_device(backend, device):
    if backend != "torch":
        return None
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def tour_backend(ls, backend):
    """(the backend lesson ``ls`` runs on in a tour on ``backend``, words for the progress line): its
    own when it runs on one backend only (lesson 09: torch), or (None, why) when that backend is
    not installed: the tour goes on without it."""
    if backend in ls.backends:
        return backend, ""
    own = ls.backends[0]
    if own == "torch" and importlib.util.find_spec("torch") is None:
        return None, 'it runs on torch, which is not installed (pip install -e ".[torch]")'
    return own, f" on {own} (the only backend it runs on)"


def cmd_tour(args) -> int:
    lessons = [lesson(args.only)] if args.only else LESSONS
    device = resolve_device(args.backend, args.device)
    where = f"{args.backend}" + (f" on {device}" if device else "")
    if args.figures:
        os.makedirs(args.out, exist_ok=True)
    print(f"minipar tour: {len(lessons)} lesson(s) on {args.n} ranks ({where}); "
          + (f"figures go to {args.out}/" if args.figures else "checks only, no figures"), flush=True)
    table, figures, ok = [], [], True
    for i, ls in enumerate(progress(lessons, desc="tour", unit="lesson"), 1):
        backend, on = tour_backend(ls, args.backend)
        if backend is None:
            print(f"[{i}/{len(lessons)}] {ls.key} {ls.name}: skipped: {on}", flush=True)
            continue
        lesson_device = device if backend == args.backend else resolve_device(backend, args.device)
        print(f"[{i}/{len(lessons)}] {ls.key} {ls.name}: running on {args.n} ranks{on} ...", flush=True)
        t0 = time.perf_counter()
        try:
            out = launch(args.n, ls.driver, backend=backend, device=lesson_device, quiet=True)
            rows = merge_rows(out.results)
        except LaunchError as err:
            rows = [{"what": "the lesson's run", "error": float("nan"), "tolerance": 0.0, "ok": False}]
            print(err.output[-3000:])
        ran = time.perf_counter() - t0
        print(f"      checked {len(rows)} results in {ran:.1f} s" + ("; drawing figures ..." if args.figures else ""),
              flush=True)
        for module in ls.figures_modules if args.figures else ():
            figures += importlib.import_module(module).make(args.out, quick=True, backend=backend, device=lesson_device)
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
    if figures:
        print("\nfigures:")
        for p in figures:
            print(f"  {p}")
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


# --------------------------------------------------------------------------- minipar figures


def cmd_figures(args) -> int:
    lessons = [ls for ls in ([lesson(args.only)] if args.only else LESSONS) if ls.figures_modules]
    count = sum(len(ls.figures) for ls in lessons)
    how_long = "" if args.only or args.quick else f"; about {FIGURES_MINUTES} minutes on 2 cores"
    print(f"minipar figures: regenerates {count} figures of {len(lessons)} lesson{'s' * (len(lessons) != 1)}"
          f"{how_long}, into {args.into}/", flush=True)
    os.makedirs(args.into, exist_ok=True)
    for ls in progress(lessons, desc="figures", unit="lesson"):
        t0 = time.perf_counter()
        print(f"{ls.key} {ls.name}: drawing figures ...", flush=True)
        for module in ls.figures_modules:
            for path in importlib.import_module(module).make(args.into, quick=args.quick):
                print(f"  wrote {path}", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0
