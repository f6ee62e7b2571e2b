"""Splitting one matrix product Y = X · A across ranks: by columns, by rows, by blocks.

    mpiexec -n 4 python -m mpi4py -c "import minipar, numpy as np; \
        from minipar.tensor_parallel.matmul import summa, grid_block, assemble_grid; \
        c = minipar.init(); rng = np.random.default_rng(0); A, B = rng.random((6, 4)), rng.random((4, 8)); \
        C = assemble_grid(c, summa(c, grid_block(c, A), grid_block(c, B))); print(abs(C - A @ B).max())"

Column split (p ranks): A = [A_1 ... A_p] by columns; rank r computes Y_r = X · A_r, a
block of columns of Y. No communication unless every rank wants the whole Y (an all-gather).

Row split: A = [A_1; ...; A_p] by rows and X = [X_1 ... X_p] by columns; rank r computes
X_r · A_r, a *partial sum* of the whole Y. Y = sum over r: an all-reduce.

Block split (q x q ranks, p = q^2): rank (i, j) computes block C_ij = sum_k A_ik · B_kj. With
q = 2 that is C_ij = A_i1 · B_1j + A_i2 · B_2j. SUMMA (van de Geijn and Watts 1997) gets the
blocks there by broadcasts along the rows and columns of the rank grid, so that each rank only
ever stores one block of A and one of B.

Each distributed function sits beside its dense reference; shapes p does not divide raise
ValueError naming the dimension and p, and a world size SUMMA cannot use (not a square)
raises ValueError on every rank, before any message is sent.
"""
from __future__ import annotations

from math import isqrt

from ..collectives import all_gather, all_reduce, broadcast
from ..xp import copy, empty, namespace, zeros
from .ops import check_divisible, gather_forward, shard


def matmul_dense(x, a):
    """The reference every split must reproduce: Y = X · A on one process."""
    return x @ a  # (m, n)


# --------------------------------------------------------------------------- column and row splits


def column_shard(comm, a):
    """A_r: rank r's columns of A (k, n) -> (k, n/p). Raises ValueError if p does not divide n."""
    return shard(a, comm.size, comm.rank, axis=-1, what="n (columns of A)")


def row_shards(comm, x, a):
    """(X_r, A_r): rank r's columns of X (m, k) and rows of A (k, n). ValueError if p does not divide k."""
    return (shard(x, comm.size, comm.rank, axis=-1, what="k (columns of X = rows of A)"),
            shard(a, comm.size, comm.rank, axis=0, what="k (columns of X = rows of A)"))


def column_parallel_matmul(comm, x, a_r, gather_output=True):
    """Y_r = X · A_r with X (m, k) whole on every rank and A_r (k, n/p) this rank's columns.

    Returns Y (m, n) on every rank (an all-gather of the Y_r along the columns), or just
    Y_r (m, n/p) with gather_output=False.
    """
    y_r = x @ a_r  # (m, n/p)
    return gather_forward(comm, y_r) if gather_output else y_r  # (m, n) or (m, n/p)


def row_parallel_matmul(comm, x_r, a_r):
    """Y = sum_r X_r · A_r with X_r (m, k/p) and A_r (k/p, n): one all-reduce of the partial sums."""
    partial = x_r @ a_r  # (m, n): my share of every entry of Y
    return all_reduce(comm, partial)  # (m, n)


# --------------------------------------------------------------------------- blocks on a q x q grid


def grid_shape(comm):
    """(q, i, j): the grid side and this rank's row and column (rank = i*q + j).

    Raises ValueError (on every rank alike) if the number of ranks is not a square.
    """
    p = comm.size
    q = isqrt(p)
    if q * q != p:
        raise ValueError(f"block matmul needs a square number of ranks (a q x q grid), got p={p}; "
                         f"use p = 1, 4, 9, 16, ...")
    i, j = divmod(comm.rank, q)
    return q, i, j


def grid_block(comm, full, row=None, col=None):
    """Block (row, col) (default: this rank's (i, j)) of a matrix cut into q x q equal blocks.

    Raises ValueError if q does not divide its rows or columns.
    """
    q, i, j = grid_shape(comm)
    i, j = i if row is None else row, j if col is None else col
    by = f"the grid side (p={q * q} ranks as {q} x {q}) q"
    rows = shard(full, q, i, axis=0, what=f"rows of the {tuple(full.shape)} matrix", by=by)
    return shard(rows, q, j, axis=1, what=f"columns of the {tuple(full.shape)} matrix", by=by)


def block_product_2x2(comm, a, b):
    """The four-rank picture: rank (i, j) computes C_ij = A_i1 · B_1j + A_i2 · B_2j.

    ``a`` (m, k) and ``b`` (k, n) are whole on every rank; each rank reads the two blocks of A's
    row i and of B's column j it needs and returns its block C_ij (m/2, n/2). No messages: the
    data was already everywhere. ``summa`` removes that assumption.
    """
    if comm.size != 4:
        raise ValueError(f"block_product_2x2 runs on exactly 4 ranks (a 2 x 2 grid), got p={comm.size}")
    _, i, j = grid_shape(comm)
    A = lambda r, c: grid_block(comm, a, r, c)  # noqa: E731  (paper indices start at 1, ours at 0)
    B = lambda r, c: grid_block(comm, b, r, c)  # noqa: E731
    return A(i, 0) @ B(0, j) + A(i, 1) @ B(1, j)  # (m/2, n/2)


def grid_comms(comm):
    """(row, col) sub-communicators of the q x q grid: my row i (ordered by column j) and my
    column j (ordered by row i). Collective over ``comm``."""
    q, i, j = grid_shape(comm)
    row = comm.split(i, key=j, name=f"{comm.name}/row{i}")
    col = comm.split(j, key=i, name=f"{comm.name}/col{j}")
    return row, col


def summa(comm, a_ij, b_ij, grids=None):
    """C_ij = sum_k A_ik · B_kj with each rank (i, j) holding only its blocks A_ij and B_ij.

    Step k: rank (i, k) broadcasts A_ik to its row, rank (k, j) broadcasts B_kj to its column,
    and every rank adds A_ik · B_kj to its C_ij. After q steps C_ij is complete.
    Each step is one broadcast along a row and one along a column (q = sqrt(p) ranks each), so a
    rank receives 2 (q - 1) blocks in all and never stores more than two blocks of A and B.
    ``grids``: (row, col) from ``grid_comms`` to reuse; default: split them here.
    """
    q, i, j = grid_shape(comm)
    if a_ij.shape[1] != b_ij.shape[0]:
        raise ValueError(f"summa: A's blocks {tuple(a_ij.shape)} and B's {tuple(b_ij.shape)} do not chain")
    row, col = grids or grid_comms(comm)
    c = zeros((a_ij.shape[0], b_ij.shape[1]), like=a_ij)  # (m/q, n/q)
    for k in range(q):
        a_ik = broadcast(row, copy(a_ij) if j == k else empty(a_ij.shape, like=a_ij), root=k)  # (m/q, k/q)
        b_kj = broadcast(col, copy(b_ij) if i == k else empty(b_ij.shape, like=b_ij), root=k)  # (k/q, n/q)
        c += a_ik @ b_kj
    return c


def summa_dense(a, b, q):
    """The same loop on one process: C = sum over k of the k-th block column of A times the
    k-th block row of B (each step is a rank-(k/q) update of all of C)."""
    check_divisible(a.shape[1], q, "k (columns of A)")
    w = a.shape[1] // q
    c = zeros((a.shape[0], b.shape[1]), like=a)  # (m, n)
    for k in range(q):
        c += a[:, k * w:(k + 1) * w] @ b[k * w:(k + 1) * w, :]  # block column k x block row k
    return c


def assemble_grid(comm, c_ij):
    """The whole C on every rank from each rank's block C_ij (an all-gather, then reordering)."""
    xp = namespace(c_ij)
    q, _, _ = grid_shape(comm)
    mb, nb = c_ij.shape
    blocks = all_gather(comm, xp.reshape(c_ij, (1, mb, nb)))  # (p, m/q, n/q) in rank order
    grid = xp.reshape(blocks, (q, q, mb, nb))  # [i, j] = C_ij
    return xp.reshape(xp.permute_dims(grid, (0, 2, 1, 3)), (q * mb, q * nb))  # (m, n)
