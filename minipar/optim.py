"""Optimizers as in-place updates on plain arrays: SGD and Adam.

    params = [p for _, p in model.named_parameters()]
    opt = Adam(params, lr=1e-3)
    opt.step([g for _, g in model.named_grads()])    # updates every param in place
    opt.state_bytes()                                 # Adam keeps m and v: 2x the params' bytes
    norm = clip_grad_norm(grads, 1.0)                 # before the step: global L2 norm at most 1

The step functions work on arrays of any shape, including 1-D views into a flat buffer: ZeRO
calls ``adam_step`` on the shard of the flattened parameters that a rank owns. Because the update
is elementwise, updating the shards one by one gives bitwise the same numbers as updating the
whole array.
"""
from __future__ import annotations

import math

from .xp import namespace, nbytes, zeros


def clip_scale(norm, max_norm):
    """The factor ``torch.nn.utils.clip_grad_norm_`` multiplies every gradient by:
    max_norm / (norm + 1e-6), clamped at 1 (below the threshold the gradients stay as they are).
    ``norm`` is the global L2 norm, sqrt of the sum of squares of every gradient of the model."""
    return min(1.0, max_norm / (norm + 1e-6))


def clip_grad_norm(grads, max_norm, norm_type=2.0):
    """Scale ``grads`` in place so that their global norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does; returns the norm before clipping. ``norm_type`` 2.0:
    the L2 norm; ``math.inf``: the largest |element|. One process: every gradient is here once. On
    a grid the sum of squares (inf: the max) is taken over ranks, each parameter counted once
    (``minipar.train.trainer.Trainer.clip_grads``), and the same factor applied everywhere."""
    grads = list(grads)
    if norm_type == math.inf:
        norm = max((float(namespace(g).max(namespace(g).abs(g))) for g in grads), default=0.0)
    else:
        norm = math.sqrt(sum(float(namespace(g).sum(g * g)) for g in grads))
    scale = clip_scale(norm, max_norm)
    for g in grads:
        g *= scale
    return norm


def sgd_step(param, grad, lr):
    """param <- param - lr * grad, in place."""
    param -= lr * grad


def adam_step(param, grad, m, v, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """One Adam update of ``param`` and its moments ``m``, ``v``, all in place.

    ``step`` counts updates from 1 (this one included). Same formula as ``torch.optim.Adam``:

        g = grad + weight_decay * param              (L2 penalty, not AdamW's decoupled decay)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g^2
        param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)

    The bias corrections undo the pull of m and v towards their zero start; eps is added after
    the square root of the bias-corrected v.
    """
    beta1, beta2 = betas
    if weight_decay:
        grad = grad + weight_decay * param  # a new array: the caller's grad is left unchanged
    m *= beta1
    m += (1 - beta1) * grad
    v *= beta2
    v += (1 - beta2) * grad * grad
    step_size = lr / (1 - beta1**step)
    denom = namespace(v).sqrt(v) / math.sqrt(1 - beta2**step) + eps
    param -= step_size * (m / denom)


class Optimizer:
    """Holds the parameter list and, per parameter, a dict of state arrays."""

    def __init__(self, params):
        self.params = list(params)
        self.state = [{} for _ in self.params]
        self.steps = 0  # updates done so far

    def step(self, grads):
        """Update every param in place from the grads (same order as the params)."""
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError(f"step: got {len(grads)} grads for {len(self.params)} params")
        self.steps += 1
        for i, (p, g) in enumerate(zip(self.params, grads)):
            self._update(i, p, g)

    def _update(self, i, param, grad):
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def state_bytes(self):
        """Bytes of optimizer state held (what ZeRO-1 shards across ranks)."""
        return sum(nbytes(a) for s in self.state for a in s.values())


class SGD(Optimizer):
    """Plain SGD: no state."""

    def __init__(self, params, lr):
        super().__init__(params)
        self.lr = lr

    def _update(self, i, param, grad):
        sgd_step(param, grad, self.lr)


class Adam(Optimizer):
    """Adam (torch.optim.Adam's formula). State per param: ``{"m": ..., "v": ...}``, created as
    zeros like the param (same shape, dtype, device) at construction.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state = [{"m": zeros(p.shape, like=p), "v": zeros(p.shape, like=p)} for p in self.params]

    def _update(self, i, param, grad):
        m, v = self.state[i]["m"], self.state[i]["v"]
        adam_step(param, grad, m, v, self.steps, self.lr, self.betas, self.eps, self.weight_decay)
