"""The C library, for the two calls minipar makes to it through ctypes.

    prctl()     # Linux's prctl(2), or None: launcher's mpiexec gets SIGTERM when its parent dies
    glibc()     # glibc itself, or None: comm/malloc's mallopt(3) and mallinfo2(3)

Two calls, two owners:

- ``prctl`` is a **Linux** system call (``PR_SET_PDEATHSIG``), reached through whatever C library
  the process runs on: glibc or musl alike export it. On macOS and other systems there is none,
  and ``prctl()`` returns None without loading anything.
- ``mallopt`` and ``mallinfo2`` are **glibc**'s: they tune and report glibc's own allocator. On
  musl (Alpine) or macOS the C library loads but has no ``gnu_get_libc_version``, and ``glibc()``
  returns None: freed memory goes back as that allocator decides.

Each caller then does nothing: no error, no warning, the same result as before minipar made the
call, only without the help it gives on glibc Linux.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys


def prctl():
    """The C library's ``prctl`` where there is one (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # the process's own C library
    except (OSError, AttributeError):
        return None


def glibc():
    """glibc, or None (another C library, or none found)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (raises AttributeError off glibc)
        return libc
    except (OSError, AttributeError):
        return None
