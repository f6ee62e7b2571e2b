"""``minipar``: the command line of the lab.

    minipar tour                         run every lesson on 4 ranks, checked against its reference
    minipar lessons                      list the lessons with their lab, notebook, figures and verbs
    minipar notebook 01                  read notebook 01 as stored, in the terminal (--html FILE: a web page)
    minipar run -n 4 collectives         run one lesson's checks on real ranks
    minipar lab start 01                 your copy of lab 01 to edit, in ./minipar-labs/01_collectives/
    minipar check 01 [--task 1.3]        grade it; --hint 1.3: a hint, one stage at a time
    minipar lab solution 01 --task 1.3   minipar's own answer
    minipar bench collectives -n 4       ours vs the builtin all-reduce, busbw per size
    minipar figures --into figures       regenerate every figure in figures/ (default: figures-out/)

Every verb has ``--help`` with an example. The verbs of the whole course are in
``minipar/cli/course.py``; each lesson's own verbs are in the module its entry in
``minipar/course.py`` names (``Lesson.cli``, by default ``minipar/cli/<lesson>.py``), shared
helpers in ``minipar/cli/common.py``.
"""
from __future__ import annotations

import importlib
import os
import sys

from ..course import LESSONS
from ..errors import UsageError
from .common import Parser, nonnegative_float, with_example
from .course import add_verbs as add_course_verbs
from .course import run_by_lesson

# a lesson whose verbs fail to import because one of these is not installed hides its verbs quietly
# (with a note at the end of ``minipar --help``); any other import failure is reported on stderr
OPTIONAL = {"torch": 'pip install -e ".[torch]"'}


def build_parser(lessons=None) -> Parser:
    """The parser of ``minipar``: the course's verbs, then the verbs of each of ``lessons``
    (default: every lesson of the course, in its order)."""
    p = Parser(prog="minipar", description=__doc__.split("\n\n")[0], **with_example("minipar tour"))
    p.add_argument("--watchdog", type=nonnegative_float, metavar="SECONDS",
                   help="abort a job blocked this long in one call, reporting every rank (default 60; 0 = off)")
    p.add_argument("--link", dest="emulate_link", metavar="NAME",
                   help="every message also pays this link's alpha + n beta: nvlink, pcie, infiniband, ethernet "
                        "(MINIPAR_LINK; see minipar/comm/link.py)")
    verbs = add_course_verbs(p.add_subparsers(dest="verb", metavar="VERB"))
    hidden = _add_lesson_verbs(LESSONS if lessons is None else lessons, verbs)
    if hidden:
        p.epilog += "\n\nnot installed, so these verbs are missing:\n" + "\n".join(f"  {h}" for h in hidden)
    return p


def _add_lesson_verbs(lessons, verbs) -> list[str]:
    """Import each lesson's cli module and let it add its verbs. A module that fails to import
    is named on stderr with the reason; one whose failure is an OPTIONAL dependency is returned
    as a note for ``--help`` instead."""
    hidden = []
    for ls in lessons:
        try:
            mod = importlib.import_module(ls.cli)
        except Exception as err:  # noqa: BLE001  (any failure: name it, keep the other verbs)
            missing = (getattr(err, "name", None) or "").split(".")[0]
            if isinstance(err, ImportError) and missing in OPTIONAL:
                hidden.append(f"{ls.cli}: needs {missing} ({OPTIONAL[missing]})")
            else:
                print(f"minipar: warning: the verbs of {ls.cli} are missing: it failed to import "
                      f"({type(err).__name__}: {err})", file=sys.stderr)
            continue
        mod.add_verbs(verbs)
    return hidden


def main(argv=None) -> int:
    """Parse, validate before launching anything, run the verb. A ``UsageError`` from any verb
    (or from its ``validate``) is printed as ``minipar: error: ...`` and exits 2."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also through a pipe
    parser = build_parser()
    try:
        argv = run_by_lesson(sys.argv[1:] if argv is None else list(argv))  # `minipar run 06` names lesson 06's run
    except UsageError as err:
        parser.error(str(err))
    args = parser.parse_args(argv)
    if args.emulate_link is not None:
        from ..comm.link import LINKS

        if args.emulate_link not in LINKS:
            parser.error(f"--link {args.emulate_link!r}: choose one of {', '.join(LINKS)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..launcher import job_settings

    # the ranks it launches get --watchdog and --link; os.environ is as it was when main returns
    with job_settings({"MINIPAR_WATCHDOG": args.watchdog, "MINIPAR_LINK": args.emulate_link}):
        return _run(args)


def _run(args) -> int:
    """The verb, its ``UsageError`` printed as one line (exit 2)."""
    try:
        from ..comm.watchdog import timeout_from_env

        timeout_from_env()  # a bad MINIPAR_WATCHDOG is one line now, not a traceback from a rank
        if getattr(args, "validate", None):
            args.validate(args)
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"minipar: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (``minipar lessons | head``): stop quietly, as a pipe's writer does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
