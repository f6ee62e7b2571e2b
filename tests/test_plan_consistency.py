"""Numbers that must agree: a layout with the GPUs and the batch (``minipar plan`` refuses the
mismatch in one line naming both sides), and every published row of the validation table with
what its source states beside it (model size, aggregate PFLOP/s, share of peak, seconds)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from minipar.cli import main
from minipar.plan import validation
from minipar.plan.models import MODELS
from minipar.plan.search import consistency
from minipar.plan.validation import ROWS, row_problems


@pytest.mark.parametrize("fixed,needle", [
    (dict(tp=8, pp=4, dp=4), "--tp 8 x --pp 4 x --dp 4 = 128 GPUs does not divide --gpus 64"),
    (dict(tp=8, pp=2, dp=2), "--tp 8 x --pp 2 x --dp 2 = 32 GPUs, not --gpus 64"),
    (dict(tp=4, pp=2, dp=2, cp=2), "--tp 4 x --pp 2 x --dp 2 x --cp 2 = 32 GPUs, not --gpus 64"),
    (dict(dp=16, microbatch=4), "--global-batch 96 is not a multiple of dp 16 x --microbatch 4 = 64"),
    (dict(tp=8, pp=4, cp=1, microbatch=5), "dp 2 (--gpus 64 / --tp 8 x --pp 4 x --cp 1) x --microbatch 5 = 10"),
    (dict(dp=64), "--global-batch 96 is not a multiple of dp 64 = 64"),
])
def test_a_layout_that_disagrees_with_the_gpus_or_the_batch_is_named(fixed, needle):
    assert needle in consistency(64, 96, fixed)


@pytest.mark.parametrize("fixed", [dict(tp=8, pp=4, dp=2), dict(tp=8, pp=2, cp=2, microbatch=3), dict(dp=32, microbatch=3),
                                   dict(tp=8), dict()])
def test_a_consistent_layout_passes(fixed):
    assert consistency(64, 96, fixed) is None


def test_the_cli_says_which_numbers_disagree(capsys):
    code = main(["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "96", "--tp", "8", "--pp", "2",
                 "--dp", "2"])
    out = capsys.readouterr().out
    assert code == 2 and out == "minipar plan: error: --tp 8 x --pp 2 x --dp 2 = 32 GPUs, not --gpus 64\n"


def test_every_published_row_adds_up():
    assert [p for row in ROWS for p in row_problems(row)] == []
    assert sum(1 for row in ROWS if (row[0], row[1]) in validation.STATED) >= 17  # most rows state more than one number


def _row(source, name, gpus=None):
    return next(r for r in ROWS if r[0] == source and r[1] == name and (gpus is None or r[2] == gpus))


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: (*r[:2], 500, *r[3:]), "= 16 GPUs does not divide --gpus 500"),           # a GPU count mistyped
    (lambda r: (*r[:4], 1537, *r[5:]), "--global-batch 1537 is not a multiple of dp 32"),  # a batch mistyped
    (lambda r: (*r[:6], 148), "148 TFLOP/s x 512 GPUs = 75.8 PFLOP/s, the source states 70.8"),  # throughput
    (lambda r: (*r[:6], 128), "128 TFLOP/s is 41.0% of 312, the source states 44%"),
])
def test_a_row_that_does_not_add_up_is_named(mutate, needle):
    row = mutate(_row("N21-T1", "megatron-39b"))
    assert any(needle in p for p in row_problems(row)), row_problems(row)


def test_a_shape_that_is_not_the_stated_size_or_a_time_that_is_not_the_throughput(monkeypatch):
    monkeypatch.setitem(MODELS, "megatron-39b", replace(MODELS["megatron-39b"], layers=47))
    assert any("the source states 39.1e9" in p for p in row_problems(_row("N21-T1", "megatron-39b")))
    bloom = _row("BLOOM", "bloom-176b")
    assert row_problems(bloom) == []
    assert any("/ 105 s = 149.3 TFLOP/s, the source states 140" in p for p in row_problems((*bloom[:6], 140)))
