"""Collectives from scratch: short visible loops on ``send`` / ``recv`` / ``sendrecv``.

    mpiexec -n 4 python -m mpi4py -c "import minipar, numpy as np; from minipar.collectives import all_reduce; \
        c = minipar.init(); print(all_reduce(c, np.arange(6.0) + c.rank, algorithm='ring'))"

Every function takes the communicator first, works for any world size (not only powers of
two) and any length (also not divisible by the world size, also shorter than it), on NumPy
arrays (MPI backend) and torch tensors (torch backend) alike. Inputs are never modified.

Costs use the alpha-beta(-gamma) model: a message of n bytes costs ``alpha + n*beta``; reducing
n bytes costs ``n*gamma``. p = number of ranks, n = bytes of the (full) vector. Formulas in
``minipar.costmodel`` (the same ones quoted in each docstring).

Chunks follow one rule everywhere (``xp.chunk_bounds``): the first ``n % p`` chunks have one
extra element. Rank r "owns" chunk r.
"""
from __future__ import annotations

import time

import numpy as np

from . import xp
from .comm.base import wait_all
from .trace import buffer

ALGORITHMS = ("naive", "tree", "recursive_doubling", "ring", "rabenseifner")
OPS = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}
TAG = 1000  # collectives use their own tags so they never match a user's tag-0 messages


def _check(comm, op="sum", root=None) -> int | None:
    """Refuse an unknown op or a root that is not a rank; returns the root as a Python int (a
    NumPy integer, ``np.int64(1)``, is a rank like any other; a bool or a float is not)."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: choose one of {sorted(OPS)}")
    if root is None:
        return None
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise ValueError(f"root={root!r} is not a rank of this communicator (size {comm.size})")
    return int(root)


def _combine(acc, incoming, op):
    """acc <- acc (op) incoming, in place."""
    getattr(xp.native(acc), OPS[op])(acc, incoming, out=acc)


def _rows(x):
    """Elements per axis-0 row: chunking a C-contiguous array along axis 0 is chunking its flat view.
    (From the shape, not size // rows: a rank's piece may have zero rows.)"""
    return int(np.prod(x.shape[1:], dtype=np.int64))


# --------------------------------------------------------------------------- broadcast / reduce


def broadcast(comm, x, root=0):
    """Binomial-tree broadcast. On ``root`` x is the data; elsewhere x is a buffer of the same
    shape and dtype, filled in place and returned.

    Round k: every rank that already has the data sends it to the rank 2^k further (relative to
    root). Cost: ceil(log2 p) * (alpha + n*beta).

    A non-contiguous x (a column slice, a transposed view) is sent and received through a
    contiguous copy, and the copy's data written back into x: the caller's buffer is filled too.
    """
    root = _check(comm, root=root)
    given, x = x, xp.contiguous(x)
    p, vr = comm.size, (comm.rank - root) % comm.size  # vr: my rank counted from the root
    with comm.region("broadcast:tree", "collective"):
        mask = 1
        while mask < p:  # receive once, from the rank that differs in my lowest set bit
            if vr & mask:
                comm.recv(x, (vr - mask + root) % p, TAG)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:  # then forward to my children, farthest first
            if vr + mask < p:
                comm.send(x, (vr + mask + root) % p, TAG)
            mask >>= 1
    if x is not given:  # the caller's buffer, not only the returned copy
        given[...] = x
        return given
    return x


def reduce(comm, x, root=0, op="sum"):
    """Binomial-tree reduction: returns the reduction of every rank's x on ``root``, None elsewhere.

    The broadcast tree run backwards: each rank adds what its children send, then sends the
    partial result to its parent. Cost: ceil(log2 p) * (alpha + n*beta + n*gamma).
    """
    root = _check(comm, op, root)
    p, vr = comm.size, (comm.rank - root) % comm.size
    acc, tmp = xp.copy(x), buffer(comm, "tree.recv", xp.empty(x.shape, like=x))  # a child's whole vector
    with comm.region("reduce:tree", "collective"):
        mask = 1
        while mask < p:
            if vr & mask:  # my subtree is done: hand it to my parent and stop
                comm.send(acc, (vr - mask + root) % p, TAG + 1)
                return None
            if vr + mask < p:  # add my child's subtree
                comm.recv(tmp, (vr + mask + root) % p, TAG + 1)
                _combine(acc, tmp, op)
            mask <<= 1
    return acc


def _tree(p, vr):
    """(end, masks) of virtual rank ``vr`` in the binomial tree of :func:`broadcast`: its subtree is
    the virtual ranks vr .. end-1 (vr's lowest set bit wide, all p for the root), and its children
    are vr + m for each m in ``masks`` (the powers of two below that bit, vr + m < p)."""
    low = vr & -vr if vr else p  # the lowest set bit: how far my subtree reaches
    masks = [1 << k for k in range(max(p - 1, 1).bit_length()) if (1 << k) < low and vr + (1 << k) < p]
    return min(vr + low, p), masks


def gather(comm, x, root=0, counts=None):
    """Binomial-tree gather: the concatenation along axis 0 of every rank's x, in rank order, on
    ``root``; None elsewhere. ``counts[r]``: rank r's rows (default: all equal to x.shape[0]).

    The broadcast tree run backwards, each rank forwarding its whole subtree at once: a rank
    receives its children's subtrees (rows of consecutive virtual ranks) straight into place,
    then sends everything it holds to its parent. Cost: ceil(log2 p) * alpha + (p-1)/p * n * beta
    at the root, n the bytes gathered (a loop of p-1 receives at the root pays (p-1) * alpha).
    """
    root = _check(comm, root=root)
    p, r = comm.size, comm.rank
    counts = [x.shape[0]] * p if counts is None else [int(c) for c in counts]
    if len(counts) != p or counts[r] != x.shape[0]:
        raise ValueError(f"counts={counts}: need one axis-0 length per rank ({p}), and counts[{r}] "
                         f"must equal x.shape[0]={x.shape[0]}")
    vr = (r - root) % p
    rows = [counts[(v + root) % p] for v in range(p)]  # rows of each virtual rank
    at = [sum(rows[:v]) for v in range(p + 1)]  # virtual rank v's rows start at at[v]
    end, children = _tree(p, vr)
    held = xp.empty((at[end] - at[vr],) + tuple(x.shape[1:]), like=x)  # my subtree's rows, virtual order
    held[:rows[vr]] = x
    with comm.region("gather:tree", "collective"):
        for m in children:  # nearest child first: its subtree is the smallest
            c, c_end = vr + m, _tree(p, vr + m)[0]
            comm.recv(held[at[c] - at[vr]:at[c_end] - at[vr]], (c + root) % p, TAG + 16)
        if vr:
            comm.send(held, (vr - (vr & -vr) + root) % p, TAG + 16)
            return None
    out = xp.empty(held.shape, like=x)  # from virtual order back to rank order
    start = [sum(counts[:q]) for q in range(p)]
    for v in range(p):
        q = (v + root) % p
        out[start[q]:start[q] + rows[v]] = held[at[v]:at[v + 1]]
    return out


def scatter(comm, x, root=0, counts=None):
    """Binomial-tree scatter: rank r gets its ``counts[r]`` rows of the root's x (default
    ``chunk_bounds``: as even as can be). x has the same shape and dtype on every rank, as
    broadcast's buffer does; only the root's values are read.

    The gather tree run forwards: a rank receives its whole subtree's rows from its parent, keeps
    its own and sends each child its child's subtree, farthest first. Cost: ceil(log2 p) * alpha
    + (p-1)/p * n * beta at the root.
    """
    root = _check(comm, root=root)
    p, r = comm.size, comm.rank
    bounds = _counted(comm, x, counts)
    vr = (r - root) % p
    rows = [bounds[(v + root) % p][1] - bounds[(v + root) % p][0] for v in range(p)]
    at = [sum(rows[:v]) for v in range(p + 1)]
    end, children = _tree(p, vr)
    held = xp.empty((at[end] - at[vr],) + tuple(x.shape[1:]), like=x)  # my subtree's rows, virtual order
    with comm.region("scatter:tree", "collective"):
        if vr:
            comm.recv(held, (vr - (vr & -vr) + root) % p, TAG + 17)
        else:
            for v in range(p):  # the root lays its rows out in virtual order
                a, b = bounds[(v + root) % p]
                held[at[v]:at[v + 1]] = x[a:b]
        for m in reversed(children):  # farthest child first: it has the most to forward
            c, c_end = vr + m, _tree(p, vr + m)[0]
            comm.send(xp.contiguous(held[at[c] - at[vr]:at[c_end] - at[vr]]), (c + root) % p, TAG + 17)
    return xp.copy(held[:rows[vr]])


# --------------------------------------------------------------------------- the ring


def ring_steps(comm, buf, bounds=None, tag=TAG + 2, phases=("reduce-scatter", "all-gather"), op="sum",
               observe=None, name=None, reuse=True):
    """The ring, as a generator: every ring collective in minipar is this one loop.

    ``buf`` is flat and is worked on in place; rank r owns chunk r, ``bounds[r] = (start, stop)``
    (default ``chunk_bounds(len(buf), p)``). Right neighbour r+1, left neighbour r-1.

    reduce-scatter, step s: send chunk (r-s-1) to the right, receive chunk (r-s-2) from the left
        and add it in. A chunk starts at the rank after its owner and travels p-1 hops, growing by
        one term per hop; after p-1 steps rank r holds the reduced chunk r.
    all-gather, step s: pass chunk (r-s) to the right, receive chunk (r-s-1) from the left
        straight into place. After p-1 steps everyone has every chunk.

    Each ``next(gen)`` *posts* one step (an ``irecv`` from the left and an ``isend`` to the right)
    and returns; the next ``next(gen)`` waits for that step, adds what arrived and posts the
    following one. Blocking collectives run it to the end at once (:func:`drain`); DDP's overlap
    and ZeRO-3's prefetch call ``next`` between layers, so the bytes move while a layer computes.
    Either way the additions happen in the same order, so the results are bitwise equal.

    ``observe(phase, step, sent_chunk, received_chunk, buf)`` sees every completed step (the
    ring-steps figure). ``name``: record one ``collective`` trace event spanning the whole ring
    (for rings advanced between layers; blocking callers wrap ``comm.region`` around ``drain``).

    Buffers: the reduce-scatter receives into ``tmp`` ("ring.recv"), one buffer the size of the
    largest chunk, allocated once and reused by every step; the all-gather needs none (each
    chunk lands in its place in ``buf``). ``reuse=False`` allocates a fresh one every step:
    what reusing saves (docs/buffers.md).
    """
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    bounds = xp.chunk_bounds(buf.shape[0], p) if bounds is None else bounds
    t0 = time.perf_counter()
    if "reduce-scatter" in phases:
        chunk = max(b - a for a, b in bounds)
        tmp = buffer(comm, "ring.recv", xp.empty((chunk,), like=buf))  # (chunk,) one receive buffer, reused
        for s in range(p - 1):
            if not reuse and s:
                tmp = buffer(comm, "ring.recv", xp.empty((chunk,), like=buf))
            (sa, sb), (ra, rb) = bounds[(r - s - 1) % p], bounds[(r - s - 2) % p]
            reqs = [comm.irecv(tmp[: rb - ra], left, tag), comm.isend(buf[sa:sb], right, tag)]
            yield
            wait_all(reqs)
            _combine(buf[ra:rb], tmp[: rb - ra], op)
            if observe:
                observe("reduce-scatter", s, (r - s - 1) % p, (r - s - 2) % p, buf)
        tmp = reqs = None  # the all-gather receives in place: no buffer from here on
    if "all-gather" in phases:
        for s in range(p - 1):
            (sa, sb), (ra, rb) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
            reqs = [comm.irecv(buf[ra:rb], left, tag), comm.isend(buf[sa:sb], right, tag)]
            yield
            wait_all(reqs)
            if observe:
                observe("all-gather", s, (r - s) % p, (r - s - 1) % p, buf)
    if name and comm.tracer.enabled:
        comm.tracer.record("collective", name, t0, time.perf_counter())


def drain(gen):
    """Run a :func:`ring_steps` generator to the end: the ring as one blocking collective."""
    for _ in gen:
        pass


def _ring_reduce_scatter(comm, buf, bounds, op, observe=None):
    """Blocking ring reduce-scatter in place on flat ``buf``: rank r ends with reduced chunk r."""
    drain(ring_steps(comm, buf, bounds, TAG + 2, ("reduce-scatter",), op, observe))


def _ring_all_gather(comm, buf, bounds, observe=None):
    """Blocking ring all-gather in place on flat ``buf`` where rank r holds chunk r."""
    drain(ring_steps(comm, buf, bounds, TAG + 3, ("all-gather",), observe=observe))


def reduce_scatter(comm, x, op="sum", counts=None):
    """Ring reduce-scatter along axis 0: returns this rank's chunk of the elementwise reduction.

    ``counts[r]`` is rank r's chunk, in axis-0 rows (default ``chunk_bounds``: as even as can be);
    the counts add up to x.shape[0] and are the same on every rank (``all_gather``'s counts, the
    other way round). Every rank sends and receives (p-1)/p of the vector once.
    Cost: (p-1) * alpha + (p-1)/p * n * (beta + gamma).
    """
    _check(comm, op)
    rows = _counted(comm, x, counts)
    k = _rows(x)
    bounds = [(a * k, b * k) for a, b in rows]
    buf = xp.flat(xp.copy(x))
    with comm.region("reduce_scatter:ring", "collective"):
        _ring_reduce_scatter(comm, buf, bounds, op)
    a, b = rows[comm.rank]
    return xp.copy(buf[a * k: b * k]).reshape((b - a,) + tuple(x.shape[1:]))


def _counted(comm, x, counts):
    """[(start, stop)] of every rank's axis-0 rows: ``counts``, or ``chunk_bounds`` without them."""
    if counts is None:
        return xp.chunk_bounds(x.shape[0], comm.size)
    counts = [int(c) for c in counts]
    if len(counts) != comm.size or min(counts) < 0 or sum(counts) != x.shape[0]:
        raise ValueError(f"counts={counts}: need one axis-0 length >= 0 per rank ({comm.size}), "
                         f"adding up to x.shape[0]={x.shape[0]}")
    starts = [sum(counts[:r]) for r in range(comm.size + 1)]
    return list(zip(starts[:-1], starts[1:]))


def all_gather(comm, x, counts=None):
    """Ring all-gather: the concatenation along axis 0 of every rank's x, on every rank.

    ``counts[r]`` is rank r's axis-0 length (default: all equal to this rank's). A wrong count
    shows up as a clear message-size error. Cost: (p-1) * alpha + (p-1)/p * n * beta, n = output bytes.
    """
    counts = [x.shape[0]] * comm.size if counts is None else list(counts)
    if len(counts) != comm.size or counts[comm.rank] != x.shape[0]:
        raise ValueError(f"counts={counts}: need one axis-0 length per rank ({comm.size}), "
                         f"and counts[{comm.rank}] must equal x.shape[0]={x.shape[0]}")
    k, starts = _rows(x), [sum(counts[:i]) for i in range(comm.size)]
    bounds = [(s * k, (s + c) * k) for s, c in zip(starts, counts)]
    out = xp.empty((sum(counts),) + tuple(x.shape[1:]), like=x)
    buf = xp.flat(out)
    a, b = bounds[comm.rank]
    buf[a:b] = xp.flat(xp.contiguous(x))
    with comm.region("all_gather:ring", "collective"):
        _ring_all_gather(comm, buf, bounds)
    return out


# --------------------------------------------------------------------------- all-reduce


def all_reduce(comm, x, algorithm="ring", op="sum"):
    """The reduction of every rank's x, on every rank (a new array; x is untouched).

    algorithm: "naive", "tree", "recursive_doubling", "ring" or "rabenseifner" — see each
    ``_all_reduce_*`` below for its loop and cost.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: choose one of {ALGORITHMS}")
    _check(comm, op)
    buf = xp.copy(x)
    with comm.region(f"all_reduce:{algorithm}", "collective"):
        _ALL_REDUCE[algorithm](comm, xp.flat(buf), op)
    return buf


def _all_reduce_naive(comm, buf, op):
    """Rank 0 receives every vector in turn, adds, and sends the sum to every rank in turn.

    Cost: (p-1) * (alpha + n*beta + n*gamma) + (p-1) * (alpha + n*beta). Rank 0's link carries
    2(p-1)n bytes: the bottleneck the other algorithms remove.
    """
    if comm.rank == 0:
        tmp = buffer(comm, "naive.recv", xp.empty(buf.shape, like=buf))  # a whole vector
        for src in range(1, comm.size):
            comm.recv(tmp, src, TAG + 4)
            _combine(buf, tmp, op)
        for dst in range(1, comm.size):
            comm.send(buf, dst, TAG + 5)
    else:
        comm.send(buf, 0, TAG + 4)
        comm.recv(buf, 0, TAG + 5)


def _all_reduce_tree(comm, buf, op):
    """Binomial reduce to rank 0, then binomial broadcast from it.

    Cost: 2 ceil(log2 p) (alpha + n*beta) + ceil(log2 p) n*gamma.
    """
    total = reduce(comm, buf, 0, op)
    if comm.rank == 0:
        buf[...] = total
    broadcast(comm, buf, 0)


def _fold(comm, buf, op, tmp):
    """Make a power-of-two group out of any p (the MPICH way).

    With pof2 = largest power of two <= p and rem = p - pof2, each of the first rem even ranks
    sends its vector to its odd neighbour and sits out. Returns (virtual rank or -1, pof2,
    real rank of virtual rank v). Costs alpha + n*beta (+ n*gamma) extra when p is not a power of two.
    """
    p, r = comm.size, comm.rank
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    real = lambda v: 2 * v + 1 if v < rem else v + rem  # noqa: E731
    if r < 2 * rem:
        if r % 2 == 0:
            comm.send(buf, r + 1, TAG + 6)
            return -1, pof2, real
        comm.recv(tmp, r - 1, TAG + 6)
        _combine(buf, tmp, op)
        return r // 2, pof2, real
    return r - rem, pof2, real


def _unfold(comm, buf):
    """Give the ranks that sat out in ``_fold`` the final result."""
    r, rem = comm.rank, comm.size - (1 << (comm.size.bit_length() - 1))
    if r < 2 * rem:
        if r % 2 == 0:
            comm.recv(buf, r + 1, TAG + 7)
        else:
            comm.send(buf, r - 1, TAG + 7)


def _all_reduce_recursive_doubling(comm, buf, op):
    """Round k: exchange the whole vector with the rank whose (virtual) number differs in bit k.

    After log2 p rounds everyone has the sum. Few messages, but each carries all n bytes, so it
    suits short vectors. Cost: log2(p) * (alpha + n*beta + n*gamma) (+ fold/unfold for p not 2^k).
    """
    tmp = buffer(comm, "recursive_doubling.recv", xp.empty(buf.shape, like=buf))  # the partner's whole vector
    v, pof2, real = _fold(comm, buf, op, tmp)
    if v >= 0:
        mask = 1
        while mask < pof2:
            partner = real(v ^ mask)
            comm.sendrecv(buf, partner, tmp, partner, TAG + 8)
            _combine(buf, tmp, op)
            mask <<= 1
    _unfold(comm, buf)


def _all_reduce_ring(comm, buf, op):
    """Ring reduce-scatter, then ring all-gather: bandwidth-optimal for long vectors.

    Each rank sends 2(p-1)/p * n bytes in 2(p-1) messages.
    Cost: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
    """
    drain(ring_steps(comm, buf, op=op))  # reduce-scatter, then all-gather


def _all_reduce_rabenseifner(comm, buf, op):
    """Recursive halving (reduce-scatter) then recursive doubling (all-gather).

    Halving: exchange half of my current range with the partner at distance pof2/2, keep and
    reduce my half; then a quarter at distance pof2/4 ... until I own chunk v. Doubling: the
    same steps backwards, swapping owned ranges until everyone has everything.
    Cost: 2 log2(p) alpha + 2(p-1)/p n beta + (p-1)/p n gamma (+ fold/unfold for p not 2^k).
    """
    tmp = buffer(comm, "rabenseifner.recv", xp.empty(buf.shape, like=buf))  # halves used, whole allocated
    v, pof2, real = _fold(comm, buf, op, tmp)
    if v >= 0:
        bounds = xp.chunk_bounds(buf.shape[0], pof2)
        span = lambda lo, hi: (bounds[lo][0], bounds[hi - 1][1])  # noqa: E731  chunks -> elements
        lo, hi, mask = 0, pof2, pof2 // 2
        while mask:  # recursive halving
            partner, mid = real(v ^ mask), (lo + hi) // 2
            (klo, khi), (slo, shi) = ((lo, mid), (mid, hi)) if not v & mask else ((mid, hi), (lo, mid))
            (ka, kb), (sa, sb) = span(klo, khi), span(slo, shi)
            comm.sendrecv(buf[sa:sb], partner, tmp[ka:kb], partner, TAG + 9)
            _combine(buf[ka:kb], tmp[ka:kb], op)
            lo, hi, mask = klo, khi, mask // 2
        mask = 1
        while mask < pof2:  # recursive doubling of the owned range
            partner, width = real(v ^ mask), hi - lo
            plo = lo + width if not v & mask else lo - width
            (ma, mb), (pa, pb) = span(lo, hi), span(plo, plo + width)
            comm.sendrecv(buf[ma:mb], partner, buf[pa:pb], partner, TAG + 10)
            lo, hi, mask = min(lo, plo), max(hi, plo + width), mask << 1
    _unfold(comm, buf)


_ALL_REDUCE = {
    "naive": _all_reduce_naive,
    "tree": _all_reduce_tree,
    "recursive_doubling": _all_reduce_recursive_doubling,
    "ring": _all_reduce_ring,
    "rabenseifner": _all_reduce_rabenseifner,
}


# --------------------------------------------------------------------------- two link levels


def node_groups(comm, ranks_per_node):
    """(intra, inter) for ranks placed on nodes in blocks, as ``mpiexec -hosts a:R,b:R`` and
    torchrun place them: rank r sits on node r // R with local index r % R.

    intra: the R ranks of my node (fast link: shared memory, NVLink). inter: the ranks with my
    local index, one per node (the slow link: the network). Both keep the world's order.
    """
    if not isinstance(ranks_per_node, int) or ranks_per_node < 1 or comm.size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node!r} must divide the {comm.size} ranks")
    intra = comm.split(comm.rank // ranks_per_node, key=comm.rank, name="node")
    inter = comm.split(comm.rank % ranks_per_node, key=comm.rank, name="across_nodes")
    return intra, inter


def hierarchical_all_reduce(intra, inter, x, op="sum"):
    """All-reduce over two link levels (``intra``, ``inter`` from :func:`node_groups`): the slow
    link carries each byte once per node instead of once per rank.

    1. reduce-scatter inside the node (ring on ``intra``): local rank l holds the node's sum of shard l;
    2. all-reduce of shard l among the nodes (ring on ``inter``: my peers with local index l);
    3. all-gather inside the node (ring on ``intra``): everyone has every reduced shard.

    With N nodes of R ranks, intra link (a1, b1), a node's uplink (a2, b2) shared by its R rings:
    cost 2(R-1)(a1 + n/R b1) + 2(N-1)(a2 + n/N b2); a flat ring on the same placement pays
    2(p-1)(a2 + n/p b2), since every step waits for the chunk that crosses the uplink
    (``costmodel.two_level_allreduce_time``). Uplink bytes per node: 2(N-1)/N n, against
    2(p-1)/p n for the flat ring.
    """
    _check(intra, op)
    buf = xp.copy(x)
    flat = xp.flat(buf)
    bounds = xp.chunk_bounds(flat.shape[0], intra.size)  # shard l: local rank l's
    a, b = bounds[intra.rank]
    with intra.region("all_reduce:hierarchical", "collective"):
        drain(ring_steps(intra, flat, bounds, TAG + 13, ("reduce-scatter",), op))
        drain(ring_steps(inter, flat[a:b], None, TAG + 14, op=op))  # only my shard crosses the nodes
        drain(ring_steps(intra, flat, bounds, TAG + 15, ("all-gather",)))
    return buf


# --------------------------------------------------------------------------- all-to-all


def all_to_all(comm, x, send_counts=None):
    """Rows of x go to every rank; returns the rows every rank sent me, in source-rank order.

    ``send_counts[j]``: how many rows (axis 0) of x go to rank j, consecutive and in rank order.
    Default: x.shape[0] / p rows to each rank (p must divide x.shape[0]). With ``send_counts``
    (all-to-all-v: the counts may differ, and differ per rank, as in mixture-of-experts
    dispatch) the ranks first swap their counts, so every rank knows how many rows arrive from
    where; :func:`all_to_all_v` returns those counts too.

    Pairwise exchange: in step s every rank sends to r+s and receives from r-s, so each step is
    a permutation and no link is used twice. Cost: (p-1) * (alpha + n/p * beta) for equal chunks.
    """
    return all_to_all_v(comm, x, send_counts)[0]


def all_to_all_v(comm, x, send_counts=None):
    """(received rows, recv_counts): :func:`all_to_all` that also says how many rows came from
    each rank (``recv_counts[j]`` rows from rank j, concatenated in rank order)."""
    p, r = comm.size, comm.rank
    if send_counts is None:
        if x.shape[0] % p:
            raise ValueError(f"all_to_all: x.shape[0]={x.shape[0]} must be divisible by the number of ranks p={p} "
                             f"(or pass send_counts)")
        send_counts = [x.shape[0] // p] * p
        recv_counts = list(send_counts)
    else:
        send_counts = [int(c) for c in send_counts]
        if len(send_counts) != p or min(send_counts) < 0 or sum(send_counts) != x.shape[0]:
            raise ValueError(f"all_to_all: send_counts={send_counts} must hold one count >= 0 per rank "
                             f"({p}) adding up to x.shape[0]={x.shape[0]}")
        recv_counts = _swap_counts(comm, send_counts)
    starts = lambda counts: [sum(counts[:j]) for j in range(p)]  # noqa: E731
    s_at, r_at = starts(send_counts), starts(recv_counts)
    src_x = xp.contiguous(x)
    out = xp.empty((sum(recv_counts),) + tuple(x.shape[1:]), like=x)
    out[r_at[r]:r_at[r] + recv_counts[r]] = src_x[s_at[r]:s_at[r] + send_counts[r]]
    with comm.region("all_to_all:pairwise", "collective"):
        for s in range(1, p):
            dst, src = (r + s) % p, (r - s) % p
            comm.sendrecv(src_x[s_at[dst]:s_at[dst] + send_counts[dst]], dst,
                          out[r_at[src]:r_at[src] + recv_counts[src]], src, TAG + 11)
    return out, recv_counts


def _swap_counts(comm, send_counts):
    """Every rank tells every other how many rows it will send it: a pairwise exchange of one
    int64 each (the 'counts' phase of an all-to-all-v)."""
    p, r = comm.size, comm.rank
    mine = comm.asarray(np.array(send_counts, dtype=np.int64))  # (p,)
    got = comm.asarray(np.zeros(p, dtype=np.int64))  # (p,)
    got[r] = mine[r]
    for s in range(1, p):
        dst, src = (r + s) % p, (r - s) % p
        comm.sendrecv(mine[dst:dst + 1], dst, got[src:src + 1], src, TAG + 12)
    return [int(v) for v in xp.to_numpy(got)]
