"""The watchdog: a blocked job is reported and ended, never left hanging.

Every blocking call of a communicator (send, recv, wait, sendrecv, barrier, builtin
collectives) runs through ``Watchdog.call``, which first writes *what it is about to wait on*
into ``Watchdog.state``::

    ("sendrecv to rank 1 tag 0 (32 bytes) and from rank 3 tag 0 (32 bytes)", t_enter, thread)

and puts the previous state back when the call returns *or raises* (an exception caught in
user code must not leave a stale "blocked in recv" behind). That is one tuple per call.

A stretch of work can also be given a time budget, ``with watchdog.within("task 1.1", 30):``
(the lab grader gives each task one): a rank still inside it after that many seconds, blocked or
computing (a loop that never ends, a sleep), fires the same way; so does a rank whose resident
memory grew by more than ``memory`` megabytes inside it (``within("task 3.2", 15, memory=512)``: a
loop that never ends and allocates as it goes is stopped before it takes the machine's memory).

A daemon thread per rank wakes every ``POLL`` seconds. When its rank has been inside one
call for longer than ``timeout`` seconds, or inside a budget past its end or over its memory,
it *fires* (over its memory, once the report is printed, the rank's address space is capped
where it is, :func:`hold_memory`, so it grows no further while the job is being ended):

1. it creates the report folder (``os.mkdir`` is atomic: the first rank to fire owns the
   report). The folder's path was agreed at start-up (rank 0 picks it and announces it with
   the engine's own broadcast), but nothing exists on disk until a rank fires;
2. every rank's thread sees the folder and writes ``rank.<r>`` into it: what its rank is
   doing right now (blocked in which call, or computing, or finished) and the user's line
   it is on (the innermost frame of a real file outside the minipar library: not the
   ``<string>`` of code Python writes itself; lesson drivers in ``minipar/lessons`` count as
   user code);
3. the owner waits up to ``GRACE`` seconds for all reports, prints them once, removes the
   folder, and aborts the whole job (``MPI_Abort``, or ``os._exit`` under torchrun, whose
   agent then stops the rest). A job that never fires leaves nothing on disk.

The folder must be visible to every rank: true on one host; across hosts each rank's report
only reaches its own host's folder (the job still ends). A rank still running ``ORPHANED``
seconds after the owner removed the folder was not reached by the owner's abort (the owner's host
is cut off, and its printed report with it): it prints one line of its own, what it waits on, and
aborts the job itself. It lives in ``$MINIPAR_WATCHDOG_DIR``
(``minipar.launch`` points that into its own temporary folder) or else the temp directory.

The timeout defaults to 60 s; set it with ``minipar.init(watchdog=SECONDS)``, the
``MINIPAR_WATCHDOG`` environment variable, or ``--watchdog`` on the CLI; 0 turns it off.
"""
from __future__ import annotations

import linecache
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager

from ..trace import in_library, shown

DEFAULT_TIMEOUT = 60.0
POLL = 0.2
GRACE = 3.0
# a rank still alive this long after the owner printed its report (and removed the folder) was
# not reached by the owner's abort: the owner's host is cut off (docs/cluster.md). It then prints
# its own line and aborts the job itself, from its side.
ORPHANED = 5.0
# lesson drivers, inside the library, are written as a user would: their lines are the user's
_USER_CODE_INSIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons")
# the engines' and Python's own code (torch.distributed's ``work.wait()``, mpi4py, runpy) is not the user's either
_ENGINES = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                         for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def timeout_from_env(default: float = DEFAULT_TIMEOUT) -> float:
    """The watchdog's seconds from ``MINIPAR_WATCHDOG`` (0 = off), else ``default``; a value that
    is not a finite number >= 0 is a ``UsageError`` naming the variable."""
    import math

    from ..errors import UsageError

    value = os.environ.get("MINIPAR_WATCHDOG", "")
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"MINIPAR_WATCHDOG must be a number of seconds >= 0 (0 = off), got {value!r}")
    return seconds


def new_report_dir() -> str:
    """A fresh path for one job's report folder (rank 0 picks it; nothing is created)."""
    parent = os.environ.get("MINIPAR_WATCHDOG_DIR") or tempfile.gettempdir()
    return os.path.join(parent, f"minipar-wd-{uuid.uuid4().hex[:12]}")


def users(filename: str) -> bool:
    """Code in ``filename`` is the user's: a real file (not the ``<string>`` of code Python writes
    itself, as the ``__new__`` of a namedtuple), outside minipar's library (lesson drivers count as
    the user's) and outside the engines' and Python's own code."""
    path = os.path.abspath(filename)
    if filename.startswith("<") or not os.path.isfile(path):
        return False
    return path.startswith(_USER_CODE_INSIDE + os.sep) or not (in_library(path) or path.startswith(_ENGINES))


def user_line(frame) -> str | None:
    """``file:line: code`` of the innermost frame that is the user's (:func:`users`): not minipar's
    library code, not an engine's or Python's own (a rank blocked in torch.distributed waits in
    torch's ``work.wait()``; the line to show is the user's call that led there), and not code
    without a file (a loop building namedtuples is shown at its own line, not at ``<string>:1``)."""
    while frame is not None:
        if users(frame.f_code.co_filename):
            path = os.path.abspath(frame.f_code.co_filename)
            return f"{shown(path)}:{frame.f_lineno}: {linecache.getline(path, frame.f_lineno).strip()}"
        frame = frame.f_back
    return None


MB = 2 ** 20
HEADROOM = 64 * MB  # what a rank whose memory is held may still map (to print and abort)


def resident() -> int | None:
    """This process's resident memory in bytes (Linux's /proc/self/statm), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def hold_memory():
    """Cap this process's address space (RLIMIT_AS) at its size now, plus ``HEADROOM``: a loop still
    allocating fails with MemoryError instead of growing on while the job is being ended (a cap
    this tight from the start would break the engines, which map much they never touch)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        cap = size + HEADROOM
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, ValueError, IndexError):
        pass  # not Linux: the abort a second later ends it


class Watchdog:
    def __init__(self, rank: int, size: int, timeout: float, report_dir: str | None, abort):
        self.rank, self.size = rank, size
        self.timeout = float(timeout)
        self.report_dir = report_dir  # agreed path; created only when a rank fires
        self.abort = abort  # callable(exit_code) that ends every rank
        self.state = None  # (what, t_enter, thread id) while inside a blocking call
        self.budget = None  # (what, seconds, t_end, memory cap or None) while inside within()
        self.last = None  # the last call that completed (for "computing since ...")
        self.last_t = time.monotonic()
        self.finished = False
        self._seen = False  # this rank has seen a report folder: never create one again
        self._gone = None  # when the folder another rank owned disappeared (its report printed)
        self._written = False
        self._main = threading.main_thread().ident
        if self.timeout > 0 and report_dir is not None:
            threading.Thread(target=self._loop, name="minipar-watchdog", daemon=True).start()

    # called by the communicator around every blocking call ------------------------------
    def call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, a call that may block, announced as ``what``.

        The state is restored however ``fn`` ends: returning, or raising an exception that the
        caller may catch and carry on from.
        """
        outer = self.state
        self.state = (what, time.monotonic(), threading.get_ident())
        try:
            return fn(*args, **kwargs)
        finally:
            self.last, self.state = self.state, outer
            self.last_t = time.monotonic()

    @contextmanager
    def within(self, what: str, seconds: float, memory: float | None = None):
        """A time budget for the block: still inside it ``seconds`` later, the rank fires (if the
        watchdog runs at all: a timeout of 0 turns budgets off too). ``memory``: megabytes this
        rank's resident memory may grow by inside the block; past that it fires too (a loop that
        never ends and allocates is stopped before it takes the machine's memory, not only once its
        time is up). Checked every ``POLL`` seconds, so a rank may overshoot by what it allocates
        in that time."""
        outer = self.budget
        base = resident() if memory is not None else None
        cap = None if base is None else (base + memory * MB, base, float(memory))
        self.budget = (what, float(seconds), time.monotonic() + seconds, cap)
        try:
            yield
        finally:
            self.budget = outer

    # the thread -------------------------------------------------------------------------
    def describe(self) -> str:
        now = time.monotonic()
        st = self.state
        if st is not None:
            what, t0, thread = st
            if self.finished:
                return f"finished its work, waiting for the others in {what} for {now - t0:.1f} s"
            return f"blocked in {what} for {now - t0:.1f} s" + self._where(thread)
        if self.finished:
            return "finished its work (waiting for the others to exit)"
        since = f" since its last call ({self.last[0]})" if self.last is not None else " (no call yet)"
        return (f"not in a communication call: running Python for {now - self.last_t:.1f} s{since}"
                + self._where(self._main))

    def _where(self, thread) -> str:
        line = user_line(sys._current_frames().get(thread))
        return f"; at {line}" if line else ""

    def _loop(self):
        while True:
            time.sleep(POLL)
            st = self.state
            if os.path.isdir(self.report_dir):
                self._seen = True
                self._write_report()
                continue
            if self._seen:  # the owner printed the report: its abort should have ended this rank by now
                self._gone = self._gone or time.monotonic()
                if time.monotonic() - self._gone > ORPHANED:
                    self._abort_alone()
                    return
                continue
            budget, now = self.budget, time.monotonic()
            used = resident() if budget is not None and budget[3] is not None else None
            hold = False  # over its memory limit: after the report, this rank's memory is held where it is
            if st is not None and not self._seen and now - st[1] > self.timeout:
                why = (f"made no progress for {self.timeout:g} s (a deadlock, or a send/recv without its "
                       f"partner)", " Raise the limit with --watchdog SECONDS or MINIPAR_WATCHDOG.")
            elif used is not None and not self._seen and used > budget[3][0]:
                _, base, allowed = budget[3]
                why = (f"used {used / MB:.0f} MB in {budget[0]}, {(used - base) / MB:.0f} MB more than when it "
                       f"began (its limit: {allowed:g} MB more)", "")
                hold = True
            elif budget is not None and not self._seen and now > budget[2]:
                why = f"did not finish {budget[0]} in {budget[1]:g} s (its time budget)", ""
            else:
                continue
            try:
                os.mkdir(self.report_dir)
            except FileExistsError:
                continue  # another rank fired first; it prints the report
            except OSError as err:  # no folder to share: report this rank alone
                sys.stderr.write(f"minipar watchdog: cannot create {self.report_dir}: {err}\n")
            self._write_report()
            self._collect_and_abort(*why, hold=hold)
            return

    def _write_report(self):
        if self._written:
            return
        self._written = True
        path = os.path.join(self.report_dir, f"rank.{self.rank}")
        try:
            with open(path + ".tmp", "w") as f:
                f.write(self.describe())
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the owner has already printed the report and removed the folder

    def _abort_alone(self):
        """The owner's abort did not reach this rank (its host cut off, whose output is lost too):
        say, in one line, what this rank waits on, and end the job from here."""
        sys.stderr.write(f"minipar watchdog: rank {self.rank}: another rank reported a blocked job {ORPHANED:g} s "
                         f"ago, but its abort never came (its host cut off?); this rank is {self.describe()}. "
                         f"Aborting the job.\n")
        sys.stderr.flush()
        time.sleep(1.0)
        self.abort(3)

    def _collect_and_abort(self, why, hint, hold=False):
        deadline = time.monotonic() + GRACE
        paths = [os.path.join(self.report_dir, f"rank.{r}") for r in range(self.size)]
        while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
            time.sleep(0.05)
        lines = [f"minipar watchdog: rank {self.rank} {why}. What every rank is doing:"]
        for r, p in enumerate(paths):
            try:
                with open(p) as f:
                    lines.append(f"  rank {r}: {f.read()}")
            except OSError:
                lines.append(f"  rank {r}: no report (process exited or unresponsive)")
        lines.append("Aborting the job." + hint)
        shutil.rmtree(self.report_dir, ignore_errors=True)
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        if hold:
            hold_memory()
        time.sleep(1.0)  # let the launcher forward the report before the abort tears the job down
        self.abort(3)
