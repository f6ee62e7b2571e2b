"""Pipeline schedules as data: generators, validator, simulator, plots and the CLI verb."""
import pathlib
import argparse
import json
import subprocess
import sys
from fractions import Fraction

import pytest

from minipar.pipeline import (Action, Costs, Schedule, ScheduleError, format_grid, gpipe,
                              inflight_profile, interleaved_1f1b, naive,
                              one_f_one_b, simulate, theory_bubble_fraction, validate,
                              zero_bubble_h1)

UNIT = {"F": 1, "B": 2}
PM = [(1, 1), (1, 5), (2, 1), (2, 2), (2, 5), (3, 2), (3, 7), (4, 1), (4, 3), (4, 8), (5, 16), (8, 8)]


# ---------------------------------------------------------------- actions and generators

def test_action_prints_and_parses():
    assert str(Action(1, "F", 3)) == "1F3"
    assert Action.parse("1F3") == Action(1, "F", 3)
    assert Action.parse("12W10") == Action(12, "W", 10)
    assert [str(a) for a in [Action(0, "B", 2), Action(5, "I", 0)]] == ["0B2", "5I0"]
    with pytest.raises(ValueError, match="1X3"):
        Action.parse("1X3")


@pytest.mark.parametrize("call, name", [
    (lambda: gpipe(0, 4), "p"), (lambda: one_f_one_b(2, 0), "m"), (lambda: naive(-1), "p"),
    (lambda: interleaved_1f1b(2, 4, 0), "v"), (lambda: zero_bubble_h1(2, 1.5), "m")])
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 1"):
        call()


def test_interleaved_needs_m_divisible_by_p():
    with pytest.raises(ValueError, match=r"m=6, p=4"):
        interleaved_1f1b(4, 6, 2)


def test_one_f_one_b_order_by_hand():
    assert one_f_one_b(2, 3).as_strings() == [
        ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]]
    assert gpipe(2, 2).as_strings() == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
    assert naive(3).as_strings() == [["0F0", "0B0"], ["1F0", "1B0"], ["2F0", "2B0"]]


def test_interleaved_chunks_round_robin():
    s = interleaved_1f1b(2, 4, 3)
    assert s.total_stages == 6 and s.stage_to_rank == (0, 1, 0, 1, 0, 1)
    assert {a.stage for a in s.actions[1]} == {1, 3, 5}
    # Megatron: groups of p micro-batches per chunk; rank 0 warms up (v-1)*p + 2*(p-1) = 6
    assert s.as_strings()[0][:7] == ["0F0", "0F1", "2F0", "2F1", "4F0", "4F1", "0F2"]


def test_zb_h1_defers_w_by_rank():
    s = zero_bubble_h1(3, 4).as_strings()
    assert s[0][:7] == ["0F0", "0F1", "0F2", "0I0", "0W0", "0F3", "0I1"]   # rank 0: no delay
    assert s[2][-2:] == ["2W2", "2W3"]                                     # last rank: p-1 late W's


@pytest.mark.parametrize("p, m", PM)
def test_every_generator_validates(p, m):
    for s in (gpipe(p, m), one_f_one_b(p, m), zero_bubble_h1(p, m), naive(p)):
        validate(s)
    for v in (1, 2, 3):
        if m % p == 0:
            validate(interleaved_1f1b(p, m, v))


# ---------------------------------------------------------------- validator rejects broken schedules

def one_f_one_b_with(p, m, warmup):
    """1F1B with a replaceable warm-up rule -- the bug the validator must catch."""
    actions = []
    for r in range(p):
        w = min(warmup(r), m)
        ops = [Action(r, "F", i) for i in range(w)]
        for i in range(m - w):
            ops += [Action(r, "F", w + i), Action(r, "B", i)]
        actions.append(ops + [Action(r, "B", i) for i in range(m - w, m)])
    return Schedule("broken-1f1b", p, m, 1, actions, inflight_limit=one_f_one_b(p, m).inflight_limit)


def rejected(schedule) -> str:
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    msg = str(info.value)
    assert "step" in msg and "rank 0" in msg                 # the time x rank grid ...
    assert ">" in msg and "<" in msg                         # ... with a marked cell
    assert msg.splitlines()[-1].startswith("rule broken: ")
    return msg


def test_deadlock_is_rejected_with_grid():
    msg = rejected(one_f_one_b_with(4, 6, lambda r: r))      # warm-up counted from the wrong end
    assert ">0B0<" in msg and ">1F1<" in msg and "deadlock" in msg
    assert "rank 0 waits at 0B0 for 1B0/1I0" in msg and "rank 1 waits at 1F1 for 0F1" in msg
    assert ">2F1<" not in msg                                # only the cycle is marked


def test_warmup_one_too_long_breaks_the_memory_bound():
    msg = rejected(one_f_one_b_with(4, 6, lambda r: 4 - r))
    assert ">0F4<" in msg and "holds 5 activations" in msg and "bound 4" in msg


def test_missing_duplicate_misplaced_out_of_range():
    s = one_f_one_b(3, 4)
    s.actions[1].remove(Action(1, "F", 2))
    assert "1F2 is missing" in rejected(s)
    s = gpipe(2, 2)
    s.actions[0].append(Action(0, "B", 1))
    assert "0B1 appears twice" in rejected(s)
    s = gpipe(2, 2)
    s.actions[0][0], s.actions[1][0] = s.actions[1][0], s.actions[0][0]
    assert "1F0 runs on rank 0, but stage 1 lives on rank 1" in rejected(s)
    s = gpipe(2, 2)
    s.actions[1].append(Action(1, "F", 2))
    assert "micro-batch in 0..1" in rejected(s)
    s = zero_bubble_h1(2, 2)
    s.actions[1].remove(Action(1, "W", 0))
    assert "need one B, or one I and one W" in rejected(s)


def test_w_before_i_is_a_deadlock_on_one_rank():
    s = zero_bubble_h1(3, 4)
    ops = s.actions[2]
    i, w = ops.index(Action(2, "I", 0)), ops.index(Action(2, "W", 0))
    ops[i], ops[w] = ops[w], ops[i]
    assert "rank 2 waits at 2W0 for 2I0 (W after I" in rejected(s)


def test_validated_once_until_changed(monkeypatch):
    """The executor validates every step: a schedule that passed is not checked again, but one
    changed after passing is, and fails with the message it would have had from the start."""
    from minipar.pipeline import schedules

    s = one_f_one_b(3, 4)
    validate(s)
    calls = []
    real = schedules.lockstep
    monkeypatch.setattr(schedules, "lockstep", lambda sched: calls.append(1) or real(sched))
    validate(s)
    assert calls == []                                       # unchanged: nothing re-checked
    s.actions[1].remove(Action(1, "F", 2))
    changed = rejected(s)
    fresh = one_f_one_b(3, 4)
    fresh.actions[1].remove(Action(1, "F", 2))
    assert changed == rejected(fresh) and "1F2 is missing" in changed
    assert s.ranks == s.stages == s.total_stages == 3        # one stage per rank
    two = interleaved_1f1b(2, 4, 2)
    assert (two.ranks, two.stages, two.total_stages) == (2, 4, 4)    # stages count the stages, not the ranks


def test_schedule_from_strings_and_grid():
    s = Schedule("hand", 2, 1, 1, [["0F0", "0B0"], ["1F0", "1B0"]])
    validate(s)
    assert s.actions[0][0] == Action(0, "F", 0)
    assert format_grid(s).splitlines()[1:] == [
        "step       0   1   2   3",
        "rank 0   0F0   .   . 0B0",
        "rank 1     . 1F0 1B0   ."]


# ---------------------------------------------------------------- simulation

@pytest.mark.parametrize("p, m", PM)
def test_gpipe_and_1f1b_bubble_is_exactly_the_formula(p, m):
    expected = Fraction(p - 1, m + p - 1)
    for s in (gpipe(p, m), one_f_one_b(p, m)):
        sim = simulate(s, UNIT)
        assert sim.bubble_fraction == expected == theory_bubble_fraction(s.name, p, m)
        assert sim.makespan == 3 * (m + p - 1) and sim.busy == [3 * m] * p


def test_naive_bubble():
    for p in (1, 2, 5):
        assert simulate(naive(p), UNIT).bubble_fraction == Fraction(p - 1, p) == theory_bubble_fraction("naive", p)


@pytest.mark.parametrize("p, m, v", [(2, 2, 2), (2, 8, 4), (4, 4, 2), (4, 8, 2), (4, 16, 3), (3, 6, 1)])
def test_interleaved_bubble_shrinks_by_about_v(p, m, v):
    sim = simulate(interleaved_1f1b(p, m, v), UNIT)      # each chunk action costs F/v, B/v
    assert sim.busy == [3 * m] * p and sim.makespan == 3 * m + Fraction(3 * (p - 1), v)
    assert sim.bubble_fraction == Fraction(p - 1, v * m + p - 1) == theory_bubble_fraction("interleaved", p, m, v)
    ratio = sim.bubble_fraction / simulate(one_f_one_b(p, m), UNIT).bubble_fraction
    assert 1 / Fraction(v) <= ratio <= 1.5 / v


@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (4, 12), (4, 16), (8, 16), (8, 40)])
def test_zb_h1_bubble_about_a_third_of_1f1b(p, m):
    zb = simulate(zero_bubble_h1(p, m), {"F": 1, "I": 1, "W": 1}).bubble_fraction
    ref = simulate(one_f_one_b(p, m), UNIT).bubble_fraction
    assert zb == theory_bubble_fraction("zb-h1", p, m) == Fraction(p - 1, 3 * m + p - 1)
    # ratio = (m+p-1)/(3m+p-1): 3/7 bounds it from m = 2p on, 0.4 from m = 3p on, 1/3 in the limit
    assert zb / ref <= Fraction(3, 7) and (m < 3 * p or zb / ref <= Fraction(2, 5))


def test_zb_h1_below_p_microbatches_is_worse_than_its_formula():
    assert simulate(zero_bubble_h1(4, 2), {"F": 1, "I": 1, "W": 1}).bubble_fraction > theory_bubble_fraction("zb-h1", 4, 2)


@pytest.mark.parametrize("p, m", PM)
def test_peak_inflight(p, m):
    assert simulate(gpipe(p, m), UNIT).peak_inflight == [m] * p
    assert simulate(one_f_one_b(p, m), UNIT).peak_inflight == [min(p - r, m) for r in range(p)]
    # ZB-H1: 1F1B's peak memory, reached on every rank: rank r holds back r W's and an
    # activation stays until its W (which needs the stage's saved inputs) is done
    assert simulate(zero_bubble_h1(p, m)).peak_inflight == [min(p, m)] * p
    assert inflight_profile(gpipe(1, 3).actions[0]) == [1, 2, 3, 2, 1, 0]
    assert inflight_profile(zero_bubble_h1(1, 2).actions[0]) == [1, 1, 0, 1, 1, 0]


def test_costs_split_and_p2p_latency():
    c = Costs(F=1, B=3)
    assert (c.I, c.W) == (Fraction(3, 2), Fraction(3, 2))
    assert Costs(F=1, I=1, W=2).B == 3 and Costs(F=1, B=4, I=1).W == 3
    p, m, d = 3, 4, Fraction(1, 2)
    sim = simulate(gpipe(p, m), {"F": 1, "B": 2, "p2p": d})
    assert sim.makespan == 3 * (m + p - 1) + 2 * (p - 1) * d   # one hop per stage, there and back
    first = {e.action: e for e in sim.events}
    assert first[Action(1, "F", 0)].start == 1 + d


def test_simulate_reports_deadlock_without_validation():
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(one_f_one_b_with(3, 3, lambda r: r), check=False)


def test_import_stays_light():
    code = ("import sys, minipar.pipeline, minipar.figures.pipeline, minipar.cli.pipeline; "
            "bad = {'torch', 'matplotlib'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- CLI and plots

def run_cli(*argv):
    from minipar.cli.pipeline import add_schedule_command
    parser = argparse.ArgumentParser(prog="minipar")
    add_schedule_command(parser.add_subparsers())
    args = parser.parse_args(["schedule", *argv])
    return args.func(args)


def test_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert run_cli("1f1b", "--stages", "4", "--microbatches", "8", "--json", str(out)) == 0
    text = capsys.readouterr().out
    assert "rank 0: 0F0 0F1 0F2 0F3 0B0" in text and "3/11" in text and "rank 3" in text
    data = json.loads(out.read_text())
    assert set(data) >= {"schedule", "stages", "microbatches", "chunks", "actions", "bubble_fraction",
                         "theory_bubble_fraction", "makespan", "peak_inflight"}
    assert (data["schedule"], data["stages"], data["microbatches"], data["chunks"]) == ("1f1b", 4, 8, 1)
    assert data["actions"] == one_f_one_b(4, 8).as_strings()
    assert data["bubble_fraction"] == data["theory_bubble_fraction"] == 3 / 11
    assert data["makespan"] == 33 and data["peak_inflight"] == [4, 3, 2, 1]


def test_cli_costs_with_w_and_errors(tmp_path, capsys):
    out = tmp_path / "z.json"
    assert run_cli("zb-h1", "-p", "4", "-m", "8", "--costs", "1,1,1", "--json", str(out)) == 0
    data = json.loads(out.read_text())
    assert data["costs"]["I"] == 1 and data["costs"]["W"] == 1 and data["bubble_fraction"] == 1 / 9
    assert run_cli("interleaved", "-p", "4", "-m", "6") == 2
    assert "m=6, p=4" in capsys.readouterr().err
    assert run_cli("gpipe", "--costs", "1") == 2


def test_plots_write_files(tmp_path):
    from minipar.figures import pipeline as plot
    assert run_cli("interleaved", "-p", "2", "-m", "4", "--plot", str(tmp_path / "t.png")) == 0
    paths = [plot.plot_schedules(tmp_path / "a.png", p=2, m=4, v=2),
             plot.plot_bubble_vs_microbatches(tmp_path / "b.png", p=2, ms=(1, 2, 4),
                                              measured={"1f1b": [(2, 0.4)]}),
             plot.plot_inflight_memory(tmp_path / "c.png", p=3, m=4), tmp_path / "t.png"]
    for path in paths:
        assert pathlib.Path(path).read_bytes()[:4] == b"\x89PNG"


def test_simulate_replays_given_durations():
    """durations= overrides the cost of exactly the actions it names (the replay of a real run)."""
    from fractions import Fraction

    from minipar.pipeline import Action, one_f_one_b, simulate

    sched = one_f_one_b(3, 4)
    base = simulate(sched, {"F": 1, "B": 2})
    same = simulate(sched, {"F": 1, "B": 2}, durations={a: (1 if a.kind == "F" else 2) for ops in sched.actions for a in ops})
    assert same.makespan == base.makespan and same.bubble_fraction == base.bubble_fraction
    slow = simulate(sched, {"F": 1, "B": 2}, durations={Action(0, "F", 0): 3})
    assert slow.makespan == base.makespan + 2  # the first forward is on every path: all of it shows
    ev = {e.action: e for e in slow.events}
    assert ev[Action(0, "F", 0)].end - ev[Action(0, "F", 0)].start == 3
    assert ev[Action(1, "F", 0)].start == 3
    assert slow.bubble_fraction != base.bubble_fraction and isinstance(slow.bubble_fraction, Fraction)
