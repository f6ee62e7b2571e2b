"""Forward/backward pairs with the backward written by hand, each right beside its forward.

    y, ctx = linear_forward(x, w, b)          # forward returns the output and what backward needs
    dx = linear_backward_input(dy, ctx)        # gradient w.r.t. the input ...
    dw, db = linear_backward_weight(dy, ctx)   # ... and w.r.t. the weights, as two separate calls

Pure functions: no state, nothing cached between calls. Each docstring says what ``ctx`` holds,
because that is the activation memory a layer keeps alive between its forward and its backward.

All math goes through the array namespace of the inputs (``xp = namespace(x)``), so the same
lines run on NumPy arrays and on torch tensors (CPU or CUDA). Shapes: B batch, T sequence
length, C = d_model channels, nh heads, hs = C // nh head size, V classes.
"""
from __future__ import annotations

import math

import numpy as np

from ..xp import device, is_torch, namespace, size


def matmul(a, b):
    """a @ b, as a tensor core computes 16-bit matmuls: 16-bit inputs, float32 sums, a 16-bit
    output. NumPy has no BLAS for float16 (its own loop runs ~35x slower than float32 here), so
    NumPy float16 operands are multiplied by float32 BLAS and the product rounded to float16;
    ml_dtypes' bfloat16 matmul sums and returns float32, rounded to bfloat16 here. Everything
    else (torch, whose 16-bit kernels do this already): a @ b."""
    if not is_torch(a) and a.dtype == np.float16:
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    return kept(a @ b, a)


def kept(y, like):
    """``y`` in ``like``'s dtype: each kernel here returns (and saves) its input's dtype, as a 16-bit
    GPU kernel computes in float32 registers and writes 16 bits. Only NumPy's bfloat16 needs it
    (ml_dtypes promotes bfloat16 with a Python float, and its matmul, to float32: the activations
    kept and the tensors all-reduced would be float32, twice a real engine's bytes); a no-op for
    every other dtype and for torch."""
    if y is None or y.dtype == like.dtype:
        return y
    return namespace(y).astype(y, like.dtype)


def wide(x):
    """``x`` in float32 if it is NumPy's bfloat16, else ``x`` itself: a kernel's inputs in its
    registers' dtype. ml_dtypes' own bfloat16 loops run 30x (a product) to 200x (tanh, exp) slower
    than float32's; a kernel widens its inputs once and ``kept`` rounds its outputs."""
    if not is_torch(x) and x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x

# --------------------------------------------------------------------------- linear


def rows_matmul(x, w):
    """x @ w, with a stack of single rows multiplied as one 2-D product:
    (..., 1, d_in) -> (N, d_in) @ (d_in, d_out) -> (..., 1, d_out), N = product of the leading dims.

    The same product as ``x @ w`` (its last bits may differ: a matrix-vector and a matrix-matrix
    kernel add in different orders). NumPy runs a stacked (B, 1, d_in) @ w, a decode step at batch B,
    as B matrix-vector products, each reading all of w: the step would read the weights B times
    and never become compute-bound (docs/inference.md, "Batch"). One (B, d_in) product reads w
    once, as a GPU kernel does. Stacks of longer sequences (T >= 32 rows each, training and
    prefill) stay as they are: there OpenBLAS's per-sequence products measured as fast as one
    folded product, or faster (0.73x-1.28x on this model's shapes).
    """
    if x.ndim <= 2 or x.shape[-2] != 1:
        return matmul(x, w)
    xp = namespace(x)
    y = matmul(xp.reshape(x, (-1, x.shape[-1])), w)  # (N, d_out)
    return xp.reshape(y, (*x.shape[:-1], w.shape[-1]))  # (..., 1, d_out)


def linear_forward(x, w, b=None):
    """y = x @ w + b, with w of shape (d_in, d_out) and x of shape (..., d_in).

    Saved for backward: ctx = (x, w, has_bias). x is needed for dw, w for dx.
    """
    y = rows_matmul(x, w)  # (..., d_out)
    if b is not None:
        y = y + b
    return y, (x, w, b is not None)


def linear_backward_input(dy, ctx):
    """dx = dy @ w.T: the part of the backward that the previous layer is waiting for."""
    _, w, _ = ctx
    return rows_matmul(dy, namespace(w).matrix_transpose(w))  # (..., d_in)


def linear_backward_weight(dy, ctx):
    """(dw, db): every leading position of x contributes an outer product x_i^T dy_i.

    db is None when the forward had no bias.
    """
    x, w, has_bias = ctx
    xp = namespace(dy)
    x2 = xp.reshape(x, (-1, w.shape[0]))  # (N, d_in), N = product of leading dims
    dy2 = xp.reshape(dy, (-1, w.shape[1]))  # (N, d_out)
    x2, dy2 = wide(x2), wide(dy2)  # NumPy bf16: dw in float32, unrounded (Megatron's gradient-accumulation
    dw = matmul(xp.matrix_transpose(x2), dy2)  # (d_in, d_out)   fusion writes it into float32 main_grad)
    db = xp.sum(dy2, axis=0) if has_bias else None  # (d_out,)
    return dw, db


# --------------------------------------------------------------------------- GeLU (tanh approximation)

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu_forward(x):
    """y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)  (GPT-2's GeLU,
    ``torch.nn.functional.gelu(x, approximate="tanh")``).

    Saved for backward: ctx = (x, tanh(u)).
    """
    xp, xw = namespace(x), wide(x)
    t = xp.tanh(_GELU_C * (xw + _GELU_A * (xw * xw * xw)))  # x*x*x: NumPy's float power is ~100x slower
    return kept(0.5 * xw * (1.0 + t), x), (x, kept(t, x))


def gelu_backward(dy, ctx):
    """dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    x, t = (wide(a) for a in ctx)
    du = _GELU_C * (1.0 + 3.0 * _GELU_A * (x * x))
    return kept(wide(dy) * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du), dy)


# --------------------------------------------------------------------------- softmax


def softmax_forward(x, axis=-1):
    """y = exp(x - max) / sum(exp(x - max)) along ``axis`` (subtracting the max avoids overflow).

    Saved for backward: ctx = (y, axis); the output is all the backward needs.
    """
    xp, xw = namespace(x), wide(x)
    e = xp.exp(xw - xp.max(xw, axis=axis, keepdims=True))
    y = kept(e / xp.sum(e, axis=axis, keepdims=True), x)
    return y, (y, axis)


def softmax_backward(dy, ctx):
    """dx = y * (dy - sum(dy * y)): the Jacobian diag(y) - y y^T applied without forming it."""
    (y, axis), dyw = ctx, wide(dy)
    xp, y = namespace(dy), wide(y)
    return kept(y * (dyw - xp.sum(dyw * y, axis=axis, keepdims=True)), dy)


# --------------------------------------------------------------------------- layernorm


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """Normalise the last axis to mean 0 / variance 1, then scale by gamma and shift by beta.

    Saved for backward: ctx = (xhat, rstd, gamma), xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps).
    """
    xp, xw = namespace(x), wide(x)
    mu = xp.mean(xw, axis=-1, keepdims=True)  # (..., 1)
    var = xp.mean((xw - mu) ** 2, axis=-1, keepdims=True)  # (..., 1), biased like torch
    rstd = 1.0 / xp.sqrt(var + eps)  # (..., 1)
    xhat = (xw - mu) * rstd  # (..., C)
    return kept(xhat * wide(gamma) + wide(beta), x), (kept(xhat, x), kept(rstd, x), gamma)


def layernorm_backward_input(dy, ctx):
    """dx. With g = dy * gamma (the gradient w.r.t. xhat):

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))

    the two mean terms are the gradient flowing back through the mean and through the variance.
    """
    xhat, rstd, gamma = (wide(a) for a in ctx)
    xp = namespace(dy)
    g = wide(dy) * gamma  # (..., C)
    mean_g = xp.mean(g, axis=-1, keepdims=True)  # (..., 1)
    mean_gx = xp.mean(g * xhat, axis=-1, keepdims=True)  # (..., 1)
    return kept(rstd * (g - mean_g - xhat * mean_gx), dy)  # (..., C)


def layernorm_backward_weight(dy, ctx):
    """(dgamma, dbeta), each summed over every leading position."""
    xhat, _, gamma = ctx
    xp, dyw = namespace(dy), wide(dy)
    C = gamma.shape[0]
    dgamma = xp.sum(xp.reshape(dyw * wide(xhat), (-1, C)), axis=0)  # (C,)
    dbeta = xp.sum(xp.reshape(dyw, (-1, C)), axis=0)  # (C,)
    return kept(dgamma, dy), kept(dbeta, dy)


def layernorm_backward(dy, ctx):
    """(dx, dgamma, dbeta): both halves of the backward at once."""
    return (layernorm_backward_input(dy, ctx), *layernorm_backward_weight(dy, ctx))


# --------------------------------------------------------------------------- attention


def attention_probs(q, k, scale, causal=True):
    """p = softmax(q k^T * scale), with the future masked when ``causal``: (B, nh, Tq, Tk).

    q may hold fewer positions than k (Tq <= Tk): they are then the *last* Tq of the Tk
    positions (a rank that owns a slice of the queries passes the keys up to its last query).
    """
    xp = namespace(q)
    att = wide(matmul(q, xp.matrix_transpose(k))) * scale  # (B, nh, Tq, Tk)
    if causal:
        Tq, Tk = q.shape[-2], k.shape[-2]
        i = xp.arange(Tq, device=device(q)) + (Tk - Tq)  # each query's position among the keys
        j = xp.arange(Tk, device=device(q))
        future = j[None, :] > i[:, None]  # (Tq, Tk), True above the (shifted) diagonal
        att = xp.where(future, -xp.inf, att)
    p, _ = softmax_forward(att, axis=-1)  # (B, nh, Tq, Tk)
    return kept(p, q)


def dropped(x, keep, rate):
    """Dropout with its keep mask: x * keep / (1 - rate), what is kept scaled so that the
    expectation is x (``keep``: bools of x's shape, or None: x itself)."""
    return x if keep is None else kept(x * keep * (1.0 / (1.0 - rate)), x)


def attention_forward(q, k, v, causal=True, keep=None, rate=0.0):
    """Scaled dot-product attention: softmax(q k^T / sqrt(hs), masked if causal) @ v.

    q, k, v: (B, nh, T, hs). With ``causal`` position i attends only to positions j <= i
    (q may be the last Tq <= T positions only: see :func:`attention_probs`).
    Dropout on the probabilities (GPT-2's attn_pdrop): ``keep``, the (B, nh, Tq, Tk) keep mask
    (bools), ``rate`` its p: out = dropped(p) @ v, p normalised before the drop.
    Saved for backward: ctx = (q, k, v, p, scale, keep, rate), p the (B, nh, T, T) attention
    probabilities (and keep, one byte an element). That T x T matrix per head is what flash
    attention avoids keeping, and what selective recomputation drops (:func:`drop_probs`): the
    backward then recomputes it from q and k, and draws the mask again (``replay``).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = attention_probs(q, k, scale, causal)  # (B, nh, T, T)
    return matmul(dropped(p, keep, rate), v), (q, k, v, p, scale, keep, rate)  # (B, nh, T, hs)


def drop_probs(ctx):
    """The attention ctx without p and its dropout mask (selective recomputation keeps q, k, v:
    3 (B, T, C) instead of the (B, nh, T, T) probabilities). Only causal attention's ctx may be
    stripped."""
    q, k, v, _, scale, _, rate = ctx
    return (q, k, v, None, scale, None, rate)


def attention_backward(dout, ctx, replay=None):
    """(dq, dk, dv). Masked entries need no special care: p is 0 there, so their gradient is 0.

    If the forward's p was dropped (selective recomputation), it is recomputed here first:
    one more q k^T and softmax per backward, no communication; with dropout, ``replay()`` draws
    its keep mask again (it must be the forward's: a function of the element's index).
    With d = dropped(p): dv = d^T dout, and the gradient of p is dropped(dout v^T), the same
    mask and scale, which then goes through the softmax's backward.
    """
    q, k, v, p, scale, keep, rate = ctx
    xp = namespace(dout)
    if p is None:
        p = attention_probs(q, k, scale, causal=True)  # (B, nh, T, T) recomputed
        if rate:
            if replay is None:
                raise ValueError("the attention's dropout mask was dropped with p: pass replay, which draws it again")
            keep = replay()  # (B, nh, T, T) bools, the forward's
    dv = matmul(xp.matrix_transpose(dropped(p, keep, rate)), dout)  # (B, nh, T, hs)
    dp = dropped(matmul(dout, xp.matrix_transpose(v)), keep, rate)  # (B, nh, T, T)
    datt = kept(wide(softmax_backward(dp, (p, -1))) * scale, dout)  # (B, nh, T, T); (p, -1) is the softmax's ctx
    dq = matmul(datt, k)  # (B, nh, T, hs)
    dk = matmul(xp.matrix_transpose(datt), q)  # (B, nh, T, hs)
    return dq, dk, dv


# --------------------------------------------------------------------------- losses


def mse_loss(pred, target):
    """(loss, dpred) for loss = mean((pred - target)^2) over all elements.

    The loss is a 0-d array (call ``float(loss)`` for a Python number); dpred = 2 (pred - target) / N.
    """
    xp = namespace(pred)
    diff = pred - target
    return xp.mean(diff * diff), (2.0 / size(diff)) * diff


def cross_entropy(logits, labels):
    """(loss, dlogits) for the mean over rows of -log softmax(logits)[label].

    logits: (..., V); labels: integer array of the leading shape, same kind/device as logits.
    The loss is a 0-d array; dlogits = (softmax(logits) - onehot(labels)) / N.
    """
    xp = namespace(logits)
    V = logits.shape[-1]
    z = logits - xp.max(logits, axis=-1, keepdims=True)  # (..., V)
    logp = z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))  # (..., V) log-probabilities
    classes = xp.arange(V, device=device(logits))
    onehot = xp.astype(labels[..., None] == classes, logits.dtype)  # (..., V)
    N = size(labels)
    loss = -xp.sum(onehot * logp) / N
    return loss, (xp.exp(logp) - onehot) / N
