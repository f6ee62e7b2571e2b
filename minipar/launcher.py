"""Run a function on n real ranks from Python (a notebook, a test, the tour).

    >>> from minipar import launch
    >>> out = launch(4, "minipar.lessons.collectives:ring_walkthrough", n=8)
    >>> out.results[0]          # what rank 0's function returned
    >>> out.trace               # every rank's trace events on one clock (when trace=True)

Underneath it is ``mpiexec -n N python -m mpi4py -m minipar._worker SPEC``: real processes,
real MPI (or torch.distributed, rendezvous through MPI, with ``backend="torch"``). More ranks
than cores is fine (oversubscription). ``target`` is a ``"module:function"`` string or a
module-level function; it is called as ``target(comm, **kwargs)`` on every rank, and its
return value must be picklable.

If any rank raises, the job ends within seconds and :class:`LaunchError` carries that rank's
traceback, or, for a :class:`minipar.errors.UsageError`, its one line (``rank 3: error: ...``;
that error is then a ``UsageError`` too, so the command line prints it as one line). A rank that
dies of a fatal signal (an engine's C++ abort, a segfault) is reported the same way, from the
stacks it wrote as it died (:func:`crash_reports`).
If ranks block (a deadlock, a send without its recv), the watchdog reports what each waits on
and ends the job, also as a :class:`LaunchError`.

Nothing is left behind, whichever way the job ends: not a rank, not the launch folder, not the
file hydra keeps in /tmp. On the hard time limit, Ctrl-C, or SIGTERM / SIGHUP to this process
(a CI cancelling, ``timeout``, a closed terminal), ``minipar.supervision.stop`` ends the job the way
that lets mpiexec clean up; a SIGTERM or SIGHUP then ends this process as it would have (its exit
status says which signal), only later. This module builds the job and reads its results; keeping
its processes running and ending them is ``minipar.supervision``'s. The ranks' environment has no rendezvous of an outer torch job
(MASTER_PORT, RANK, ...): each job picks a free port of its own. docs/faults.md has the details.
"""
from __future__ import annotations

import contextlib
import linecache
import os
import pickle
import re
import shlex
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field

from .comm import _launching, check_backend
from .comm.watchdog import users
from .errors import UsageError
from .supervision import GRACE, Stopped, ending_on_signals, run_streaming, stop  # noqa: F401 (re-exported)


class LaunchError(RuntimeError):
    """A launched job failed; ``.output`` holds everything the ranks printed.

    ``.line`` is one line saying what went wrong, to print as is: ``rank 3: error: ...`` when a
    rank raised a ``UsageError`` (then ``.usage`` is True and the message is that line alone),
    else the watchdog's verdict, ``rank 2 raised KeyError: ...``, the hard time limit, or the
    exit code.
    """

    def __init__(self, message, output="", returncode=None, line=None, usage=False):
        super().__init__(message)
        self.output, self.returncode = output, returncode
        self.line, self.usage = line or str(message).splitlines()[0], usage


class RankUsageError(LaunchError, UsageError):
    """A rank raised a ``UsageError``: a LaunchError that is a UsageError as well, so whoever
    prints one line for a UsageError (the command line) prints this one as one line too."""


_USAGE = re.compile(r"^rank \d+: error: .*$", re.M)


def failure(n: int, target: str, code: int, output: str) -> LaunchError:
    """The LaunchError for a job that ended with exit code ``code``, its one line taken from
    what the ranks printed."""
    usage = _USAGE.search(output)
    if usage:
        return RankUsageError(usage.group(0), output, code, usage.group(0), usage=True)
    lines = [re.sub(r"^\[rank\d+\]: ", "", ln) for ln in output.splitlines()]  # torch's prefix
    if "minipar watchdog:" in output:
        line = next(ln for ln in lines if ln.startswith("minipar watchdog:")).split(" What every rank")[0]
    elif any(re.match(r"^rank \d+ raised:$", ln) for ln in lines):
        line = _exception_line(lines)
    elif any(_CRASH.match(ln) for ln in lines):  # crash_reports': its rank and its last line
        i = next(i for i, ln in enumerate(lines) if _CRASH.match(ln))
        last = next((ln for ln in lines[i + 1:] if ln and not ln.startswith((" ", "Traceback"))), "")
        line = f"{lines[i]} {last}".strip()
    elif code == 124:
        line = lines[-1]
    else:
        line = f"{n}-rank job {target} failed (exit code {code})"
    return LaunchError(f"{n}-rank job {target} failed (exit code {code}): {line}\n{_tail(output)}",
                       output, code, line)


def _exception_line(lines) -> str:
    """``rank 2 raised RuntimeError: ...`` from the first traceback a rank printed."""
    i = next(i for i, ln in enumerate(lines) if re.match(r"^rank \d+ raised:$", ln))
    for ln in lines[i + 1:]:
        if ln and not ln.startswith((" ", "Traceback")):
            return f"{lines[i][:-1]} {ln}"
    return lines[i][:-1] + " an exception"


_CRASH = re.compile(r"^rank (\d+) crashed:$")  # the first line of a rank's report in crash_reports
_FH_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def crash_reports(folder: str, n: int, output: str) -> str:
    """What the ranks that died of a fatal signal wrote into ``folder`` (``crash.<rank>``: Python's
    faulthandler, enabled by ``minipar.init`` under this launcher; an engine's C++ abort, as gloo's
    on a message larger than its buffer, or a segfault), each as a report like an exception's::

        rank 1 crashed:
        Traceback (most recent call last):
          File "exercise.py", line 7, in ring_pass
            return comm.sendrecv(x, right, buf, left)
          ...
        Fatal Python error: Aborted: gloo::EnforceNotMet: ... Received data size doesn't match ...

    The stack is the thread's that was running the user's code (the crash itself often happens in
    an engine's own thread, with no Python frame); the last line names the engine's exception when
    the ranks' ``output`` says which (only when a single rank crashed: the output is not per rank).
    "" when no rank crashed."""
    dumps = {}
    for r in range(n):
        with contextlib.suppress(OSError):
            with open(os.path.join(folder, f"crash.{r}")) as f:
                text = f.read()
            if text.strip():
                dumps[r] = text
    engine = re.search(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.*)", output)
    reports = []
    for r, text in dumps.items():
        fatal, threads = text.strip().splitlines()[0], []
        for block in re.split(r"\n\s*\n", text):
            if re.match(r"^(Current thread|Thread) 0x", block.strip()):
                frames = [m.groups() for m in map(_FH_FRAME.match, block.splitlines()) if m]
                threads.append((block.strip().startswith("Current"), frames[::-1]))  # most recent call last
        stacks = [fr for _, fr in sorted(threads, key=lambda t: not t[0])]  # the crashing thread's first
        frames = next((fr for fr in stacks if any(users(f) for f, _, _ in fr)), None) or next((fr for fr in stacks if fr), [])
        lines = [f"rank {r} crashed:", "Traceback (most recent call last):"]
        for path, lineno, func in frames:
            if path.startswith("<frozen") or _launching(path):  # as an exception's report: from the user's code on
                continue
            lines.append(f'  File "{path}", line {lineno}, in {func}')
            source = linecache.getline(path, int(lineno)).strip()
            if source:
                lines.append(f"    {source}")
        said = f": {engine.group(1)}: {engine.group(2).strip()}" if engine and len(dumps) == 1 else ""
        reports.append("\n".join(lines) + f"\n{fatal}{said}\n")
    return "".join(reports)


@dataclass
class LaunchResult:
    results: list  # one entry per rank
    trace: list = field(default_factory=list)  # merged minipar.trace.Event list
    output: str = ""  # what the ranks printed


def mpiexec() -> str:
    """The ``mpiexec`` of the MPI that mpi4py uses (the mpich wheel puts it next to python)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if not found:
        raise LaunchError("mpiexec not found: install the 'mpich' wheel (pip install mpich)")
    return found


def target_name(target) -> str:
    if isinstance(target, str):
        if ":" not in target:
            raise UsageError(f"target={target!r}: expected 'package.module:function'")
        return target
    mod, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in name:
        raise UsageError("target must be importable by the ranks: pass 'module:function' or a "
                         "module-level function (not one defined in __main__ or a notebook)")
    return f"{mod}:{name}"


def launch(n: int, target, /, *, backend: str = "mpi", device: str | None = None, trace: bool = False,
           watchdog: float | None = None, job_timeout: float | None = None, quiet: bool = False,
           on_line=None, via=None, env: dict | None = None, **kwargs) -> LaunchResult:
    """Run ``target(comm, **kwargs)`` on ``n`` ranks and collect each rank's return value.

    backend/device: as in :func:`minipar.init`. trace: record and merge every rank's events.
    watchdog: seconds before a blocked job is reported and aborted (default 60).
    job_timeout: hard wall-clock limit for the whole job (default: watchdog + 120 s).
    quiet: do not echo the ranks' output (it is still returned in ``.output``).
    on_line: called with each line the ranks print, as it arrives (a progress bar counts phases).
    via: ``via(n, rank_command) -> command`` starts the ranks another way than ``mpiexec -n n``
    (``minipar.cluster`` puts them on its nodes); env: variables the ranks get besides ours.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError(f"n={n!r}: the number of ranks must be a positive int")
    if check_backend(backend, device) == "cuda":  # a GPU that torch sees, before any rank starts
        from .comm.torch_backend import require_gpu

        require_gpu()
    if watchdog is None:
        from .comm.watchdog import timeout_from_env

        watchdog = timeout_from_env()
    spec = {"target": target_name(target), "kwargs": kwargs, "backend": backend, "device": device,
            "trace": trace, "watchdog": watchdog}
    with ending_on_signals():  # SIGTERM, SIGHUP: the folder goes before this process does
        tmp = tempfile.mkdtemp(prefix="minipar-launch-")
        try:
            spec_path, result_path = os.path.join(tmp, "spec.pkl"), os.path.join(tmp, "result.pkl")
            with open(spec_path, "wb") as f:
                pickle.dump(spec, f)
            ranks = [sys.executable, "-m", "mpi4py", "-m", "minipar._worker", spec_path, result_path]
            cmd = via(n, ranks) if via else [mpiexec(), "-n", str(n), *ranks]
            limit = job_timeout or ((watchdog or 600) + 120)
            env = {**rank_env(), **(env or {})}
            env["MINIPAR_WATCHDOG_DIR"] = tmp  # a watchdog report folder dies with this one
            env["MINIPAR_CRASH_DIR"] = tmp  # where a rank that dies of a fatal signal writes its stacks
            code, output = run_streaming(cmd, limit, echo=not quiet, env=env, on_line=on_line)
            if code != 0 or not os.path.exists(result_path):
                raise failure(n, spec["target"], code, output + crash_reports(tmp, n, output))
            with open(result_path, "rb") as f:
                res = pickle.load(f)
            return LaunchResult(res["results"], res["trace"], output)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# torchrun's rendezvous: inherited from an outer job (or a shell profile), it would make every
# job meet on one port (two at once: "address already in use") or take the ranks for torchrun's
RENDEZVOUS = ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def rank_env(env=None) -> dict:
    """The ranks' environment: ours, with one BLAS thread per rank unless set otherwise, without
    torchrun's rendezvous variables (under mpiexec rank 0 picks a free port for each job; who
    runs torchrun themselves gets torchrun's), and naming the job's command (``MINIPAR_JOB``).

    Ranks are often more than cores here; several BLAS threads per rank would fight over them.
    """
    env = dict(os.environ if env is None else env)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    for var in RENDEZVOUS:
        env.pop(var, None)
    env["MINIPAR_JOB"] = this_process()
    return env


@contextlib.contextmanager
def job_settings(variables: dict):
    """``variables`` (name: value; None leaves a name alone) in this process's environment for the
    duration, and so in every job launched inside (``rank_env`` copies it) and in a rank run in
    this very process (``minipar.init`` reads them as every rank does): ``minipar --watchdog`` and
    ``--link`` reach the ranks this way. Afterwards ``os.environ`` is as it was: a caller of
    ``minipar.cli.main`` in-process does not keep them for its later jobs."""
    changes = {k: str(v) for k, v in variables.items() if v is not None}
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def this_process() -> str:
    """``pid 123 on host: command line``: who started a job, in one line (a checkpoint's lock
    names its holder this way)."""
    program, *args = sys.argv or [""]
    if os.path.basename(program) == "__main__.py":  # python -m package
        command = ["python", "-m", os.path.basename(os.path.dirname(program))]
    else:
        command = [os.path.basename(program)]
    return f"pid {os.getpid()} on {socket.gethostname()}: {shlex.join(command + args)}"


def _tail(text, n=40):
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:])
