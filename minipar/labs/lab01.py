"""Lab 01 (collectives): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns
a list of failure messages that say where the result differs (rank, element, expected vs got)
or which rule of the technique was broken. The smallest case comes first, so the first
message is the one to read. The rules (``minipar.labs.checks``):

* values against the engine's own collective (``comm.builtin``, the reference), computed
  outside the learner's call; inside it ``comm.builtin`` is refused;
* traffic: the bytes and non-empty messages each rank sends, exactly what minipar's ring
  sends (to the right neighbour only), so a builtin or mpi4py collective (0 bytes through
  comm), a naive or tree all-reduce (other counts) or a left-going ring fail;
* the broadcast is a binomial tree: every rank receives the data once, within ceil(log2 p)
  hops of the root, and the root sends at most ceil(log2 p) messages; the other ranks'
  buffers start as NaN, so a rank that returns before receiving shows;
* the messages are the learner's: every send and receive made by their own code, not by
  minipar's collectives (a tree_broadcast returning ``minipar.collectives.broadcast`` sends the
  right messages, but wrote none of them);
* the hierarchical all-reduce runs on emulated nodes (every placement of the ranks in blocks of R,
  R dividing p, as ``mpiexec -hosts a:R,b:R`` places them): each message is classed by the node
  of its peer, across nodes a rank talks only to its own local rank on the next node, and the
  bytes inside and across nodes are exactly those of the three rings (only the shard crosses).
"""
from __future__ import annotations

import math

import numpy as np

from ..lessons.collectives import draw
from ..xp import chunk_bounds, to_numpy
from ..trace import SEND_KINDS
from .checks import (chunk_counts, compare, expect_traffic, graded, no_builtin, ran, ranks,
                     ring_traffic, sent, sent_by_learner, stop)
from .grader import Task

TITLE = "collectives from send/recv"
HERE = "minipar.labs.lab01"
INSTEAD = "comm.sendrecv (or comm.send / comm.recv, isend / irecv)"

TASKS = [
    Task("1.1", "ring pass", "ring_pass", f"{HERE}:check_ring_pass"),
    Task("1.2", "tree broadcast", "tree_broadcast", f"{HERE}:check_tree_broadcast"),
    Task("1.3", "ring reduce-scatter", "ring_reduce_scatter", f"{HERE}:check_reduce_scatter"),
    Task("1.4", "ring all-gather", "ring_all_gather", f"{HERE}:check_all_gather"),
    Task("1.5", "ring all-reduce", "ring_all_reduce", f"{HERE}:check_all_reduce"),
    Task("1.6", "cost model of the ring", "predicted_ring_time", f"{HERE}:check_cost_model", sizes=(1,),
         reference=("minipar.costmodel:allreduce_time",)),
    Task("1.7", "hierarchical all-reduce", "hierarchical_all_reduce", f"{HERE}:check_hierarchical",
         reference=("minipar.collectives:hierarchical_all_reduce",)),
]

# Hints, stage by stage (`minipar check 01 --hint 1.3`): a nudge naming the idea and what to read,
# the shape of the loop, then near-pseudocode. The answer itself: `minipar lab solution 01 --task 1.3`.
HINTS = {
    "1.1": (
        """A send and a receive at once: comm.sendrecv(x, dst, buf, src) sends x to dst while it
        receives into buf from src (docs/communicator.md). A send then a recv on every rank
        deadlocks: comm.send is synchronous, so every rank waits in its send.""",
        """Right neighbour (comm.rank + 1) % comm.size, left (comm.rank - 1) % comm.size; the buffer
        has x's shape, dtype and kind: empty(x.shape, like=x) from minipar.xp (a NumPy array under
        MPI, a torch tensor under torch). On 1 rank both neighbours are you, and sendrecv still works.""",
        """
        buf = empty(x.shape, like=x)
        return comm.sendrecv(x, (comm.rank + 1) % comm.size, buf, (comm.rank - 1) % comm.size)
        """,
    ),
    "1.2": (
        """A binomial tree doubles the ranks that hold the data every round, so p ranks take
        ceil(log2 p) rounds. Count in virtual ranks vr = (rank - root) % p, the root being vr 0;
        comm.send and comm.recv suffice (every send has its recv in the same round). The lesson:
        notebooks/01_collectives.ipynb.""",
        """Rounds k = 1, 2, 4, ... while k < p. In round k the ranks vr < k have the data: each sends
        it to vr + k (if vr + k < p); the ranks k <= vr < 2k receive it from vr - k. A virtual rank v
        is the real rank (v + root) % p. Receive into x itself, then return x.""",
        """
        p, vr, k = comm.size, (comm.rank - root) % comm.size, 1
        while k < p:
            if vr < k and vr + k < p:   send x to (vr + k + root) % p
            elif k <= vr < 2 * k:       recv into x from (vr - k + root) % p
            k *= 2
        return x
        """,
    ),
    "1.3": (
        """Picture p runners on a circle, each with a bag per chunk. Every step each runner hands one
        bag to the runner on the right and adds what it gets from the left into its own bag of the
        same chunk. Which bag must start the journey where, so that after p-1 hand-overs the full
        bag of chunk r is at rank r? Draw it for p = 3 before writing code (notebooks/01_collectives.ipynb
        animates it). Chunks: chunk_bounds(len(x), p); one comm.sendrecv per step.""",
        """Work on buf = copy(x) (the caller's x stays as it was). Chunk r must finish at rank r after
        p-1 hops, so it starts at rank r + 1 and in step s it is at rank r + 1 + s: in step s rank r
        sends chunk (r - s - 1) % p to r + 1, and receives chunk (r - s - 2) % p from r - 1 into a
        buffer of that chunk's length (empty((n,), like=x): one per step, or one of the largest
        chunk's length allocated before the loop and sliced, as notebook 01's ring reuses), then adds
        it into buf's chunk. Afterwards chunk r of buf is the sum: return a copy of it. An empty chunk
        (n < p) is still sent and received, as an empty array.""",
        """
        b, buf = chunk_bounds(len(x), p), copy(x)
        for s in range(p - 1):
            (sa, sb), (ra, rb) = b[(r - s - 1) % p], b[(r - s - 2) % p]
            got = empty((rb - ra,), like=x)
            comm.sendrecv(buf[sa:sb], (r + 1) % p, got, (r - 1) % p)
            buf[ra:rb] += got
        return copy(buf[b[r][0]:b[r][1]])
        """,
    ),
    "1.4": (
        """The ring all-gather: p-1 steps; in each, every rank passes the newest chunk it has to the
        right and receives the next one from the left, straight into its place in the output.""",
        """Chunk i starts at sum(counts[:i]) and the output has sum(counts) elements:
        out = empty((total,), like=chunk), your chunk in its place. In step s = 0 .. p-2 send
        chunk (r - s) % p (a copy of out's slice) to r + 1 and receive chunk (r - s - 1) % p, of
        counts[that] elements, from r - 1.""",
        """
        starts = [sum(counts[:i]) for i in range(p + 1)]
        out = empty((starts[-1],), like=chunk); out[starts[r]:starts[r + 1]] = chunk
        for s in range(p - 1):
            i, j = (r - s) % p, (r - s - 1) % p
            got = empty((counts[j],), like=chunk)
            comm.sendrecv(copy(out[starts[i]:starts[i + 1]]), (r + 1) % p, got, (r - 1) % p)
            out[starts[j]:starts[j + 1]] = got
        return out
        """,
    ),
    "1.5": (
        """All-reduce = reduce-scatter, then all-gather: your 1.3 and 1.4, nothing new. Each sends
        p-1 chunks, 2(p-1) in all: that is the bandwidth-optimal ring.""",
        """1.4 needs the counts of every rank's chunk: the chunks 1.3 cut, from the same
        chunk_bounds(len(x), comm.size).""",
        """
        counts = [b - a for a, b in chunk_bounds(len(x), comm.size)]
        return ring_all_gather(comm, ring_reduce_scatter(comm, x), counts)
        """,
    ),
    "1.6": (
        """The alpha-beta model: a message of n bytes costs alpha + n beta. Count what one rank sends
        during 1.5: how many messages, and how many bytes in all (the README's Background).""",
        """Reduce-scatter and all-gather take p-1 steps each, one chunk of nbytes / p per step:
        2(p-1) messages and 2(p-1)/p * nbytes bytes. On p = 1 that is 0.""",
        """
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
        """,
    ),
    "1.7": (
        """Two link levels: the ranks of a node share a fast link, the nodes a slow one. Do the
        all-reduce in three rings so that only 1/R of the vector crosses the slow link: inside the
        node a reduce-scatter, across the nodes an all-reduce of your shard, inside the node an
        all-gather. Your 1.3, 1.5 and 1.4, each on its own communicator (README, Background).""",
        """comm.split(color, key=comm.rank) makes the communicators: colour rank // R gives the
        ranks of your node, colour rank % R the ranks with your local rank, one per node (your
        peers across nodes). After the intra-node reduce-scatter local rank l holds the node's
        sum of shard l = chunk_bounds(len(x), R)[l]; all-reduce that shard, and only that, among
        your peers.""",
        """
        node = comm.split(comm.rank // R, key=comm.rank)       # my node's R ranks
        peers = comm.split(comm.rank % R, key=comm.rank)      # my local rank on every node
        shard = ring_all_reduce(peers, ring_reduce_scatter(node, x))
        return ring_all_gather(node, shard, [b - a for a, b in chunk_bounds(len(x), R)])
        """,
    ),
}


def _right(comm):
    return [(comm.rank + 1) % comm.size]


def check_ring_pass(comm, fn):
    fails = []
    for n in (1, 5):
        x = draw(comm, n, "float64")
        left = (comm.rank - 1) % comm.size
        g = graded(comm, lambda: fn(comm, x))
        fails = (no_builtin(comm, g, "ring_pass", INSTEAD)
                 or compare(comm, g.out, draw(comm, n, "float64", rank=left),
                            f"what it received (should be rank {left}'s x)", f"n={n}")
                 or expect_traffic(comm, g, f"passing x ({n} double{'s' if n > 1 else ''}) to the right neighbour", 8 * n, 1, _right(comm))
                 or sent_by_learner(comm, g, fn, "ring_pass", INSTEAD))
        if stop(comm, fails):
            break
    return fails


def tree_depths(parents, root):
    """Hops from the root for every rank, given each rank's parent (None: received nothing)."""
    depth = {root: 0}
    for r in range(len(parents)):
        path, k = [], r
        while k not in depth and k is not None and k not in path:
            path.append(k)
            k = parents[k]
        base = depth.get(k)
        for i, q in enumerate(reversed(path), 1):
            depth[q] = None if base is None else base + i
    return depth


def check_tree_broadcast(comm, fn):
    p, r = comm.size, comm.rank
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    world = {comm.world_rank(q): q for q in range(p)}
    fails = []
    for root in sorted({0, p - 1}):
        for n in (1, 6):
            x = draw(comm, n, "float64") if r == root else comm.asarray(np.full(n, np.nan))
            g = graded(comm, lambda: fn(comm, x, root))
            case = f"root {root}, n={n} on {ranks(p)}"
            fails = no_builtin(comm, g, "tree_broadcast", INSTEAD) or compare(
                comm, g.out, draw(comm, n, "float64", rank=root), f"broadcast from root {root}", f"n={n}")
            got = [world.get(e.peer, e.peer) for e in g.events if e.kind in ("recv", "irecv", "sendrecv") and e.bytes]
            if not fails and r != root and len(got) != 1:
                fails = [f"rank {r} received {len(got)} messages ({case}); in a broadcast every rank but the "
                         f"root receives the data exactly once" + (": did you use a builtin collective (mpi4py's "
                                                                  "own) instead of comm?" if not got else "")]
            parents = comm.builtin.allgather_object(got[0] if r != root and len(got) == 1 else None)
            sends = sent(comm, g.events)[1]
            if not fails and r == root and sends > rounds:
                fails = [f"rank {root} (the root) sent {sends} messages on {p} ranks: a binomial tree sends at most "
                         f"ceil(log2 p) = {rounds} from the root; is this a loop over all ranks?"]
            depth = tree_depths(parents, root).get(r)
            if not fails and r != root and depth is not None and depth > rounds:
                fails = [f"rank {r} got the data {depth} hops from root {root} ({case}); a binomial tree reaches "
                         f"every rank within ceil(log2 p) = {rounds} rounds (in round k every rank that has the "
                         f"data sends to the rank 2^k further): is this a chain?"]
            fails = fails or sent_by_learner(comm, g, fn, "tree_broadcast", INSTEAD)
            if stop(comm, fails):
                return fails
    return fails


def _returned_chunk(comm, got, n):
    """A message when the returned chunk has the wrong length (chunk_bounds' rule)."""
    a, b = chunk_bounds(n, comm.size)[comm.rank]
    if got is not None and np.ndim(got) == 1 and len(got) != b - a:
        return [f"rank {comm.rank} returned {len(got)} elements for n={n} on {ranks(comm.size)}; its chunk "
                f"{comm.rank} is elements {a}:{b} ({b - a} elements) = chunk_bounds({n}, {comm.size})[{comm.rank}]: "
                f"the first n % p chunks get one extra element"]
    return []


def check_reduce_scatter(comm, fn):
    fails, p, r = [], comm.size, comm.rank
    for n in (4, 7, 10, 2):  # 7 and 10 do not divide by 3 or 4; 2 is shorter than 3 or 4 ranks
        x = draw(comm, n, "float64")
        want = comm.builtin.reduce_scatter(x)
        a, b = chunk_bounds(n, p)[r]
        g = graded(comm, lambda: fn(comm, x))
        nbytes, msgs = ring_traffic(chunk_counts(n, p), r, 8, ("reduce-scatter",))
        fails = (no_builtin(comm, g, "ring_reduce_scatter", INSTEAD)
                 or _returned_chunk(comm, g.out, n)
                 or compare(comm, g.out, want, f"its chunk {r} of the sum (chunk = elements {a}:{b})",
                            f"n={n} on {ranks(p)}", offset=a)
                 or expect_traffic(comm, g, f"a ring reduce-scatter of {n} doubles", nbytes, msgs, _right(comm),
                                   hint="p-1 steps, each sending one chunk (every chunk but your own)")
                 or sent_by_learner(comm, g, fn, "ring_reduce_scatter", INSTEAD))
        if stop(comm, fails):
            break
    return fails


def check_all_gather(comm, fn):
    fails, p, r = [], comm.size, comm.rank
    for n in (4, 7, 2):
        counts = chunk_counts(n, p)
        a, b = chunk_bounds(n, p)[r]
        x = draw(comm, n, "float64")
        mine = comm.asarray(to_numpy(x)[a:b].copy())
        want = comm.builtin.all_gather(mine)
        g = graded(comm, lambda: fn(comm, mine, counts))
        nbytes, msgs = ring_traffic(counts, r, 8, ("all-gather",))
        fails = (no_builtin(comm, g, "ring_all_gather", INSTEAD)
                 or compare(comm, g.out, want, "the gathered vector", f"n={n}, counts={counts}")
                 or expect_traffic(comm, g, f"a ring all-gather of {n} doubles", nbytes, msgs, _right(comm),
                                   hint="p-1 steps, each passing on one chunk (every chunk but your right "
                                        "neighbour's)")
                 or sent_by_learner(comm, g, fn, "ring_all_gather", INSTEAD))
        if stop(comm, fails):
            break
    return fails


def check_all_reduce(comm, fn):
    fails, p, r = [], comm.size, comm.rank
    for n in (12, 7, 2):
        x = draw(comm, n, "float64")
        want = comm.builtin.all_reduce(x)
        g = graded(comm, lambda: fn(comm, x))
        nbytes, msgs = ring_traffic(chunk_counts(n, p), r, 8)
        fails = (no_builtin(comm, g, "ring_all_reduce", INSTEAD)
                 or compare(comm, g.out, want, "the sum", f"n={n}")
                 or expect_traffic(comm, g, f"a ring all-reduce of {n} doubles", nbytes, msgs, _right(comm),
                                   hint="reduce-scatter then all-gather: 2(p-1) chunks, not whole vectors")
                 or sent_by_learner(comm, g, fn, "ring_all_reduce", INSTEAD))
        if stop(comm, fails):
            break
    return fails


def by_link(comm, events, ranks_per_node):
    """{"intra": [bytes, messages], "inter": [...]} this rank sent, classed by its peer's node
    (rank // ranks_per_node), and the sends to a rank that is neither its right neighbour in the
    node nor its own local rank on the next node, as (peer, bytes)."""
    R, world = ranks_per_node, {comm.world_rank(q): q for q in range(comm.size)}
    node, local, nodes = comm.rank // R, comm.rank % R, comm.size // R
    right = {node * R + (local + 1) % R, (node + 1) % nodes * R + local}
    out, stray = {"intra": [0, 0], "inter": [0, 0]}, []
    for e in events:
        if e.kind not in SEND_KINDS or not e.bytes:
            continue
        q = world.get(e.peer, e.peer)
        link = out["intra" if q // R == node else "inter"]
        link[0], link[1] = link[0] + e.bytes, link[1] + 1
        if q not in right:
            stray.append((q, e.bytes))
    return out, stray


def _placement(comm, g, R, case, want):
    """The hierarchical all-reduce's messages on their links: peers, then bytes across and inside."""
    r, nodes = comm.rank, comm.size // R
    node, local = r // R, r % R
    links, stray = by_link(comm, g.events, R)
    if stray:
        q, b = stray[0]
        where = (f"rank {q}, local rank {q % R} of node {q // R}" if q // R != node
                 else f"rank {q} of its own node")
        return [f"rank {r} (local rank {local} of node {node}) sent {b} bytes to {where} ({case}); in the "
                f"hierarchical all-reduce a rank sends only to its right neighbour inside its node "
                f"(rank {node * R + (local + 1) % R}) and, across nodes, to its own local rank on the next "
                f"node (rank {(node + 1) % nodes * R + local}): only they hold the same shard"]
    total = sum(b for b, _ in links.values())
    if total == 0 and sum(b for b, _ in want.values()):
        return expect_traffic(comm, g, f"a hierarchical all-reduce ({case})", sum(b for b, _ in want.values()))
    for link, what, why in (("inter", "across nodes", "2(N-1) chunks of your shard: only the shard crosses the "
                                                      "slow link, not the whole vector"),
                            ("intra", "inside its node", "a ring reduce-scatter and a ring all-gather of the "
                                                         "vector among the node's ranks")):
        (b, m), (wb, wm) = links[link], want[link]
        if (b, m) != (wb, wm):
            return [f"rank {r} sent {b} bytes in {m} messages {what} ({case}); the hierarchical all-reduce sends "
                    f"exactly {wb} bytes in {wm} messages there (the trace shows {ran(g.events)}): {why}"]
    return []


def check_hierarchical(comm, fn):
    fails, p, r = [], comm.size, comm.rank
    for R in [d for d in range(1, p + 1) if p % d == 0]:  # every placement of p ranks on nodes of R
        nodes, node, local = p // R, r // R, r % R
        for n in (12, 7):
            x = draw(comm, n, "float64")
            want = comm.builtin.all_reduce(x)
            g = graded(comm, lambda: fn(comm, x, R))
            case = f"n={n}, {nodes} node{'s' if nodes > 1 else ''} x {R} rank{'s' if R > 1 else ''}"
            shards = chunk_counts(n, R)  # shard l: local rank l's, as the intra-node reduce-scatter cuts it
            links = {"intra": ring_traffic(shards, local, 8), "inter": ring_traffic(chunk_counts(shards[local], nodes),
                                                                                    node, 8)}
            fails = (no_builtin(comm, g, "hierarchical_all_reduce", INSTEAD)
                     or _placement(comm, g, R, case, links)
                     or compare(comm, g.out, want, "the sum", case)
                     or sent_by_learner(comm, g, fn, "hierarchical_all_reduce", INSTEAD))
            if stop(comm, fails):
                return fails
    return fails


def check_cost_model(comm, fn):
    from ..costmodel import allreduce_time

    fails = []
    for nbytes, p, alpha, beta in [(1 << 20, 4, 5e-6, 1e-10), (8, 8, 2e-6, 5e-10), (3 << 24, 3, 1e-5, 2e-11), (100, 1, 1e-6, 1e-9)]:
        want = allreduce_time("ring", nbytes, p, alpha, beta, 0.0)
        got = fn(nbytes, p, alpha, beta)
        if got is None or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15):
            fails.append(f"predicted_ring_time(n={nbytes}, p={p}, alpha={alpha}, beta={beta}) = {got}, "
                         f"expected {want:.6g} s = 2(p-1)*alpha + 2(p-1)/p*n*beta")
            break
    return fails
