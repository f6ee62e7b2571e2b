"""Where the pieces of a tensor live on a mesh of ranks: Shard, Replicate, Partial.

    mesh = Mesh((2, 2), comm)                     # 4 ranks as a 2 x 2 grid: rank = c0 * 2 + c1
    pl = (Shard(0), Replicate())                  # one placement per mesh axis
    block((10, 6), pl, mesh.shape, (1, 0))        # [(5, 10), (0, 6)]: rows 5..9, every column

The vocabulary is DTensor's and GSPMD's. Per mesh axis a tensor is

- ``Shard(d)``: split along its dim ``d`` over that axis's ranks, by ``minipar.xp.chunk_bounds``
  (the first ``n % m`` pieces one longer; shapes that do not divide are fine);
- ``Replicate()``: every rank of the axis holds the same values;
- ``Partial()``: every rank holds an addend; the tensor is their sum (a matmul whose
  contraction was split leaves its output like this).

Two axes may shard the same dim: axis 0 splits it first, axis 1 splits axis 0's piece again
(DTensor's default order). A rank's *local* tensor is the block :func:`block` names, and
:func:`assemble` is the reference that puts the locals of every rank back together.

Pure functions only: no communicator is touched here except by :class:`Mesh` itself, which
splits its communicator into one sub-communicator per axis. Moving a tensor from one placement
to another is :mod:`minipar.autoparallel.transitions`.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ..xp import chunk_bounds


@dataclass(frozen=True)
class Shard:
    """Split along tensor dim ``dim`` over the ranks of one mesh axis."""
    dim: int

    def __repr__(self):
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """The same full values on every rank of one mesh axis."""

    def __repr__(self):
        return "R"


@dataclass(frozen=True)
class Partial:
    """Every rank of the axis holds an addend; the tensor is the sum over the axis."""
    op: str = "sum"

    def __post_init__(self):
        if self.op != "sum":
            raise ValueError(f"Partial(op={self.op!r}): only 'sum' is supported")

    def __repr__(self):
        return "P"


R, P = Replicate(), Partial()


def parse(text: str):
    """'S(1)' / 'R' / 'P' -> a placement (the reverse of repr)."""
    text = text.strip()
    if text == "R":
        return R
    if text == "P":
        return P
    if text.startswith("S(") and text.endswith(")") and text[2:-1].isdigit():
        return Shard(int(text[2:-1]))
    raise ValueError(f"placement {text!r}: write S(d), R or P")


def normalize(placements, ndim_mesh: int) -> tuple:
    """One placement per mesh axis, as a tuple (a lone placement is fine on a 1-D mesh)."""
    if isinstance(placements, (Shard, Replicate, Partial)):
        placements = (placements,)
    placements = tuple(placements)
    if len(placements) != ndim_mesh or not all(isinstance(p, (Shard, Replicate, Partial)) for p in placements):
        raise ValueError(f"placements={placements!r}: need one Shard/Replicate/Partial per mesh axis ({ndim_mesh})")
    return placements


_IDS: dict = {}


def pid(placements) -> int:
    """A small int naming a placements tuple (cheap to hash: the simulator's cache keys)."""
    return _IDS.setdefault(placements, len(_IDS))


def fmt(placements) -> str:
    """(S(0), R) -> 'S(0)R'."""
    return "".join(repr(p) for p in placements)


# --------------------------------------------------------------------------- the mesh


class Mesh:
    """Ranks arranged as an array of ``shape`` (1-D or 2-D): rank = c0 * m1 + c1.

    With a communicator it also holds ``coords`` (this rank's) and ``axis_comms[i]``: the ranks
    that differ from this one only in coordinate i, ordered by it (so rank j of that
    sub-communicator has coordinate j). Without one it is just the shape, for the simulator.
    """

    def __init__(self, shape, comm=None):
        self.shape = tuple(int(m) for m in shape)
        if not 1 <= len(self.shape) <= 2 or min(self.shape) < 1:
            raise ValueError(f"mesh shape {shape!r}: give 1 or 2 positive sizes")
        self.size = prod(self.shape)
        self.comm, self.coords, self.axis_comms = comm, None, None
        if comm is not None:
            if comm.size != self.size:
                raise ValueError(f"mesh shape {self.shape} has {self.size} ranks but the communicator has {comm.size}")
            self.coords = self.coords_of(comm.rank)
            if len(self.shape) == 1:
                self.axis_comms = [comm]
            else:  # color: my other coordinate; key: my coordinate along the axis
                c0, c1 = self.coords
                self.axis_comms = [comm.split(c1, c0, name=f"{comm.name}/axis0:{c1}"),
                                   comm.split(c0, c1, name=f"{comm.name}/axis1:{c0}")]

    def __repr__(self):
        return "Mesh(" + "x".join(map(str, self.shape)) + ")"

    def coords_of(self, rank: int) -> tuple:
        return tuple(int(c) for c in np.unravel_index(rank, self.shape))

    def rank_of(self, coords) -> int:
        return int(np.ravel_multi_index(tuple(coords), self.shape))

    def group(self, rank: int, axis: int) -> list[int]:
        """The ranks of ``rank``'s sub-communicator along ``axis``, in coordinate order."""
        c = list(self.coords_of(rank))
        out = []
        for k in range(self.shape[axis]):
            c[axis] = k
            out.append(self.rank_of(c))
        return out

    def groups(self, axis: int) -> list[list[int]]:
        """Every sub-communicator along ``axis`` (as lists of mesh ranks)."""
        return sorted({tuple(self.group(r, axis)) for r in range(self.size)})


def as_mesh(comm_or_mesh) -> Mesh:
    """A Mesh as is; a communicator becomes the 1-D mesh of all its ranks."""
    return comm_or_mesh if isinstance(comm_or_mesh, Mesh) else Mesh((comm_or_mesh.size,), comm_or_mesh)


# --------------------------------------------------------------------------- blocks


def block(shape, placements, mesh_shape, coords, upto=None) -> list[tuple[int, int]]:
    """The global index range [start, stop) of each tensor dim that the rank at ``coords`` holds.

    Mesh axes apply in order; ``upto=i`` applies only axes < i (the piece axis i splits further).
    """
    ranges = [(0, n) for n in shape]
    for axis, (pl, m) in enumerate(zip(placements, mesh_shape)):
        if upto is not None and axis >= upto:
            break
        if isinstance(pl, Shard):
            a, b = ranges[pl.dim]
            lo, hi = chunk_bounds(b - a, m)[coords[axis]]
            ranges[pl.dim] = (a + lo, a + hi)
    return ranges


def local_shape(shape, placements, mesh_shape, coords) -> tuple:
    return tuple(b - a for a, b in block(shape, placements, mesh_shape, coords))


def check_fits(shape, placements, mesh_shape, what="tensor"):
    """Every Shard dim names a dim of ``shape`` (a 0-d tensor can be R or P only)."""
    for pl in placements:
        if isinstance(pl, Shard) and not 0 <= pl.dim < len(shape):
            raise ValueError(f"{what} of shape {tuple(shape)} cannot be {fmt(placements)}: it has no dim {pl.dim}")


def slices(ranges):
    return tuple(slice(a, b) for a, b in ranges)


def local_block(full, placements, mesh_shape, coords):
    """Reference 'distribute': the local tensor of the rank at ``coords`` cut from the full one.

    On a Partial axis coordinate 0 holds the value and the others zeros (any split into
    addends is a valid Partial; tests add noise that cancels to make them non-trivial).
    """
    out = full[slices(block(full.shape, placements, mesh_shape, coords))]
    if any(isinstance(pl, Partial) and coords[i] != 0 for i, pl in enumerate(placements)):
        out = out * 0
    return np.array(out, copy=True)


def assemble(locals_by_rank, placements, shape, mesh_shape) -> np.ndarray:
    """Reference gather: the full tensor from every rank's local one (NumPy arrays).

    Sums over Partial axes, places Shard blocks, and takes coordinate 0 of Replicate axes.
    """
    out = np.zeros(shape)
    for rank, loc in enumerate(locals_by_rank):
        coords = np.unravel_index(rank, mesh_shape)
        if any(isinstance(pl, Replicate) and coords[i] != 0 for i, pl in enumerate(placements)):
            continue
        out[slices(block(shape, placements, mesh_shape, coords))] += loc
    return out
