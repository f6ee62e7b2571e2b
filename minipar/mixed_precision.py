"""Mixed precision's vocabulary, and Adam on one flat 1-D array in full or mixed precision, optionally offloaded.

    pol = policy("bf16")        # compute "bfloat16", master "float32": mixed; policy("fp64") is not
    pol.scaled                  # whether the loss is scaled: fp16 only
    opt = FlatAdam(param, init, lr=1e-3, mixed=True)   # param: a 16-bit working copy (a shard)
    opt.step(param, grad)                               # grad -> fp32 Adam on the master -> param

The one set of precision names (``PRECISIONS``), the dtype each computes in (``COMPUTE``), the one
master dtype of the 16-bit ones (``MASTER``), and ``Policy``, the object the engines
(``minipar.data_parallel``, ``minipar.zero``) and the trainer (``minipar.train``) take:

    precision  computes in   master weights, Adam state   mixed   loss scaled
    fp64       float64       - (the weights)              no      no
    fp32       float32       - (the weights)              no      no
    bf16       bfloat16      float32                      yes     no (float32's exponent range)
    fp16       float16       float32                      yes     yes (range 6e-5 ... 65504)

(``minipar.memory.Precision`` is the planner's table of the bytes per parameter, in Megatron's
convention: it names the weights' and the gradients' dtypes, fp8 included.)

What DDP and every ZeRO stage run on the parameters they own: DDP on whole flat buckets, ZeRO on
one rank's shard of each flat layer. Adam is elementwise, so the shard of an update is the
update of the shard, bit for bit.

Bytes per parameter (the ZeRO paper's notation: 2 + 2 + K):

    precision  working params  grads  optimizer state (K)
    full       itemsize        itemsize  m, v in the param dtype: 2 x itemsize (16 for float64)
    mixed      2 (16 bits)     2      fp32 master + fp32 m + fp32 v = 4 + 4 + 4 = 12

Mixed precision: forward and backward run on the 16-bit working copy; the update happens on the
float32 master weights (a small update added to a 16-bit weight would round away), and the new
master is rounded back into the working copy. fp16's narrow range needs the loss scaled against
gradient underflow: the trainer's dynamic loss scale (``minipar.train.precision.LossScaler``);
lesson 04's engines run fp16 unscaled, their gradients are O(0.1). bfloat16 needs no scale; on
NumPy it comes from ``ml_dtypes`` (``minipar.xp.dtype_named``).

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
from dataclasses import dataclass

import numpy as np

from .errors import UsageError
from .optim import adam_step
from .xp import copy, from_numpy, namespace, to_numpy

PRECISIONS = ("fp64", "fp32", "bf16", "fp16")  # the precisions a run computes in: the one list
COMPUTE = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # the dtype each computes in
MASTER = "float32"  # the master dtype of every 16-bit precision: gradients (main_grad), master weights, Adam's state
BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}  # bytes of an element of each dtype


@dataclass(frozen=True)
class Policy:
    """One precision: ``compute`` (the dtype of the weights and activations), ``master`` (of the
    gradients, master weights and Adam's state), ``mixed`` (the two differ), ``scaled`` (the
    loss is scaled: fp16 alone, whose range is too narrow for small gradients)."""

    name: str

    @property
    def compute(self) -> str:
        return COMPUTE[self.name]

    @property
    def mixed(self) -> bool:
        """16 bits: a 16-bit working copy beside float32 master weights."""
        return self.compute in ("bfloat16", "float16")

    @property
    def master(self) -> str:
        return MASTER if self.mixed else self.compute

    @property
    def compute_bytes(self) -> int:
        """Bytes of an element in the compute dtype: a weight, an activation, a message over tp, pp, cp."""
        return BYTES[self.compute]

    @property
    def master_bytes(self) -> int:
        """Bytes of an element in the master dtype: a main_grad element, reduced over dp and emb."""
        return BYTES[self.master]

    @property
    def scaled(self) -> bool:
        """Whether the loss is scaled: fp16 only (bf16 has float32's exponent range)."""
        return self.name == "fp16"

    def why_unscaled(self) -> str:
        """Why this precision scales no loss, in a few words (a refusal's reason)."""
        return ("bf16 has float32's exponent range: its gradients need no scale" if self.name == "bf16"
                else f"{self.name} is no 16-bit precision")


def policy(name) -> Policy:
    """The ``Policy`` of a precision's name (a ``Policy`` is returned as it is); a UsageError naming
    the choices for any other name."""
    if isinstance(name, Policy):
        return name
    if name not in PRECISIONS:
        raise UsageError(f"--precision={name!r}: choose one of {', '.join(PRECISIONS)}")
    return Policy(name)


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


def working_dtype(like, precision=None):
    """The dtype forward and backward run in, on ``like``'s backend: a mixed ``precision``'s
    compute dtype (bf16: bfloat16, fp16: float16), else ``like``'s own (the weights are their
    own master, in the dtype they were built in)."""
    from .xp import dtype_named

    pol = policy(precision) if precision is not None else None
    if pol is None or not pol.mixed:
        return like.dtype
    return dtype_named(pol.compute, like)


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
