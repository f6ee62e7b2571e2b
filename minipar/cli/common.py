"""What every verb of ``minipar`` shares: the parser class, argument types, the options of
``minipar run``, launching a lesson's checks, writing JSON, and re-running under mpiexec.

A lesson's verbs live in ``minipar/cli/<lesson>.py``, one module per lesson, each with
``add_verbs(verbs)``; this module is below all of them and imports none.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from dataclasses import dataclass

from ..lessons.common import format_rows, merge_rows
from ..records import output_problem, write_json


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line, ``minipar run: error: ...``, exit 2
    (subcommand parsers are of the same class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass
class Verbs:
    """Where a cli module adds its verbs: ``minipar VERB`` (``top``), ``minipar run LESSON``
    (``run``) and ``minipar bench NAME`` (``bench``); each is an argparse subparsers object."""

    top: argparse._SubParsersAction
    run: argparse._SubParsersAction
    bench: argparse._SubParsersAction


def positive(text: str, what: str = "a whole number") -> int:
    """The argparse type of a count: an int >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}")
    return n


# The largest count of ranks a verb accepts: every rank is a process on this one machine, and
# MPI launchers wrap or refuse counts far past this (a ``-n`` of 10^12 once "succeeded" on 2 ranks).
MAX_RANKS = 1024


def ranks(text: str) -> int:
    """The argparse type of ``-n`` in every verb: a number of ranks, 1 ... MAX_RANKS."""
    n = positive(text, "a number of ranks")
    if n > MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{text!r} ranks: at most {MAX_RANKS}, as every rank is a process on this machine")
    return n


def bounded(high: int, why: str, low: int = 1, what: str = "a whole number"):
    """An argparse type: an int in ``low ... high``; ``why`` says where the upper bound comes from."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low}, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low}, got {text!r}")
        if n > high:
            raise argparse.ArgumentTypeError(f"{text!r}: at most {high:,} ({why})")
        return n
    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def number(text: str, low: float | None = 0.0, inclusive: bool = False) -> float:
    """A finite float; by default > 0 (``low=None``: any finite value; ``inclusive``: >= low)."""
    import math

    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if low is not None and (x < low if inclusive else x <= low):
        raise argparse.ArgumentTypeError(f"expected a number {'>=' if inclusive else '>'} {low:g}, got {text!r}")
    return x


def float_at_most(high: float, why: str, low: float | None = 0.0, inclusive: bool = False):
    """An argparse type: a finite float above ``low`` (see ``number``) and at most ``high``, for ``why``."""
    def parse(text: str) -> float:
        x = number(text, low, inclusive)
        if x > high:
            raise argparse.ArgumentTypeError(f"{text!r}: at most {high:g} ({why})")
        return x
    parse.__name__ = "float"
    return parse


def size_at_most(high: int, why: str):
    """``parse_size`` with an upper bound (``why`` says where it comes from)."""
    def parse(text: str) -> int:
        n = parse_size(text)
        if n > high:
            raise argparse.ArgumentTypeError(f"{text!r}: at most {high:,} ({why})")
        return n
    parse.__name__ = "size"
    return parse


def positive_float(text: str) -> float:
    """The argparse type of a size, rate or time that must be finite and > 0."""
    return number(text)


def nonnegative_float(text: str) -> float:
    """The argparse type of a finite float >= 0 (a weight, a time where 0 means off)."""
    return number(text, 0.0, inclusive=True)


def output_path(text: str) -> str:
    """The argparse type of a file a verb writes at the end (``--json``, ``--trace``, ``--out``):
    its folder must exist and be writable now (``records.output_problem``)."""
    problem = output_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


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


COUNT_HELP = "a number, or with K, M, B (or G), T = 10^3, 10^6, 10^9, 10^12 as model sizes are named: 7.5e9, 350M, 7B"
_DECIMAL = {"K": 3, "M": 6, "B": 9, "G": 9, "T": 12}


def parameter_count(text: str) -> float:
    """A count of parameters as models are named: ``"7B"`` -> 7e9, ``"350M"``, ``"1.3B"``, ``"7.5e9"``.

    Powers of ten, unlike ``parse_size`` (bytes, powers of two): "7B" is seven billion parameters.
    """
    m = re.fullmatch(r"(.+?)\s*([KMBGT])", text.strip(), re.IGNORECASE)
    digits, power = (m.group(1), _DECIMAL[m.group(2).upper()]) if m else (text, 0)
    try:
        value = number(digits) * 10 ** power
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} ({COUNT_HELP})") from None
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# --------------------------------------------------------------------------- progress bars

PROGRESS_ENV = "MINIPAR_PROGRESS"  # 1: bars even when stderr is not a terminal; 0: never


def progress(iterable=None, desc: str = "", total: int | None = None, unit: str = "it"):
    """A tqdm bar on stderr over ``iterable`` (or ``total`` steps: ``bar.update(k)``), with an ETA.

    Shown only when stderr is a terminal (tqdm's ``disable=None``) unless ``MINIPAR_PROGRESS=1``
    asks for it (``=0``: never); never on a rank of an mpiexec job, only in the process that
    launched it. The bar is gone when the work is done (``leave=False``): what is left on the
    screen is the results on stdout, unchanged. While it is shown, lines written to stdout go
    above it instead of through it.
    """
    wish = os.environ.get(PROGRESS_ENV, "").strip()
    disable = True if (wish == "0" or in_mpi_job()) else False if wish == "1" else None
    return _bar_class()(iterable, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, disable=disable,
                dynamic_ncols=True)


class _AboveBar:
    """sys.stdout while a bar is shown: each whole line is written above the bar (clear the bar,
    write the line, draw the bar again), so a print never lands in the middle of the bar."""

    def __init__(self, stream, bar):
        self.stream, self.bar, self.pending = stream, bar, ""

    def write(self, text):
        with self.bar.get_lock():  # the launcher echoes the ranks' lines from a thread of its own
            self.pending += text
            if "\n" in self.pending:
                lines, self.pending = self.pending.rsplit("\n", 1)
                self.bar.clear(nolock=True)
                self.stream.write(lines + "\n")
                self.stream.flush()
                self.bar.refresh(nolock=True)
        return len(text)

    def flush(self):
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@functools.cache
def _bar_class():
    """tqdm's bar, moving stdout above itself while it is shown (tqdm is imported with the first bar)."""
    import tqdm

    class Bar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.stdout = None
            if not self.disable and not isinstance(sys.stdout, _AboveBar):  # the outer bar moves stdout
                self.stdout, sys.stdout = sys.stdout, _AboveBar(sys.stdout, self)

        def close(self):
            if getattr(self, "stdout", None) is not None:
                above, sys.stdout, self.stdout = sys.stdout, self.stdout, None
                sys.stdout.write(above.pending)
            super().close()

    return Bar


def shown(value) -> str:
    """A default as a help text shows it: 3e-3, 65536, 1.25, 0."""
    if isinstance(value, float) and value and abs(value) < 1e-2:
        mantissa, exponent = f"{value:e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_field_flag(p, flag: str, field, default, value, options: dict):
    """``flag`` made from a dataclass ``field``: ``value`` when not given (``default``, the field's,
    or a "not said" None), the help text of the field's metadata (``minipar.layout.knob``) with
    ``{default}`` shown, and ``options`` saying what the flag parses. A flag so made cannot say
    another default than its field."""
    kw = dict(options)
    if kw.get("action") != "store_true":
        kw["default"] = value
    text = field.metadata.get("help")
    if text:
        kw["help"] = text.format(default=shown(default))
    p.add_argument(flag, **kw)


def checked_device(args) -> str | None:
    """``--device``, checked before any rank starts: cuda needs the torch backend and a GPU."""
    from ..comm import check_backend

    if args.device == "cpu":
        return None
    check_backend(args.backend, args.device)
    from ..comm.torch_backend import require_gpu

    require_gpu()
    return args.device


def launch_failed(verb, err, echoed) -> int:
    """A job whose ranks failed: what they printed once (unless it was already echoed as it ran),
    then the one line saying what went wrong; exit 1. A rank's UsageError goes on to ``main``."""
    if err.usage:
        raise err
    if not echoed and err.output:
        print(err.output.rstrip("\n"), file=sys.stderr)
    print(f"minipar {verb}: error: {err.line}", file=sys.stderr)
    return 1


def with_example(text, heading="example"):
    """The keyword arguments of a parser whose ``--help`` ends with ``heading:`` and ``text``, kept as written."""
    return {"epilog": f"{heading}:\n  " + text, "formatter_class": argparse.RawDescriptionHelpFormatter}


# --------------------------------------------------------------------------- minipar run LESSON


def run_options(p, lesson_level=False):
    """Options of ``minipar run`` shared by every lesson, accepted before or after its name.

    On the lesson's own parser the defaults are suppressed, so a value given before the lesson
    name is not overwritten by the lesson parser's default.
    """
    d = (lambda v: argparse.SUPPRESS) if lesson_level else (lambda v: v)
    p.add_argument("-n", type=ranks, default=d(4), help="ranks (default 4)")
    p.add_argument("--backend", choices=("mpi", "torch"), default=d("mpi"))
    p.add_argument("--trace", metavar="FILE", type=output_path, default=d(None),
                   help="write a Chrome trace (open in https://ui.perfetto.dev)")
    p.add_argument("--json", metavar="FILE", type=output_path, default=d(None), help="write the run's summary as JSON")


def lesson_run_parser(run_subparsers, name, help, example, validate=None):
    """A ``minipar run NAME`` parser with the shared options.

    ``validate(args)`` runs before any rank is launched and raises ``UsageError`` for what
    can be known up front (a shape that does not split over ``-n`` ranks); ``main`` prints it
    as one line and exits 2. Any verb may set the same default (``set_defaults(validate=...)``).
    """
    p = run_subparsers.add_parser(name, help=help, **with_example(example))
    run_options(p, lesson_level=True)
    p.set_defaults(validate=validate)
    return p


def run_and_report(args, what: str, target: str, summarize=merge_rows, **kwargs) -> int:
    """``minipar run`` for a lesson: launch ``target`` on ``args.n`` ranks, print the check rows,
    write ``--trace`` / ``--json`` if asked; exit code 0 only if every row is ok."""
    import time

    from ..launcher import launch
    from ..trace import write_chrome_trace

    print(f"{what} on {args.n} ranks ({args.backend}): launching {target} ...", flush=True)
    t0 = time.perf_counter()
    out = launch(args.n, target, backend=args.backend, trace=bool(args.trace), quiet=True, **kwargs)
    rows = summarize(out.results)
    print(f"{len(rows)} checks ran in {time.perf_counter() - t0:.1f} s on {args.n} ranks:", flush=True)
    print(format_rows(rows))
    if args.trace:
        print(f"trace: {write_chrome_trace(args.trace, out.trace)} ({len(out.trace)} events; open in https://ui.perfetto.dev)")
    if args.json:
        write_json(args.json, rows)
    return 0 if all(r["ok"] for r in rows) else 1


# --------------------------------------------------------------------------- a verb that runs on every rank


def in_mpi_job() -> bool:
    """True when this process was started by mpiexec (so it is one rank of a job)."""
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MINIPAR_IN_JOB"))


def relaunch(n: int, argv: list[str]) -> int:
    """Re-run this same command on n ranks: mpiexec -n N python -m mpi4py -m minipar ARGV."""
    from ..launcher import mpiexec, rank_env, run_streaming

    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "minipar", *argv]
    print("launching:", " ".join(cmd[:3] + ["python"] + cmd[4:]), flush=True)
    code, _ = run_streaming(cmd, limit=3600, env=rank_env({**os.environ, "MINIPAR_IN_JOB": "1"}))
    return code


def strip_n(argv: list[str]) -> list[str]:
    """``argv`` without its ``-n N`` / ``-nN`` (what ``relaunch`` passes to every rank)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "-n":
            skip = True
            continue
        if a.startswith("-n") and a[2:].isdigit():
            continue
        out.append(a)
    return out
