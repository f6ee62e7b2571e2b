"""Lab 08 solved as a learner would: the moves written on minipar.collectives through the array
namespace of the piece (minipar.xp: NumPy under MPI, torch under torch.distributed), the layouts
by the dim rule, the chain step by hand (no solution module). Must pass `minipar check 08 --file`
on both backends."""
import math

from minipar.autoparallel.placement import Partial, Replicate, Shard, block, plan
from minipar.collectives import all_gather, all_reduce, all_to_all_v, reduce_scatter
from minipar.xp import chunk_bounds, namespace, zeros

COLLECTIVE = {(Shard, Replicate): "all_gather", (Partial, Replicate): "all_reduce",
              (Partial, Shard): "reduce_scatter", (Shard, Shard): "all_to_all", (Replicate, Shard): "slice",
              (Replicate, Partial): "to_partial", (Shard, Partial): "shard_to_partial"}


def transition_cost(src, dst, shape, m, itemsize, alpha, beta, gamma):
    if src == dst:
        return None, 0.0
    kind = COLLECTIVE[type(src), type(dst)]
    n = math.prod(shape)
    if kind == "all_reduce":
        c = math.ceil(n / m) * itemsize
        return kind, 2 * (m - 1) * alpha + 2 * (m - 1) * c * beta + (m - 1) * c * gamma
    if kind == "all_to_all":
        d, e = src.dim, dst.dim
        c = math.ceil(shape[d] / m) * math.ceil(shape[e] / m) * (n // shape[d] // shape[e]) * itemsize
        swap = (m - 1) * (alpha + 8 * beta) if shape[d] % m or shape[e] % m else 0.0
        return kind, (m - 1) * (alpha + c * beta) + swap
    if kind in ("all_gather", "reduce_scatter"):
        d = (src if kind == "all_gather" else dst).dim
        c = math.ceil(shape[d] / m) * (n // shape[d]) * itemsize
        return kind, (m - 1) * (alpha + c * (beta + (gamma if kind == "reduce_scatter" else 0.0)))
    return kind, 0.0


def _sizes(n, m):
    return [b - a for a, b in chunk_bounds(n, m)]


def _cut(x, d, a, b):
    """x[..., a:b, ...] along dim d (a view)."""
    return x[(slice(None),) * d + (slice(a, b),)]


def redistribute(comm, x, src, dst, shape):
    m, r, xp = comm.size, comm.rank, namespace(x)
    if src == dst:
        return x
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        d = src.dim
        out = all_gather(comm, xp.moveaxis(x, d, 0), counts=_sizes(shape[d], m))  # (n_d, ...)
        return xp.moveaxis(out, 0, d)
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return all_reduce(comm, x)
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return xp.moveaxis(reduce_scatter(comm, xp.moveaxis(x, dst.dim, 0)), 0, dst.dim)
    if isinstance(src, Shard) and isinstance(dst, Shard):
        d, e = src.dim, dst.dim
        cuts = chunk_bounds(x.shape[e], m)
        pieces = [xp.reshape(_cut(x, e, a, b), (-1,)) for a, b in cuts]
        sizes = [p.shape[0] for p in pieces]
        d_sizes = _sizes(shape[d], m)
        same = len(set(d_sizes)) == 1 and len({b - a for a, b in cuts}) == 1
        rows, counts = all_to_all_v(comm, xp.concat(pieces), None if same else sizes)
        starts = [sum(counts[:j]) for j in range(m + 1)]
        got = []
        for j in range(m):
            piece_shape = list(x.shape)
            piece_shape[d], piece_shape[e] = d_sizes[j], cuts[r][1] - cuts[r][0]
            got.append(xp.reshape(rows[starts[j]:starts[j + 1]], tuple(piece_shape)))
        return xp.concat(got, axis=d)
    if isinstance(src, Replicate) and isinstance(dst, Shard):
        a, b = chunk_bounds(shape[dst.dim], m)[r]
        return _cut(x, dst.dim, a, b)
    if isinstance(src, Replicate):  # -> Partial
        return x if r == 0 else zeros(x.shape, like=x)
    d = src.dim  # Shard -> Partial
    full = list(x.shape)
    full[d] = shape[d]
    out = zeros(full, like=x)
    a, b = chunk_bounds(shape[d], m)[r]
    out[(slice(None),) * d + (slice(a, b),)] = x
    return out


def redistribute_2d(mesh, x, src, dst, shape):
    for step in plan(src, dst):
        seen = list(step.before)
        seen[step.axis] = Replicate()  # the block the other axes leave
        sub = tuple(b - a for a, b in block(shape, seen, mesh.shape, mesh.coords))
        x = redistribute(mesh.axis_comms[step.axis], x, step.src, step.dst, sub)
    return x


def op_layout(kind, choice, ins, params, out):
    if choice == "-" or choice.startswith("@"):
        return [Replicate()] * len(ins), {p: Replicate() for p in params}, (
            Replicate() if choice == "-" else Partial())
    y = Shard(out.index(choice)) if choice in out else Partial()  # summed over the split dim
    if kind == "attention" and choice == "T":
        return [Replicate()], {}, y  # every query needs the keys and values before it
    xs = [Shard(d.index(choice)) if choice in d else Replicate() for d in ins]
    ps = {p: Shard(d.index(choice)) if choice in d else (Partial() if y == Partial() else Replicate())
          for p, d in params.items()}
    return xs, ps, y


def mcmc_step(strategy, cost, space, simulate, rng, beta=30.0):
    ops = [op for op, cs in space.items() if len(cs) > 1]
    op = ops[rng.integers(len(ops))]
    others = [c for c in space[op] if c != strategy[op]]
    candidate = dict(strategy)
    candidate[op] = others[rng.integers(len(others))]
    c = simulate(candidate)
    if c <= cost or rng.random() < math.exp(-beta * (c - cost) / cost):
        return candidate, c, True
    return strategy, cost, False
