"""Pipeline executor: every schedule run on real ranks against the dense model (one launch per
world size checks all schedules), the torch backend, a planted bug the check must catch, and
the measured bubble."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from minipar import launch
from minipar.lessons.tensor_parallel import summarize
from minipar.pipeline import theory_bubble_fraction
from minipar.pipeline.execute import act_tag, build_stages, grad_tag, measured_bubble, reference_step
from minipar.trace import Event


def failures(rows):
    return [f"{r['what']}: error {r['error']:.2e} > {r['tolerance']:.0e}" for r in rows if not r["ok"]]


# --------------------------------------------------------------------------- pure functions


def test_tags_are_unique_per_message():
    S, m = 8, 5
    tags = [f(s, i, m) for s in range(S) for i in range(m) for f in (act_tag, grad_tag)]
    assert len(set(tags)) == len(tags) and min(tags) >= 0


def test_stages_split_all_layers_in_order():
    stages = build_stages(3, layers=8, width=4, rng=np.random.default_rng(0))
    assert [len(s) for s in stages] == [3, 3, 2]
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    assert np.isfinite(reference_step(stages, x, t))
    assert all(np.any(g != 0) for s in stages for _, g in s.named_grads() if g.ndim == 2)


def test_measured_bubble_counts_compute_actions_only():
    ev = [Event(0, "compute", "0F0", 0.0, 1.0, 0, -1), Event(1, "compute", "1F0", 1.0, 2.0, 0, -1),
          Event(1, "compute", "1B0", 2.0, 4.0, 0, -1), Event(0, "compute", "0B0", 4.0, 6.0, 0, -1),
          Event(0, "recv", "recv", 1.0, 4.0, 64, 1), Event(1, "compute", "loss", 0.0, 6.0, 0, -1)]
    # makespan 6, busy 3 + 3: idle 6 of 12
    assert measured_bubble(ev, 2) == pytest.approx(0.5)
    assert measured_bubble([], 2) == 0.0


# --------------------------------------------------------------------------- real ranks


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_every_schedule_matches_dense_on_n_ranks(n):
    ms = (4, 2) if n == 4 else (4, 3)    # m < p for 1F1B/ZB on 4 ranks, m % p != 0 on 2
    out = launch(n, "minipar.lessons.pipeline:check_schedules", quiet=True, m=ms, watchdog=60)
    rows = summarize(out.results)
    assert not failures(rows), "\n".join(failures(rows))
    whats = " | ".join(r["what"] for r in rows)
    for kind in ("naive", "gpipe", "1f1b", "interleaved", "zb-h1"):
        assert f"{kind} p={n}" in whats
    assert ("interleaved p=4 m=2" in whats) is False and ("interleaved p=2 m=3" in whats) is False
    assert all(r["tolerance"] == 1e-12 for r in rows)


@pytest.mark.mpi
@pytest.mark.torch
@pytest.mark.timeout(180)
def test_torch_backend_every_schedule_matches_dense():
    pytest.importorskip("torch")
    out = launch(2, "minipar.lessons.pipeline:check_schedules", backend="torch", quiet=True, m=4,
                 watchdog=90)
    rows = summarize(out.results)
    assert len(rows) == 10 and not failures(rows), "\n".join(failures(rows))


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_planted_bug_dropping_the_1_over_m_scale_is_caught():
    """scale=1 (loss summed over micro-batches, not averaged): loss and every gradient are m
    times too big; every row with m > 1 must fail (naive has m = 1, where 1/m == 1)."""
    out = launch(2, "minipar.lessons.pipeline:check_schedules", quiet=True, m=4, scale=1.0, watchdog=60)
    rows = summarize(out.results)
    for r in rows:
        assert r["ok"] == r["what"].startswith("naive"), r
        if not r["ok"]:
            assert r["error"] == pytest.approx(3.0, rel=1e-9)   # (4x - x) / x


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_measured_bubble_is_a_fraction_and_simulation_is_the_theory():
    out = launch(2, "minipar.lessons.pipeline:measure", quiet=True, schedule="1f1b", m=4, width=64,
                 b=32, watchdog=60)
    r = out.results[0]
    assert r == {**r, "schedule": "1f1b", "p": 2, "m": 4}
    assert 0.0 <= r["measured"] < 1.0
    assert Fraction(r["simulated"]).limit_denominator(100) == theory_bubble_fraction("1f1b", 2, 4)
    assert out.results[1]["measured"] == r["measured"]    # merged trace: same on every rank
