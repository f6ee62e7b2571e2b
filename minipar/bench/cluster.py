"""Benchmark on the emulated cluster: the flat ring, the hierarchical all-reduce and MPI's own,
at each link rate, in one job per rate (so machine noise hits all three alike).

    sudo minipar cluster bench --rates 100mbit 1gbit --nodes 2 --ranks-per-node 2 --json out.json
    python -m minipar.bench.cluster out.json      # the records as docs/cluster.md's table

For each rate it brings up a cluster of its own (and takes it down), or reshapes the one it is
given (``state=``: ``nodes.set_rate``), runs ``minipar.cluster.traffic:measure`` on it and writes
one record per (rate, algorithm): the load average when it started, seconds (slowest rank, median over repetitions), each node's
uplink bytes against the exact payload, busbw and busbw over the configured rate, the uplink's
use (its bytes / seconds / rate), and the two-level alpha-beta prediction
(``costmodel.two_level_allreduce_time``) from ping-pongs inside and across nodes, with the
inter-node beta replaced by the configured rate. MPI's own all-reduce has no message list here
(its algorithm is MPICH's choice), so its bytes are reported, not checked.

The first all-reduce of each algorithm is a warm-up, neither timed nor counted (as nccl-tests'
warm-up iterations): it opens the TCP connections, and starts each in slow start; measured at
1 Gbit/s it ran at 0.05-0.3 of the rate, against 0.7-0.85 for the ones after it.
"""
from __future__ import annotations

import os
import statistics

from ..cluster import launch as L
from ..cluster import nodes as N
from ..cluster import traffic as T
from ..costmodel import busbw, two_level_allreduce_time

ALGS = ("ring", "hierarchical", "builtin")
NAMES = {"ring": "ring", "hierarchical": "hierarchical", "builtin": "MPI (MPICH)"}


def run(rates, n: int, nodes: int = 2, per_node: int = 2, reps: int = 3, progress=None, state: dict | None = None,
        warmup: int = 1) -> list[dict]:
    """Records for each rate (tc's spelling: "100mbit") and algorithm; ``n`` float32 elements.
    ``state``: a cluster of ``nodes`` x ``per_node`` that is up, reshaped to each rate in turn and
    left at the rate it had; else a cluster of its own per rate."""
    records = []
    before = state and state["inter_rate"]
    try:
        for rate in (progress(rates) if progress else rates):
            own = N.up(nodes, per_node, rate) if state is None else N.set_rate(state, rate)
            load = os.getloadavg()[0]  # the machine's state when the job starts: the records say how busy it was
            try:
                res = L.launch_on(own, "minipar.cluster.traffic:measure", n=n, algorithms=ALGS,
                                  ranks_per_node=per_node, reps=warmup + reps, fit=True).results
            finally:
                if state is None:
                    N.down(own)
            records += [dict(r, load_average=load) for r in summarize(res, rate, n, nodes, per_node, reps, warmup)]
    finally:
        if state is not None and N.existing(state):  # (a cluster taken down meanwhile: nothing to restore)
            N.set_rate(state, f"{before}bit")
    return records


def summarize(results, rate, n, nodes, per_node, reps, warmup: int = 0) -> list[dict]:
    """One record per algorithm from the ranks' ``measure`` results; the first ``warmup`` reps are dropped."""
    bits, nbytes, p = N.parse_rate(rate), 4 * n, nodes * per_node
    zero = results[0]
    intra = zero["intra"] or (0.0, 0.0)
    inter = ((zero["inter"] or (0.0, 0.0))[0], 8 / bits)
    timed = range(warmup, warmup + reps)
    out = []
    for alg in ALGS:
        seconds = statistics.median(max(r["algorithms"][alg]["seconds"][k] for r in results) for k in timed)
        reps_by_node = [[T.per_node(results, alg, k)[f"node{i}"] for k in timed] for i in range(nodes)]
        tx = [statistics.median(d["tx_bytes"] for d in ds) for ds in reps_by_node]
        bw = busbw("all_reduce", nbytes, seconds, p)
        rec = {"rate": rate, "rate_bits": bits, "algorithm": alg, "bytes": nbytes, "nodes": nodes,
               "ranks_per_node": per_node, "reps": reps, "warmup": warmup, "seconds": seconds, "busbw": bw,
               "busbw_over_rate": bw / (bits / 8), "uplink_tx": tx, "uplink_use": max(tx) / seconds / (bits / 8),
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
    """The records as rows: rate, algorithm, ms, busbw, busbw over the rate, uplink use, headers (%
    of payload), MPI's own bytes, whether the counters match, predicted ms, the hierarchical's time over the ring's."""
    lines = [f"{'rate':>8} {'algorithm':>12} {'ms':>9} {'busbw MB/s':>10} {'busbw/rate':>10} {'uplink use':>10} "
             f"{'headers':>8} {'MPI B':>6} {'bytes':>5} {'pred ms':>8} {'vs ring (pred)':>15}"]
    for r in records:
        fr = f"{100 * max(r['headers']) / max(r['payload']):.2f}%" if "headers" in r else "-"
        mpi = f"{max(r['mpi_bytes']):.0f}" if "mpi_bytes" in r else "-"
        ok = ("ok" if r["crossing_ok"] else "FAIL") if "crossing_ok" in r else "-"
        pred = f"{1e3 * r['predicted']:.1f}" if "predicted" in r else "-"
        vs = f"{r['vs_ring']:.2f} ({r['vs_ring_predicted']:.2f})" if "vs_ring" in r else ""
        lines.append(f"{r['rate']:>8} {r['algorithm']:>12} {1e3 * r['seconds']:9.1f} {r['busbw'] / 1e6:10.1f} "
                     f"{r['busbw'] / (r['rate_bits'] / 8):10.2f} {r['uplink_use']:10.2f} {fr:>8} {mpi:>6} {ok:>5} "
                     f"{pred:>8} {vs:>15}")
    return "\n".join(lines)


def check_rows(records) -> list[dict]:
    """Check rows (``lessons.common.format_rows``) of the ring and hierarchical records: the sums
    equal MPI's (float32 against float32, 1e-5: only the order of the additions differs), and each
    uplink carried the algorithm's payload + 66 B a packet + MPI's own 0 ... ``traffic.SLACK``
    bytes, in every timed repetition (the error shown: MPI's bytes over the payload)."""
    rows = []
    for r in records:
        if "payload" not in r:
            continue
        where = f"cluster {r['nodes']}x{r['ranks_per_node']} at {r['rate']}: {r['algorithm']}"
        rows.append({"what": f"{where} == MPI's all-reduce (float32)", "error": r["rel_error"], "tolerance": 1e-5,
                     "ok": r["rel_error"] <= 1e-5})
        rows.append({"what": f"{where}: uplink bytes == payload + headers + MPI's few",
                     "error": max(abs(b) for b in r["mpi_bytes"]) / max(r["payload"]),
                     "tolerance": T.SLACK / max(r["payload"]), "ok": bool(r["crossing_ok"])})
    return rows


def same_losses_row(records) -> dict:
    """A check row: every placement of one grid trained the same model (its losses, float64, to 1e-12)."""
    base = records[0]["losses"]
    err = max(abs(a - b) / abs(b) for r in records for a, b in zip(r["losses"], base))
    return {"what": f"placements {' / '.join(dict.fromkeys(r['order'] for r in records))}: the same losses (float64)",
            "error": err, "tolerance": 1e-12, "ok": err <= 1e-12 and all(len(r["losses"]) == len(base) for r in records)}


def rate_words(bits: int) -> str:
    """10**9 -> "1 Gbit/s", 10**8 -> "100 Mbit/s"."""
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if bits >= size:
            return f"{bits / size:g} {unit}bit/s"
    return f"{bits} bit/s"


def markdown(records) -> str:
    """The records as docs/cluster.md's table (one row per rate and algorithm)."""
    out = ["| rate | load | ranks | algorithm | ms | busbw MB/s | busbw / rate | uplink use | headers | MPI's bytes | counters "
           "| predicted ms | hierarchical / ring (predicted) |",
           "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in records:
        checked = "payload" in r
        load = f"{r['load_average']:.0f}" if "load_average" in r else ""
        out.append(f"| {rate_words(r['rate_bits'])} | {load} | {r['nodes']} x {r['ranks_per_node']} | {NAMES[r['algorithm']]} | "
                   f"{1e3 * r['seconds']:.0f} | {r['busbw'] / 1e6:.1f} | {r['busbw'] / (r['rate_bits'] / 8):.2f} | "
                   f"{r['uplink_use']:.2f} | "
                   + (f"{100 * max(r['headers']) / max(r['payload']):.2g}% | {max(r['mpi_bytes']):.0f} | "
                      f"{'ok' if r['crossing_ok'] else 'FAIL'} | {1e3 * r['predicted']:.0f} | " if checked else "| | | | ")
                   + (f"{r['vs_ring']:.2f} ({r['vs_ring_predicted']:.2f})" if "vs_ring" in r else "") + " |")
    return "\n".join(out)


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


if __name__ == "__main__":  # python -m minipar.bench.cluster RECORDS.json: the records as docs/cluster.md's table
    import json
    import sys

    for name in sys.argv[1:]:
        with open(name) as f:
            print(markdown(json.load(f)))
