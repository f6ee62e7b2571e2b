"""Tensor parallelism on the torch backend (gloo, CPU): the same lesson code as on MPI, checked
against the dense NumPy model, against the NumPy run itself, and against PyTorch's own tensor
parallelism (DTensor ``ColwiseParallel`` / ``RowwiseParallel``)."""
from __future__ import annotations

import numpy as np
import pytest

from minipar import launch
from minipar.lessons.tensor_parallel import summarize

pytest.importorskip("torch")

pytestmark = [pytest.mark.mpi, pytest.mark.torch]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 4])
def test_torch_backend_passes_every_check_and_matches_torch_tp(n):
    """float64 and float32 lesson checks, plus minipar's Megatron MLP vs torch's DTensor TP."""
    dtypes = ("float64", "float32") if n == 2 else ("float64",)
    out = launch(n, "minipar.lessons.tensor_parallel:verify", backend="torch", quiet=True, dtypes=dtypes,
                 torch_tp=True, watchdog=90)
    rows = summarize(out.results)
    bad = [f"{r['what']}: {r['error']:.2e} > {r['tolerance']:.0e}" for r in rows if not r["ok"]]
    assert not bad, "\n".join(bad)
    torch_rows = [r for r in rows if r["what"].startswith("torch TP MLP")]
    assert len(torch_rows) == 6 and all(r["tolerance"] == 1e-12 for r in torch_rows)


@pytest.mark.timeout(180)
def test_torch_backend_equals_numpy_backend():
    """The same Megatron MLP step on both backends: every rank's arrays agree to 1e-12 (float64)."""
    on_mpi = launch(2, "minipar.lessons.tensor_parallel:megatron_mlp_step", quiet=True).results
    on_torch = launch(2, "minipar.lessons.tensor_parallel:megatron_mlp_step", backend="torch", quiet=True).results
    for rank, (a, b) in enumerate(zip(on_mpi, on_torch)):
        assert a.keys() == b.keys()
        for name in a:
            scale = np.max(np.abs(a[name]))
            err = np.max(np.abs(a[name] - b[name])) / scale
            assert a[name].shape == b[name].shape and err <= 1e-12, f"rank {rank} {name}: {err:.2e}"
