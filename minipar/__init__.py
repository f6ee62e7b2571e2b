"""minipar: a from-scratch parallelism lab.

    comm = minipar.init(backend="mpi")            # under: mpiexec -n 4 python -m mpi4py script.py
    comm = minipar.init(backend="torch")          # under torchrun, or mpiexec with torch ranks
    out = minipar.launch(4, "minipar.lessons.collectives:demo")   # from Python / a notebook

``import minipar`` stays light: torch and matplotlib are imported only by the code that needs them.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["init", "launch", "LaunchError", "__version__"]


def init(backend: str = "mpi", **kwargs):
    """Create the world communicator (see :func:`minipar.comm.init`)."""
    from .comm import init as _init

    return _init(backend, **kwargs)


def launch(n: int, target, /, **kwargs):
    """Run ``target(comm, **kwargs)`` on ``n`` real ranks (see :func:`minipar.launcher.launch`)."""
    from .launcher import launch as _launch

    return _launch(n, target, **kwargs)


def __getattr__(name):
    if name == "LaunchError":
        from .launcher import LaunchError

        return LaunchError
    raise AttributeError(f"module 'minipar' has no attribute {name!r}")
