"""Benchmark on the emulated cluster: the flat ring, the hierarchical all-reduce and MPI's own,
at each link rate, in one job per rate (so machine noise hits all three alike).

    sudo minipar cluster bench --rates 100mbit 1gbit --nodes 2 --ranks-per-node 2 --json out.json

For each rate it brings up a cluster of its own (and takes it down), runs
``minipar.cluster.traffic:measure`` on it and writes one record per (rate, algorithm): seconds
(slowest rank, median over repetitions), each node's uplink bytes against the exact payload,
busbw, the uplink's use (its bytes / seconds / rate), and the two-level alpha-beta prediction
(``costmodel.two_level_allreduce_time``) from ping-pongs inside and across nodes, with the
inter-node beta replaced by the configured rate. MPI's own all-reduce has no message list here
(its algorithm is MPICH's choice), so its bytes are reported, not checked.
"""
from __future__ import annotations

import statistics

from ..cluster import launch as L
from ..cluster import nodes as N
from ..cluster import traffic as T
from ..costmodel import busbw, two_level_allreduce_time

ALGS = ("ring", "hierarchical", "builtin")


def run(rates, n: int, nodes: int = 2, per_node: int = 2, reps: int = 3, progress=None) -> list[dict]:
    """Records for each rate (tc's spelling: "100mbit") and algorithm; ``n`` float32 elements."""
    records = []
    for rate in (progress(rates) if progress else rates):
        state = N.up(nodes, per_node, rate)
        try:
            res = L.launch_on(state, "minipar.cluster.traffic:measure", n=n, algorithms=ALGS,
                              ranks_per_node=per_node, reps=reps, fit=True).results
        finally:
            N.down(state)
        records += summarize(res, rate, n, nodes, per_node, reps)
    return records


def summarize(results, rate, n, nodes, per_node, reps) -> list[dict]:
    bits, nbytes, p = N.parse_rate(rate), 4 * n, nodes * per_node
    zero = results[0]
    intra = zero["intra"] or (0.0, 0.0)
    inter = ((zero["inter"] or (0.0, 0.0))[0], 8 / bits)
    out = []
    for alg in ALGS:
        seconds = statistics.median(max(r["algorithms"][alg]["seconds"][k] for r in results) for k in range(reps))
        reps_by_node = [[T.per_node(results, alg, k)[f"node{i}"] for k in range(reps)] for i in range(nodes)]
        tx = [statistics.median(d["tx_bytes"] for d in ds) for ds in reps_by_node]
        rec = {"rate": rate, "rate_bits": bits, "algorithm": alg, "bytes": nbytes, "nodes": nodes,
               "ranks_per_node": per_node, "seconds": seconds, "busbw": busbw("all_reduce", nbytes, seconds, p),
               "uplink_tx": tx, "uplink_use": max(tx) / seconds / (bits / 8),
               "rel_error": max(r["algorithms"][alg]["rel_error"] for r in results)}
        if alg != "builtin":
            payload = T.crossing_bytes(alg, n, 4, nodes, per_node)
            rec["payload"] = payload
            rec["headers"] = [statistics.median(T.HEADERS * d["tx_packets"] for d in ds) for ds in reps_by_node]
            rec["mpi_bytes"] = [statistics.median(d["tx_bytes"] - T.HEADERS * d["tx_packets"] - q for d in ds)
                                for ds, q in zip(reps_by_node, payload)]
            rec["crossing_ok"] = all(T.verdict(d, q)[0] for ds, q in zip(reps_by_node, payload) for d in ds)
            rec["predicted"] = two_level_allreduce_time(alg, nbytes, nodes, per_node, intra, inter)
        out.append(rec)
    ring = next(r for r in out if r["algorithm"] == "ring")
    hier = next(r for r in out if r["algorithm"] == "hierarchical")
    hier["vs_ring"] = hier["seconds"] / ring["seconds"]
    hier["vs_ring_predicted"] = hier["predicted"] / ring["predicted"]
    return out


def table(records) -> str:
    """The records as rows: rate, algorithm, ms, busbw, uplink use, headers (% of payload), MPI's
    own bytes, whether the counters match, predicted ms, the hierarchical's time over the ring's."""
    lines = [f"{'rate':>8} {'algorithm':>12} {'ms':>9} {'busbw MB/s':>10} {'uplink use':>10} "
             f"{'headers':>8} {'MPI B':>6} {'bytes':>5} {'pred ms':>8} {'vs ring (pred)':>15}"]
    for r in records:
        fr = f"{100 * max(r['headers']) / max(r['payload']):.2f}%" if "headers" in r else "-"
        mpi = f"{max(r['mpi_bytes']):.0f}" if "mpi_bytes" in r else "-"
        ok = ("ok" if r["crossing_ok"] else "FAIL") if "crossing_ok" in r else "-"
        pred = f"{1e3 * r['predicted']:.1f}" if "predicted" in r else "-"
        vs = f"{r['vs_ring']:.2f} ({r['vs_ring_predicted']:.2f})" if "vs_ring" in r else ""
        lines.append(f"{r['rate']:>8} {r['algorithm']:>12} {1e3 * r['seconds']:9.1f} {r['busbw'] / 1e6:10.1f} "
                     f"{r['uplink_use']:10.2f} {fr:>8} {mpi:>6} {ok:>5} {pred:>8} {vs:>15}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- placement of a 3D grid

PLACEMENTS = {"tp inside, dp across": "tp-cp-pp-dp", "tp across, dp inside": "dp-tp-cp-pp"}


def placement_rank(comm, cfg):
    """Lesson 05's trainer for ``cfg.steps`` steps on this rank; step 1 traced: the step times
    (slowest rank) and the bytes this rank sent between nodes and inside them in step 1."""
    from ..trace import link_bytes
    from ..train.trainer import train

    _, losses, times = train(comm, cfg, trace_step=1)
    return {"step_times_s": times, "losses": losses, **link_bytes(comm.tracer.events, comm.rank)}


def placements(rate, cfg, rounds: int = 2, progress=None) -> list[dict]:
    """TP inside the nodes and DP across them, against TP across and DP inside, on a cluster of
    2 nodes x 2 ranks of its own with uplinks at ``rate``; ``cfg`` a dp = tp = 2 TrainConfig. The
    placements run in ``rounds`` interleaved rounds (the machine's speed drifts); per placement
    the median step time after the first step of every round, and the bytes between nodes."""
    state = N.up(2, 2, rate)
    runs = {name: [] for name in PLACEMENTS}
    try:
        for _ in (progress(range(rounds)) if progress else range(rounds)):
            for name, order in PLACEMENTS.items():
                c = cfg.with_(order=order, ranks_per_node=2)
                runs[name].append(L.launch_on(state, "minipar.bench.cluster:placement_rank", cfg=c).results)
    finally:
        N.down(state)
    out = []
    for name, res in runs.items():
        times = [t for r in res for t in r[0]["step_times_s"][1:]]
        out.append({"rate": rate, "placement": name, "order": PLACEMENTS[name], "step_s": statistics.median(times),
                    "steps_timed": len(times), "inter_bytes": sum(x["inter"] for x in res[0]),
                    "intra_bytes": sum(x["intra"] for x in res[0]), "losses": res[0][0]["losses"]})
    return out
