"""Skips the technique: the whole tensor on every rank. Every move gathers everything (an
all-gather of the pieces, or an all-reduce of the addends) and cuts out what it needs, and
every operator runs replicated, whatever its choice. (A move costed as that gather:
tests/test_lab08_hints.py.)

EXPECT 8.2: rank 0 sent 288 bytes in S(0) -> S(1), shape (6, 3, 3) on mesh 3; all_to_all sends exactly 96
EXPECT 8.2: gathering the whole tensor and slicing it sends more; a cheaper collective exists
EXPECT 8.3: rank 0 sent 40 bytes in (S(0), S(0)) -> (S(0), P), shape (3, 5) on mesh 2x2; shard_to_partial is local, my piece inside zeros: nothing to send
EXPECT 8.4: block ln1.mean split along 'B'
EXPECT 8.4: input 0 ('B', 'T', 'C') must be S(0), you returned R: it has B at position 0
"""
from minipar.autoparallel.placement import Partial, Replicate, Shard, block, plan
from minipar.collectives import all_gather, all_reduce
from minipar.xp import chunk_bounds, namespace, zeros


def redistribute(comm, x, src, dst, shape):
    xp = namespace(x)
    if src == dst:
        return x
    if isinstance(src, Partial):
        x = all_reduce(comm, x)
    elif isinstance(src, Shard):
        d = src.dim
        counts = [b - a for a, b in chunk_bounds(shape[d], comm.size)]
        x = xp.moveaxis(all_gather(comm, xp.moveaxis(x, d, 0), counts), 0, d)  # the whole tensor, everywhere
    if isinstance(dst, Shard):
        a, b = chunk_bounds(shape[dst.dim], comm.size)[comm.rank]
        return x[(slice(None),) * dst.dim + (slice(a, b),)]
    if isinstance(dst, Partial):
        return x if comm.rank == 0 else zeros(x.shape, like=x)
    return x


def redistribute_2d(mesh, x, src, dst, shape):
    for step in plan(src, dst):
        seen = list(step.before)
        seen[step.axis] = Replicate()
        sub = tuple(b - a for a, b in block(shape, seen, mesh.shape, mesh.coords))
        x = redistribute(mesh.axis_comms[step.axis], x, step.src, step.dst, sub)
    return x


def op_layout(kind, choice, ins, params, out):
    return [Replicate()] * len(ins), {p: Replicate() for p in params}, Replicate()  # every rank does it all
