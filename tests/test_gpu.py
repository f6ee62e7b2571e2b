"""The torch backend on a CUDA GPU (``gpu``-marked: they run where torch sees a GPU, and are
skipped elsewhere), and what a machine without one answers when a command asks for it.

On one GPU every rank shares the device: the ranks compute there and communicate through gloo
with host staging (``comm.torch_backend.choose_engine``). docs/gpu.md has the measured runs.
"""
from __future__ import annotations

import functools
import json

import pytest

from .conftest import has_cuda, minipar


minipar = functools.partial(minipar, timeout=600)  # this file's jobs' limit


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_the_tour_on_cuda(tmp_path):
    """Every lesson's checks and figure runs with the ranks on the GPU: a NumPy call on a device
    tensor anywhere in a check or a figure fails it (three did, before ``to_numpy``)."""
    out = minipar("tour", "--backend", "torch", "--device", "cuda", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "all checks passed" in out.stdout


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", ["fp64", "fp32", "bf16", "fp16"])
def test_train_on_cuda_equals_one_process(precision):
    out = minipar("train", "-n", "4", "--dp", "2", "--tp", "2", "--backend", "torch", "--device", "cuda",
                  "--precision", precision, "--steps", "3", "--compare")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "(ok, tolerance" in out.stdout


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_the_allocator_keeps_what_the_ledger_counts(tmp_path):
    """ZeRO-1 keeps exactly its ledger on the GPU (and one allocator block); DDP, the first to multiply, keeps the ledger plus
    cuBLAS's workspace, which the caching allocator holds from then on."""
    path = tmp_path / "gpu.json"
    out = minipar("bench", "gpu", "-n", "2", "--json", str(path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    zero = json.loads(path.read_text())["zero"]
    for r in zero:
        ledger = sum(r["ledger"].values())
        if r["stage"] == 1:  # + the engine's one-element ``like``: one 512-byte block of the allocator
            assert 0 < r["alloc"]["kept"] - ledger <= 512, r
        if r["stage"] == 0:
            assert r["alloc"]["kept"] > ledger, r


@pytest.mark.slow
@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU: the refusal is for machines without one")
@pytest.mark.parametrize("args", [["train", "--backend", "torch", "--device", "cuda", "--steps", "1"],
                                  ["bench", "gpu"]])
def test_asking_for_a_gpu_where_there_is_none_is_one_line(args):
    pytest.importorskip("torch")
    out = minipar(*args, timeout=120)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0], out.stderr


def test_cuda_needs_the_torch_backend():
    out = minipar("train", "--device", "cuda", "--steps", "1", timeout=120)
    assert out.returncode == 2 and "mpi backend computes on the CPU" in out.stderr, out
    assert len(out.stderr.strip().splitlines()) == 1
