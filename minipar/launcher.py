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
traceback. If ranks block (a deadlock, a send without its recv), the watchdog reports what each
waits on and ends the job, also as a :class:`LaunchError`.
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field


class LaunchError(RuntimeError):
    """A launched job failed; ``.output`` holds everything the ranks printed."""

    def __init__(self, message, output="", returncode=None):
        super().__init__(message)
        self.output, self.returncode = output, returncode


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
            raise ValueError(f"target={target!r}: expected 'package.module:function'")
        return target
    mod, name = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in name:
        raise ValueError("target must be importable by the ranks: pass 'module:function' or a "
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
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: the number of ranks must be a positive int")
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
        code, output = run_streaming(cmd, limit, echo=not quiet, env=rank_env())
        if code != 0 and os.path.exists(result_path) and teardown_abort_only(output):
            note = ("minipar: a torch rank aborted in gloo's teardown after the job had finished "
                    "(results complete; 'terminate called without an active exception')\n")
            sys.stderr.write(note)
            output, code = output + note, 0
        if code != 0 or not os.path.exists(result_path):
            raise LaunchError(f"{n}-rank job {spec['target']} failed (exit code {code}):\n"
                              f"{_tail(output)}", output, code)
        with open(result_path, "rb") as f:
            res = pickle.load(f)
        return LaunchResult(res["results"], res["trace"], output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def teardown_abort_only(output: str) -> bool:
    """True when the job's only trouble is gloo's abort at interpreter exit.

    Rank 0 writes the results only after every rank has returned from its function and
    passed the final barrier. Now and then a torch rank still aborts as Python shuts down:
    gloo's C++ threads can hold work objects whose tensors are released while the interpreter
    is being dismantled (reported upstream; it survives destroy_process_group here). Such a
    job is complete. Anything else in the output (a traceback, the watchdog) is a real failure.
    """
    return ("terminate called without an active exception" in output and "Traceback" not in output
            and "minipar watchdog" not in output)


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
    reader.join(timeout=5)
    return code, "".join(lines)


def _tail(text, n=40):
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-n:])
