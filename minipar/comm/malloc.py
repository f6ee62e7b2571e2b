"""Keep freed memory in the process: glibc's ``mallopt``, called once by every rank at start-up.

    keep_freed_memory()     # minipar.init calls it: every rank, both backends, any launcher
    probe()                 # {"mmapped": bytes of an 8 MiB temporary that got its own mmap, ...}

A training step makes the same temporaries every step: a (b, T, 4C) hidden layer, a
(b, nh, T, T) attention matrix, each a few MiB, freed a moment later. glibc's malloc serves a
block above ``M_MMAP_THRESHOLD`` (128 KiB at start, raised as such blocks are freed, to 32 MiB at
most) with its own ``mmap`` and gives it back with ``munmap`` on free; and it hands the top of the
heap back to the kernel once more than ``M_TRIM_THRESHOLD`` is free there. Either way the next
step's temporary lands on fresh pages, and the kernel zero-fills each 4 KiB page on its first
touch: a minor page fault per page, every step. Measured on one rank of the documented model
(docs/benchmarks_train.md): 289k faults in 7 steps without this, a few hundred with it, and the
same elementwise kernels twice as fast.

Setting both thresholds high keeps every freed block in the heap, where the next step's
temporary of the same size reuses it, already faulted in. This is what PyTorch's caching
allocator does on a GPU, where ``cudaMalloc``/``cudaFree`` cost far more than a page fault: it
keeps freed blocks by size and hands them out again, never returning them to the driver unless
asked (``torch.cuda.empty_cache``). The price is the same here: the process keeps its peak
memory until it exits.

Why ``mallopt`` at start-up, over the alternatives: ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` in the environment would reach only the ranks our own launcher starts
(not ``torchrun`` or a hand-typed ``mpiexec``); another allocator (jemalloc, tcmalloc via
``LD_PRELOAD``) is a dependency to install and must be loaded before Python starts; reusing
buffers by hand would touch every layer of every lesson. Every rank, on both backends, goes
through ``minipar.init``, and so does the one-process baseline of ``minipar bench train``: the
comparison stays fair. ``mallopt`` is glibc's: elsewhere (macOS, musl) this does nothing.
"""
from __future__ import annotations

import ctypes

from ..libc import glibc

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
# M_MMAP_THRESHOLD's documented ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX, mallopt(3)): blocks
# above it still get their own mmap; the trainer's temporaries at the documented size are a few MiB
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30  # hand the heap's top back only past 1 GiB free


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if glibc took both."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def probe(nbytes: int = 8 * 2**20) -> dict:
    """Allocate, touch and free an ``nbytes`` NumPy temporary; report where malloc put it:
    {"mmapped": bytes of it in blocks of their own mmap (0 with ``keep_freed_memory``), "faults":
    minor page faults of the second such temporary (0: it reused the first one's pages)}. Needs
    glibc >= 2.33 (``mallinfo2``); elsewhere {}."""
    import resource

    import numpy as np

    libc = glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _Mallinfo2
    before = libc.mallinfo2().hblkhd
    a = np.ones(nbytes // 8)  # (n,) float64, every page touched
    mmapped = libc.mallinfo2().hblkhd - before
    del a
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = np.ones(nbytes // 8)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    del b
    return {"mmapped": int(mmapped), "faults": int(faults)}


def probe_rank(comm, nbytes: int = 8 * 2**20) -> dict:
    """``probe`` on a launched rank (``launch(n, "minipar.comm.malloc:probe_rank")``)."""
    return probe(nbytes)
