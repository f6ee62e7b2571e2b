"""The operators of the graph: how each may be split, and its forward and backward on local pieces.

For every operator kind, ``rules(op)`` lists the dims it can be parallelized along, FlexFlow's
SOAP vocabulary (Sample, Operator, Attribute, Parameter), and for each one the placement, on
one mesh axis, that its inputs need, that its parameters have and that its output gets:

    linear  x (B, T, *in) @ w (*in, *out) + b
      B    Sample      x S(0)        w R        b R       -> y S(0)
      T    Attribute   x S(1)        w R        b R       -> y S(1)
      out  Parameter   x R           w S(out)   b S       -> y S(out)     (Megatron's column split)
      in   Parameter   x S(in)       w S(in)    b P       -> y P          (Megatron's row split)

Besides those, every operator can run replicated ("-": full inputs, same output everywhere),
and one without weights can run on a single coordinate of the axis ("@k": FlexFlow's Operator
dimension; its output is Partial: the value on rank k, zeros elsewhere), so two independent
operators (LayerNorm's mean and variance) can run side by side on different ranks.

The backward needs no table: on each axis the gradient of S(d) is S(d), the gradient of P is
R (each addend's gradient is the whole output gradient) and the gradient of R is P when the
axis divides the work (each rank's share of the uses) or R when every rank did it all.

The kernels are minipar's hand-written ones (``minipar.nn.functional``); LayerNorm is cut into
its mean, its variance and the normalization (three operators whose backward adds up to
``layernorm_backward_input``), and the loss is ``mse_loss`` rescaled from the local mean to
this piece's share of the global one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from ..nn import functional as F
from ..xp import namespace, zeros
from .sharding import P, R, Shard

CATEGORY = {"B": "Sample", "T": "Attribute", "heads": "Parameter", "out": "Parameter", "in": "Parameter",
            "-": "replicated"}


def category(choice: str) -> str:
    """The SOAP dimension a choice name belongs to ("@k": Operator; a channel dim: Attribute)."""
    return "Operator" if choice.startswith("@") else CATEGORY.get(choice, "Attribute")


@dataclass(frozen=True)
class Rule:
    """One mesh axis's share of a choice: placements of the inputs, the parameters, the output."""
    ins: tuple
    params: dict = field(default_factory=dict)
    out: object = R


S0, S1, S2 = Shard(0), Shard(1), Shard(2)


def rules(op) -> dict[str, Rule]:
    """The choices of ``op`` on one mesh axis (besides "-" and "@k", added by the graph)."""
    return KINDS[op.kind][0](op)


def forward(op, ins, params, out_block):
    """(output, ctx) on local pieces. ``out_block``: the global ranges of the local output."""
    return KINDS[op.kind][1](op, ins, params, out_block)


def backward(op, dout, ctx):
    """(input gradients, {param: gradient}) on local pieces."""
    return KINDS[op.kind][2](op, dout, ctx)


def has_weights(op) -> bool:
    return bool(op.params)


# --------------------------------------------------------------------------- linear


def _linear_rules(op):
    n_in = op.attrs["n_in"]
    w, b = op.params_named("w"), op.params_named("b")
    wo, wi = Shard(n_in + op.attrs["out_axis"]), Shard(op.attrs["in_axis"])
    return {"B": Rule((S0,), {w: R, b: R}, S0),
            "T": Rule((S1,), {w: R, b: R}, S1),
            "out": Rule((R,), {w: wo, b: Shard(op.attrs["out_axis"])}, Shard(2 + op.attrs["out_axis"])),
            "in": Rule((Shard(2 + op.attrs["in_axis"]),), {w: wi, b: P}, P)}


def _flat(x, keep):
    xp = namespace(x)
    return xp.reshape(x, (*x.shape[:keep], -1))


def _linear_forward(op, ins, params, out_block):
    (x,), w, b = ins, params[op.params_named("w")], params[op.params_named("b")]
    n_in = op.attrs["n_in"]
    out_shape = w.shape[n_in:]
    w2 = namespace(w).reshape(w, (prod(w.shape[:n_in]), prod(out_shape)))  # (in, out) flattened
    y, ctx = F.linear_forward(_flat(x, 2), w2, namespace(b).reshape(b, (-1,)))  # (B, T, out)
    return namespace(y).reshape(y, (*y.shape[:2], *out_shape)), (ctx, x.shape, w.shape, b.shape)


def _linear_backward(op, dy, ctx):
    inner, x_shape, w_shape, b_shape = ctx
    xp, dy2 = namespace(dy), _flat(dy, 2)
    dx = F.linear_backward_input(dy2, inner)  # (B, T, in)
    dw, db = F.linear_backward_weight(dy2, inner)  # (in, out), (out,)
    return [xp.reshape(dx, x_shape)], {op.params_named("w"): xp.reshape(dw, w_shape),
                                       op.params_named("b"): xp.reshape(db, b_shape)}


# --------------------------------------------------------------------------- LayerNorm in three operators


def _mean_rules(op):
    return {"B": Rule((S0,), out=S0), "T": Rule((S1,), out=S1), "C": Rule((S2,), out=P)}


def _mean_forward(op, ins, params, out_block):
    """mu = sum over my channels / C: with the channels split each rank holds an addend (P)."""
    (x,) = ins
    return namespace(x).sum(x, axis=-1, keepdims=True) / op.attrs["C"], x.shape  # (B, T, 1)


def _mean_backward(op, dmu, x_shape):
    return [namespace(dmu).broadcast_to(dmu / op.attrs["C"], x_shape)], {}  # (B, T, C)


def _var_rules(op):
    return {"B": Rule((S0,), out=S0), "T": Rule((S1,), out=S1)}


def _var_forward(op, ins, params, out_block):
    """var = mean((x - mean(x))^2): the mean recomputed inside, so this operator needs nothing
    from the mean operator and can run beside it."""
    (x,) = ins
    xp = namespace(x)
    xc = x - xp.mean(x, axis=-1, keepdims=True)  # (B, T, C)
    return xp.mean(xc ** 2, axis=-1, keepdims=True), xc  # (B, T, 1)


def _var_backward(op, dvar, xc):
    return [dvar * (2.0 / op.attrs["C"]) * xc], {}  # the mean's share cancels: sum(xc) = 0


def _norm_rules(op):
    g, b = op.params_named("gamma"), op.params_named("beta")
    return {"B": Rule((S0, S0, S0), {g: R, b: R}, S0), "T": Rule((S1, S1, S1), {g: R, b: R}, S1),
            "C": Rule((S2, R, R), {g: S0, b: S0}, S2)}


def _norm_forward(op, ins, params, out_block):
    """y = (x - mu) / sqrt(var + eps) * gamma + beta."""
    x, mu, var = ins
    gamma, beta = params[op.params_named("gamma")], params[op.params_named("beta")]
    rstd = 1.0 / namespace(x).sqrt(var + op.attrs["eps"])  # (B, T, 1)
    xhat = (x - mu) * rstd  # (B, T, C)
    return xhat * gamma + beta, (xhat, rstd, gamma)


def _norm_backward(op, dy, ctx):
    """dx = g rstd; dmu = -sum(g rstd); dvar = -sum(g xhat) rstd^2 / 2, with g = dy gamma
    (sums over my channels: with the channels split, dmu and dvar are addends)."""
    xhat, rstd, gamma = ctx
    xp, g = namespace(dy), dy * gamma
    dmu = -xp.sum(g, axis=-1, keepdims=True) * rstd  # (B, T, 1)
    dvar = -0.5 * xp.sum(g * xhat, axis=-1, keepdims=True) * rstd * rstd  # (B, T, 1)
    dgamma, dbeta = F.layernorm_backward_weight(dy, ctx)
    return [g * rstd, dmu, dvar], {op.params_named("gamma"): dgamma, op.params_named("beta"): dbeta}


# --------------------------------------------------------------------------- elementwise, attention, loss


def _pointwise_rules(op):
    last = op.attrs["last"]  # the name of the channel dim: C or H
    return {"B": Rule((S0,) * len(op.inputs), out=S0), "T": Rule((S1,) * len(op.inputs), out=S1),
            last: Rule((S2,) * len(op.inputs), out=S2)}


def _gelu_forward(op, ins, params, out_block):
    return F.gelu_forward(ins[0])


def _gelu_backward(op, dy, ctx):
    return [F.gelu_backward(dy, ctx)], {}


def _add_forward(op, ins, params, out_block):
    return ins[0] + ins[1], None


def _add_backward(op, dy, ctx):
    return [dy, dy], {}


def _attention_rules(op):
    """qkv (B, T, 3, nh, hs) -> y (B, T, nh, hs). Splitting T splits the queries: each rank needs
    every key and value (a replicated qkv) and its output rows only."""
    return {"B": Rule((S0,), out=S0), "heads": Rule((Shard(3),), out=S2), "T": Rule((R,), out=S1)}


def _heads_first(a):  # (B, T, nh, hs) -> (B, nh, T, hs)
    return namespace(a).permute_dims(a, (0, 2, 1, 3))


def _attention_forward(op, ins, params, out_block):
    (qkv,) = ins
    t0, t1 = out_block[1]  # my queries; causal: they see keys 0 .. t1-1 only
    q, k, v = (_heads_first(qkv[:, lo:t1, i]) for i, lo in ((0, t0), (1, 0), (2, 0)))  # (B, nh, T', hs)
    y, ctx = F.attention_forward(q, k, v, causal=True)  # (B, nh, t1 - t0, hs)
    return _heads_first(y), (ctx, qkv.shape, t0, t1)  # (B, t1 - t0, nh, hs)


def _attention_backward(op, dy, ctx):
    inner, qkv_shape, t0, t1 = ctx
    xp = namespace(dy)
    dq, dk, dv = (_heads_first(d) for d in F.attention_backward(_heads_first(dy), inner))  # (B, T', nh, hs)
    if (t0, t1) == (0, qkv_shape[1]):
        return [xp.stack([dq, dk, dv], axis=2)], {}  # (B, T, 3, nh, hs)
    dqkv = zeros(qkv_shape, like=dy)  # my queries' share of the gradient: an addend
    dqkv[:, t0:t1, 0], dqkv[:, :t1, 1], dqkv[:, :t1, 2] = dq, dk, dv
    return [dqkv], {}


def _mse_rules(op):
    return {"B": Rule((S0, S0), out=P), "T": Rule((S1, S1), out=P), op.attrs["last"]: Rule((S2, S2), out=P)}


def _mse_forward(op, ins, params, out_block):
    """mean((pred - target)^2) over all N elements: F.mse_loss on my piece, scaled by n/N, is my
    addend of it (and of its gradient)."""
    pred, target = ins
    n = prod(pred.shape)
    loss, dpred = F.mse_loss(pred, target)
    scale = n / op.attrs["N"]
    return loss * scale, dpred * scale


def _mse_backward(op, dloss, dpred):
    return [dpred * dloss, None], {}  # None: the target is data, it has no gradient


KINDS = {
    "linear": (_linear_rules, _linear_forward, _linear_backward),
    "mean": (_mean_rules, _mean_forward, _mean_backward),
    "var": (_var_rules, _var_forward, _var_backward),
    "norm": (_norm_rules, _norm_forward, _norm_backward),
    "gelu": (_pointwise_rules, _gelu_forward, _gelu_backward),
    "add": (_pointwise_rules, _add_forward, _add_backward),
    "attention": (_attention_rules, _attention_forward, _attention_backward),
    "mse": (_mse_rules, _mse_forward, _mse_backward),
}
