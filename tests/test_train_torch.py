"""Lesson 05 on the torch backend (gloo): the same code on torch tensors gives one process's losses."""
import pytest

from minipar import launch
from minipar.lessons.common import merge_rows
from minipar.lessons.train import SHORT

TORCH_GRIDS = [
    dict(dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True, recompute="selective",
         dropout=0.2),  # NumPy's Philox masks on torch tensors: the same as one process's
    dict(dp=2, pp=1, tp=2, microbatches=2, zero=1, recompute="full", dropout=0.2),  # replayed inside B
    dict(dp=2, pp=2, tp=1, schedule="interleaved", microbatches=2, precision="fp32", zero=3),  # FSDP with PP
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, sequence_parallel=True, dropout=0.2),  # zigzag rows, the ring and its masks
]


@pytest.mark.mpi
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_representative_grids_on_torch_gloo():
    pytest.importorskip("torch")
    out = launch(4, "minipar.lessons.train:check_grids", backend="torch", quiet=True, job_timeout=600,
                 configs=TORCH_GRIDS, steps=5)
    rows = merge_rows(out.results)
    assert len(rows) == 4 * len(TORCH_GRIDS) - 2  # no tied copies on the pp = 1 grids
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert [r["tolerance"] for r in rows if "float32" in r["what"] and "losses" in r["what"]] == [1e-5]
