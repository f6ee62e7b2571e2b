"""The one-process reference every grid must reproduce: the dense GPT, the whole global batch per
step, in one process (the trainer's ``train`` is its distributed version, ``minipar.train.trainer``).

    losses, params = train_dense(cfg)           # the same steps as train(comm, cfg) on any grid
    loss, norm, stepped = dense_step(model, opt, ids, clip)   # one of its steps

The dense reference goes by one name in every technique, beside its distributed version:
``train_dense`` trains in one process (``minipar.data_parallel``, ``minipar.pipeline.asynchronous``,
here), ``dense_step`` takes one step (``minipar.pipeline.execute``, here).

Nothing here communicates: every rank's sums are plain sums over arrays one process holds.
"""
from __future__ import annotations

import numpy as np

from ..mixed_precision import FlatAdam
from ..nn import cross_entropy
from ..nn.dropout import Draw
from ..optim import Adam, clip_grad_norm
from ..xp import dtype_named
from .config import TrainConfig, make_data
from .model import GPT, moe_layers, place_dropout
from .parallelize import parallelize
from .precision import LossScaler, loss_in_master, nonfinite
from .saving import named_modules


def train_dense(cfg: TrainConfig, steps: int | None = None, dense=None, record=None, progress=None, norms=None,
                skipped=None):
    """The dense GPT, one process, in ``cfg.precision`` (float64 by default), the whole global
    batch per step, torch's Adam (and, with ``cfg.clip``, torch's ``clip_grad_norm_`` before it;
    ``norms``: a list to which each step's gradient norm before clipping is appended).

    Mixed precision (bf16, fp16) as on the grid (``minipar.train.precision``): 16-bit weights
    and activations, float32 gradients, float32 master weights with Adam's state, the loss on
    float32 logits; fp16 with the same dynamic loss scale (``skipped``: a list to which each
    skipped step is appended).

    Returns (losses, {dense name: final parameter}). Every grid must reproduce both.

    With experts, the loss includes each MoE layer's aux loss, and the routing decisions must be
    the grid's: capacity per group of one micro-batch of one dp replica (b rows), the aux loss
    per micro-batch over the dp replicas (the ep group). So the batch's rows are taken in the
    order (micro-batch, replica), which makes those groups consecutive (``MoE(groups=dp m,
    aux_groups=m)``); the order of the rows changes no other term of the mean loss. ``record``:
    a list to which each step's {MoE layer: {"kept", "routed"}} is appended. ``progress``: wraps
    the steps (``progress(range(steps), desc=..., total=...)``: a bar over them, from the CLI).
    """
    model = GPT(cfg.model, cfg.seed) if dense is None else dense
    draw = Draw(cfg.dropout, cfg.seed) if cfg.dropout else None
    if draw is not None:  # one process holds every row, position and column of every site
        place_dropout(model, draw, cfg.model.seq_len)
    data = make_data(cfg)
    pol = parallelize(cfg).precision  # the grid's precision, read from the run's plan
    if pol.compute != "float64":
        model.to(np.zeros(1, dtype=dtype_named(pol.compute)))
    if pol.mixed:  # 16-bit weights, float32 gradients and master weights (each parameter its own FlatAdam)
        for _, m in named_modules(model):
            m.grads = {k: np.zeros(g.shape, dtype=pol.master) for k, g in m.grads.items()}
        model.compute = dtype_named(pol.compute)
        opt = MasterAdam([p for _, p in model.named_parameters()], cfg.lr)
    else:
        opt = Adam([p for _, p in model.named_parameters()], lr=cfg.lr)
    scaler = LossScaler(cfg.initial_scale, cfg.growth_interval) if pol.scaled else None
    moes = [(f"h.{name}.mlp", blk.mlp) for name, blk in model.blocks() if moe_layers(blk.mlp)]
    rows = np.arange(cfg.batch)
    if moes:
        m, b = cfg.microbatches, cfg.batch // (cfg.dp * cfg.microbatches)
        rows = rows.reshape(cfg.dp, m, b).transpose(1, 0, 2).reshape(-1)  # (micro-batch, replica, row)
        for _, moe in moes:
            moe.groups, moe.aux_groups, moe.log = cfg.dp * m, m, []
    losses, steps = [], steps if steps is not None else cfg.steps
    for step in (progress or (lambda it, **_: it))(range(steps), desc="one-process reference", total=steps, unit="step"):
        if draw is not None:
            draw.at(step=step, rows=rows)  # the global row of each of the batch's rows, in their order here
        loss, norm, stepped = dense_step(model, opt, data.batch(step, cfg.batch, cfg.model.seq_len)[rows], cfg.clip,
                                         pol, scaler, cfg.clip_norm_type)
        if norms is not None and stepped:
            norms.append(norm)
        if skipped is not None and not stepped:
            skipped.append(step)
        aux = sum(moe.log[0][0] for _, moe in moes)
        losses.append(float(loss) + aux if moes else float(loss))
        if record is not None:
            record.append({name: {"kept": moe.log[0][1].tolist(), "routed": moe.log[0][2].tolist()} for name, moe in moes})
        for _, moe in moes:
            moe.log.clear()
    return losses, {n: np.array(p) for n, p in model.named_parameters()}


train_reference = train_dense  # its name before the dense reference had one name


class MasterAdam:
    """One process's mixed-precision Adam: a ``FlatAdam`` per parameter (float32 master weights,
    m and v), each step rounding the master into the 16-bit weight: what the grid's engines do on
    their flat buffers, element by element."""

    def __init__(self, params, lr):
        self.params = params
        self.opts = [FlatAdam(p, p, lr=lr, mixed=True) for p in params]

    def step(self, grads):
        for p, g, opt in zip(self.params, grads, self.opts):
            opt.step(p, g)


def dense_step(model, opt, ids, clip=None, pol=None, scaler=None, norm_type=2.0):
    """One step of the dense GPT on token ids (B, T+1) in one process: forward, cross-entropy,
    backward, [fp16: unscale, or skip on an overflow], [clipping by the global norm, as torch's
    ``clip_grad_norm_(max_norm=clip, norm_type=norm_type)``], Adam. Returns (the loss, the gradient norm before
    clipping or None, whether it stepped: fp16 skips a step with an overflow): the loss is the
    cross-entropy; MoE aux losses are in the layers' logs."""
    model.zero_grad()
    logits, ctx = model.forward(ids[:, :-1])  # (B, T, V)
    if pol is None:
        loss, dlogits = cross_entropy(logits, ids[:, 1:])
    else:
        loss, dlogits = loss_in_master(cross_entropy, logits, ids[:, 1:], pol, scaler.scale if scaler else 1.0)
    model.backward(dlogits, ctx)
    grads = [g for _, g in model.named_grads()]
    if scaler is not None:
        inf = nonfinite(grads)
        if not inf:
            for g in grads:
                g *= 1.0 / scaler.scale
        scaler.update(inf)
        if inf:
            return loss, None, False
    norm = clip_grad_norm(grads, clip, norm_type) if clip is not None else None  # every parameter is here once
    opt.step(grads)
    return loss, norm, True
