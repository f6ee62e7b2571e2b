"""The planner's formulas: ZeRO's table, Korthikanti's activations, FLOPs, in-flight counts, the
simulated pipeline, a step computed by hand. Pure functions, no ranks."""
from dataclasses import replace

import numpy as np
import pytest

import minipar.plan.memory as planmem
from minipar import costmodel as cm
from minipar.lessons.planning import ZERO_TABLE, as_printed, zero_table_rows
from minipar.pipeline import make_schedule, simulate, theory_bubble_fraction
from minipar.pipeline import Costs
from minipar.plan import Config, ModelSpec, Problem, executed_flops, model, model_flops, predict, preset
from minipar.plan import pipeline as planpipe
from minipar.plan.hardware import MATMUL_FRACTION
from minipar.plan.memory import inflight, layer_activations, stored_activations
from minipar.plan.validation import calibrate_matmul_fraction


# --------------------------------------------------------------------------- ZeRO's table


def test_zero_paper_table_every_cell():
    rows = zero_table_rows()
    assert len(rows) == 54
    assert [r for r in rows if r[3] != r[4]] == []


@pytest.mark.parametrize("mutant", ["unsharded", "fp32_adam", "stage_off_by_one"])
def test_zero_table_rejects_wrong_states(monkeypatch, mutant):
    """A model that skips the sharding, uses the wrong K, or shards one thing too many misses the table."""
    good = planmem.zero_bytes

    def bad(psi, n, stage, bp=2, bg=2, k=12, *a, **kw):
        if mutant == "unsharded":
            return good(psi, 1, stage, bp, bg, k, *a, **kw)
        if mutant == "fp32_adam":
            return good(psi, n, stage, bp, bg, 8, *a, **kw)
        return good(psi, n, min(stage + 1, 3), bp, bg, k, *a, **kw)

    monkeypatch.setattr(planmem, "zero_bytes", bad)
    rows = zero_table_rows()
    assert len([r for r in rows if r[3] != r[4]]) >= 10


def test_table_printing_rule_is_the_papers():
    assert as_printed(41.25) == 41.3 and as_printed(1.875) == 1.88 and as_printed(0.46875) == 0.47
    assert as_printed(4187.5) == 4187 and as_printed(257.75) == 257 and as_printed(15.625) == 15.6
    assert ZERO_TABLE[7.5e9][64] == (31.4, 16.6, 1.88)


# --------------------------------------------------------------------------- activations


def _prob(rng, dropout=True, e=2):
    heads = int(rng.integers(2, 9))
    m = ModelSpec(layers=4, hidden=heads * 8 * int(rng.integers(1, 5)), heads=heads, seq=int(rng.integers(16, 200)),
                  vocab=97, dropout=dropout)
    hw = preset("a100-80gb") if e == 2 else replace(preset("a100-80gb"), dtype_bytes=e, mixed_precision=False)
    return Problem(m, 8, 8, hw, 1)


def test_korthikanti_formulas_on_random_shapes():
    rng = np.random.default_rng(7)
    for _ in range(20):
        prob = _prob(rng)
        m = prob.model
        s, h, a = m.seq, m.hidden, m.heads
        b, t = int(rng.integers(1, 5)), int(rng.choice([1, 2, 4, 8]))
        sbh = s * b * h
        cases = {  # Korthikanti et al. 2022, Table 2
            ("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
            ("none", True): sbh / t * (34 + 5 * a * s / h),
            ("selective", False): sbh * (10 + 24 / t),
            ("selective", True): 34 * sbh / t,
            ("full", False): 2 * sbh,
            ("full", True): 2 * sbh / t,
        }
        for (rec, sp), want in cases.items():
            got = float(stored_activations(prob, b, t, 1, np.array(sp), np.array(rec)))
            assert got == pytest.approx(want, rel=1e-12), (rec, sp, t)
        # context parallelism splits everything by cp
        full, _ = layer_activations(prob, b, t, 2, True)
        assert float(full) == pytest.approx(sbh / t * (34 + 5 * a * s / h) / 2, rel=1e-12)


def test_activations_without_sequence_parallelism_keep_10_sbh_per_rank():
    """The wrong way (dividing everything by tp without SP) would be sbh/t (34 + 5as/h)."""
    prob = _prob(np.random.default_rng(1))
    m = prob.model
    no_sp = float(layer_activations(prob, 1, 8, 1, False)[0])
    sp = float(layer_activations(prob, 1, 8, 1, True)[0])
    assert no_sp - sp == pytest.approx(10 * m.seq * m.hidden * (1 - 1 / 8), rel=1e-12)


def test_full_precision_ranks_have_no_masks_and_wider_elements():
    prob = _prob(np.random.default_rng(2), dropout=False, e=8)
    m = prob.model
    s, h, a = m.seq, m.hidden, m.heads
    want = 8 * s * h * (8 + 2 * 4) + 8 * a * s * s  # e (8 sbh + 2 sb ffn) + e as^2 b, b = 1
    assert float(layer_activations(prob, 1, 1, 1, False)[0]) == pytest.approx(want, rel=1e-12)


# --------------------------------------------------------------------------- FLOPs and parameters


def test_flops_and_params_match_the_papers():
    m = model("gpt3-175b")
    B, L, s, h, V = 1536, m.layers, m.seq, m.hidden, m.vocab
    assert model_flops(m, B) == pytest.approx(72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L)), rel=1e-12)
    assert executed_flops(m, B, "full") == pytest.approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)),
                                                         rel=1e-12)  # Narayanan et al. eq. 3
    # selective recomputation runs Q K^T and softmax(.) V forward once more: 4 B L s^2 h (Korthikanti
    # et al.'s eq. 8, 72 B L s h^2 (1 + s/3h + ...), counts 12 B L s^2 h for it; we count what runs)
    assert executed_flops(m, B, "selective") == pytest.approx(model_flops(m, B) + 4 * B * L * s * s * h, rel=1e-12)
    assert m.params() == pytest.approx(12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h)) + 2 * h, rel=1e-12)
    assert round(m.params() / 1e9, 1) == 174.6  # Narayanan et al. Table 2


def test_matmul_fraction_is_the_documented_derivation():
    assert MATMUL_FRACTION == round(calibrate_matmul_fraction(), 2)


# --------------------------------------------------------------------------- in flight, pipeline


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "gpipe"])
def test_inflight_counts_are_the_generators(name):
    for p in (2, 3, 4):
        for m in range(p, 6 * p + 1, p):
            v = 2 if name == "interleaved" else 1
            lim = make_schedule(name, p, m, v).inflight_limit
            assert inflight(name, p, m, v)[:2] == (lim[0], lim[-1]), (p, m)


def test_inflight_probe_would_be_wrong_for_gpipe_without_the_check():
    lim_small = make_schedule("gpipe", 3, 6).inflight_limit
    assert inflight("gpipe", 3, 30, 1)[:2] == (30, 30) != (lim_small[0], lim_small[-1])


def test_simulated_pipeline_equals_textbook_without_p2p_and_bounds_it_with():
    for name, p, m, v in (("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("gpipe", 3, 7, 1)):
        exact = planpipe.makespan(name, p, m, v, 1.0, 2.0, 0.0)
        theory = 3 * m / (1 - float(theory_bubble_fraction(name, p, m, v)))
        assert exact == pytest.approx(theory, rel=1e-12)
        assert planpipe.makespan(name, p, m, v, 1.0, 2.0, 0.05) > exact


def test_extrapolated_makespan_equals_full_simulation(monkeypatch):
    monkeypatch.setattr(planpipe, "MAX_ACTIONS", 10)
    planpipe.makespan.cache_clear()
    for name, p, m, v, p2p, head in (("1f1b", 3, 40, 1, 0.02, 0.3), ("interleaved", 4, 48, 2, 0.05, 0.2),
                                     ("1f1b", 4, 60, 1, 1.5, 0.0)):
        got = planpipe.makespan(name, p, m, v, 1.0, 2.1, p2p, head, 2 * head)
        want = planpipe._simulate(name, p, m, v, 1.0, 2.1, p2p, head, 2 * head)
        assert got == pytest.approx(want, rel=1e-9), (name, p, m)
    planpipe.makespan.cache_clear()


def test_head_on_the_last_stage_is_simulated():
    sched = make_schedule("1f1b", 4, 8)
    plain = float(simulate(sched, Costs(F=1.0, B=2.0)).makespan)
    assert planpipe.makespan("1f1b", 4, 8, 1, 1.0, 2.0, 0.0, 0.5, 1.0) > plain + 8 * 1.5 - 1e-9


# --------------------------------------------------------------------------- a step by hand


def test_data_parallel_step_by_hand():
    """One stage, no tp: compute, the hierarchical all-reduce after the backward, the optimizer."""
    m = ModelSpec(layers=2, hidden=64, heads=4, seq=32, vocab=0, dropout=False, positions="rope")
    hw = preset("a100-80gb")
    prob = Problem(m, 16, 8, hw, 16, overlap_dp=False)
    p = predict(prob, Config(dp=16, microbatches=1))  # b = 16 / 16 = 1
    psi = m.params()
    rate = hw.peak_flops * hw.matmul_fraction
    flops = 3 * m.layers * (2 * m.seq * 12 * m.hidden ** 2 + 4 * m.seq * m.seq * m.hidden)
    act = 2 * m.layers * (m.seq * m.hidden * 16 + m.heads * m.seq * m.seq)  # e = 2, no masks, b = 1
    compute = flops / rate + 5 * act / hw.hbm_bandwidth
    assert p.parts["compute"] == pytest.approx(compute, rel=1e-9)
    f = hw.link_fraction
    n = 2 * psi  # gradient bytes
    a_in, b_in = hw.intra.alpha, hw.intra.beta(f)
    a_out, b_out = hw.inter.alpha, hw.inter.beta(f)
    ring = (cm.reduce_scatter_time(n, 8, a_in, b_in) + cm.allreduce_time("ring", n / 8, 2, a_out, b_out)
            + cm.all_gather_time(n, 8, a_in, b_in))
    assert p.parts["dp_comm"] == pytest.approx(ring, rel=1e-9)
    assert p.parts["optimizer"] == pytest.approx(28 * psi / hw.hbm_bandwidth, rel=1e-9)
    assert p.step_time_s == pytest.approx(compute + ring + 28 * psi / hw.hbm_bandwidth, rel=1e-9)
    assert p.tflops_per_gpu == pytest.approx(flops / p.step_time_s / 1e12, rel=1e-9)  # 16 sequences on 16 GPUs


def test_step_by_hand_rejects_a_flat_ring_across_nodes(monkeypatch):
    """The wrong way: every gradient byte over InfiniBand (no hierarchy) is slower than the hand value."""
    import minipar.plan.timing as timing

    m = ModelSpec(layers=2, hidden=64, heads=4, seq=32, vocab=0, dropout=False, positions="rope")
    prob = Problem(m, 16, 8, preset("a100-80gb"), 16, overlap_dp=False)
    good = predict(prob, Config(dp=16)).parts["dp_comm"]

    def flat(prob, cfg, n_bytes, kind):
        hw = prob.hw
        n = cfg.dp * cfg.cp
        rs = cm.reduce_scatter_time(n_bytes, n, hw.inter.alpha, hw.inter.beta(hw.link_fraction))
        return {"all_reduce": 2 * rs, "reduce_scatter": rs, "all_gather": rs}[kind]

    monkeypatch.setattr(timing, "dp_collective", flat)
    assert predict(prob, Config(dp=16)).parts["dp_comm"] > 1.5 * good


def test_offload_moves_the_optimizer_state_to_the_host_and_pays_pcie():
    m = model("megatron-7.5b")
    hw = preset("a100-80gb")
    on, off = (predict(Problem(m, 8, 8, hw, 8, offload=o), Config(dp=8, zero=1, recompute="full")) for o in (True, False))
    psi = m.params()
    assert on.memory_bytes["optimizer"] == 0 and on.memory_bytes["host"] == pytest.approx(12 * psi / 8, rel=1e-12)
    assert off.memory_bytes["optimizer"] == pytest.approx(12 * psi / 8, rel=1e-12) and off.memory_bytes["host"] == 0
    moved = 4 * psi / 8 * hw.host.beta() + 28 * psi / 8 / hw.host_bandwidth  # grads down, params up; CPU Adam
    assert on.parts["optimizer"] == pytest.approx(moved, rel=1e-9)
    assert on.parts["optimizer"] > 10 * off.parts["optimizer"]  # ignoring the host would look free
