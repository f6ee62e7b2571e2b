"""Supervising a job's processes: run them with their output streamed, end them, leave nothing behind.

    code, output = run_streaming([mpiexec, "-n", "4", ...], limit=600)   # what launch runs the ranks with
    stop(proc)                      # SIGTERM to the job's process group, GRACE seconds, then SIGKILL
    with ending_on_signals(): ...   # SIGTERM, SIGHUP: the job stopped and its files removed first

``minipar.launcher`` builds a job (the ranks' command, their environment, the result's folder) and
reads what it returns; this module keeps it running and ends it, however it ends: by itself, on
the hard time limit, on Ctrl-C, on SIGTERM or SIGHUP to this process, or when this process is
killed outright (``PR_SET_PDEATHSIG``). docs/faults.md has the details.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from . import libc


def run_streaming(cmd, limit: float, echo: bool = True, env=None, on_line=None, labels=None):
    """Run ``cmd``, echoing its output live (and handing each line to ``on_line``), stopping it
    after ``limit`` seconds. ``cmd`` may also be a list of commands, started at once (torchrun on
    every node of a cluster): each line is prefixed with the command's label (``labels``), and the
    first command to fail ends the others.

    Returns (exit code, combined output): the first failure's code, else 0; 124 means we stopped
    it on the time limit. However the call ends (the limit, a command failing, Ctrl-C, SIGTERM or
    SIGHUP, an error), every command ends with it (:func:`stop`) and leaves nothing behind.
    Hydra's topology file in /tmp is removed here, when the job is over, however it ended: a
    stopped job's (``stop`` finds it before it kills), and a job's that ended by itself after a
    rank called ``MPI_Abort``, whose proxy exits without removing it (``watch`` notes it while
    the job runs).
    """
    cmds = [cmd] if cmd and isinstance(cmd[0], (str, os.PathLike)) else list(cmd)
    labels = list(labels) if labels else [""] * len(cmds)
    with ending_on_signals():
        procs, readers, lines, held, watcher = [], [], [], set(), None
        stopping = threading.Event()  # from then on, mpiexec's "BAD TERMINATION" banner is not echoed
        ended = threading.Event()

        def watch():
            """Each job's hydra topology file: the one its processes hold open, once it exists (the
            proxy makes it as it starts: 30 s of looking is plenty, and the watch ends with the job)."""
            deadline, found = time.monotonic() + 30, set()
            while (len(found) < len(procs) and any(p.poll() is None for p in procs) and time.monotonic() < deadline
                   and not ended.is_set()):
                for p in procs:
                    files = set() if p.pid in found else _job_files(p.pid)
                    if files:
                        found.add(p.pid)
                        held.update(files)
                ended.wait(0.2)

        def pump(proc, label):
            for line in proc.stdout:
                lines.append(label + line)
                if echo and not stopping.is_set():
                    sys.stdout.write(lines[-1])
                    sys.stdout.flush()
                if on_line is not None:
                    on_line(lines[-1])

        def stop_all():
            stopping.set()
            for p in procs:
                held.update(stop(p))

        try:
            with _held_signals():  # a signal while the commands start waits until they can be stopped
                for c, label in zip(cmds, labels):
                    procs.append(subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                  bufsize=1, env=env, start_new_session=True,
                                                  preexec_fn=_dies_with(os.getpid())))
                    readers.append(threading.Thread(target=pump, args=(procs[-1], label), daemon=True))
                    readers[-1].start()
                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
            code = _first_failure(procs, limit)
            if code and len(procs) > 1:
                stop_all()  # the others, still running
        except subprocess.TimeoutExpired:
            stop_all()
            lines.append(f"minipar: job killed after {limit:g} s (hard time limit)\n")
            code = 124
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP, or any error here: no rank outlives the call
            stop_all()
            raise
        finally:
            ended.set()
            if watcher is not None:
                watcher.join(timeout=5)
            with _held_signals():  # a second Ctrl-C waits until the files are gone
                for path in held:  # gone already where hydra ended normally, or a stopped job's proxy removed it
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
        for t in readers:
            t.join(timeout=5)
        return code, "".join(lines)


def _first_failure(procs, limit: float) -> int:
    """Wait until every process has ended (0) or one has failed (its exit code); TimeoutExpired
    after ``limit`` seconds."""
    if len(procs) == 1:
        return procs[0].wait(timeout=limit)
    deadline = time.monotonic() + limit
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed or None not in codes:
            return failed[0] if failed else 0
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(procs[0].args, limit)
        time.sleep(0.1)


# ------------------------------------------------------------------ ending a job, and this process

GRACE = 3.0  # seconds a stopped job has to end its ranks and remove its files before SIGKILL


def _dies_with(parent: int):
    """What mpiexec's process runs before it starts (``preexec_fn``): if ``parent``, this process,
    is killed outright (SIGKILL, the OOM killer), where no handler of ours runs and :func:`stop`
    never comes, Linux sends mpiexec SIGTERM (``PR_SET_PDEATHSIG``), and mpiexec ends its ranks
    and removes hydra's file as when stopped. Only the launch folder stays behind: only this
    process knew it. Looked up here, in the parent: the child between fork and exec does little."""
    prctl = libc.prctl()
    if prctl is None:
        return None

    def arm():
        prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the line above: nothing would send the signal
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def stop(proc, grace: float = GRACE) -> set:
    """End the job ``proc`` (mpiexec) started, every process of it; returns hydra's files of it.

    Asked with SIGTERM, hydra's mpiexec ends its proxy, the proxy its ranks, and the proxy removes
    the topology file it keeps in /tmp (``hydra_hwloc_xmlfile_*``, whatever TMPDIR says); SIGKILL
    gives it no chance, and left that file behind at each Ctrl-C. So: SIGTERM to the job's process
    group, ``grace`` seconds, then SIGKILL to what is left of it, the ranks included (hydra starts
    the proxy and the ranks in sessions of their own: the group does not reach them). Hydra's
    files of this job (those its processes hold open) are found first and returned: the caller
    removes what the proxy could not (``run_streaming``, however the job ended). A signal meanwhile
    (a second Ctrl-C) waits until the job is ended.
    """
    with _held_signals():
        family = _descendants(proc.pid)  # known now: once mpiexec is gone they are orphans
        files = _job_files(proc.pid, family)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid, started in family:
            if _start_time(pid) == started:  # still that process, not a new one with its pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return files


def _descendants(pid: int) -> list:
    """[(pid, start time)] of every process below ``pid`` (Linux's /proc; elsewhere none)."""
    children: dict[int, list] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat:
                children.setdefault(stat[0], []).append((int(entry), stat[1]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child[0])
    return out


def _stat(pid: int):
    """(parent pid, start time) of ``pid`` from /proc/PID/stat, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command's name, which may hold spaces
    except OSError:
        return None
    return int(fields[1]), fields[19]


def _start_time(pid: int):
    stat = _stat(pid)
    return stat and stat[1]


def _job_files(pid: int, family=None) -> set:
    """The ``hydra_hwloc_xmlfile_*`` files that mpiexec ``pid`` and the processes below it
    (``family``, from :func:`_descendants`; found now if not given) hold open: this job's, no other's."""
    family = _descendants(pid) if family is None else family
    files = set()
    for pid in [pid] + [p for p, _ in family]:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if os.path.basename(target).startswith("hydra_hwloc_xmlfile_"):
                        files.add(target)
    return files


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived while a job ran: unwinds through every clean-up (the job's
    processes, the launch folder), then :func:`ending_on_signals` ends this process."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


ENDING = (signal.SIGTERM, signal.SIGHUP)


def _raise_stopped(signum, frame):
    for sig in ENDING:  # the next one changes nothing: this process is ending already
        if signal.getsignal(sig) is _raise_stopped:
            signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def ending_on_signals():
    """SIGTERM and SIGHUP inside the block raise :class:`Stopped`, so the job is stopped and its
    files removed; leaving the block, a ``SystemExit`` unwinds the caller's clean-ups too (a
    temporary file a benchmark removes in its ``finally``), and when the interpreter has finished,
    the signal ends this process with its default action (``_end_by_pending_signal``: the exit
    status names the signal, as it would have without us).

    Only where the signal would have killed this process outright (its handler is the default):
    a program with its own handler, or one run under ``nohup`` (SIGHUP ignored), keeps it. Only in
    the main thread (Python's rule for signal handlers). Nested blocks leave it to the outermost.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mine = [sig for sig in ENDING if signal.getsignal(sig) == signal.SIG_DFL]
    for sig in mine:
        signal.signal(sig, _raise_stopped)
    try:
        yield
    except Stopped as stopped:
        for sig in mine:
            signal.signal(sig, signal.SIG_DFL)
        if stopped.signum not in mine:
            raise  # an outer block's
        name = signal.Signals(stopped.signum).name
        print(f"minipar: {name}: the job was stopped, its ranks ended and its files removed", file=sys.stderr)
        _PENDING.append(stopped.signum)  # delivered again once every clean-up has run
        raise SystemExit(128 + stopped.signum) from None
    finally:
        for sig in mine:
            signal.signal(sig, signal.SIG_DFL)


_PENDING: list = []  # a signal ending_on_signals turned into SystemExit, to end this process with at exit


@atexit.register  # at import, before most others: it runs after them (atexit's order is last in, first out)
def _end_by_pending_signal():
    """At the interpreter's exit, after a job was stopped by SIGTERM or SIGHUP: that signal again,
    at its default action, so the exit status names it (the shell's 143, ``timeout``'s report)."""
    if _PENDING:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(_PENDING[0], signal.SIG_DFL)
        os.kill(os.getpid(), _PENDING[0])


@contextlib.contextmanager
def _held_signals():
    """Ctrl-C, SIGTERM and SIGHUP held back inside the block and delivered again after it, to
    whatever handled them before (main thread only; one that was ignored stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *ENDING)}
    for sig, handler in before.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            os.kill(os.getpid(), sig)
