"""Proof that the bytes cross the link: each node's uplink counters against the formula.

    out = launch_on(state, "minipar.cluster.traffic:measure", n=1 << 19, algorithms=("ring",))

Each rank reads its node's ``/sys/class/net/eth0/statistics`` (inside the node's namespace they
are that node's uplink) around a collective: ``read; barrier; collective; barrier; read``.
What the collective had to send across nodes is counted exactly from its message list
(:func:`messages`): the payload of every message whose two ranks sit on different nodes. The
counters carry more: each packet's Ethernet + IPv4 + TCP headers (66 bytes with timestamps; with
veth's segmentation offload one header per up to 64 KiB), the receiver's ACKs, MPI's own message
headers and the two barriers. :func:`verdict` accepts measured bytes between the payload and the
payload plus ``FRAMING`` of it plus ``SLACK`` bytes; bytes that went through shared memory instead
(ranks that are really on one node) leave the counters near zero and fail it.
"""
from __future__ import annotations

import socket
import time

import numpy as np

from .. import collectives as C
from .. import xp
from ..xp import chunk_bounds

FRAMING = 0.03  # at most 3% over the payload: headers, ACKs (measured 0.2-0.7%: docs/cluster.md)
SLACK = 16 * 1024  # bytes: the barriers, MPI's connection set-up and rendezvous messages
STATS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
ALGORITHMS = ("ring", "hierarchical", "builtin")


def messages(algorithm: str, n: int, nodes: int, per_node: int):
    """Every message of one all-reduce of ``n`` elements on ``nodes`` x ``per_node`` ranks
    (placed in blocks): (source rank, destination rank, elements). Exact, from the same chunk
    rule as :mod:`minipar.collectives`."""
    p = nodes * per_node
    out = []

    def ring(members, length):  # ring_steps' reduce-scatter then all-gather on ``members``
        q = len(members)
        b = chunk_bounds(length, q)
        size = lambda c: b[c % q][1] - b[c % q][0]  # noqa: E731
        for i, src in enumerate(members):
            dst = members[(i + 1) % q]
            out.extend((src, dst, size(i - s - 1)) for s in range(q - 1))  # reduce-scatter
            out.extend((src, dst, size(i - s)) for s in range(q - 1))  # all-gather

    if algorithm == "ring":
        ring(list(range(p)), n)
    elif algorithm == "hierarchical":
        shards = chunk_bounds(n, per_node)
        for node in range(nodes):  # reduce-scatter and all-gather inside each node: same sizes as one ring
            ring([node * per_node + l for l in range(per_node)], n)
        for l, (a, b) in enumerate(shards):  # local index l's ring across the nodes, on shard l
            ring([node * per_node + l for node in range(nodes)], b - a)
    else:
        raise ValueError(f"algorithm={algorithm!r}: the message list is known for ring and hierarchical")
    return [m for m in out if m[2] and m[0] != m[1]]


def crossing_bytes(algorithm: str, n: int, itemsize: int, nodes: int, per_node: int) -> list[int]:
    """Payload bytes each node must send over its uplink: messages between ranks on different nodes."""
    sent = [0] * nodes
    for src, dst, elems in messages(algorithm, n, nodes, per_node):
        if src // per_node != dst // per_node:
            sent[src // per_node] += elems * itemsize
    return sent


def read_counters(ifname: str = "eth0") -> dict:
    """This node's uplink counters (inside a node's namespace, /sys/class/net is the node's)."""
    out = {}
    for k in STATS:
        with open(f"/sys/class/net/{ifname}/statistics/{k}") as f:
            out[k] = int(f.read())
    return out


def measure(comm, n: int = 1 << 18, algorithms=("ring",), ranks_per_node: int = 1, reps: int = 1,
            ifname: str = "eth0", dtype: str = "float32", seed: int = 0, fit: bool = False):
    """On every rank of a cluster job: for each algorithm, ``reps`` all-reduces of ``n`` elements,
    each timed and each wrapped in counter reads. Returns this rank's host, its node's
    shared-memory group size as MPI sees it, and per algorithm the seconds of each rep and the
    counter deltas of each rep (what this rank's node's uplink carried). ``fit``: also the
    (alpha, beta) of a ping-pong inside node 0 (ranks 0, 1) and across (ranks 0, R)."""
    rng = np.random.default_rng([seed, comm.rank])
    x = comm.asarray(rng.standard_normal(n).astype(dtype))
    groups = C.node_groups(comm, ranks_per_node) if "hierarchical" in algorithms else None
    run = {"ring": lambda: C.all_reduce(comm, x, "ring"),
           "hierarchical": lambda: C.hierarchical_all_reduce(*groups, x),
           "builtin": lambda: comm.builtin.all_reduce(x)}
    want = comm.builtin.all_reduce(x)
    out = {"host": socket.gethostname(), "rank": comm.rank, "shared_memory_group": _shared_group_size(),
           "algorithms": {}}
    for alg in algorithms:
        times, deltas, err = [], [], 0.0
        for _ in range(reps):
            before = read_counters(ifname)
            comm.barrier()
            t0 = time.perf_counter()
            got = run[alg]()
            t1 = time.perf_counter()
            comm.barrier()
            after = read_counters(ifname)
            times.append(t1 - t0)
            deltas.append({k: after[k] - before[k] for k in STATS})
            err = max(err, float(abs(xp.to_numpy(got) - xp.to_numpy(want)).max() / abs(xp.to_numpy(want)).max()))
        out["algorithms"][alg] = {"seconds": times, "deltas": deltas, "rel_error": err}
    if fit:
        out["intra"] = _fit_pair(comm, 1) if ranks_per_node > 1 else None
        out["inter"] = _fit_pair(comm, ranks_per_node) if comm.size > ranks_per_node else None
    return out


def _fit_pair(comm, other: int, sizes=(8, 1 << 16, 1 << 20), reps=3):
    """(alpha, beta) of a ping-pong between rank 0 and rank ``other`` (the others wait)."""
    from ..costmodel import fit_alpha_beta, pingpong

    pair = comm.split(0 if comm.rank in (0, other) else None, key=comm.rank, name="pingpong")
    got = fit_alpha_beta(*zip(*pingpong(pair, sizes, reps))) if pair is not None else None
    comm.barrier()
    return got


def _shared_group_size():
    """How many ranks MPI puts on my shared-memory node (MPI_COMM_TYPE_SHARED), or None off MPI."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    if not MPI.Is_initialized():
        return None
    return MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_size()


def per_node(results: list, algorithm: str, rep: int = 0) -> dict:
    """{host: counter deltas} of one rep, from any rank of each node (they read the same counters;
    the first rank of a node is taken)."""
    out = {}
    for r in sorted(results, key=lambda r: r["rank"]):
        out.setdefault(r["host"], r["algorithms"][algorithm]["deltas"][rep])
    return out


def verdict(measured_tx: int, payload: int, framing: float = FRAMING, slack: int = SLACK) -> tuple[bool, str]:
    """(ok, one line): did ``measured_tx`` bytes on an uplink carry ``payload`` bytes of messages?"""
    over = measured_tx - payload
    ok = payload <= measured_tx <= payload * (1 + framing) + slack
    pct = 100 * over / payload if payload else float("inf")
    why = ("" if ok else " -- less than the payload: the bytes did not cross this link (shared memory?)"
           if measured_tx < payload else f" -- more than {100 * framing:.0f}% + {slack} B of framing")
    return ok, f"measured {measured_tx} B, payload {payload} B, framing {over:+d} B ({pct:+.1f}%){why}"
