"""The DP x PP x CP x TP process grid and its sub-communicators.

    grid = Grid(comm, dp=2, pp=2, tp=2)      # 8 ranks
    grid.tp  # the ranks that share my (dp, pp, cp) coordinates: all-reduce activations here
    grid.cp  # the ranks that share my (dp, pp, tp): K/V blocks travel around this ring
    grid.pp  # the ranks that share my (dp, cp, tp): send activations along the pipeline here
    grid.dp  # the ranks that share my (pp, cp, tp): the same positions of other sequences
    grid.dp_cp  # the ranks that share my (pp, tp): dp x cp of them, gradients are averaged here
    grid.emb # first and last pipeline stage of my (dp, cp, tp): the tied embedding's gradient
             # is summed here (None on the stages in between, and when pp = 1)

World rank w sits at ``numpy.arange(world).reshape(dp, pp, cp, tp)[d, p, c, t] == w``: the
axis that exchanges the most bytes varies fastest, so its partners are neighbours (on the
fastest links, inside one node). Tensor-parallel partners all-reduce every layer's activations
twice per pass; context-parallel partners pass K/V blocks every layer (less often, and
overlapped with the attention), so cp comes next, as in Megatron-LM's order tp-cp-...-dp;
pipeline neighbours send one activation per micro-batch; data-parallel partners talk once per
step, so they are farthest apart.

The cp ranks see different tokens of the same sequences: for the gradients of the replicated
weights they are data parallelism (each holds a part of the loss), so the gradient group is
dp x cp (Megatron folds cp into its data-parallel gradient group the same way).

The order is a string, as Megatron-LM's ``--order`` writes it: the axes from the fastest-varying
to the slowest. The default, ``"tp-cp-pp-dp"``, is the layout above; ``"dp-tp-cp-pp"`` would put
the data-parallel partners next to each other and tensor parallelism across them. With
``ranks_per_node`` R the world's ranks sit on nodes in blocks, as ``mpiexec -hosts a:R,b:R`` and
torchrun place them (rank w on node w // R): ``grid.node_of(w)``, and ``grid.crosses(axis)`` says
whether my group along an axis spans several nodes. The tracer then marks each message intra- or
inter-node (``minipar.trace``).

With cp = 1 (the default) the grid is the DP x PP x TP grid: ``shape`` (dp, pp, tp), ``coords``
(d, p, t), ``dp_cp`` is ``dp``. ``coords`` never includes cp (``cp_rank`` holds it), so code
written for three axes keeps working on four.
"""
from __future__ import annotations

import numpy as np

AXES = ("dp", "pp", "cp", "tp")  # outermost first
ORDER = "tp-cp-pp-dp"  # Megatron's order string: fastest-varying axis first (this grid's layout)


def parse_order(order: str) -> tuple:
    """The axes of a Megatron order string, fastest first; ValueError unless it names each of
    tp, cp, pp, dp once (``"tp-dp-pp"`` without cp is accepted: cp goes next to tp)."""
    parts = order.split("-") if isinstance(order, str) else []
    if len(parts) == 3 and "cp" not in parts:
        parts.insert(parts.index("tp") + 1 if "tp" in parts else 0, "cp")
    if sorted(parts) != sorted(AXES):
        raise ValueError(f"order={order!r}: name each of tp, cp, pp, dp once, fastest first, joined by '-' "
                         f"(Megatron's order string, e.g. {ORDER!r})")
    return tuple(parts)


def rank_grid(shape, order: str = ORDER):
    """World rank at every position of a grid of ``shape`` (its axes: :func:`axes_of`) when the
    ranks are laid out in ``order`` (fastest axis first): ``rank_grid(shape)[d, p, t]``."""
    names = axes_of(shape)
    slow = [a for a in reversed(parse_order(order)) if a in names]  # slowest first, as reshape wants
    sizes = [shape[names.index(a)] for a in slow]
    return np.arange(int(np.prod(sizes))).reshape(sizes).transpose([slow.index(a) for a in names])


def axes_of(shape) -> tuple:
    """The names of a grid shape's axes: (dp, pp, tp), or (dp, pp, cp, tp)."""
    return AXES if len(shape) == 4 else ("dp", "pp", "tp")


def axis_color(shape, coords, axis: str) -> int:
    """The colour of my group along ``axis`` ("dp", or several joined by "+": "dp+cp"): my
    coordinates on the *other* axes, as one number. Ranks with the same colour differ only along
    ``axis``, so they form its group."""
    names, group = axes_of(shape), set(axis.split("+"))
    other = [i for i, n in enumerate(names) if n not in group]
    if not other:
        return 0
    return int(np.ravel_multi_index([coords[i] for i in other], [shape[i] for i in other]))


class Grid:
    def __init__(self, comm, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1, order: str = ORDER,
                 ranks_per_node: int | None = None):
        for name, v in (("dp", dp), ("pp", pp), ("tp", tp), ("cp", cp)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        dims = f"dp={dp} x pp={pp} x " + (f"cp={cp} x " if cp > 1 else "") + f"tp={tp}"
        if dp * pp * cp * tp != comm.size:
            raise ValueError(f"a grid of {dims} needs {dp * pp * cp * tp} ranks, "
                             f"but the communicator has {comm.size}")
        if ranks_per_node is not None and (not isinstance(ranks_per_node, int) or ranks_per_node < 1
                                           or comm.size % ranks_per_node):
            raise ValueError(f"ranks_per_node={ranks_per_node!r} must divide the {comm.size} ranks")
        self.shape = (dp, pp, tp) if cp == 1 else (dp, pp, cp, tp)
        self.order, self.ranks_per_node = "-".join(parse_order(order)), ranks_per_node or comm.size
        self.ranks = rank_grid(self.shape, order)  # shape -> world rank
        position = tuple(int(i) for i in np.argwhere(self.ranks == comm.rank)[0])
        d, p, t = position[0], position[1], position[-1]
        c = position[2] if cp > 1 else 0
        self.coords, self.cp_rank, self.position = (d, p, t), c, position
        self.world = comm

        def group(axis, key, name):  # colour = my coordinates on the other axes
            return comm.split(axis_color(self.shape, position, axis), key=key, name=name)

        self.tp = group("tp", t, f"tp(d{d},p{p}" + (f",c{c})" if cp > 1 else ")"))
        self.pp = group("pp", p, f"pp(d{d}," + (f"c{c}," if cp > 1 else "") + f"t{t})")
        self.dp = group("dp", d, f"dp(p{p}," + (f"c{c}," if cp > 1 else "") + f"t{t})")
        self.cp = group("cp", c, f"cp(d{d},p{p},t{t})") if cp > 1 else None
        self.dp_cp = group("dp+cp", d * cp + c, f"dp(p{p},t{t})") if cp > 1 else self.dp
        ends = pp > 1 and p in (0, pp - 1)
        self.emb = comm.split(axis_color(self.shape, position, "pp") if ends else None, key=p,
                              name=f"emb(d{d}," + (f"c{c}," if cp > 1 else "") + f"t{t})")

    def node_of(self, world_rank: int) -> int:
        """The node world rank ``world_rank`` sits on (ranks in blocks of ``ranks_per_node``)."""
        return world_rank // self.ranks_per_node

    def crosses(self, axis: str) -> bool:
        """My group along ``axis`` ("tp", "dp+cp", ...) spans more than one node."""
        names, group = axes_of(self.shape), set(axis.split("+"))
        index = tuple(slice(None) if n in group else i for n, i in zip(names, self.position))
        return len({self.node_of(int(w)) for w in np.ravel(self.ranks[index])}) > 1

    def __repr__(self):
        where = ", ".join(f"{a}={i}" for a, i in zip(axes_of(self.shape), self.position))
        return f"<Grid {' x '.join(axes_of(self.shape))} = {self.shape}; rank {self.world.rank} at ({where})>"
