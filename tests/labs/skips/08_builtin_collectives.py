"""Skips the technique: every rank's piece travels through the engine's own object transport
(comm.builtin.allgather_object) instead of minipar.collectives, the whole tensor is put back
together on every rank (minipar's reference assemble) and each rank cuts out its new piece.

EXPECT 8.2: rank 0 called comm.builtin.allgather_object inside redistribute: comm.builtin is the engine's own collective
EXPECT 8.3: rank 0 called comm.builtin.allgather_object inside redistribute_2d: comm.builtin is the engine's own collective
"""
from minipar.autoparallel.placement import assemble, local_block
from minipar.xp import to_numpy


def redistribute(comm, x, src, dst, shape):
    full = assemble(comm.builtin.allgather_object(to_numpy(x)), (src,), shape, (comm.size,))
    return comm.asarray(local_block(full, (dst,), (comm.size,), (comm.rank,)))


def redistribute_2d(mesh, x, src, dst, shape):
    full = assemble(mesh.comm.builtin.allgather_object(to_numpy(x)), src, shape, mesh.shape)
    return mesh.comm.asarray(local_block(full, dst, mesh.shape, mesh.coords))
