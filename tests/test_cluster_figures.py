"""The cluster's all-reduce bench records and their figures: the warm-up left out of the times,
busbw over the rate, the check rows the notebook prints, the figures drawn from the stored
records, and reshaping a running cluster's uplinks (root; skipped with the reason otherwise).
Notebook 01 runs its cluster section end to end in tests/test_notebooks.py."""
import copy
import json
import os

import pytest

from minipar.bench import cluster as B
from minipar.cluster import nodes as N
from minipar.cluster import traffic as T
from minipar.figures import cluster as FC

WHY = N.refusal()
needs_namespaces = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def fake_results(seconds, n=1 << 10, nodes=2, per_node=2, extra=500):
    """What ``traffic.measure`` returns on each rank of ``nodes`` x ``per_node``, rep k of every
    algorithm taking ``seconds[k]``, each uplink carrying the payload + 66 B x packets + ``extra``."""
    out = []
    for rank in range(nodes * per_node):
        node = rank // per_node
        algs = {}
        for alg in B.ALGS:
            pay = T.crossing_bytes(alg, n, 4, nodes, per_node)[node] if alg != "builtin" else n * 4
            d = {"tx_bytes": pay + T.HEADERS * 100 + extra, "tx_packets": 100, "rx_bytes": 0, "rx_packets": 0}
            algs[alg] = {"seconds": list(seconds), "deltas": [dict(d) for _ in seconds], "rel_error": 3e-8}
        out.append({"host": f"node{node}", "rank": rank, "shared_memory_group": per_node, "algorithms": algs,
                    "intra": (1e-5, 1e-9), "inter": (5e-5, 1e-8)})
    return out


def test_the_warm_up_is_left_out_and_busbw_is_read_against_the_rate():
    res = fake_results([1.0, 0.01, 0.03])  # rep 0: connection set-up and slow start
    recs = B.summarize(res, "100mbit", 1 << 10, 2, 2, reps=2, warmup=1)
    ring = next(r for r in recs if r["algorithm"] == "ring")
    assert ring["seconds"] == pytest.approx(0.02) and ring["warmup"] == 1
    assert ring["busbw_over_rate"] == pytest.approx(4096 / 0.02 * 1.5 / 12.5e6)
    assert all(r["crossing_ok"] for r in recs if "payload" in r)
    # a bench that timed its warm-up (the mutant): the slow first rep drags the median
    timed_all = B.summarize(res, "100mbit", 1 << 10, 2, 2, reps=2, warmup=0)
    assert next(r for r in timed_all if r["algorithm"] == "ring")["seconds"] == pytest.approx(0.505)
    # the printed table and the doc's table say busbw / rate
    assert "busbw/rate" in B.table(recs) and f"{ring['busbw_over_rate']:10.2f}" in B.table(recs)
    lines = B.markdown(recs).splitlines()
    assert len(lines) == 2 + len(recs) and "| 100 Mbit/s |  | 2 x 2 | ring |" in lines[2]
    assert f"| {ring['busbw_over_rate']:.2f} |" in lines[2]


def test_the_check_rows_fail_on_wrong_sums_bytes_or_losses():
    recs = B.summarize(fake_results([0.01, 0.01]), "1gbit", 1 << 10, 2, 2, reps=1, warmup=1)
    rows = B.check_rows(recs)
    assert len(rows) == 4 and all(r["ok"] for r in rows)  # ring and hierarchical: sums and bytes
    bad = copy.deepcopy(recs)
    bad[0]["rel_error"] = 1e-3
    bad[1]["crossing_ok"] = False  # the hierarchical's bytes went through shared memory
    assert [r["ok"] for r in B.check_rows(bad)] == [False, True, True, False]
    # the same mutants judged by the counters themselves: shared memory leaves the uplink near zero
    short = B.summarize(fake_results([0.01, 0.01], extra=-5000), "1gbit", 1 << 10, 2, 2, reps=1, warmup=1)
    assert not any(r["ok"] for r in B.check_rows(short) if "uplink" in r["what"])
    placed = [{"order": "tp-cp-pp-dp", "losses": [4.5, 4.25]}, {"order": "dp-tp-cp-pp", "losses": [4.5, 4.25 * (1 + 1e-15)]}]
    assert B.same_losses_row(placed)["ok"]
    placed[1]["losses"][1] = 4.3  # a placement that trained something else
    assert not B.same_losses_row(placed)["ok"]


@pytest.mark.slow
def test_the_figures_draw_the_stored_records(tmp_path):
    bench, placed = FC.load(FC.BENCH), FC.load(FC.PLACEMENT)
    series = FC.allreduce_series(bench)
    for alg, s in series.items():  # every point is a record's, rates ascending
        recs = sorted((r for r in bench if r["algorithm"] == alg), key=lambda r: r["rate_bits"])
        assert s["seconds"] == [r["seconds"] for r in recs] and s["rate_bits"] == sorted(s["rate_bits"])
        assert (s["predicted"] is None) == (alg == "builtin")
    assert set(series) == set(B.ALGS)
    swapped = copy.deepcopy(bench)  # a mutant record set: measured and predicted exchanged
    for r in swapped:
        if "predicted" in r:
            r["seconds"], r["predicted"] = r["predicted"], r["seconds"]
    assert FC.allreduce_series(swapped)["ring"]["seconds"] != series["ring"]["seconds"]
    rows = FC.placement_series(placed)
    assert sorted(r["inter_bytes"] for r in rows) == sorted(r["inter_bytes"] for r in placed)
    paths = FC.make(tmp_path)
    assert [os.path.basename(p) for p in paths] == ["cluster_allreduce.png", "cluster_placement.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(p) > 10_000
    # a record with the planner's prediction draws it too (``predicted_s``)
    with_pred = [dict(r, predicted_s=r["step_s"] * 0.8) for r in placed]
    got = FC.placement_series(with_pred)
    assert sorted(r["predicted"] for r in got) == sorted(r["step_s"] * 0.8 for r in placed)
    # the uplink's share: half the bytes between 2 nodes, at the rate (100 Mbit/s: 12.5 MB/s)
    slow = next(r for r in got if r["label"].startswith("100mbit"))
    assert slow["link_s"] == slow["inter_bytes"] / 2 / 12.5e6
    FC.placement(with_pred, tmp_path / "pred.png")
    # the stored records are the bench's, and their own checks pass
    assert all(r["ok"] for r in B.check_rows(bench)) and B.same_losses_row(placed)["ok"]
    json.dumps(bench)


@needs_namespaces
@pytest.mark.timeout(60)
def test_set_rate_reshapes_a_running_cluster_both_ways():
    state = N.up(2, 1, "100mbit")
    try:
        assert all("rate 100Mbit" in q for q in N.qdiscs(state).values())
        N.set_rate(state, "1gbit")
        assert all("rate 1Gbit" in q for q in N.qdiscs(state).values())  # each node's side
        switch = N._sh("tc", "-n", state["switch"], "qdisc", "show")
        assert switch.count("rate 1Gbit") == 2 and "100Mbit" not in switch  # the switch's side of each link
        assert N.find(state["id"])["inter_rate"] == 10**9  # the state file says so
    finally:
        N.down(state)
    assert not N.existing(state)
