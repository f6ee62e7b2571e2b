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
traceback, or, for a :class:`minipar.errors.UsageError`, its one line (``rank 3: error: ...``).
If ranks block (a deadlock, a send without its recv), the watchdog reports what each waits on
and ends the job, also as a :class:`LaunchError`. Nothing is left behind in the temporary
directory, whichever way the job ends.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

from .comm import check_backend
from .errors import UsageError


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


_USAGE = re.compile(r"^rank \d+: error: .*$", re.M)


def failure(n: int, target: str, code: int, output: str) -> LaunchError:
    """The LaunchError for a job that ended with exit code ``code``, its one line taken from
    what the ranks printed."""
    usage = _USAGE.search(output)
    if usage:
        return LaunchError(usage.group(0), output, code, usage.group(0), usage=True)
    lines = [re.sub(r"^\[rank\d+\]: ", "", ln) for ln in output.splitlines()]  # torch's prefix
    if "minipar watchdog:" in output:
        line = next(ln for ln in lines if ln.startswith("minipar watchdog:")).split(" What every rank")[0]
    elif any(re.match(r"^rank \d+ raised:$", ln) for ln in lines):
        line = _exception_line(lines)
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
           **kwargs) -> LaunchResult:
    """Run ``target(comm, **kwargs)`` on ``n`` ranks and collect each rank's return value.

    backend/device: as in :func:`minipar.init`. trace: record and merge every rank's events.
    watchdog: seconds before a blocked job is reported and aborted (default 60).
    job_timeout: hard wall-clock limit for the whole job (default: watchdog + 120 s).
    quiet: do not echo the ranks' output (it is still returned in ``.output``).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError(f"n={n!r}: the number of ranks must be a positive int")
    check_backend(backend, device)
    if watchdog is None:
        from .comm.watchdog import timeout_from_env

        watchdog = timeout_from_env()
    spec = {"target": target_name(target), "kwargs": kwargs, "backend": backend, "device": device,
            "trace": trace, "watchdog": watchdog}
    tmp = tempfile.mkdtemp(prefix="minipar-launch-")
    try:
        spec_path, result_path = os.path.join(tmp, "spec.pkl"), os.path.join(tmp, "result.pkl")
        with open(spec_path, "wb") as f:
            pickle.dump(spec, f)
        cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "minipar._worker",
               spec_path, result_path]
        limit = job_timeout or ((watchdog or 600) + 120)
        env = rank_env()
        env["MINIPAR_WATCHDOG_DIR"] = tmp  # a watchdog report folder dies with this one
        code, output = run_streaming(cmd, limit, echo=not quiet, env=env)
        if code != 0 or not os.path.exists(result_path):
            raise failure(n, spec["target"], code, output)
        with open(result_path, "rb") as f:
            res = pickle.load(f)
        return LaunchResult(res["results"], res["trace"], output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rank_env(env=None) -> dict:
    """The ranks' environment: ours, with one BLAS thread per rank unless set otherwise.

    Ranks are often more than cores here; several BLAS threads per rank would fight over them.
    """
    env = dict(os.environ if env is None else env)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def run_streaming(cmd, limit: float, echo: bool = True, env=None):
    """Run ``cmd``, echoing its output live, killing it after ``limit`` seconds.

    Returns (exit code, combined output). Exit code 124 means we killed it on the time limit.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env, start_new_session=True)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        lines.append(f"minipar: job killed after {limit:g} s (hard time limit)\n")
        code = 124
    except BaseException:  # Ctrl-C, or any error here: no rank outlives the call
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    reader.join(timeout=5)
    return code, "".join(lines)


def _tail(text, n=40):
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:])
