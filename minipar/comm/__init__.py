"""Communicators on real engines: ``minipar.init(backend="mpi" | "torch")``.

    comm = minipar.init("mpi")                    # NumPy arrays over MPI (mpi4py)
    comm = minipar.init("torch", device="cpu")    # torch tensors over gloo
    comm = minipar.init("torch", device="cuda")   # NCCL, or gloo with host staging (see torch_backend)

The MPI backend is imported only when asked for, the torch one likewise, so the NumPy path
works without torch installed.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

from ..trace import Tracer
from .base import Comm, Request, wait_all
from .watchdog import Watchdog, timeout_from_env

__all__ = ["init", "finalize", "Comm", "Request", "wait_all", "BACKENDS"]

BACKENDS = ("mpi", "torch")
_WORLD: dict[tuple, Comm] = {}


def _abort(code: int):
    """End every rank of the job now."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def _report_dir(bcast, rank):
    """A folder every rank can see, for the watchdog's report (made by rank 0)."""
    path = tempfile.mkdtemp(prefix="minipar-wd-") if rank == 0 else None
    path = bcast(path)
    if rank == 0:
        atexit.register(shutil.rmtree, path, True)
    return path


def init(backend: str = "mpi", device: str | None = None, watchdog: float | None = None,
         trace: bool = False) -> Comm:
    """The world communicator of this process (created once, then returned again).

    backend:  "mpi" (NumPy buffers, mpi4py) or "torch" (torch tensors, torch.distributed)
    device:   torch only: "cpu" (default) or "cuda"
    watchdog: seconds a rank may stay blocked in one call before the job is aborted with a
              report of what every rank waits on (default: $MINIPAR_WATCHDOG or 60; 0 = off)
    trace:    start with tracing on (``comm.tracer.enabled`` can be flipped at any time)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
    if backend == "mpi" and device not in (None, "cpu"):
        raise ValueError(f"device={device!r}: the mpi backend computes on the CPU with NumPy")
    device = device or "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: choose 'cpu' or 'cuda'")
    key = (backend, device)
    if key in _WORLD:
        return _WORLD[key]
    timeout = timeout_from_env() if watchdog is None else float(watchdog)

    if backend == "mpi":
        from mpi4py import MPI

        from .mpi import MPIComm

        world = MPI.COMM_WORLD
        tracer = Tracer(world.rank, trace)
        wd_dir = _report_dir(lambda o: world.bcast(o, 0), world.rank) if timeout > 0 else None
        wd = Watchdog(world.rank, world.size, timeout, wd_dir, _abort)
        comm = MPIComm(world, tracer, wd)
    else:
        comm = _init_torch(device, timeout, trace)
    _WORLD[key] = comm
    return comm


def _init_torch(device, timeout, trace):
    import datetime

    import torch
    import torch.distributed as dist

    from .torch_backend import TorchComm, choose_engine, rendezvous

    rank, size, local_rank = rendezvous()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or _local_size_mpi(size)
    engine = choose_engine(device, local_size)
    if device == "cuda":
        dev = f"cuda:{local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(dev)
    else:
        dev = "cpu"
    if not dist.is_initialized():
        # the engine's own timeout stays well above ours, so our watchdog reports first
        limit = datetime.timedelta(seconds=max(timeout * 4, 300) if timeout > 0 else 3600)
        dist.init_process_group(engine, rank=rank, world_size=size, timeout=limit)
        atexit.register(_destroy)
    tracer = Tracer(rank, trace)
    boxed = [None]

    def bcast(obj):
        boxed[0] = obj
        dist.broadcast_object_list(boxed, src=0)
        return boxed[0]

    wd_dir = _report_dir(bcast, rank) if timeout > 0 else None
    wd = Watchdog(rank, size, timeout, wd_dir, _abort)
    return TorchComm(None, dev, engine, tracer, wd)


def _local_size_mpi(size):
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).size
    except Exception:
        return size


def _destroy():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def finalize():
    """End this process's communicators while the interpreter is fully alive.

    torch: destroys every process group. Left to interpreter exit, gloo's worker threads can
    still hold tensors when Python is being torn down, and the process aborts with "terminate
    called without an active exception". MPI finalizes itself at exit.
    """
    _WORLD.clear()
    if "torch.distributed" in sys.modules:
        import gc

        gc.collect()  # drop finished Work objects and their tensors before the groups go
        _destroy()
