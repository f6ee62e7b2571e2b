"""Serving predictions (minipar.plan.inference), lesson 05's decoding measured on ranks
(minipar.bench.inference), ``minipar infer`` and the figures drawn from the recorded run."""
import json
import os

import numpy as np
import pytest

from minipar.errors import UsageError
from minipar.plan import inference as I
from minipar.plan import model, preset
from minipar.plan.models import minipar_gpt

A100 = preset("a100-80gb")


def test_decode_at_batch_one_is_memory_bound_and_tp_divides_the_reading():
    m = I.LLAMA2["llama2-7b"]
    one, two = (I.decode_step(m, A100, t, 1, 0) for t in (1, 2))
    assert one.bound == two.bound == "memory"
    assert one.memory_s / one.compute_s > 50  # 2 FLOPs per 2-byte weight against a ridge of ~109 FLOPs per byte
    split, rep = m.layer_params()
    # exactly 1/2 of the split weights, the replicated norms whole on both
    assert one.weight_bytes - two.weight_bytes == pytest.approx((m.layers * split + m.vocab * m.hidden) * 2 / 2, rel=1e-12)
    assert one.comm_s == 0 < two.comm_s < 0.15 * two.memory_s  # 66 all-reduces of 16 KB: 2 alpha each, mostly
    assert two.seconds < 0.6 * one.seconds


def test_batch_past_the_ridge_point_turns_compute_bound():
    m = I.LLAMA2["llama2-7b"]
    b_star = I.critical_batch(A100)
    assert b_star == pytest.approx(312e12 * A100.matmul_fraction / 2.039e12 * 2 / 2)
    assert I.decode_step(m, A100, 1, int(b_star * 0.8), 0).bound == "memory"
    assert I.decode_step(m, A100, 1, int(b_star * 1.25), 0).bound == "compute"
    assert I.prefill(m, A100, 1, 1, 512).bound == "compute"


def test_kv_cache_per_token_splits_over_tp_and_tp_makes_room_for_a_bigger_batch():
    m = model("llama3-70b")  # 80 layers, 8 KV heads of 128
    assert I.kv_bytes_per_token(m, 1, 2) == 2 * 80 * 8 * 128 * 2
    assert I.kv_bytes_per_token(m, 8, 2) == 2 * 80 * 1 * 128 * 2
    fits = [I.max_batch(m, A100, t, 4096) for t in (1, 2, 4, 8)]
    assert fits[0] == 0 and fits[1] < fits[2] < fits[3]  # 141 GB of weights do not fit one GPU
    with pytest.raises(UsageError, match="tp=16 does not divide"):
        I.decode_step(m, A100, 16)


def test_tp_stops_paying_where_the_all_reduce_latency_exceeds_the_saved_reading():
    m = I.LLAMA2["llama2-7b"]
    stop = I.tp_stops_paying(m, A100)
    assert stop["best"] == 4
    last = stop["steps"][-1]
    assert not last["pays"] and last["added_per_layer_s"] > last["saved_per_layer_s"]
    assert all(s["pays"] for s in stop["steps"][:-1])
    # a link with no latency always pays
    from dataclasses import replace

    fast = replace(A100, intra=replace(A100.intra, alpha=0.0))
    assert I.tp_stops_paying(m, fast)["best"] == 8


def test_the_planner_against_published_serving_numbers():
    rows = I.against_published(A100)
    assert len(rows) == len(I.PUBLISHED) and all(abs(r["error"]) < 0.4 for r in rows), rows
    # the technique-skipping model, decode timed as compute (FLOPs / peak), is off by an order of magnitude
    from dataclasses import replace

    as_compute = replace(A100, hbm_bandwidth=1e30)
    assert all(r["error"] < -0.75 for r in I.against_published(as_compute) if r["tp"] <= 2)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_rank_holds_the_formulas_bytes_and_tp_decodes_the_same_tokens():
    from minipar import launch
    from minipar.bench.inference import gpt_config

    one, two = (launch(n, "minipar.bench.inference:decode_rank", quiet=True, d=64, n_new=3, probe_bytes=1 << 20).results[0]
                for n in (1, 2))
    assert one["tokens"] == two["tokens"]
    assert all(r[k] > 0 for r in (one, two) for k in ("probe_before", "probe_after", "probe_cpu_before", "probe_cpu_after"))
    m = minipar_gpt(gpt_config(64, 4 + 3 + 1))
    pos = m.seq * m.hidden * 8  # the position embedding: held, one row read per token
    assert one["held_bytes"] == I.weight_bytes(m, 1, 8) + pos
    assert two["held_bytes"] == I.weight_bytes(m, 2, 8) + pos
    assert two["held_bytes"] != I.weight_bytes(m, 1, 8) + pos  # a rank holding everything would fail the line above


def test_a_rows_prediction_reads_the_bandwidth_its_own_job_probed():
    """d = 256, TP = 2, batch 1, 4 prompt tokens, 16 new (the context 4 + 8 in the middle): the
    probe read 8 and 12 GB/s before and after the token loop; the machine table's STREAM says 5."""
    from minipar.bench.inference import hardware, predict_row

    one = {"matmul_flops": {"float64": 1e30}, "memory_bytes": 1 << 34, "memory_bandwidth": 5e9, "cores": 2}
    hw = hardware(one, {"alpha": 1e-5, "beta": 0.0})  # a link of latency alone: 10 us a message
    r = {"d": 256, "tp": 2, "batch": 1, "prompt": 4, "n_new": 16, "token_s": 3e-3, "token_cpu_s": 3e-3,
         "probe_before": 8e9, "probe_after": 12e9, "probe_cpu_before": 10e9, "probe_cpu_after": 10e9}
    d, L, V = 256, 8, 64
    # a rank's weights: its half of 12 d^2 + 4 d per layer (qkv, proj, fc1 and its bias, fc2) and of the
    # V x d head, the 6 d of biases and norms per layer and the final norm's 2 d whole; 8 bytes each
    weights = (L * (12 * d * d + 4 * d) / 2 + 6 * d * L + V * d / 2 + 2 * d) * 8  # 25 366 528
    kv = 12 * 2 * L * (8 // 2) * (d // 8) * 8  # 12 tokens' K and V, 4 of the 8 heads of 32: 196 608
    ring = 2 * (2 - 1) * 1e-5  # a ring all-reduce on 2 ranks: 2 (p - 1) alpha
    comm = (2 * L + 2) * ring  # 2 per block, 2 for the greedy argmax

    def hand(bandwidth):
        return (weights + kv) / bandwidth + comm

    probe = 2 / (1 / 8e9 + 1 / 12e9)  # 9.6 GB/s: the two probes' predicted times averaged
    row = predict_row(r, hw, 5e9)
    assert row["predicted_token_s"] == pytest.approx(hand(probe), rel=1e-9)
    assert row["predicted_cpu_token_s"] == pytest.approx(hand(10e9), rel=1e-9)
    assert row["read_bytes"] == weights and row["achieved_bandwidth"] == weights / 3e-3
    # the mutant docs/inference.md describes: the machine table's STREAM instead of the job's probe
    # (it is the row's predicted_stream_token_s); and the probe before the loop alone
    stream = predict_row(dict(r, probe_before=5e9, probe_after=5e9), hw, 5e9)["predicted_token_s"]
    assert stream == pytest.approx(row["predicted_stream_token_s"], rel=1e-12)
    before = predict_row(dict(r, probe_after=8e9), hw, 5e9)["predicted_token_s"]
    for mutant in (stream, before):
        assert mutant != pytest.approx(hand(probe), rel=1e-3)


def test_infer_prints_the_table_and_refuses_bad_input_in_one_line(capsys):
    from minipar.cli import main

    assert main(["infer", "--model", "llama3-70b", "--tp", "1", "2", "4", "8"]) == 0
    out = capsys.readouterr().out
    assert "fastest per token: tp = 8" in out and "memory" in out
    assert main(["infer", "--model", "llama3-70b", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no tp in [3]" in err, err
    assert main(["infer"]) == 2
    err = capsys.readouterr().err
    assert "give --model NAME" in err and "Traceback" not in err
    assert main(["infer", "--published"]) == 0 and "llama2-70b" in capsys.readouterr().out


def test_figures_draw_from_the_recorded_run(tmp_path):
    from minipar.figures import inference as F

    with open(F.RUN) as f:
        rec = json.load(f)
    assert {r["tp"] for r in rec["rows"]} >= {1, 2} and len({r["d"] for r in rec["rows"]}) >= 3
    paths = F.make(str(tmp_path), records=rec)
    assert [os.path.basename(p) for p in paths] == ["inference_latency.png", "inference_roofline.png"]
    assert all(os.path.getsize(p) > 10_000 for p in paths)


def test_each_width_is_predicted_as_roofline_plus_the_cache_resident_widths_overhead_at_its_tp():
    """The smallest width's measured-minus-roofline time is its TP's per-token overhead; every
    other row at that TP adds it (and is checked), the source row is not a check."""
    from minipar.bench.inference import with_overhead

    def row(d, tp, meas, pred):
        return dict(d=d, tp=tp, token_s=meas, token_cpu_s=meas, predicted_token_s=pred,
                    predicted_cpu_token_s=pred, predicted_stream_token_s=2 * pred)

    rows = with_overhead([row(64, 1, 2.4e-3, 0.2e-3), row(1024, 1, 49e-3, 44e-3),
                          row(64, 2, 3.9e-3, 0.5e-3), row(1024, 2, 32e-3, 25e-3)])
    by = {(r["d"], r["tp"]): r for r in rows}
    assert by[64, 1]["overhead_source"] and not by[1024, 1]["overhead_source"]
    assert by[1024, 1]["predicted_token_s"] == pytest.approx(44e-3 + 2.2e-3)  # not TP 2's 3.4 ms, nor none
    assert by[1024, 2]["predicted_token_s"] == pytest.approx(25e-3 + 3.4e-3)
    assert by[1024, 2]["roofline_token_s"] == pytest.approx(25e-3)
    assert by[1024, 2]["predicted_stream_token_s"] == pytest.approx(50e-3 + 3.4e-3)


def test_the_read_probe_divides_by_the_median_read_not_the_luckiest(monkeypatch):
    """Five reads timed 1, 5, 2, 3, 4 s (wall) and 2, 2, 6, 4, 1 s (CPU): the rates are the bytes over
    the median, 3 s and 2 s. A best-of-n (1 s) is the luckiest moment of a bandwidth that drifts,
    while a token's time is the median of its tokens."""
    import itertools

    from minipar.bench import inference as B

    walls = itertools.accumulate([0, 1, 0, 5, 0, 2, 0, 3, 0, 4])  # start, end of each read
    cpus = itertools.accumulate([0, 2, 0, 2, 0, 6, 0, 4, 0, 1])
    monkeypatch.setattr(B.time, "perf_counter", lambda: float(next(walls)))
    monkeypatch.setattr(B.time, "process_time", lambda: float(next(cpus)))
    w, x = np.ones((4, 3)), np.ones(4)
    assert B.read_rate(w, x, reps=5) == (w.nbytes / 3, w.nbytes / 2)
