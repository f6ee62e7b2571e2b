"""minipar's schedules against torch.distributed.pipelining's (see docs/pipeline_vs_torch.md).

torch's schedule classes compute ``pipeline_order`` (rank -> list of ``_Action`` or None for
an idle slot) in their constructor. Like torch's own ``_schedule_visualizer.get_schedule_ops``
we build them on mock stages, so no process group is needed. Idle slots and the
bookkeeping action REDUCE_GRAD are dropped; what is left is each rank's compute order.
"""
from fractions import Fraction
from unittest import mock

import pytest

pytest.importorskip("torch")
from torch.distributed.pipelining import schedules as ts  # noqa: E402
from torch.distributed.pipelining.stage import PipelineStage  # noqa: E402

from minipar.pipeline import (Action, Schedule, ScheduleError, gpipe, interleaved_1f1b,  # noqa: E402
                              one_f_one_b, simulate, theory_bubble_fraction, validate,
                              zero_bubble_h1)

COMPUTE = ("F", "B", "I", "W")
PM = [(1, 1), (1, 4), (2, 2), (2, 5), (3, 3), (3, 7), (4, 4), (4, 8), (5, 16)]


def torch_order(cls, p, m, v=1):
    """Per-rank compute actions of torch schedule ``cls`` for p ranks, m micro-batches, v stages per rank."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p * v
    stages = stage if issubclass(cls, ts.PipelineScheduleSingle) else [stage] * v
    order = cls(stages, m).pipeline_order
    return [[str(a) for a in order[r] if a is not None and a.computation_type in COMPUTE]
            for r in range(p)]


@pytest.mark.parametrize("p, m", PM + [(4, 2), (5, 3)])
def test_gpipe_matches_torch(p, m):
    assert gpipe(p, m).as_strings() == torch_order(ts.ScheduleGPipe, p, m)


@pytest.mark.parametrize("p, m", PM)
def test_1f1b_matches_torch_except_the_last_ranks_microbatch_numbers(p, m):
    ours, theirs = one_f_one_b(p, m).as_strings(), torch_order(ts.Schedule1F1B, p, m)
    assert theirs[:-1] == ours[:-1]
    # Known difference: torch's Schedule1F1B._get_pipeline_order starts the last rank (no
    # warm-up forwards) at forward_mb = 0 and increments *before* use, so its forwards are
    # numbered 1..m instead of 0..m-1 (backwards are right). Only this descriptive IR is
    # off; torch's runtime (_step_microbatches) does not read it. minipar rejects that order.
    shifted = [str(Action(a.stage, a.kind, a.microbatch + (a.kind == "F")))
               for a in map(Action.parse, ours[-1])]
    assert theirs[-1] == shifted
    with pytest.raises(ScheduleError, match=rf"{p - 1}F{m}: stage must be in"):
        validate(Schedule("torch-1f1b", p, m, 1, theirs))


def test_torch_1f1b_refuses_fewer_microbatches_than_stages():
    with pytest.raises(ValueError, match="greater than"):
        torch_order(ts.Schedule1F1B, 4, 3)
    validate(one_f_one_b(4, 3))                      # minipar allows m < p


@pytest.mark.parametrize("p, m, v", [(1, 3, 2), (2, 2, 2), (2, 6, 3), (3, 6, 2), (4, 4, 2),
                                     (4, 8, 2), (4, 12, 3), (3, 6, 1), (2, 8, 4)])
def test_interleaved_matches_torch(p, m, v):
    assert interleaved_1f1b(p, m, v).as_strings() == torch_order(ts.ScheduleInterleaved1F1B, p, m, v)


@pytest.mark.parametrize("p, m, v, bubble", [(4, 6, 2, Fraction(1, 5)), (3, 4, 2, Fraction(1, 5)),
                                             (4, 2, 2, Fraction(5, 9))])
def test_interleaved_m_not_multiple_of_p_only_in_torch(p, m, v, bubble):
    # Known difference: minipar requires m % p == 0, like Megatron; torch relaxes it to
    # m % max(1, m // p) == 0 ("flex" rounds). torch's order still passes minipar's checks
    # (with no memory bound); with m > p it even meets (p-1)/(v*m+p-1), with m < p not.
    with pytest.raises(ValueError, match=f"m={m}, p={p}"):
        interleaved_1f1b(p, m, v)
    flex = Schedule("torch-interleaved", p, m, v, torch_order(ts.ScheduleInterleaved1F1B, p, m, v))
    validate(flex)
    assert simulate(flex, {"F": 1, "B": 2}).bubble_fraction == bubble
    assert (bubble == theory_bubble_fraction("interleaved", p, m, v)) == (m > p)


@pytest.mark.parametrize("p, m", [(1, 1), (1, 4), (2, 2), (2, 6), (3, 3), (3, 6), (4, 2), (4, 8),
                                  (5, 15), (8, 8)])
def test_zb_h1_matches_torch_interleaved_zero_bubble_with_one_stage_per_rank(p, m):
    # torch has no class called ZB-H1; ScheduleInterleavedZeroBubble (the ZB-1P schedule)
    # with one stage per rank reduces to it: warm-up p-1-r, rank r holds back its first r W's.
    theirs = torch_order(ts.ScheduleInterleavedZeroBubble, p, m, 1)
    assert zero_bubble_h1(p, m).as_strings() == theirs


def test_torch_zero_bubble_needs_m_multiple_of_its_rounds():
    # torch needs m % max(1, m // p) == 0 here too (3 rounds of 16 on p=5); minipar does not.
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        torch_order(ts.ScheduleInterleavedZeroBubble, 5, 16, 1)
    validate(zero_bubble_h1(5, 16))


@pytest.mark.parametrize("make", [lambda: gpipe(3, 5), lambda: one_f_one_b(4, 6),
                                  lambda: interleaved_1f1b(2, 4, 3), lambda: zero_bubble_h1(3, 5)])
def test_torch_validator_accepts_minipar_schedules(make):
    s = make()
    order = {r: [ts._Action(a.stage, ts._ComputationType(a.kind), a.microbatch) for a in ops]
             for r, ops in enumerate(s.actions)}
    stage_to_rank = ts._validate_schedule(order, s.ranks, s.total_stages, s.microbatches)
    assert stage_to_rank == dict(enumerate(s.stage_to_rank))
