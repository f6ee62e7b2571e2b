"""DP: single-process ``DataParallel`` rebuilt on ranks, rank 0 doing the talking.

    dp = DP(comm, model, batch_size=12, sample_shape=(5,), lr=1e-3)
    loss = dp.train_step(x, y)      # x, y: the whole batch on rank 0, None elsewhere
"""
from __future__ import annotations

from ..mixed_precision import FlatAdam
from ..nn import mse_loss
from ..xp import chunk_bounds, copy, empty, zeros
from .engine import Flat


# --------------------------------------------------------------------------- DP


class DP:
    """``torch.nn.DataParallel`` on ranks: rank 0 holds the batch, the model and the optimizer.

    Per step (N ranks, B samples, Psi weights), five exchanges, all through rank 0:
      1. scatter the micro-batches   rank 0 -> r: rows chunk r of x
      2. replicate the weights       rank 0 -> r: all Psi weights          ((N-1) Psi out of rank 0)
      3. gather the outputs          r -> rank 0: rows chunk r of the prediction
      4. loss on rank 0; scatter the output gradients   rank 0 -> r
      5. gather the weight gradients r -> rank 0: Psi each                ((N-1) Psi into rank 0)
    then rank 0 alone updates. The gradients are *summed*, not averaged: the loss rank 0 computed
    is the mean over the whole batch, so its 1/B is already in every output gradient it scattered
    (DataParallel's ReduceAddCoalesced sums too). Other ranks only hold a replica between steps.
    """

    def __init__(self, comm, model, batch_size, sample_shape, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, loss=mse_loss):
        self.comm, self.model, self.loss = comm, model, loss
        self.rows = chunk_bounds(batch_size, comm.size)
        self.sample_shape = tuple(sample_shape)
        flat = Flat(list(model.children().values()), 1)
        like = next(p for _, p in model.named_parameters())
        self.P, self.G = flat.values(like, like.dtype), zeros((flat.n,), like=like)
        flat.bind("params", self.P)
        flat.bind("grads", self.G)
        self.opt = FlatAdam(self.P, None, lr, betas, eps, weight_decay) if comm.rank == 0 else None

    def train_step(self, x=None, y=None):
        """x, y: the whole batch on rank 0 (ignored elsewhere). Returns the loss on rank 0, None elsewhere."""
        comm, r = self.comm, self.comm.rank
        a, b = self.rows[r]
        if r == 0:  # 1. scatter the micro-batches
            for dst, (lo, hi) in enumerate(self.rows[1:], 1):
                comm.send(copy(x[lo:hi]), dst, 1)
            xr = x[a:b]
        else:
            xr = comm.recv(empty((b - a,) + self.sample_shape, like=self.P), 0, 1)
        for dst in range(1, comm.size) if r == 0 else ():  # 2. replicate the weights
            comm.send(self.P, dst, 2)
        if r:
            comm.recv(self.P, 0, 2)
        with comm.region("forward"):
            pred, ctx = self.model.forward(xr)  # (b - a, d_out)
        value = None
        if r == 0:  # 3. gather the outputs, 4. loss and scatter the output gradients
            full = empty((self.rows[-1][1],) + tuple(pred.shape[1:]), like=pred)  # (B, d_out)
            full[a:b] = pred
            for src, (lo, hi) in enumerate(self.rows[1:], 1):
                comm.recv(full[lo:hi], src, 3)
            with comm.region("loss"):
                value, dfull = self.loss(full, y)
            for dst, (lo, hi) in enumerate(self.rows[1:], 1):
                comm.send(copy(dfull[lo:hi]), dst, 4)
            dpred = dfull[a:b]
        else:
            comm.send(pred, 0, 3)
            dpred = comm.recv(empty(pred.shape, like=pred), 0, 4)
        self.G[...] = 0
        with comm.region("backward"):
            self.model.backward(dpred, ctx)
        if r == 0:  # 5. gather and sum the weight gradients, then update
            tmp = empty(self.G.shape, like=self.G)
            for src in range(1, comm.size):
                comm.recv(tmp, src, 5)
                self.G += tmp
            with comm.region("update"):
                self.opt.step(self.P, self.G)
            return float(value)
        comm.send(self.G, 0, 5)
        return None
