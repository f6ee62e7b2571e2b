"""Proof that the bytes cross the link: each node's uplink counters against the formula.

    out = launch_on(state, "minipar.cluster.traffic:measure", n=1 << 19, algorithms=("ring",))

Each rank reads its node's ``/sys/class/net/eth0/statistics`` (inside the node's namespace they
are that node's uplink) around a collective: ``read; barrier; collective; barrier; read``.
What the collective had to send across nodes is counted exactly from its message list
(:func:`messages`): the payload of every message whose two ranks sit on different nodes.

The counters carry more than the payload, and the rest is measured: every packet has
``HEADERS`` = 66 bytes of Ethernet (14) + IPv4 (20) + TCP (20 + 12 of timestamps), the ACKs
for what came in are packets of 66 bytes, and MPI adds its own message headers and the two
barriers. So ``tx_bytes - 66 * tx_packets - payload`` is what MPI added; measured here it is
about 1.1 kB per all-reduce, whatever its size (docs/cluster.md), and :func:`verdict` accepts
0 ... ``SLACK`` bytes. The 66 bytes per packet are 0.2% of the bytes at 1 Gbit/s (veth's
segmentation offload sends up to 64 kB per packet) and 4.5% at 100 Mbit/s (TCP sizes its
packets to the pacing rate: one 1448-byte segment each). Bytes that went through shared memory
instead (ranks that are really on one node) leave the counters near zero: far below the payload.

A segment TCP sends twice crosses twice. At 10 Gbit/s on 2 cores the receiving side sometimes
drops a burst (its backlog full while both cores are busy) and the sender retransmits it: measured
once in five 8 MB all-reduces, 65,160 bytes (45 segments of 1448) more than the payload. So each
rank also reads its node's ``RetransSegs`` (``/proc/net/snmp``, per namespace: the node's TCP), and
:func:`verdict` takes ``MSS`` bytes per retransmitted segment off before it bounds the rest.
"""
from __future__ import annotations

import socket
import time

import numpy as np

from .. import collectives as C
from .. import xp
from ..xp import chunk_bounds

HEADERS = 66  # bytes per packet: Ethernet 14 + IPv4 20 + TCP 20 + TCP timestamps 12
SLACK = 8 * 1024  # bytes MPI may add: message headers, the barriers, connection set-up (measured ~1.1 kB)
MSS = 1448  # payload bytes of a full TCP segment: MTU 1500 - IPv4 20 - TCP 20 - timestamps 12
STATS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets", "retrans_segs")
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
    for k in STATS[:-1]:
        with open(f"/sys/class/net/{ifname}/statistics/{k}") as f:
            out[k] = int(f.read())
    out["retrans_segs"] = retransmitted_segments()
    return out


def retransmitted_segments(snmp: str = "/proc/net/snmp") -> int:
    """This namespace's TCP ``RetransSegs``: segments sent again since boot (a header line of
    names, then a line of values, both starting "Tcp:")."""
    with open(snmp) as f:
        names, values = [line.split() for line in f if line.startswith("Tcp:")][:2]
    return int(values[names.index("RetransSegs")])


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


def mpi_bytes(counters: dict, payload: int) -> int:
    """What an uplink carried besides the payload, the packets' headers and the segments TCP sent
    again (each crossed twice): MPI's own bytes, if the payload really crossed."""
    return (counters["tx_bytes"] - HEADERS * counters["tx_packets"] - payload
            - MSS * counters.get("retrans_segs", 0))


def verdict(counters: dict, payload: int, slack: int = SLACK) -> tuple[bool, str]:
    """(ok, one line): did an uplink whose counters moved by ``counters`` (tx_bytes, tx_packets)
    carry ``payload`` bytes of messages? What is left after the payload and 66 bytes per packet
    must be MPI's own few bytes: 0 ... ``slack``."""
    tx, packets = counters["tx_bytes"], counters["tx_packets"]
    rest = mpi_bytes(counters, payload)
    ok = 0 <= rest <= slack
    why = ("" if ok else " -- less than the payload: the bytes did not cross this link (shared memory?)"
           if rest < 0 else f" -- more than {slack} B besides the payload and the headers")
    again = counters.get("retrans_segs", 0)
    resent = f" + {MSS} B x {again} segments sent again" if again else ""
    return ok, (f"measured {tx} B in {packets} packets = payload {payload} B + {HEADERS} B x {packets} "
                f"headers{resent} {rest:+d} B{why}")
