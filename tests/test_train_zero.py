"""Lesson 05 with ZeRO-2 and ZeRO-3 (``--zero 2|3``): the gradients reduce-scattered once per step
after the flush, the weights (ZeRO-3) gathered once per step or around every action (``reshard``);
losses and weights bitwise ZeRO-1's, memory per rank = ``zero_bytes`` to the byte, dp bytes and
gathers = the formula; with TP (each TP rank shards its own TP shard), PP, CP, experts, padding, bf16, fp16."""
import re

import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, SHORT, make_config
from minipar.train.config import check_shapes

GRIDS = [
    # experts (their engine a group of one: sharded over nothing, no dp bytes), the forward contexts' NamedTuples
    dict(model=MOE, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2),
    dict(model=SHORT, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2),  # with PP (+ reshard), the tied embedding
    dict(model=dict(SHORT, n_layers=2), batch=6, dp=3, pp=1, tp=1),  # units padded to a multiple of 3
    # two chunks per rank (resharding gathers one at a time), dp x cp, float32 reductions of bf16 weights
    dict(model=SHORT, dp=1, pp=2, cp=2, tp=1, schedule="interleaved", microbatches=2, precision="bf16"),
    # FSDP x TP; fp16 whose first step overflows (skipped on every rank), the second steps: the shards unscaled, clipped
    # by the norm of the shards, dropout
    dict(model=SHORT, dp=2, pp=1, tp=2, microbatches=2, precision="fp16", initial_scale=2.0**18, clip=0.5,
         dropout=0.1),
]


@pytest.mark.parametrize("kw, needle", [
    (dict(zero=4), "--zero=4: choose 0 (DDP), 1, 2 or 3"),
    (dict(zero=True), "--zero=True"),
    (dict(zero=1, reshard=True), "--reshard with --zero=1"),
])
def test_bad_zero_settings_are_refused_in_one_line(kw, needle):
    with pytest.raises(UsageError, match=re.escape(needle)) as err:
        check_shapes(make_config(model=SHORT, **kw), 1)
    assert "\n" not in str(err.value)


def test_a_layer_that_does_not_divide_over_dp_is_padded_and_the_pad_counted():
    """ZeRO-3 over dp = 3 of a unit whose size 3 does not divide: padded (lesson 04's ``Flat``),
    not refused; ``zero_bytes`` counts the pad like parameters, which the 3-rank grid above checks."""
    from minipar.data_parallel.engine import Flat
    from minipar.train.model import GPT, GPTConfig

    gpt = GPT(GPTConfig(**dict(SHORT, n_layers=2)), 0)
    sizes = [Flat([m], 3) for m in gpt.children().values() if m.num_params()]
    assert any(f.n % 3 for f in sizes) and all(f.n_pad % 3 == 0 and f.n_pad - f.n < 3 for f in sizes)


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_zero_2_and_3_equal_zero_1_bitwise_and_count_to_the_byte():
    out = launch(4, "minipar.lessons.train_zero:check_zero", quiet=True, job_timeout=170, configs=GRIDS, steps=2)
    rows = merge_rows(out.results)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    for stage in ("ZeRO-2", "ZeRO-3", "ZeRO-3 reshard"):  # every check ran for every stage
        assert sum(f"{stage}," in r["what"] or f"{stage})" in r["what"] for r in rows if "bitwise" in r["what"]) >= 2
    # resharding with two chunks a rank: a smaller weights' peak, paid with an all-gather per action
    (whole,) = [r for r in rows if r["what"].startswith("dp1 pp2 cp2 tp1 (interleaved m=2, ZeRO-3, bfloat16): dp bytes")]
    (reshard,) = [r for r in rows if r["what"].startswith("dp1 pp2 cp2 tp1 (interleaved m=2, ZeRO-3 reshard, bfloat16): dp")]
    assert reshard["memory"]["params"] < whole["memory"]["params"]
    assert reshard["gathers"] == 4 * whole["gathers"] and reshard["dp_bytes"] > whole["dp_bytes"]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_gradients_reduce_scattered_per_micro_batch_fail_the_bytes_and_the_bitwise_check():
    """The planted ``zero_reduce_per_microbatch``: each micro-batch's gradient reduce-scattered into
    the shards as its backward ends (m + 1 reduce-scatters a step, the tied embedding's sum after the
    flush then short of what was reduced): ZeRO-0 and 1 untouched pass, every ZeRO-2/3 run fails."""
    out = launch(4, "minipar.lessons.train_zero:check_zero", quiet=True, job_timeout=110, configs=GRIDS[1:2], steps=2,
                 mutant="zero_reduce_per_microbatch")
    rows = merge_rows(out.results)
    for check in ("bitwise ZeRO-1's", "dp bytes per step = formula"):
        hit = [r for r in rows if check in r["what"] and ("ZeRO-2" in r["what"] or "ZeRO-3" in r["what"])]
        assert len(hit) == 3 and not any(r["ok"] for r in hit), hit
    assert all(r["ok"] for r in rows if "ZeRO-2" not in r["what"] and "ZeRO-3" not in r["what"])


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_zero_3_resumes_on_its_grid_and_on_another(tmp_path):
    """Saved under ZeRO-3 (dp rank 0 writes the weights gathered, every rank its Adam ranges),
    resumed on the same grid and on one with ZeRO-2 and another dp: the uninterrupted losses."""
    saved = dict(model=SHORT, dp=2, pp=2, tp=1, schedule="1f1b", microbatches=2, zero=3)
    out = launch(4, "minipar.lessons.train:check_checkpoints", quiet=True, job_timeout=170, directory=str(tmp_path),
                 saved=saved, resumed=[dict(saved), dict(dp=1, pp=2, tp=2, schedule="1f1b", microbatches=2, zero=2)])
    rows = merge_rows(out.results)
    assert len(rows) == 4 and all(r["ok"] for r in rows), rows


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_activations_and_every_groups_bytes_still_match_the_formulas_with_zero_3():
    """One traced step: the contexts hold placeholders, not the gathered weights, between actions
    (``--reshard``: the activation count would otherwise hold them), and tp, pp, dp, emb bytes = formula."""
    configs = [dict(model=SHORT, dp=2, pp=2, tp=1, schedule="zb-h1", microbatches=2, zero=3, reshard=True,
                    recompute="full"),
               dict(model=SHORT, dp=2, pp=1, tp=2, microbatches=2, zero=2, sequence_parallel=True, recompute="selective")]
    out = launch(4, "minipar.lessons.train:check_mutants", quiet=True, job_timeout=110,
                 cases=[(None, "accounting", kw) for kw in configs]
                 + [("zero3_context_keeps_weights", "accounting", configs[0])])
    rows = merge_rows(out.results)
    good = [r for r in rows if not r["what"].startswith("zero3_")]
    assert len(good) == 2 * 5 and all(r["ok"] for r in good), [r for r in good if not r["ok"]]
    (kept,) = [r for r in rows if r["what"].startswith("zero3_") and "activation bytes" in r["what"]]
    assert not kept["ok"], kept  # the weights the contexts keep counted among the activations
