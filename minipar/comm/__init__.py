"""Communicators on real engines: ``minipar.init(backend="mpi" | "torch")``.

    comm = minipar.init("mpi")                    # NumPy arrays over MPI (mpi4py)
    comm = minipar.init("torch", device="cpu")    # torch tensors over gloo
    comm = minipar.init("torch", device="cuda")   # NCCL, or gloo with host staging (see torch_backend)
    comm = minipar.init("auto")                   # torch when torchrun started this process, else mpi

The MPI backend is imported only when asked for, the torch one likewise, so the NumPy path
works without torch installed.
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import re
import sys
import time
import traceback

from ..errors import UsageError
from ..trace import Tracer
from .base import Comm, Request, wait_all
from .malloc import keep_freed_memory
from .watchdog import Watchdog, new_report_dir, timeout_from_env

__all__ = ["init", "finalize", "Comm", "Request", "wait_all", "BACKENDS", "check_backend"]

BACKENDS = ("mpi", "torch")
_WORLD: dict[tuple, Comm] = {}


def _abort(code: int):
    """End every rank of the job now."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def started_by() -> str:
    """The backend a script's ``minipar.init("auto")`` takes: "torch" when torchrun started this
    process (torchrun's agent sets TORCHELASTIC_RUN_ID in every rank), else "mpi". A lab's demo
    uses it, so the same ``exercise.py`` runs under ``mpiexec ... python -m mpi4py`` and under
    ``torchrun``."""
    return "torch" if "TORCHELASTIC_RUN_ID" in os.environ else "mpi"


def check_backend(backend: str, device: str | None) -> str:
    """The device ``init`` will use for ``(backend, device)``; a ``UsageError`` when it cannot.

    Pure: ``minipar.launch`` calls it before starting any rank.
    """
    if backend not in BACKENDS:
        raise UsageError(f"backend={backend!r}: choose one of {BACKENDS}")
    if backend == "mpi" and device not in (None, "cpu"):
        raise UsageError(f"device={device!r}: the mpi backend computes on the CPU with NumPy")
    if device not in (None, "cpu", "cuda"):
        raise UsageError(f"device={device!r}: choose 'cpu' or 'cuda'")
    return device or "cpu"


def _end_job_on_uncaught(rank: int, size: int):
    """How a rank ends on an exception nobody caught (installed as ``sys.excepthook``).

    A ``UsageError`` (a mistake in what was asked for) prints one line, ``rank 3: error: ...``;
    so does a rank whose peer vanished (under torchrun, the ranks left behind by one that
    failed see gloo's "Connection closed by peer" before torchrun's agent stops them; "Connection
    reset by peer" where the peer was ended by a crash of its own: its report is the one to read).
    Anything else is a bug and prints its traceback once. Then, with more than one rank, the
    whole job ends at once (``MPI_Abort``, or exit under torchrun, whose agent stops the rest),
    so no other rank waits forever for this one, with or without ``python -m mpi4py``.
    """
    def hook(kind, value, tb):
        if issubclass(kind, UsageError):
            report = f"rank {rank}: error: {value}\n"
        elif issubclass(kind, RuntimeError) and _PEER_GONE.search(str(value)):
            said = _PEER_GONE.search(str(value)).group(0).lower()
            report = f"rank {rank}: stopped: another rank has ended (gloo: {said})\n"
        else:
            while tb is not None and _launching(tb.tb_frame.f_code.co_filename):
                tb = tb.tb_next  # start the traceback at the user's code
            report = f"rank {rank} raised:\n" + "".join(traceback.format_exception(kind, value.with_traceback(tb), tb))
        # one write: several ranks failing at once share mpiexec's stderr, and a report written
        # in pieces (as the default hook writes a traceback) interleaves with theirs mid-line
        sys.stderr.flush()
        _write_all(2, report.encode(errors="replace"))
        if size > 1:
            time.sleep(1.0)  # let mpiexec / torchrun forward these lines before the abort
            _abort(1)

    sys.excepthook = hook


_PEER_GONE = re.compile(r"Connection (closed|reset) by peer")
_CRASH_FILES: list = []  # kept open: faulthandler writes into it when the rank dies


def _stacks_on_crash(rank: int):
    """Under ``minipar.launch`` (``$MINIPAR_CRASH_DIR``): a rank that dies of a fatal signal (a C++
    abort in an engine's thread, as gloo's on a message larger than the buffer, or a segfault)
    writes every thread's Python stack to ``crash.<rank>`` there, and the launcher reports it like
    an exception: the user's line that was running, and the rank. Elsewhere nothing changes (who
    runs mpiexec or torchrun can set ``PYTHONFAULTHANDLER``)."""
    folder = os.environ.get("MINIPAR_CRASH_DIR")
    if not folder or faulthandler.is_enabled():
        return
    try:
        f = open(os.path.join(folder, f"crash.{rank}"), "w")
    except OSError:  # a rank on another host than the launcher: no folder to write to
        return
    _CRASH_FILES.append(f)
    faulthandler.enable(f, all_threads=True)


def _write_all(fd: int, data: bytes):
    while data:
        data = data[os.write(fd, data):]


def _launching(filename: str) -> bool:
    """A frame of what started the rank's code: runpy, ``python -m mpi4py``, minipar's worker."""
    return ("runpy" in filename or os.sep + "mpi4py" + os.sep in filename
            or filename.endswith(os.path.join("minipar", "_worker.py")))


def init(backend: str = "mpi", device: str | None = None, watchdog: float | None = None,
         trace: bool = False) -> Comm:
    """The world communicator of this process (created once, then returned again).

    backend:  "mpi" (NumPy buffers, mpi4py), "torch" (torch tensors, torch.distributed), or
              "auto": torch when torchrun started this process, else mpi (:func:`started_by`)
    device:   torch only: "cpu" (default) or "cuda"
    watchdog: seconds a rank may stay blocked in one call before the job is aborted with a
              report of what every rank waits on (default: $MINIPAR_WATCHDOG or 60; 0 = off)
    trace:    start with tracing on (``comm.tracer.enabled`` can be flipped at any time)
    """
    if backend == "auto":
        backend = started_by()
    device = check_backend(backend, device)
    key = (backend, device)
    if key in _WORLD:
        return _WORLD[key]
    keep_freed_memory()  # every rank, both backends: a step's temporaries reuse the last step's pages (malloc.py)
    timeout = timeout_from_env() if watchdog is None else float(watchdog)

    if backend == "mpi":
        from mpi4py import MPI

        from .mpi import MPIComm

        world = MPI.COMM_WORLD
        tracer = Tracer(world.rank, trace)
        wd_dir = world.bcast(new_report_dir() if world.rank == 0 else None, 0) if timeout > 0 else None
        wd = Watchdog(world.rank, world.size, timeout, wd_dir, _abort)
        comm = MPIComm(world, tracer, wd)
    else:
        comm = _init_torch(device, timeout, trace)
    if sys.excepthook.__module__ != __name__:
        _end_job_on_uncaught(comm.rank, comm.size)
        _stacks_on_crash(comm.rank)
    _WORLD[key] = comm
    return comm


ENGINE_TIMEOUT_MAX = 86400.0  # seconds


def _init_torch(device, timeout, trace):
    import datetime

    import torch
    import torch.distributed as dist

    from .torch_backend import TorchComm, choose_engine, rendezvous

    rank, size, local_rank = rendezvous()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or _local_size_mpi(size)
    engine, why = choose_engine(device, local_size)
    if why and rank == 0:
        sys.stderr.write(f"minipar: {why}\n")
    if device == "cuda":
        dev = f"cuda:{local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(dev)
    else:
        dev = "cpu"
    if not dist.is_initialized():
        # the engine's own timeout stays well above ours, so our watchdog reports first; at most a
        # day: torch keeps it in int64 nanoseconds, and a watchdog of 10^12 s (in effect: none)
        # overflowed them, after which every rendezvous "timed out" at once
        limit = datetime.timedelta(seconds=min(max(timeout * 4, 300), ENGINE_TIMEOUT_MAX) if timeout > 0 else 3600)
        dist.init_process_group(engine, rank=rank, world_size=size, timeout=limit)
        atexit.register(finalize)
    tracer = Tracer(rank, trace)
    boxed = [None]

    def bcast(obj):
        boxed[0] = obj
        dist.broadcast_object_list(boxed, src=0)
        return boxed[0]

    wd_dir = bcast(new_report_dir() if rank == 0 else None) if timeout > 0 else None
    wd = Watchdog(rank, size, timeout, wd_dir, _abort)
    return TorchComm(None, dev, engine, tracer, wd)


def _local_size_mpi(size):
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).size
    except Exception:
        return size


def finalize():
    """End this process's communicators while the interpreter is fully alive (``init`` also
    registers it to run at exit).

    torch: destroys every process group and makes sure each one is really gone, its gloo
    threads joined, before Python starts shutting down (see ``torch_backend.destroy_groups``:
    a group that outlived this call crashed about one torch job in 30-50 at exit). MPI
    finalizes itself at exit.
    """
    _WORLD.clear()
    if "torch.distributed" in sys.modules:
        from .torch_backend import destroy_groups

        destroy_groups()
