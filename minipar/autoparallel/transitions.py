"""Moving a tensor from one placement to another: which steps, each with minipar's own collectives.

    redistribution_steps((Shard(0),), (Shard(1),))                        # (axis 0: S(0)->S(1) (all_to_all),)
    y = redistribute(mesh, x, (Shard(0),), (Shard(1),), shape=(10, 7))   # runs that all-to-all

Every transition on one mesh axis is one function below, run on that axis's sub-communicator:

    transition             what runs                          cost (alpha-beta, m ranks on the axis)
    S(d) -> R              all_gather along d (uneven counts)  (m-1) (alpha + c beta)
    P    -> R              all_reduce (ring)                   2(m-1) alpha + 2 (m-1) c (beta) + (m-1) c gamma
    P    -> S(d)           reduce_scatter along d              (m-1) (alpha + c (beta + gamma))
    S(d) -> S(e)           all_to_all_v: cut along e, swap     (m-1) (alpha + c beta)  [+ counts swap if uneven]
    R    -> S(d)           local slice                         0
    R    -> P              local: coordinate 0 keeps x, others 0
    S(d) -> P              local: my piece inside zeros

c = bytes of the largest piece a rank sends in one message (n/m when shapes divide): the ring
and the pairwise exchange wait for their slowest message each step. The formulas are
``minipar.costmodel``'s; :func:`step_bytes` is what a rank sends, exact to the byte, and the
tests compare it with the trace. A move is a sequence of these steps, one mesh axis each, in
the order :func:`redistribution_steps` gives (on a 2-D mesh, changing axis 0 can undo axis 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, prod

from .. import collectives, costmodel
from ..xp import chunk_bounds, contiguous, namespace, zeros
from .sharding import R, Partial, Replicate, Shard, as_mesh, block, check_fits, normalize

ITEMSIZE_COUNTS = 8  # all_to_all_v swaps its counts as int64


# --------------------------------------------------------------------------- the steps of a move


@dataclass(frozen=True)
class Step:
    """One transition on one mesh axis: ``kind`` is the collective (or local op) it runs."""
    axis: int
    kind: str  # all_gather, reduce_scatter, all_reduce, all_to_all, slice, to_partial, shard_to_partial
    src: object
    dst: object
    before: tuple  # placements of the whole tensor before this step
    after: tuple

    def __repr__(self):
        return f"axis {self.axis}: {self.src!r}->{self.dst!r} ({self.kind})"


COMMUNICATING = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def step_kind(src, dst) -> str | None:
    """The one operation that turns placement ``src`` into ``dst`` on one axis (None: nothing)."""
    if src == dst:
        return None
    return {
        (Shard, Replicate): "all_gather",        # everyone gets every piece
        (Shard, Shard): "all_to_all",            # cut along the new dim, swap pieces
        (Shard, Partial): "shard_to_partial",    # local: my piece inside zeros is an addend
        (Partial, Replicate): "all_reduce",      # sum the addends, everyone gets the sum
        (Partial, Shard): "reduce_scatter",      # sum the addends, each keeps its piece
        (Replicate, Shard): "slice",             # local: keep my piece
        (Replicate, Partial): "to_partial",      # local: coordinate 0 keeps it, the rest hold 0
    }[type(src), type(dst)]


@lru_cache(maxsize=None)
def redistribution_steps(src, dst) -> tuple:
    """The steps that turn placements ``src`` into ``dst`` (tuples, one entry per mesh axis).

    On one axis it is one step. With two axes, changing how axis i splits dim d also changes
    the piece that any later axis j > i splits along d, so such an axis is *reset* too. Reset
    axes are first brought to Replicate from the last axis to the first (gathers never cut
    through a later axis's split), then sent to their target from the first to the last. The
    lowest reset axis goes straight from src to dst in one step (all-to-all, reduce-scatter,
    ...) since nothing below it needs undoing.
    """
    n = len(src)
    reset, touched = [False] * n, set()
    for i in range(n):
        if src[i] != dst[i] or (isinstance(src[i], Shard) and src[i].dim in touched):
            reset[i] = True
            touched |= {p.dim for p in (src[i], dst[i]) if isinstance(p, Shard)}
    order = [i for i in range(n) if reset[i]]
    steps, cur = [], list(src)

    def go(axis, to):
        kind = step_kind(cur[axis], to)
        if kind is not None:
            before = tuple(cur)
            cur[axis] = to
            steps.append(Step(axis, kind, before[axis], to, before, tuple(cur)))

    for i in reversed(order[1:]):  # undo the higher axes: to Replicate, last axis first
        go(i, R)
    if order:
        go(order[0], dst[order[0]])  # the lowest reset axis: straight there
    for i in order[1:]:  # then the higher axes from Replicate to their target
        go(i, dst[i])
    assert tuple(cur) == tuple(dst), (src, dst, cur)
    return tuple(steps)


# --------------------------------------------------------------------------- moving a tensor


def redistribute(comm_or_mesh, x, src, dst, shape):
    """This rank's local tensor of the global ``shape`` moved from placements ``src`` to ``dst``.

    ``comm_or_mesh``: a :class:`Mesh` (1-D or 2-D), or a communicator for the 1-D mesh of all its
    ranks. ``x`` is not modified; with nothing to do it is returned as is.
    """
    mesh = as_mesh(comm_or_mesh)
    src, dst = normalize(src, len(mesh.shape)), normalize(dst, len(mesh.shape))
    check_fits(shape, src, mesh.shape, "src")
    check_fits(shape, dst, mesh.shape, "dst")
    for step in redistribution_steps(src, dst):
        x = run_step(mesh, x, step, shape)
    return x


def run_step(mesh, x, step, shape):
    """Run one :class:`Step` on this rank (a collective on the step's axis, or a local op)."""
    level = block(shape, step.before, mesh.shape, mesh.coords, upto=step.axis)  # the piece this axis splits
    fn = TRANSITIONS[step.kind]
    return fn(mesh.axis_comms[step.axis], x, step, level, mesh.coords[step.axis])


def _front(x, d):
    """x with dim d moved to the front (contiguous), and the permutation that undoes it."""
    order = [d] + [i for i in range(x.ndim) if i != d]
    inverse = [order.index(i) for i in range(x.ndim)]
    return contiguous(namespace(x).permute_dims(x, tuple(order))), tuple(inverse)


def _back(y, inverse):
    return contiguous(namespace(y).permute_dims(y, inverse))


def _sizes(level, d, m):
    a, b = level[d]
    return [hi - lo for lo, hi in chunk_bounds(b - a, m)]


def _cut(x, d, lo, hi):
    return x[(slice(None),) * d + (slice(lo, hi),)]


# --------------------------------------------------------------------------- the transitions


def all_gather(comm, x, step, level, coord):
    """S(d) -> R: ring all-gather of the pieces along d (each rank's count from chunk_bounds)."""
    d = step.src.dim
    xp, (xf, inverse) = namespace(x), _front(x, d)
    rest = xf.shape[1:]
    row = prod(rest)  # sent flat, counted in elements: a rank whose piece is empty still knows its row
    out = collectives.all_gather(comm, xp.reshape(xf, (-1,)), counts=[c * row for c in _sizes(level, d, comm.size)])
    return _back(xp.reshape(out, (-1, *rest)), inverse)


def all_reduce(comm, x, step, level, coord):
    """P -> R: ring all-reduce of the addends."""
    return collectives.all_reduce(comm, x, algorithm="ring")


def reduce_scatter(comm, x, step, level, coord):
    """P -> S(d): ring reduce-scatter along d; rank j keeps chunk j of the sum."""
    xf, inverse = _front(x, step.dst.dim)
    return _back(collectives.reduce_scatter(comm, xf), inverse)


def all_to_all(comm, x, step, level, coord):
    """S(d) -> S(e): cut my piece along e into m chunks, send chunk j to rank j, and stack what
    arrives along d in rank order. Pieces are sent flat, so uneven shapes need no padding; when
    the pieces are not all equal all_to_all_v first swaps the counts."""
    xp, m, d, e = namespace(x), comm.size, step.src.dim, step.dst.dim
    d_sizes, e_bounds = _sizes(level, d, m), chunk_bounds(x.shape[e], m)
    pieces = [xp.reshape(contiguous(_cut(x, e, lo, hi)), (-1,)) for lo, hi in e_bounds]
    flat = xp.concat(pieces)
    mine = e_bounds[coord][1] - e_bounds[coord][0]
    rest = prod(n for i, n in enumerate(x.shape) if i not in (d, e))
    even = len(set(d_sizes)) == 1 and len({hi - lo for lo, hi in e_bounds}) == 1
    rows, counts = collectives.all_to_all_v(comm, flat, None if even else [int(p.shape[0]) for p in pieces])
    shape_from = lambda j: tuple(d_sizes[j] if i == d else mine if i == e else x.shape[i] for i in range(x.ndim))  # noqa: E731
    starts = [sum(counts[:j]) for j in range(m)]
    got = [xp.reshape(rows[starts[j]:starts[j] + counts[j]], shape_from(j)) for j in range(m)]
    assert all(c == d_sizes[j] * mine * rest for j, c in enumerate(counts))
    return contiguous(xp.concat(got, axis=d))


def slice_local(comm, x, step, level, coord):
    """R -> S(d): keep my chunk along d; nothing is sent."""
    d = step.dst.dim
    lo, hi = chunk_bounds(x.shape[d], comm.size)[coord]
    return contiguous(_cut(x, d, lo, hi))


def to_partial(comm, x, step, level, coord):
    """R -> P: coordinate 0 keeps the value, every other rank holds zeros (their sum is x, exactly;
    torch's DTensor divides by m instead)."""
    return x if coord == 0 else zeros(x.shape, like=x)


def shard_to_partial(comm, x, step, level, coord):
    """S(d) -> P: my piece in place inside zeros of the unsharded shape: the pieces add up to x."""
    d = step.src.dim
    shape = list(x.shape)
    shape[d] = level[d][1] - level[d][0]
    out = zeros(shape, like=x)
    lo, hi = chunk_bounds(shape[d], comm.size)[coord]
    out[(slice(None),) * d + (slice(lo, hi),)] = x
    return out


TRANSITIONS = {"all_gather": all_gather, "all_reduce": all_reduce, "reduce_scatter": reduce_scatter,
               "all_to_all": all_to_all, "slice": slice_local, "to_partial": to_partial,
               "shard_to_partial": shard_to_partial}


# --------------------------------------------------------------------------- traffic and cost


def _group_sizes(step, shape, mesh_shape, coords):
    """(m, element counts of the m pieces the axis's collective moves, elements of the whole
    vector) for the group of the rank at ``coords`` along the step's axis."""
    m = mesh_shape[step.axis]
    level = block(shape, step.before, mesh_shape, coords, upto=step.axis)
    # the other dims of the local block are the same for every rank of the group
    others = block(shape, step.before, mesh_shape, coords)
    local = [b - a for a, b in others]
    if step.kind in ("all_gather", "reduce_scatter"):
        d = (step.src if step.kind == "all_gather" else step.dst).dim
        row = prod(n for i, n in enumerate(local) if i != d)
        pieces = [c * row for c in _sizes(level, d, m)]
        return m, pieces, sum(pieces)
    if step.kind == "all_reduce":
        n = prod(local)
        return m, [b - a for a, b in chunk_bounds(n, m)], n
    if step.kind == "all_to_all":
        d, e = step.src.dim, step.dst.dim
        ne = level[e][1] - level[e][0]
        rest = prod(n for i, n in enumerate(local) if i not in (d, e))
        d_sizes, e_sizes = _sizes(level, d, m), [b - a for a, b in chunk_bounds(ne, m)]
        return m, [[ds * es * rest for es in e_sizes] for ds in d_sizes], None  # pieces[src][dst]
    return m, [], 0


def step_bytes(step, shape, mesh_shape, coords, nbytes_item) -> int:
    """Bytes the rank at ``coords`` sends in ``step``: exact, the same number the trace counts."""
    if step.kind not in COMMUNICATING:
        return 0
    m, pieces, total = _group_sizes(step, shape, mesh_shape, coords)
    r = coords[step.axis]
    if step.kind == "all_gather":  # the ring passes on every chunk except my right neighbour's
        return (total - pieces[(r + 1) % m]) * nbytes_item
    if step.kind == "reduce_scatter":  # every chunk except my own
        return (total - pieces[r]) * nbytes_item
    if step.kind == "all_reduce":  # both phases
        return (2 * total - pieces[r] - pieces[(r + 1) % m]) * nbytes_item
    mine = sum(pieces[r]) - pieces[r][r]  # all_to_all: my pieces for the others
    even = len({c for row in pieces for c in row}) == 1
    return mine * nbytes_item + (0 if even else (m - 1) * ITEMSIZE_COUNTS)


def step_time(step, shape, mesh_shape, coords, nbytes_item, alpha, beta, gamma=0.0) -> float:
    """Predicted seconds of ``step`` for the group of the rank at ``coords`` (0 for local steps)."""
    if step.kind not in COMMUNICATING:
        return 0.0
    m, pieces, total = _group_sizes(step, shape, mesh_shape, coords)
    if m == 1:
        return 0.0
    if step.kind == "all_gather":
        return costmodel.all_gather_time(m * max(pieces) * nbytes_item, m, alpha, beta)
    if step.kind == "reduce_scatter":
        return costmodel.reduce_scatter_time(m * max(pieces) * nbytes_item, m, alpha, beta, gamma)
    if step.kind == "all_reduce":
        return costmodel.allreduce_time("ring", m * ceil(total / m) * nbytes_item, m, alpha, beta, gamma)
    biggest = max(c for row in pieces for c in row)
    even = len({c for row in pieces for c in row}) == 1
    swap = 0.0 if even else (m - 1) * (alpha + ITEMSIZE_COUNTS * beta)
    return costmodel.all_to_all_time(m * biggest * nbytes_item, m, alpha, beta) + swap


def local_bytes(step, shape, mesh_shape, coords, nbytes_item) -> int:
    """Bytes a local step writes (a slice, a zero-filled partial): what it costs in copying."""
    if step.kind in COMMUNICATING or step.kind == "to_partial":
        return 0
    out = [b - a for a, b in block(shape, step.after if step.kind == "slice" else step.before, mesh_shape, coords)]
    if step.kind == "shard_to_partial":  # the piece grows back to the unsharded extent along d
        a, b = block(shape, step.before, mesh_shape, coords, upto=step.axis)[step.src.dim]
        out[step.src.dim] = b - a
    return prod(out) * nbytes_item
