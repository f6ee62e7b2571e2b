"""Memory-Centric Tiling (ZeRO-Infinity, Rajbhandari et al. 2021, sec. 5.1.3): a Linear too large
for one device, computed tile by tile under ZeRO-3.

    model = nn.Sequential(nn.Linear(5, 64, rng), nn.GeLU(), *tiled_linear(64, 96, tiles=4, rng=rng))
    engine = ZeRO(comm, model, stage=3, prefetch=False)
    engine.train_step(x, y)
    engine.peak_gathered()          # bytes: one tile's weights, not the whole layer's

ZeRO-3 keeps 1/N of every unit (a top-level layer) and gathers the whole unit just before it
computes, freeing it right after. So the largest layer must fit whole on a device for a moment:
a (d_in x d_out) Linear larger than a device cannot run even with ZeRO-3. Tiling splits its
output columns into ``tiles`` independent Linear(d_in, d_out / tiles) that run one after the
other, each its own unit: only one tile is gathered at any time (``prefetch=False``; with
prefetch, the next tile's gather overlaps this one's compute, two tiles).

What passes between the tiles:

    forward   Fork: x -> (x, [])       Tile i: (x, ys) -> (x, ys + [x @ W_i + b_i])     Join: concat(ys)
    backward  Join: dy -> (None, [dy_0, ..., dy_{k-1}])  (the column blocks of dy)
              Tile i: (dx, dys) -> (dx + dy_i @ W_i^T, dys); its weight gradient x^T dy_i, dy_i summed
              Fork: (dx, dys) -> dx

The same numbers as the untiled Linear: each output column is the same dot product; dx adds the
tiles' partial products in another order (relative error ~1e-16, checked at 1e-12).
"""
from __future__ import annotations

import numpy as np

from .. import nn
from ..xp import chunk_bounds, namespace


class Fork(nn.Module):
    """x -> (x, []): the input every tile reads, and the list their outputs join."""

    def forward(self, x):
        return (x, []), None

    def backward_input(self, dy, ctx):
        dx, _ = dy
        return dx

    def backward_weight(self, dy, ctx):
        pass


class Tile(nn.Module):
    """Columns [a, b) of a Linear: one unit of ZeRO-3, gathered on its own."""

    def __init__(self, lin: nn.Linear, index: int):
        super().__init__()
        self.lin, self.index = lin, index

    def forward(self, xs):
        x, ys = xs
        y, ctx = self.lin.forward(x)  # (..., cols)
        return (x, ys + [y]), ctx

    def backward_input(self, dxs, ctx):
        dx, dys = dxs
        part = self.lin.backward_input(dys[self.index], ctx)  # (..., d_in): dy_i @ W_i^T
        return (part if dx is None else dx + part), dys

    def backward_weight(self, dxs, ctx):
        self.lin.backward_weight(dxs[1][self.index], ctx)


class Join(nn.Module):
    """[y_0, ..., y_{k-1}] -> their concatenation along the last axis; backward: its column blocks."""

    def forward(self, xs):
        _, ys = xs
        widths = [y.shape[-1] for y in ys]
        return namespace(ys[0]).concat(ys, axis=-1), widths  # (..., d_out)

    def backward_input(self, dy, widths):
        edges = np.cumsum([0] + widths)
        return None, [dy[..., a:b] for a, b in zip(edges, edges[1:])]

    def backward_weight(self, dy, ctx):
        pass


def tiled_linear(d_in, d_out, tiles, rng=None, dense: nn.Linear | None = None) -> list:
    """[Fork, Tile 0, ..., Tile k-1, Join]: Linear(d_in, d_out) in ``tiles`` column blocks (sizes
    of ``chunk_bounds``), to splice into an ``nn.Sequential``. With ``dense`` the tiles hold its
    columns (the untiled reference); otherwise a new Linear drawn from ``rng``."""
    dense = dense if dense is not None else nn.Linear(d_in, d_out, rng)
    parts = []
    for i, (a, b) in enumerate(chunk_bounds(d_out, tiles)):
        lin = nn.Linear(d_in, b - a, np.random.default_rng(0), bias="b" in dense.params)
        for name, p in lin.params.items():  # holding columns [a, b) of the dense Linear
            p[...] = dense.params[name][..., a:b]  # w (d_in, b - a), b (b - a,)
        parts.append(Tile(lin, i))
    return [Fork(), *parts, Join()]
