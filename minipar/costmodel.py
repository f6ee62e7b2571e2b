"""The alpha-beta-gamma cost model of collectives, and the nccl-tests bandwidth definitions.

A message of n bytes between two ranks costs ``alpha + n*beta`` seconds (alpha: latency,
beta: seconds per byte = 1/bandwidth); combining n bytes costs ``n*gamma``. ``p`` ranks, ``n``
bytes in the full vector. These are the formulas quoted in ``minipar.collectives``.

    >>> t = allreduce_time("ring", n=16 * 2**20, p=4, alpha=5e-6, beta=1e-10)
    alpha, beta = fit_alpha_beta(*zip(*pingpong(comm)))   # measured between ranks 0 and 1

Bandwidths as nccl-tests reports them (https://github.com/NVIDIA/nccl-tests, PERFORMANCE.md):
``algbw = bytes / time``; ``busbw = algbw * factor`` with factor 2(p-1)/p for all-reduce,
(p-1)/p for all-gather and reduce-scatter, 1 for broadcast and reduce. busbw is what a ring
actually pushes through each link, so it is comparable across p and against link speed.
"""
from __future__ import annotations

import time
from math import ceil, log2

import numpy as np


def _lg(p):
    return ceil(log2(p)) if p > 1 else 0


def _fold_cost(p, n, alpha, beta, gamma):
    """Extra cost of folding a non-power-of-two p to a power of two and back."""
    return 0.0 if p & (p - 1) == 0 else 2 * (alpha + n * beta) + n * gamma


def allreduce_time(algorithm, n, p, alpha, beta, gamma=0.0):
    """Predicted seconds for one all-reduce of n bytes on p ranks."""
    if p == 1:
        return 0.0
    lg = p.bit_length() - 1  # rounds among the largest power of two <= p (after folding)
    if algorithm == "naive":
        return (p - 1) * (alpha + n * beta + n * gamma) + (p - 1) * (alpha + n * beta)
    if algorithm == "tree":
        return 2 * _lg(p) * (alpha + n * beta) + _lg(p) * n * gamma
    if algorithm == "recursive_doubling":
        return lg * (alpha + n * beta + n * gamma) + _fold_cost(p, n, alpha, beta, gamma)
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma
    if algorithm == "rabenseifner":
        q = 2**lg
        return 2 * lg * alpha + 2 * (q - 1) / q * n * beta + (q - 1) / q * n * gamma + _fold_cost(p, n, alpha, beta, gamma)
    raise ValueError(f"algorithm={algorithm!r}: no cost formula")


def two_level_allreduce_time(algorithm, n, nodes, per_node, intra, inter, gamma=0.0):
    """Predicted seconds for one all-reduce of n bytes on ``nodes`` x ``per_node`` ranks placed in
    blocks, over two links: ``intra`` = (alpha, beta) inside a node, ``inter`` = (alpha, beta) of
    a node's uplink, which all its ranks share.

    "ring" (flat): 2(p-1) steps; in each, every rank passes n/p bytes to its right neighbour, and
        on each node one of those hops crosses the uplink, so a step lasts as long as the slower
        hop: 2(p-1) max(a1 + n/p b1, a2 + n/p b2).
    "hierarchical": reduce-scatter and all-gather inside the node, 2(R-1)(a1 + n/R b1); between
        them R rings, one per local index, each of N ranks on a shard of n/R, side by side on the
        uplink: 2(N-1) steps moving R * n/(RN) = n/N bytes through it, 2(N-1)(a2 + n/N b2).
    """
    (a1, b1), (a2, b2) = intra, inter
    p, R, N = nodes * per_node, per_node, nodes
    if algorithm == "ring":
        if p == 1:
            return 0.0
        hop = max(a1 + n / p * b1, a2 + n / p * b2) if N > 1 else a1 + n / p * b1
        return 2 * (p - 1) * hop + (p - 1) / p * n * gamma
    if algorithm == "hierarchical":
        return (2 * (R - 1) * (a1 + n / R * b1) + 2 * (N - 1) * (a2 + n / N * b2)
                + ((R - 1) / R * n + (N - 1) / N * n / R) * gamma)
    raise ValueError(f"algorithm={algorithm!r}: no two-level formula (ring or hierarchical)")


def all_gather_time(n, p, alpha, beta):
    """Ring; n = bytes of the gathered output."""
    return (p - 1) * alpha + (p - 1) / p * n * beta


def reduce_scatter_time(n, p, alpha, beta, gamma=0.0):
    """Ring; n = bytes of the full input vector."""
    return (p - 1) * alpha + (p - 1) / p * n * (beta + gamma)


def all_to_all_time(n, p, alpha, beta):
    """Pairwise exchange; n = bytes of each rank's input."""
    return (p - 1) * (alpha + n / p * beta)


BUSBW_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def algbw(nbytes, seconds):
    """Algorithm bandwidth in bytes/s: what the caller sees."""
    return nbytes / seconds


def busbw(collective, nbytes, seconds, p):
    """Bus bandwidth in bytes/s: algbw times the collective's traffic factor."""
    return algbw(nbytes, seconds) * BUSBW_FACTOR[collective](p)


def fit_alpha_beta(nbytes, seconds):
    """Least-squares fit of one-way message time ``t = alpha + n*beta`` (e.g. from a ping-pong).

    Returns (alpha, beta), both clipped at 0 (noise can make the intercept negative).
    """
    n, t = np.asarray(nbytes, float), np.asarray(seconds, float)
    beta, alpha = np.polyfit(n, t, 1)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def pingpong(comm, sizes=(8, 1024, 65536, 1 << 20, 4 << 20), reps=20):
    """[(bytes, one-way seconds)] between ranks 0 and 1: half the round trip, best of ``reps``
    (the same on every rank). The measurement ``fit_alpha_beta`` is made for."""
    out = []
    for n in sizes:
        buf = comm.asarray(np.zeros(n // 8))
        best = float("inf")
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.send(buf, 1)
                comm.recv(buf, 1)
            elif comm.rank == 1:
                comm.recv(buf, 0)
                comm.send(buf, 0)
            best = min(best, (time.perf_counter() - t0) / 2)
        out.append((n, comm.builtin.bcast_object(best, 0)))
    return out
