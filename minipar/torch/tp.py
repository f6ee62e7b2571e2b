"""Tensor parallelism for ``torch.nn.Linear`` layers: Megatron's column and row splits, by a plan.

    parallelize(model, {"mlp.fc": "colwise", "mlp.proj": "rowwise"}, comm)
    y = model(x)            # every rank: the whole x in, the whole y out; 1/p of the two weights

Lesson 02's table of conjugate operators, each a ``torch.autograd.Function`` whose forward and
backward call minipar's collectives (``minipar.tensor_parallel.ops``):

    function        forward                          backward                   where
    f               identity                         all-reduce                 input of a colwise layer
    g               all-reduce                       identity                   output of a rowwise layer
    sp_gather       all-gather the tokens            reduce-scatter the tokens  input of a colwise layer (SP)
    sp_scatter      reduce-scatter the tokens        all-gather the tokens      output of a rowwise layer (SP)
    split_tokens    keep my tokens                   all-gather the tokens      entering a sequence-parallel region
    gather_tokens   all-gather the tokens            keep my tokens             leaving it

The plan maps module names to a style:

* ``"colwise"`` (an ``nn.Linear``): rank r keeps rows r of W (out_features / p of them) and of the
  bias; its input goes through f (sp_gather when sequence parallel); its output is the local
  slice of the features, (..., out_features / p). torch: ``ColwiseParallel()``.
* ``"rowwise"`` (an ``nn.Linear``): rank r keeps columns r of W; its input is the local slice of
  the features; the partial products go through g (sp_scatter when sequence parallel), then the
  whole bias is added once (sequence parallel: to my tokens, so its gradient is all-reduced like
  a "sequence" module's). torch: ``RowwiseParallel()``.
* ``"sequence"`` (any module: a LayerNorm, a dropout): the module runs on this rank's tokens
  (axis -2 cut in p); its weights stay whole, and their gradients, each rank's share of the
  tokens, are all-reduced as autograd completes them. torch: ``SequenceParallel()``. A plan with
  a "sequence" entry is sequence parallel throughout: every colwise input is all-gathered along
  the tokens and every rowwise output reduce-scattered along them; the model enters and leaves
  the token-split region with :func:`split_tokens` and :func:`gather_tokens` (forward hooks on
  the modules before and after, for example).

Splits must be even: p must divide out_features (colwise), in_features (rowwise) and, sequence
parallel, the number of tokens. A module that views its features as heads must read the number
of heads from the tensor (``q.view(B, T, -1, head_dim)``), as with torch's own plans; a fused
projection (q, k and v in one Linear) would be split across q, k and v, so keep them separate.

The dense reference is the module before ``parallelize``: :func:`dense_linear` is the one
product every split must add up to.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..collectives import all_reduce
from ..errors import UsageError
from ..tensor_parallel import ops
from .group import broadcast_state, communicator, say_once

STYLES = ("colwise", "rowwise", "sequence")


def dense_linear(x, weight, bias=None):
    """The reference: Y = X W^T + b on one process, whole weights."""
    return F.linear(x, weight, bias)


def _c(t):
    return t.contiguous()


class _F(torch.autograd.Function):
    """f: identity forward, all-reduce backward (each rank's dX is its columns' share)."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return ops.f_forward(comm, x).view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return None, ops.f_backward(ctx.comm, _c(dx))


class _G(torch.autograd.Function):
    """g: all-reduce forward (the partial sums X_r W_r), identity backward."""

    @staticmethod
    def forward(ctx, comm, y):
        ctx.comm = comm
        return ops.g_forward(comm, _c(y))

    @staticmethod
    def backward(ctx, dy):
        return None, ops.g_backward(ctx.comm, dy)


class _SPGather(torch.autograd.Function):
    """sp_gather: all-gather the tokens forward, reduce-scatter them backward."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return ops.sp_gather_forward(comm, _c(x))

    @staticmethod
    def backward(ctx, dx):
        return None, ops.sp_gather_backward(ctx.comm, _c(dx))


class _SPScatter(torch.autograd.Function):
    """sp_scatter: reduce-scatter the tokens forward, all-gather them backward."""

    @staticmethod
    def forward(ctx, comm, y):
        ctx.comm = comm
        return ops.sp_scatter_forward(comm, _c(y))

    @staticmethod
    def backward(ctx, dy):
        return None, ops.sp_scatter_backward(ctx.comm, _c(dy))


class _SplitTokens(torch.autograd.Function):
    """Enter a sequence-parallel region: keep my tokens forward, all-gather them backward."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return ops.split_forward(comm, x, ops.TOKENS)

    @staticmethod
    def backward(ctx, dx):
        return None, ops.split_backward(ctx.comm, _c(dx), ops.TOKENS)


class _GatherTokens(torch.autograd.Function):
    """Leave a sequence-parallel region: all-gather the tokens forward, keep mine backward."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return ops.gather_forward(comm, _c(x), ops.TOKENS)

    @staticmethod
    def backward(ctx, dx):
        return None, ops.gather_backward(ctx.comm, dx, ops.TOKENS)


def f(comm, x):
    return _F.apply(comm, x)


def g(comm, y):
    return _G.apply(comm, y)


def sp_gather(comm, x):
    return _SPGather.apply(comm, x)


def sp_scatter(comm, y):
    return _SPScatter.apply(comm, y)


def split_tokens(comm, x):
    return _SplitTokens.apply(comm, x)


def gather_tokens(comm, x):
    return _GatherTokens.apply(comm, x)


# --------------------------------------------------------------------------- the plan


def _keep(t, r, p, dim):
    """Chunk r of p equal chunks of ``t`` along ``dim``, a new Parameter (None stays None)."""
    if t is None:
        return None
    return torch.nn.Parameter(t.detach().chunk(p, dim)[r].clone(), requires_grad=t.requires_grad)


def colwise_forward(module, comm, sequence, x):
    """A colwise layer: f (or sp_gather), then my rows of W: (..., out_features / p)."""
    x = sp_gather(comm, x) if sequence else f(comm, x)
    return F.linear(x, module.weight, module.bias)


def rowwise_forward(module, comm, sequence, x):
    """A rowwise layer: my columns of W, the partial sums through g (or sp_scatter), the bias once."""
    y = F.linear(x, module.weight)  # (..., out_features): my share of the sum
    y = sp_scatter(comm, y) if sequence else g(comm, y)
    return y + module.bias if module.bias is not None else y


def _check_linear(name, module, style, p, what):
    if not isinstance(module, torch.nn.Linear):
        raise UsageError(f"plan[{name!r}] = {style!r}: {type(module).__name__} is not an nn.Linear")
    n = getattr(module, what)
    if n % p:
        raise UsageError(f"plan[{name!r}] = {style!r}: {what}={n} is not divisible by the {p} ranks")


def _all_reduce_grad(comm):
    def hook(param):  # a sequence-parallel weight: each rank saw 1/p of the tokens
        with torch.no_grad():
            param.grad.copy_(all_reduce(comm, _c(param.grad)))
    return hook


def parallelize(module, plan, comm=None):
    """Split ``module``'s layers named in ``plan`` over the ranks of ``comm`` (in place; returns
    ``module``), from rank 0's weights (broadcast first, as torch's ``distribute_tensor`` takes
    them from rank 0)."""
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"parallelize: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(plan, dict) or not plan:
        raise UsageError(f"plan={plan!r}: expected a dict {{module name: style}} naming at least one module")
    params = list(module.parameters())
    if not params:
        raise UsageError(f"parallelize: the module {type(module).__name__} has no parameters")
    comm = communicator(comm, params[0], "parallelize")
    say_once(comm, "parallelize")
    p, r = comm.size, comm.rank
    sequence = "sequence" in plan.values()
    modules = dict(module.named_modules())
    for name, style in plan.items():  # every entry checked before anything changes
        if style not in STYLES:
            raise UsageError(f"plan[{name!r}] = {style!r}: choose one of {STYLES}")
        if name not in modules:
            raise UsageError(f"plan names {name!r}, which is not a submodule of {type(module).__name__}")
        if style != "sequence":
            _check_linear(name, modules[name], style, p, "out_features" if style == "colwise" else "in_features")
    broadcast_state(comm, module)
    for name, style in plan.items():
        sub = modules[name]
        if style == "colwise":
            sub.weight, sub.bias = _keep(sub.weight, r, p, 0), _keep(sub.bias, r, p, 0)
            sub.out_features //= p
            sub.forward = lambda x, sub=sub: colwise_forward(sub, comm, sequence, x)
        elif style == "rowwise":
            sub.weight = _keep(sub.weight, r, p, 1)
            sub.in_features //= p
            sub.forward = lambda x, sub=sub: rowwise_forward(sub, comm, sequence, x)
            if sequence and sub.bias is not None and sub.bias.requires_grad:  # added to my tokens only
                sub.bias.register_post_accumulate_grad_hook(_all_reduce_grad(comm))
        else:
            for prm in sub.parameters():
                if prm.requires_grad:
                    prm.register_post_accumulate_grad_hook(_all_reduce_grad(comm))
    return module


def bytes_per_step(comm, calls, rank=None):
    """Bytes this rank sends in one forward and backward, for ``calls``: [(function, n, itemsize)],
    one per call of f, g, sp_gather, sp_scatter, split_tokens, gather_tokens, or "grad" (a
    sequence-parallel weight's all-reduce), n the elements of the *whole* tensor its collective
    works on (all p ranks' tokens for the token functions). An all-reduce is minipar's ring, both
    phases; a token all-gather or reduce-scatter, one phase over equal chunks."""
    from .group import ring_bytes

    r, p = (comm.rank if rank is None else rank), comm.size
    phases = {"f": ("reduce-scatter", "all-gather"), "g": ("reduce-scatter", "all-gather"),
              "grad": ("reduce-scatter", "all-gather"), "sp_gather": ("all-gather", "reduce-scatter"),
              "sp_scatter": ("reduce-scatter", "all-gather"), "split_tokens": ("all-gather",),
              "gather_tokens": ("all-gather",)}
    return sum(ring_bytes(n, p, r, itemsize, (ph,)) for fn, n, itemsize in calls for ph in phases[fn])
