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

    sudo minipar cluster placement --rates 100mbit --json placement.json --hardware-file cluster.json

``placements``: lesson 05's trainer placed two ways per comparison (``COMPARISONS``: TP inside
or across the nodes, PP or TP across, DDP on one node or across the link), in interleaved
rounds on a cluster of its own; per placement the step time, the bytes between nodes (trace and
``accounting.comm_bytes``) and the planner's prediction from the cluster's hardware file
(``cluster_hardware``: links measured by ping-pong, the uplink's rate).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from ..cluster import launch as L
from ..cluster import nodes as N
from ..cluster import traffic as T
from ..costmodel import busbw, two_level_allreduce_time
from ..records import write_json

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
            rec["mpi_bytes"] = [statistics.median(T.mpi_bytes(d, q) for d in ds) for ds, q in zip(reps_by_node, payload)]
            rec["crossing_ok"] = all(T.verdict(d, q)[0] for ds, q in zip(reps_by_node, payload) for d in ds)
            rec["retransmitted_segments"] = [[d.get("retrans_segs", 0) for d in ds] for ds in reps_by_node]  # per node, rep
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

@dataclass(frozen=True)
class Placement:
    name: str
    order: str  # Megatron's order string, fastest-varying axis first
    per_node: int  # ranks on each node it uses, in blocks (nodes 0, 1, ...)


# Each comparison: lesson 05's grid, and two placements of it on a cluster of 2 nodes, first the one
# that keeps the slow link lighter. "ddp" is "DDP with and without NVLink": the same 2 ranks on
# one node, and across the shaped link.
COMPARISONS = {
    "tp": (dict(dp=2, tp=2), (Placement("tp inside, dp across", "tp-cp-pp-dp", 2),
                              Placement("tp across, dp inside", "dp-tp-cp-pp", 2))),
    "pp": (dict(pp=2, tp=2, microbatches=2), (Placement("tp inside, pp across", "tp-cp-pp-dp", 2),
                                              Placement("tp across, pp inside", "pp-tp-cp-dp", 2))),
    "ddp": (dict(dp=2), (Placement("ddp on one node", "tp-cp-pp-dp", 2),
                         Placement("ddp across the link", "tp-cp-pp-dp", 1))),
}
# the trainer's groups (accounting.comm_bytes' keys) and the grid axis each runs along
GROUP_AXIS = {"tp": "tp", "pp": "pp", "emb": "pp", "dp": "dp+cp", "cp": "cp"}


def formula_link_bytes(tr) -> dict:
    """{"inter", "intra"}: the bytes this rank sends in one step by ``accounting.comm_bytes``, a
    group's counted between nodes where the group spans nodes (``Grid.crosses``)."""
    from ..lessons.train import dp_units
    from ..train import accounting as acc

    want = acc.comm_bytes(tr.cfg, tr.grid.coords, *dp_units(tr))
    inter = sum(b for g, b in want.items() if b and tr.grid.crosses(GROUP_AXIS[g]))
    return {"inter": inter, "intra": sum(want.values()) - inter}


def placement_config(cfg, grid: dict, p: Placement):
    """``cfg`` on ``grid`` (a comparison's dp, pp, tp ...; the rest 1), placed as ``p`` says."""
    return cfg.with_(**{"dp": 1, "pp": 1, "tp": 1, "microbatches": 1, **grid}, order=p.order, ranks_per_node=p.per_node)


def tp_across(cfg, per_node: int) -> bool:
    """Do TP groups of ``cfg``'s grid span nodes of ``per_node`` ranks (placed in blocks)?"""
    from ..grid import rank_grid

    node = rank_grid((cfg.dp, cfg.pp, cfg.cp, cfg.tp), cfg.order) // per_node  # (dp, pp, cp, tp): each rank's node
    return bool((node != node[..., :1]).any())


def placement_rank(comm, cfg):
    """Lesson 05's trainer for ``cfg.steps`` steps on this rank; step 1 traced: the step times
    (slowest rank), the bytes this rank sent between nodes and inside them in step 1, read from
    the trace and by the formula."""
    from ..trace import link_bytes
    from ..train.trainer import train

    tr, losses, times = train(comm, cfg, trace_step=1)
    want = formula_link_bytes(tr)
    return {"step_times_s": times, "losses": losses, **link_bytes(comm.tracer.events, comm.rank),
            "want_inter": want["inter"], "want_intra": want["intra"]}


def cluster_hardware(rate: str, per_node: int, intra, inter_alpha: float, machine=None) -> dict:
    """The emulated cluster as a ``minipar plan --hardware-file`` (``plan.hardware.FILE_FIELDS``):
    ``per_node`` GPUs (ranks) per node; inside a node the link of a ping-pong between two ranks of
    node 0 (``intra``: alpha, beta); between nodes the latency of a ping-pong across the uplink and
    tbf's ``rate`` shared by the node's ranks (the file's inter link is per GPU, as a node with a
    NIC per GPU has it; here the node's ranks cross at once through its one uplink); the matmul
    rate, memory and its bandwidth this machine's (``this-machine``, float64). No calibration
    constants: the fractions are 1."""
    from ..plan.hardware import this_machine

    m = machine or this_machine("float64")
    return {"name": f"emulated cluster: nodes of {per_node} ranks, uplinks {rate} (float64 ranks of this machine)",
            "peak_flops": {"bf16": m.peak_flops}, "memory_bytes": m.memory_bytes, "hbm_bandwidth": m.hbm_bandwidth,
            "gpus_per_node": per_node, "intra": {"bandwidth": 1.0 / intra[1], "latency": intra[0]},
            "inter": {"bandwidth": N.parse_rate(rate) / 8 / per_node, "latency": inter_alpha},
            "matmul_fraction": 1.0, "link_fraction": 1.0}


def predicted(cfg, per_node: int, hw, tp_across: bool, cores: int):
    """The planner's prediction (``plan.predict``) of ``cfg`` on nodes of ``per_node`` ranks of ``hw``.

    What a hardware file cannot say is set here: the ranks train in float64 (8-byte activations,
    no mixed precision), and all ranks share this machine's ``cores`` (each gets cores / ranks of
    one); with ``per_node`` ranks on a node where the file has ``gpus_per_node``, each gets its
    share of the uplink. The planner lays TP innermost, inside a node, and the other axes outward
    across nodes; a placement with TP across the nodes and the other axis inside is that layout
    with the two links swapped (exact for the two-axis grids of ``COMPARISONS``)."""
    from dataclasses import replace

    from ..plan.config import Problem
    from ..plan.models import minipar_gpt
    from ..plan.predict import predict

    uplink = replace(hw.inter, bandwidth=hw.inter.bandwidth * hw.gpus_per_node / per_node)
    hw = replace(hw, dtype_bytes=8, mixed_precision=False, cores=cores * per_node / cfg.ranks, busy=(), inter=uplink,
                 gpus_per_node=per_node)
    if tp_across:
        hw = replace(hw, intra=hw.inter, inter=hw.intra)
    return predict(Problem(minipar_gpt(cfg.model), cfg.ranks, per_node, hw, cfg.batch, overlap_dp=False), cfg)


def probe_links(state) -> tuple:
    """((alpha, beta) inside node 0, (alpha, beta) across the uplink): ping-pongs on the cluster."""
    res = L.launch_on(state, "minipar.cluster.traffic:measure", per_node=2, n=256, ranks_per_node=2, fit=True).results
    return tuple(res[0]["intra"]), tuple(res[0]["inter"])


def placements(rate, cfg, compare=tuple(COMPARISONS), rounds: int = 2, hardware_file=None, progress=None):
    """Each comparison of ``compare`` on a cluster of 2 nodes (2 ranks each at most) of its own
    with uplinks at ``rate``; ``cfg`` a TrainConfig whose grid each comparison sets. All
    placements run in ``rounds`` interleaved rounds (the machine's speed drifts); per placement
    the median step time after the first step of every round, the bytes between nodes (trace and
    formula) and the planner's step time (and its parts) for the cluster's hardware file (written to
    ``hardware_file`` if given, with the links measured on the cluster first)."""
    from ..plan.hardware import hardware_from_dict, this_machine

    machine = this_machine("float64")
    state = N.up(2, 2, rate)
    runs = {(c, p.name): [] for c in compare for p in COMPARISONS[c][1]}
    try:
        intra, inter = probe_links(state)
        file = cluster_hardware(rate, 2, intra, inter[0], machine)
        if hardware_file:
            write_json(hardware_file, file, label="wrote the cluster's hardware file")
        for _ in (progress(range(rounds)) if progress else range(rounds)):
            for c in compare:
                grid, options = COMPARISONS[c]
                for p in options:
                    run = placement_config(cfg, grid, p)
                    on = list(range(run.ranks // p.per_node))
                    runs[c, p.name].append((run, p, L.launch_on(state, "minipar.bench.cluster:placement_rank",
                                                                per_node=p.per_node, on=on, cfg=run).results))
    finally:
        N.down(state)
    hw = hardware_from_dict(file, "the cluster's hardware file")
    out = []
    for (c, name), res in runs.items():
        run, p, first = res[0][0], res[0][1], res[0][2]
        times = [t for _, _, r in res for t in r[0]["step_times_s"][1:]]
        pred = predicted(run, p.per_node, hw, tp_across(run, p.per_node), machine.cores)
        out.append({"rate": rate, "comparison": c, "placement": name, "order": p.order, "ranks": run.ranks,
                    "ranks_per_node": p.per_node, "step_s": statistics.median(times), "steps_timed": len(times),
                    "inter_bytes": sum(x["inter"] for x in first), "intra_bytes": sum(x["intra"] for x in first),
                    "inter_bytes_formula": sum(x["want_inter"] for x in first),
                    "intra_bytes_formula": sum(x["want_intra"] for x in first),
                    "predicted_s": pred.step_time_s, "predicted_parts": pred.parts, "losses": first[0]["losses"]})
    return out


def placement_table(records) -> str:
    """The placement records as rows: step time measured and predicted, bytes between nodes
    (trace; the formula's when it differs) and inside them."""
    lines = [f"{'rate':>8} {'placement':>22} {'order':>12} {'ranks':>7} {'step ms':>8} {'predicted':>9} "
             f"{'between nodes B':>16} {'inside B':>11}"]
    for r in records:
        inter = f"{r['inter_bytes']:,}" + ("" if r["inter_bytes"] == r["inter_bytes_formula"]
                                           else f" (formula {r['inter_bytes_formula']:,})")
        lines.append(f"{r['rate']:>8} {r['placement']:>22} {r['order']:>12} {r['ranks'] // r['ranks_per_node']:>3}x"
                     f"{r['ranks_per_node']:<3} {1e3 * r['step_s']:8.0f} {1e3 * r['predicted_s']:9.0f} {inter:>16} "
                     f"{r['intra_bytes']:11,}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m minipar.bench.cluster RECORDS.json: the records as docs/cluster.md's table
    import json
    import sys

    for name in sys.argv[1:]:
        with open(name) as f:
            print(markdown(json.load(f)))
