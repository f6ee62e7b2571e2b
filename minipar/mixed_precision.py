"""Adam on one flat 1-D array, in full or mixed precision, optionally offloaded to the host.

    opt = FlatAdam(param, init, lr=1e-3, mixed=True)   # param: float16 working copy (a shard)
    opt.step(param, grad)                               # grad (float16) -> fp32 Adam -> param

What DDP and every ZeRO stage run on the parameters they own: DDP on whole flat buckets, ZeRO on
one rank's shard of each flat layer. Adam is elementwise, so the shard of an update is the
update of the shard, bit for bit.

Bytes per parameter (the ZeRO paper's notation: 2 + 2 + K):

    precision  working params  grads  optimizer state (K)
    full       itemsize        itemsize  m, v in the param dtype: 2 x itemsize (16 for float64)
    mixed      2 (float16)     2      fp32 master + fp32 m + fp32 v = 4 + 4 + 4 = 12

Mixed precision: forward and backward run on the float16 working copy; the update happens on
the float32 master weights (a small update added to a float16 weight would round away), and
the new master is rounded back into the working copy. Real trainers add loss scaling against
float16 gradient underflow; our gradients are O(0.1), so it is left out. (bfloat16 would need
no scaling but NumPy has no bfloat16.)

Offload (ZeRO-Offload, ``offload="cpu"`` or True): master, m and v live on the host as NumPy
arrays; each step copies the gradient shard to the host, updates there, and copies the new
working values back. With the MPI backend everything is already on the host, so this only moves
the bookkeeping; with torch on CUDA it moves 12 bytes per owned parameter off the GPU.

NVMe offload (ZeRO-Infinity, ``offload="nvme"`` or ``offload=NVMe(path)``): master, m and v are
rows of a ``numpy.memmap``, a file on disk mapped into memory. The step updates them there, as
on the host, and flushes the file (``msync``): the state's home is the file, and the kernel
pages it in and out as the step touches it. The file lives in a temporary directory removed
with its ``NVMe`` store (or in a directory the user names: then only our files are removed).
The update is the same arithmetic on the same values, so it is bitwise the in-memory one.

Where the state lives, per parameter of the shard (``where``): "optimizer" (with the working
copy: device memory on a GPU), "host" (CPU RAM) or "file" (the disk).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np

from .optim import adam_step
from .xp import copy, from_numpy, namespace, to_numpy

LOW = "float16"  # the working dtype of mixed precision
MASTER = "float32"


class NVMe:
    """Where NVMe-offloaded optimizer state lives: memory-mapped files in ``path`` (default: a new
    temporary directory). ``close()`` (or garbage collection, or the end of the process) removes
    the files, and the directory when it made it."""

    def __init__(self, path=None):
        if path is not None and not os.path.isdir(path):
            from .errors import UsageError

            raise UsageError(f"--offload-dir {path}: not a directory")
        self.own = path is None
        self.path = tempfile.mkdtemp(prefix="minipar-nvme-") if self.own else path
        self.files = []
        self._finalizer = weakref.finalize(self, _remove, self.files, self.path if self.own else None)

    def array(self, rows: int, n: int, dtype) -> np.memmap:
        """A new (rows, n) array in a new file of rows x n x itemsize bytes, zero-filled."""
        fd, name = tempfile.mkstemp(dir=self.path, prefix="adam-", suffix=".state")
        os.close(fd)
        self.files.append(name)
        return np.memmap(name, dtype=dtype, mode="w+", shape=(rows, n))

    def bytes_on_disk(self) -> int:
        return sum(os.path.getsize(f) for f in self.files)

    def close(self):
        self._finalizer()


def _remove(files, directory):
    for f in files:
        if os.path.exists(f):
            os.remove(f)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def where(offload) -> str:
    """Where optimizer state lives for an ``offload`` setting: "optimizer", "host" or "file"."""
    if isinstance(offload, NVMe) or offload == "nvme":
        return "file"
    if offload in (False, None, "none"):
        return "optimizer"
    if offload in (True, "cpu"):
        return "host"
    raise ValueError(f"offload={offload!r}: choose False, 'cpu' (True) or 'nvme' (or an NVMe store)")


def working_dtype(like, mixed):
    """The dtype forward/backward run in: float16 when ``mixed`` is True, the dtype it names when
    it is a name ("bfloat16"), else the dtype of ``like``."""
    from .xp import dtype_named

    if not mixed:
        return like.dtype
    return dtype_named(LOW if mixed is True else mixed, like)


def astype(x, dtype):
    return namespace(x).astype(x, dtype)


class FlatAdam:
    """Adam state for one 1-D array: (master,) m, v. ``init`` holds the starting values in full
    precision (the master starts from them, not from their float16 rounding).
    """

    def __init__(self, param, init=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 mixed=False, offload=False):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.mixed, self.offload, self.steps = mixed, offload, 0
        self.where, self.file = where(offload), None
        init = param if init is None else init
        if self.where == "file":  # one file: rows master, m, v (float32 when mixed)
            store = offload if isinstance(offload, NVMe) else NVMe()
            self.store = store  # a store made here lives as long as this optimizer
            start = to_numpy(init)
            self.file = store.array(3, start.size, MASTER if mixed else start.dtype)  # (3, n) on disk
            self.file[0] = start
            self.master, self.m, self.v = self.file  # (n,) views of the mapped file
        elif offload:  # host NumPy arrays, float32 when mixed
            dt = MASTER if mixed else to_numpy(param).dtype
            self.master = np.array(to_numpy(init), dtype=dt)  # (n,) on the host
            self.m, self.v = np.zeros_like(self.master), np.zeros_like(self.master)
        elif mixed:
            f32 = getattr(namespace(param), MASTER)
            self.master = astype(copy(init), f32)  # (n,) fp32 master weights
            self.m, self.v = namespace(param).zeros_like(self.master), namespace(param).zeros_like(self.master)
        else:  # full precision: the working array is its own master
            self.master = None
            self.m, self.v = namespace(param).zeros_like(param), namespace(param).zeros_like(param)

    def arrays(self):
        """The arrays this optimizer holds (for the memory ledger; the file once, not its rows)."""
        if self.file is not None:
            return [self.file]
        return [a for a in (self.master, self.m, self.v) if a is not None]

    def step(self, param, grad):
        """One update: ``param`` (the working array, written in place) from ``grad`` (same shape)."""
        self.steps += 1
        hp = (self.steps, self.lr, self.betas, self.eps, self.weight_decay)
        if self.offload:
            g = np.asarray(to_numpy(grad), dtype=self.master.dtype)  # device -> host
            adam_step(self.master, g, self.m, self.v, *hp)
            param[...] = from_numpy(self.master, like=param)  # host -> device, rounded to param's dtype
            if self.file is not None:
                self.file.flush()  # the new state written back to the disk
        elif self.master is not None:
            adam_step(self.master, astype(grad, self.master.dtype), self.m, self.v, *hp)
            param[...] = astype(self.master, param.dtype)  # round the new master into the working copy
        else:
            adam_step(param, grad, self.m, self.v, *hp)
