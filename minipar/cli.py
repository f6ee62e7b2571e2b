"""``minipar``: the command line of the lab.

    minipar tour                         run every lesson on 4 ranks, checked against its reference
    minipar lessons                      list the lessons with their lab, notebook and figures
    minipar run -n 4 collectives         run one lesson's checks on real ranks
    minipar check 01 [--task 1.3]        grade your lab exercise
    minipar bench collectives -n 4       ours vs the builtin all-reduce, busbw per size
    minipar figures                      regenerate every figure in figures/

Every verb has ``--help`` with an example.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from .errors import UsageError

# lesson modules that add verbs: module -> functions they may define
PLUGINS = [
    "minipar.pipeline.cli",  # schedule, run pipeline
    "minipar.memory",  # memory
    "minipar.bench.tp",  # bench tp
    "minipar.lessons.tensor_parallel",  # run tensor_parallel
    "minipar.lessons.data_parallel",  # run data_parallel
    "minipar.train.cli",  # train, generate, bench train
    "minipar.lessons.train",  # run train
    "minipar.lessons.sequence_experts",  # run context_parallel, run experts
    "minipar.plan.cli",  # plan
    "minipar.lessons.auto_parallel",  # search, run auto_parallel
]


# a plugin that fails to import because one of these is not installed hides its verbs quietly
# (with a note at the end of ``minipar --help``); any other import failure is reported on stderr
OPTIONAL = {"torch": 'pip install -e ".[torch]"'}


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line, ``minipar run: error: ...``, exit 2
    (subcommand parsers are of the same class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive(text: str, what: str = "a whole number") -> int:
    """The argparse type of a count: an int >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}")
    return n


def ranks(text: str) -> int:
    """The argparse type of ``-n`` in every verb: a number of ranks, at least 1."""
    return positive(text, "a number of ranks")


SIZE_HELP = "K, M, G = 2^10, 2^20, 2^30 (as in nccl-tests; KiB, MiB, GiB alike): 8, 4K, 16M, 64MiB, 1G"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([KMGT])(i?B)?|(B)?)", re.IGNORECASE)
_POWER = {"K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text: str) -> int:
    """A human size: ``"8"`` -> 8, ``"4K"`` -> 4096, ``"16M"`` / ``"16MiB"`` -> 16 * 2**20, ``"1G"``.

    Powers of two, as nccl-tests reads ``-b 8 -e 128M``. ``MB`` is refused: it means 10**6
    to some and 2**20 to others.
    """
    m = _SIZE.fullmatch(text.strip())
    if not m or (m.group(3) or "").lower() == "b":
        hint = " (MB is ambiguous: write 16M or 16MiB)" if m else ""
        raise argparse.ArgumentTypeError(f"not a size: {text!r}{hint}; {SIZE_HELP}")
    value = float(m.group(1)) * 2 ** _POWER.get((m.group(2) or "").upper(), 0)
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"not a whole positive size: {text!r}; {SIZE_HELP}")
    return int(value)


def with_example(text, heading="example"):
    """The keyword arguments of a parser whose ``--help`` ends with ``heading:`` and ``text``, kept as written."""
    return {"epilog": f"{heading}:\n  " + text, "formatter_class": argparse.RawDescriptionHelpFormatter}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="minipar", description=__doc__.split("\n\n")[0], **with_example("minipar tour"))
    p.add_argument("--watchdog", type=float, metavar="SECONDS",
                   help="abort a job blocked this long in one call, reporting every rank (default 60; 0 = off)")
    p.add_argument("--link", dest="emulate_link", metavar="NAME",
                   help="every message also pays this link's alpha + n beta: nvlink, pcie, infiniband, ethernet "
                        "(MINIPAR_LINK; see minipar/comm/link.py)")
    sub = p.add_subparsers(dest="verb", metavar="VERB")

    t = sub.add_parser("tour", help="run every lesson on real ranks and check it", **with_example("minipar tour --backend torch"))
    t.add_argument("-n", type=ranks, default=4, help="ranks (default 4)")
    t.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    t.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="torch backend: cuda when available (auto), or force cpu/cuda")
    t.add_argument("--out", default="tour-output", help="where the lesson figures go (default tour-output/)")
    t.add_argument("--only", help="run just this lesson (key or name)")
    t.set_defaults(func=lambda a: _call("minipar.tour", "main", a))

    ls = sub.add_parser("lessons", help="list the lessons", **with_example("minipar lessons"))
    ls.set_defaults(func=cmd_lessons)

    r = sub.add_parser("run", help="run a lesson on real ranks", **with_example("minipar run -n 4 collectives --trace trace.json"))
    _run_options(r)
    rsub = r.add_subparsers(dest="lesson", metavar="LESSON", required=True)
    rc = lesson_run_parser(rsub, "collectives", "every from-scratch collective vs the builtin",
                           "minipar run -n 5 collectives --backend torch --trace trace.json")
    rc.set_defaults(func=cmd_run_collectives)

    c = sub.add_parser("check", help="grade a lab exercise", **with_example("minipar check 01 --task 1.3 --file labs/01_collectives/exercise.py"))
    c.add_argument("lab", help="lab number, e.g. 01 (the labs: `minipar lessons`)")
    c.add_argument("--task", action="append", help="grade only this task (repeatable), e.g. 1.3")
    c.add_argument("--file", help="the exercise file to grade (default: the lab's exercise.py)")
    c.add_argument("--solution", action="store_true", help="grade minipar's own implementation (must pass)")
    c.add_argument("--timeout", type=float, default=20.0, help="watchdog seconds per graded run (default 20)")
    c.add_argument("-v", "--verbose", action="store_true", help="show every failing check of a task, not only the first")
    c.set_defaults(func=lambda a: _call("minipar.labs.grader", "main", a))

    b = sub.add_parser("bench", help="benchmarks: ours vs the engine's own", **with_example("minipar bench collectives -n 4 --json bench.json"))
    bsub = b.add_subparsers(dest="bench", metavar="BENCH", required=True)
    bc = bsub.add_parser("collectives", help="all-reduce algorithms vs the builtin: time, algbw, busbw",
                         **with_example("mpiexec -n 4 python -m mpi4py -m minipar bench collectives --json out.json"))
    bc.add_argument("-n", type=ranks, help="launch this many ranks with mpiexec (omit when already under mpiexec)")
    bc.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    bc.add_argument("--sizes", type=parse_size, nargs="+", metavar="SIZE",
                    help=f"message sizes in bytes (default 8 ... 64M); {SIZE_HELP}")
    bc.add_argument("--algorithms", nargs="+", help="subset of algorithms (default all + builtin)")
    bc.add_argument("--budget", type=float, default=0.3, help="seconds of repetitions per measurement")
    bc.add_argument("--json", help="write one record per (algorithm, size) here")
    bc.add_argument("--plot", default="figures/collectives_busbw.png", help="figure path ('' to skip)")
    bc.set_defaults(func=lambda a: _call("minipar.bench.cli", "collectives", a))

    f = sub.add_parser("figures", help="regenerate every figure from real runs and the models", **with_example("minipar figures --only collectives"))
    f.add_argument("--out", default="figures")
    f.add_argument("--only", help="one lesson (key or name)")
    f.add_argument("--quick", action="store_true", help="smaller runs (for tests)")
    f.set_defaults(func=lambda a: _call("minipar.figures.all", "main", a))

    hidden = _load_plugins({"add_commands": sub, "add_schedule_command": sub, "add_run_command": rsub,
                            "add_bench_command": bsub})
    if hidden:
        p.epilog += "\n\nnot installed, so these verbs are missing:\n" + "\n".join(f"  {h}" for h in hidden)
    return p


def _load_plugins(hooks) -> list[str]:
    """Import every module of PLUGINS and let it add its verbs (``hooks``: function name ->
    subparsers). A module that fails to import is named on stderr with the reason; one whose
    failure is an OPTIONAL dependency is returned as a note for ``--help`` instead."""
    hidden = []
    for name in PLUGINS:
        try:
            mod = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001  (any failure: name it, keep the other verbs)
            missing = (getattr(err, "name", None) or "").split(".")[0]
            if isinstance(err, ImportError) and missing in OPTIONAL:
                hidden.append(f"{name}: needs {missing} ({OPTIONAL[missing]})")
            else:
                print(f"minipar: warning: the verbs of {name} are missing: it failed to import "
                      f"({type(err).__name__}: {err})", file=sys.stderr)
            continue
        for hook, target in hooks.items():
            if hasattr(mod, hook):
                getattr(mod, hook)(target)
    return hidden


def _run_options(p, lesson_level=False):
    """Options of ``minipar run`` shared by every lesson, accepted before or after its name.

    On the lesson's own parser the defaults are suppressed, so a value given before the lesson
    name is not overwritten by the lesson parser's default.
    """
    d = (lambda v: argparse.SUPPRESS) if lesson_level else (lambda v: v)
    p.add_argument("-n", type=ranks, default=d(4), help="ranks (default 4)")
    p.add_argument("--backend", choices=("mpi", "torch"), default=d("mpi"))
    p.add_argument("--trace", metavar="FILE", default=d(None), help="write a Chrome trace (open in https://ui.perfetto.dev)")
    p.add_argument("--json", metavar="FILE", default=d(None), help="write the run's summary as JSON")


def lesson_run_parser(run_subparsers, name, help, example, validate=None):
    """A ``minipar run NAME`` parser with the shared options (for lesson plugins).

    ``validate(args)`` runs before any rank is launched and raises ``UsageError`` for what
    can be known up front (a shape that does not split over ``-n`` ranks); ``main`` prints it
    as one line and exits 2. Any verb may set the same default (``set_defaults(validate=...)``).
    """
    p = run_subparsers.add_parser(name, help=help, **with_example(example))
    _run_options(p, lesson_level=True)
    p.set_defaults(validate=validate)
    return p


def _call(module, func, args):
    return getattr(importlib.import_module(module), func)(args)


def cmd_lessons(args):
    from .course import LESSONS

    for ls in LESSONS:
        print(f"{ls.key}  {ls.name:<18} {ls.title}")
        print(f"    library: {', '.join(ls.packages)}   run: minipar run {ls.run}")
        print(f"    lab: {ls.lab + f'   (minipar check {ls.key})' if ls.lab else 'none'}   notebook: {ls.notebook or 'none'}")
        print(f"    figures: {', '.join('figures/' + f for f in ls.figures) or 'none'}")
    return 0


def cmd_run_collectives(args):
    from .lessons.collectives import summarize
    from .lessons.common import run_and_report

    return run_and_report(args, "every collective against the builtin", "minipar.lessons.collectives:verify",
                          summarize=summarize)


def main(argv=None) -> int:
    """Parse, validate before launching anything, run the verb. A ``UsageError`` from any verb
    (or from its ``validate``) is printed as ``minipar: error: ...`` and exits 2."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also through a pipe
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.watchdog is not None:
        os.environ["MINIPAR_WATCHDOG"] = str(args.watchdog)
    if args.emulate_link is not None:
        from .comm.link import LINKS

        if args.emulate_link not in LINKS:
            parser.error(f"--link {args.emulate_link!r}: choose one of {', '.join(LINKS)}")
        os.environ["MINIPAR_LINK"] = args.emulate_link
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "validate", None):
            args.validate(args)
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"minipar: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
