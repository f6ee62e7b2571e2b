"""Lesson 05 in mixed precision (``--precision``): 16-bit compute, float32 main_grad and master weights,
fp16's loss scale decided by every rank together; equal to one process at the same precision and to
float64 within the dtype's tolerance (``minipar.train.precision.tolerances``, docs/train.md)."""
import numpy as np
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, SHORT, make_config
from minipar.train.config import check_shapes
from minipar.train.precision import LossScaler, running_sum, tolerances

from .conftest import minipar

# the grids: every axis once, each kind of parameter the found-inf flag and the norm must reach
GRIDS = [
    dict(model=SHORT, dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2, precision="bf16"),
    # fp16 from a scale that overflows: every rank skips the steps one process skips, then trains
    dict(model=SHORT, dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2, precision="fp16",
         initial_scale=2.0**20, growth_interval=2, clip=0.5),
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, sequence_parallel=True, recompute="full", precision="bf16"),
    # every expert chosen (top-k = E): in 16 bits a last-bit difference of the activations (another
    # reduction order) moves a token between nearly tied experts on any grid; the norm and the flag
    # must still reach the experts' gradients. tp1: on tp2 the norm drifts past u by step 2 (docs/train.md)
    dict(model=dict(MOE, top_k=MOE["n_experts"]), dp=2, pp=1, tp=1, microbatches=2, zero=1, precision="bf16", clip=0.5),
]


@pytest.fixture(scope="module")
def comm():
    import minipar

    return minipar.init("mpi", watchdog=0)


def test_a_bf16_running_sum_loses_the_micro_batches_that_float32_keeps():
    """The number in precision.py's docstring: 64 micro-batch gradients of 0.003 added to 1.0."""
    terms = [1.0] + [0.003] * 64
    assert running_sum(terms, "bfloat16") == 1.0
    assert running_sum(terms, "float32") == pytest.approx(1.192, abs=1e-4)


def test_the_loss_scaler_backs_off_and_grows_as_torchs_grad_scaler():
    s = LossScaler(2.0**16, growth_interval=2)
    for inf, want in ((False, 2.0**16), (False, 2.0**17), (True, 2.0**16), (False, 2.0**16), (False, 2.0**17)):
        s.update(inf)
        assert s.scale == want


@pytest.mark.parametrize("kw, flag", [
    (dict(precision="fp8"), "--precision"),
    (dict(precision="fp16", loss_scale="static"), "--loss-scale static"),
    (dict(precision="fp16", initial_scale=1000.0), "--initial-scale"),
    (dict(precision="fp16", growth_interval=0), "--growth-interval"),
])
def test_bad_precision_settings_are_refused_in_one_line(kw, flag):
    with pytest.raises(UsageError, match=flag) as err:
        check_shapes(make_config(model=SHORT, **kw), 1)
    assert "\n" not in str(err.value)


def ledger(comm, precision, zero=0, mutant=None):
    """(weights' dtypes, gradients' dtypes, [(bytes per parameter, the planner's), ...],
    [(measured, predicted) params/grads/optimizer bytes, ...]) of a trainer after one step."""
    from minipar.memory import Precision
    from minipar.train.mutants import planted
    from minipar.train.trainer import Trainer

    keys = ("params_bytes", "grads_bytes", "optimizer_bytes")
    with planted(mutant):
        tr = Trainer(comm, make_config(model=SHORT, precision=precision, zero=zero, microbatches=2))
        tr.step(0)
    with tr.gathered():  # ZeRO-3: the weights exist whole only gathered
        weights = {str(a.dtype) for st in tr.stages.values() for _, a in st.named_parameters()}
    table = Precision(precision, "fp32").bytes
    return (weights, {str(g.dtype) for g in tr.grads()}, [(e.bytes_per_param(), table) for e in tr.engines],
            [([e.measured_memory()[k] for k in keys], [e.predicted_memory()[k] for k in keys]) for e in tr.engines])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("precision, weights, grads", [("bf16", "bfloat16", "float32"), ("fp16", "float16", "float32"),
                                                       ("fp32", "float32", "float32")])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_weights_are_16_bit_the_gradients_float32_and_the_bytes_the_planners(comm, precision, weights, grads, zero):
    """The trainer's ledger to the byte: zero_bytes with the engine's bytes per parameter, which are
    the planner's ``Precision`` table (bf16: 2 + 4 + 12 = 18, fp32: 4 + 4 + 8 = 16)."""
    got_weights, got_grads, per_param, bytes_ = ledger(comm, precision, zero)
    assert got_weights == {weights}
    assert got_grads == {grads}  # main_grad: every micro-batch added in float32
    assert all(mine == table for mine, table in per_param)
    assert all(measured == predicted for measured, predicted in bytes_)


@pytest.mark.timeout(60)
def test_gradients_kept_in_16_bits_fail_the_dtype_and_the_planners_bytes(comm):
    """The planted bug ``main_grad_16_bit``: bf16 gradients, 2 bytes where the table says 4."""
    _, got_grads, per_param, _ = ledger(comm, "bf16", mutant="main_grad_16_bit")
    assert got_grads == {"bfloat16"}
    assert all(mine != table for mine, table in per_param)


def test_a_grid_and_one_process_tolerances_follow_the_unit_roundoff():
    same, f64, _ = tolerances(make_config(precision="bf16"))
    assert (same, f64) == (2.0**-8, 2.0**-7)
    assert tolerances(make_config(precision="fp64"))[:2] == (1e-12, 1e-12)


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_every_grid_in_16_bits_equals_one_process():
    out = launch(8, "minipar.lessons.train_precision:check_precision", quiet=True, job_timeout=170, configs=GRIDS,
                 steps=3)
    rows = merge_rows(out.results)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad
    skipped = [r["what"] for r in rows if "every rank skipped the steps one process skipped ([" in r["what"]]
    assert skipped, "the fp16 grid was to overflow at its initial scale"
    assert sum("vs one float64 process" in r["what"] for r in rows) >= 3
    assert sum("gradient norm of every step" in r["what"] for r in rows) == 2


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_an_overflow_on_one_rank_makes_every_rank_skip_and_a_checkpoint_keeps_the_scale(tmp_path):
    """An inf planted in one gradient of one rank: every rank skips, halves its scale, keeps its
    weights; with the flag not all-reduced (``overflow_seen_locally``) each of those checks fails.
    Then a checkpoint in fp16 resumes bitwise on its grid (the scales continuing), and within u on
    another."""
    cfg = dict(model=SHORT, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2, precision="fp16", growth_interval=1)
    out = launch(4, "minipar.lessons.train_precision:check_fp16_events", quiet=True, job_timeout=110, config=cfg,
                 directory=str(tmp_path), resumed=[dict(cfg, dp=1, tp=2)])
    rows = merge_rows(out.results)
    good = [r for r in rows if not r["what"].startswith("overflow_seen_locally")]
    planted = [r for r in rows if r["what"].startswith("overflow_seen_locally")]
    assert len(good) == 3 + 6 and all(r["ok"] for r in good), [r for r in good if not r["ok"]]
    assert len(planted) == 3 and not any(r["ok"] for r in planted), planted


@pytest.mark.mpi
@pytest.mark.torch
@pytest.mark.timeout(180)
def test_bf16_on_torch_gloo_equals_one_process():
    pytest.importorskip("torch")
    out = launch(2, "minipar.lessons.train_precision:check_precision", backend="torch", quiet=True, job_timeout=170,
                 configs=[dict(model=SHORT, dp=1, pp=1, tp=2, precision="bf16")], steps=2)
    rows = merge_rows(out.results)
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


@pytest.mark.timeout(120)
def test_a_checkpoint_in_bf16_is_not_resumed_in_another_precision_unless_said(comm, tmp_path):
    from minipar.train.trainer import train

    train(comm, make_config(model=SHORT, precision="bf16", steps=1), save=str(tmp_path), save_every=1)
    out = minipar("train", "-n", "1", "--resume", str(tmp_path), "--steps", "2")
    assert out.returncode == 2 and "--precision bf16" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = minipar("train", "-n", "1", "--precision", "bf16", "--initial-scale", "1024", "--steps", "2")
    assert out.returncode == 2 and "only --precision fp16 scales its loss" in out.stderr
    np.testing.assert_equal(len(out.stderr.strip().splitlines()), 1)
