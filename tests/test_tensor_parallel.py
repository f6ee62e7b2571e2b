"""Tensor parallelism: shard arithmetic here; every layer on 1, 2, 3, 4, 8 real MPI ranks against
the dense model (one launch per world size runs all of ``minipar.lessons.tensor_parallel:verify``).

Torch-backend checks (gloo, DTensor) are in test_tensor_parallel_torch.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minipar import launch, nn
from minipar import tensor_parallel as tp
from minipar.lessons.tensor_parallel import summarize


def failures(rows):
    return [f"{r['what']}: error {r['error']:.2e} > {r['tolerance']:.0e}" for r in rows if not r["ok"]]


# --------------------------------------------------------------------------- tier 1: pure functions


def test_shard_takes_chunk_r_along_the_axis():
    a = np.arange(24.0).reshape(4, 6)
    assert np.array_equal(tp.shard(a, 3, 1), a[:, 2:4])
    assert np.array_equal(tp.shard(a, 2, 1, axis=0), a[2:])
    assert tp.shard(a, 3, 0).flags.c_contiguous


def test_uneven_split_names_the_dimension_and_p():
    with pytest.raises(ValueError, match=r"d_out=7 is not divisible by the tensor-parallel size p=2"):
        tp.shard(np.zeros((3, 7)), 2, 0, what="d_out")
    with pytest.raises(ValueError, match=r"n_heads=6 .* p=4"):
        tp.check_divisible(6, 4, "n_heads")


def test_summa_loop_equals_the_product():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 9)), rng.standard_normal((9, 4))
    for q in (1, 3):
        np.testing.assert_allclose(tp.summa_dense(a, b, q), a @ b, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="k \\(columns of A\\)=9 .* p=2"):
        tp.summa_dense(a, b, 2)


def test_activation_bytes_skips_parameters():
    rng = np.random.default_rng(1)
    ln = nn.LayerNorm(8)
    _, ctx = ln.forward(rng.standard_normal((2, 3, 8)))
    assert tp.activation_bytes(ctx, ln) == (2 * 3 * 8 + 2 * 3) * 8  # xhat + rstd, not gamma
    assert tp.activation_bytes(ctx) == (2 * 3 * 8 + 2 * 3 + 8) * 8


# --------------------------------------------------------------------------- tier 2: real ranks


@pytest.mark.mpi
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_every_check_passes_on_n_ranks(n):
    dtypes = ("float64",) if n == 8 else ("float64", "float32")  # 8 ranks on 2 cores: keep it cheap
    out = launch(n, "minipar.lessons.tensor_parallel:verify", quiet=True, dtypes=dtypes, watchdog=60)
    rows = summarize(out.results)
    assert not failures(rows), "\n".join(failures(rows))
    assert all(r["tolerance"] in (0.0, 1e-12, 1e-5) for r in rows)  # float64: 1e-12, float32: 1e-5
    whats = " | ".join(r["what"] for r in rows)
    # what must have been checked at this world size
    assert "Megatron MLP forward: 1 all_reduce" in whats and "Megatron MLP backward: 1 all_reduce" in whats
    assert ("SUMMA on a" in whats) == (n in (1, 4)) and ("2x2 blocks" in whats) == (n == 4)
    assert ("not divisible" in whats) == (n > 1)
    # sequence parallelism: LayerNorm activations per rank divided by exactly p (measured bytes)
    ln = next(r["what"] for r in rows if r["what"].startswith("LayerNorm activations"))
    sp_bytes, tp_bytes = [int(w) for w in ln.split() if w.isdigit()][:2]
    assert tp_bytes == n * sp_bytes
    # a world size SUMMA cannot use is refused on every rank, not only on rank 0
    if n in (2, 3, 8):
        for rank_rows in out.results:
            refused = [r for r in rank_rows if r["what"].startswith(f"SUMMA on p={n}")]
            assert len(refused) == len(dtypes) and all(r["ok"] and "square" in r["what"] for r in refused)


# --------------------------------------------------------------------------- the checks can fail


def planted_bugs(comm):
    """Rank side: run the float64 checks once per planted bug; {bug: [failing rows]}."""
    from minipar.lessons.tensor_parallel import verify_dtype
    from minipar.nn import functional as F
    from minipar.tensor_parallel import layers as L
    from minipar.tensor_parallel import ops

    def bias_before_all_reduce(self, x):  # RowParallelLinear.forward with the bias on every rank
        if not self.input_is_parallel:
            x = ops.split_forward(self.comm, x)
        y, lin = F.linear_forward(x, self.params["w"], self.params["b"])
        y = ops.sp_scatter_forward(self.comm, y) if self.sp else ops.g_forward(self.comm, y)
        return y, {"linear": lin}

    good_shard = L.ColumnParallelLinear.shard

    def wrong_shard(self, name, full):  # ColumnParallelLinear.shard taking rank r+1's columns
        real = self.comm
        self.comm = SimpleNamespace(size=real.size, rank=(real.rank + 1) % real.size)
        try:
            return good_shard(self, name, full)
        finally:
            self.comm = real

    def ln_grads_not_reduced(self, dy, ctx):  # SequenceParallelLayerNorm without its all-reduce
        nn_ln = L.nn.LayerNorm.backward_weight
        nn_ln(self, dy, ctx)

    bugs = {"bias_before_all_reduce": (L.RowParallelLinear, "forward", bias_before_all_reduce),
            "no_all_reduce_of_dx": (ops, "f_backward", lambda comm, dx: dx),
            "wrong_shard": (L.ColumnParallelLinear, "shard", wrong_shard),
            "sp_layernorm_grads_not_reduced": (L.SequenceParallelLayerNorm, "backward_weight", ln_grads_not_reduced)}
    out = {}
    for bug, (owner, attr, fake) in bugs.items():
        good = getattr(owner, attr)
        setattr(owner, attr, fake)
        try:
            out[bug] = [r["what"] for r in verify_dtype(comm, "float64") if not r["ok"]]
        finally:
            setattr(owner, attr, good)
    return out


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_planted_bugs_are_caught():
    caught = launch(2, "tests.test_tensor_parallel:planted_bugs", quiet=True).results[0]
    expect = {"bias_before_all_reduce": "RowParallelLinear(input_is_parallel=True): output",
              "no_all_reduce_of_dx": "ColumnParallelLinear(gather_output=False): input gradient",
              "wrong_shard": "ColumnParallelLinear(gather_output=False): output",
              "sp_layernorm_grads_not_reduced": "SP block: 12 weight-gradient shards (worst ln"}  # ln1 or ln2
    for bug, row in expect.items():
        assert any(w.startswith(row) for w in caught[bug]), f"{bug} went unnoticed: {caught[bug]}"
    assert "Megatron MLP backward: 0 all_reduce (expected 1)" in caught["no_all_reduce_of_dx"]
    assert "SP block backward: 0 all_reduce (expected 2)" in caught["sp_layernorm_grads_not_reduced"]
