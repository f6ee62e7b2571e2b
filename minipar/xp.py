"""Array helpers shared by every lesson: one code path for NumPy arrays and torch tensors.

Lesson code never asks "which backend am I on?". It asks its *inputs*:

    xp = namespace(x)            # array-API namespace (numpy, or torch via array-api-compat)
    y = empty((n, d), like=x)    # same dtype and device as x
    native(x).add(a, b, out=a)   # numpy / torch module, for the few in-place ops with out=

Nothing here imports torch: a torch tensor can only reach us if the caller already imported it.
"""
from __future__ import annotations

import sys

import numpy as np
from array_api_compat import array_namespace, device as _device


def is_torch(x) -> bool:
    """True if ``x`` is a torch tensor (checked without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def namespace(*arrays):
    """The array-API namespace of the inputs: ``array_api_compat.numpy`` or ``.torch``."""
    return array_namespace(*arrays)


def native(x):
    """The library module itself (``numpy`` or ``torch``): for ``out=`` in-place ops."""
    return sys.modules["torch"] if is_torch(x) else np


def device(x):
    """Device of ``x`` ("cpu" for NumPy)."""
    return _device(x)


def empty(shape, like, dtype=None):
    """Uninitialised array of ``shape`` with the dtype (default) and device of ``like``."""
    return namespace(like).empty(tuple(shape), dtype=dtype or like.dtype, device=device(like))


def zeros(shape, like, dtype=None):
    """Zero array of ``shape`` with the dtype (default) and device of ``like``."""
    return namespace(like).zeros(tuple(shape), dtype=dtype or like.dtype, device=device(like))


def copy(x):
    """A contiguous copy of ``x`` (``np.array(x)`` / ``x.clone()``)."""
    return x.clone().contiguous() if is_torch(x) else np.array(x, copy=True, order="C")


def contiguous(x):
    """``x`` itself if C-contiguous, else a contiguous copy (what send/recv need)."""
    if is_torch(x):
        return x.contiguous()
    return np.asarray(x, order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)


def is_contiguous(x) -> bool:
    return x.is_contiguous() if is_torch(x) else bool(x.flags.c_contiguous)


def flat(x):
    """A 1-D *view* of a contiguous array (raises if a view is impossible)."""
    if not is_contiguous(x):
        raise ValueError("expected a contiguous array; call minipar.xp.contiguous(x) first")
    return x.view(-1) if is_torch(x) else x.reshape(-1)


def nbytes(x) -> int:
    """Size of ``x`` in bytes."""
    return x.numel() * x.element_size() if is_torch(x) else int(x.nbytes)


def itemsize(x) -> int:
    return x.element_size() if is_torch(x) else int(x.itemsize)


def size(x) -> int:
    """Number of elements."""
    return x.numel() if is_torch(x) else int(x.size)


def dtype_named(name: str, like=None):
    """The dtype called ``name`` ("float64", "float32", "bfloat16", "float16") in the library of
    ``like``: torch's own, or NumPy's. NumPy has no bfloat16: ``ml_dtypes`` (made for exactly
    this) registers one, imported here the first time it is asked for."""
    if like is not None and is_torch(like):
        return getattr(sys.modules["torch"], str(name).replace("torch.", ""))
    if str(name) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def to_numpy(x) -> np.ndarray:
    """A NumPy copy/view of ``x`` on the host (for checks, plots and printing); a torch bfloat16
    tensor comes back as ml_dtypes' bfloat16 (NumPy has no bfloat16 of its own)."""
    if is_torch(x):
        torch = sys.modules["torch"]
        if x.dtype == torch.bfloat16:  # .numpy() refuses it: through float32, which holds it exactly
            return x.detach().cpu().float().numpy().astype(dtype_named("bfloat16"))
        return x.detach().cpu().numpy()
    return np.asarray(x)


def from_numpy(a: np.ndarray, like):
    """``a`` converted to the kind (numpy/torch), dtype and device of ``like``."""
    if is_torch(like):
        torch = sys.modules["torch"]
        a = np.asarray(a, order="C")
        if a.dtype == dtype_named("bfloat16"):  # torch cannot read ml_dtypes' bfloat16: float32 holds it exactly
            a = a.astype(np.float32)
        return torch.as_tensor(a, device=like.device).to(like.dtype)
    return np.asarray(a, dtype=like.dtype)


def like_kind(a: np.ndarray, like):
    """``a`` as an array of the kind (numpy/torch) and device of ``like``, keeping ``a``'s dtype
    (a bool mask stays 1 byte an element)."""
    if is_torch(like):
        torch = sys.modules["torch"]
        return torch.as_tensor(np.asarray(a, order="C"), device=like.device)
    return np.asarray(a)


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``p`` contiguous chunks like ``numpy.array_split``.

    The first ``n % p`` chunks get one extra element; when ``n < p`` the last chunks are
    empty. Every collective and every sharded optimizer in minipar uses this one rule, so
    "rank r owns chunk r" means the same thing everywhere.

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if p <= 0:
        raise ValueError(f"chunk_bounds: p must be positive, got {p}")
    q, r = divmod(n, p)
    bounds, start = [], 0
    for i in range(p):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def index_add(dst, index, src):
    """dst[index[i]] += src[i] for every i, repeated indices adding up (a scatter-add, in place).

    ``dst[index] += src`` would keep only one of the repeated rows; this is ``np.add.at`` /
    ``torch.Tensor.index_add_`` along axis 0. The backward of a row lookup ``w[index]``. ``src``
    may be 16-bit and ``dst`` a float32 main_grad (NumPy casts; torch is told to).
    """
    if is_torch(dst):
        dst.index_add_(0, index, src.to(dst.dtype))
    else:
        np.add.at(dst, index, src)
    return dst


def storage(x):
    """(key, bytes) of the memory block that ``x`` lives in (a view shares its base's key).

    Counting memory by storage, not by array object, counts a base array and its views once.
    """
    if is_torch(x):
        s = x.untyped_storage()
        return ("torch", s.data_ptr()), s.nbytes()
    while isinstance(x, np.ndarray) and isinstance(x.base, np.ndarray):
        x = x.base
    return ("numpy", id(x)), int(x.nbytes)
