"""Layers with state: parameters, accumulated gradients, and a backward split in two.

    model = Block(d_model=32, n_heads=4, rng=np.random.default_rng(0)).to(x)  # params like x
    y, ctx = model.forward(x)            # ctx: what backward needs, returned, never stored
    dx = model.backward(dy, ctx)         # accumulates into .grads of every layer inside

A pipeline runs several micro-batch forwards before the first backward, so each context lives
with the caller, not on the module. Zero-bubble schedules split the backward in two:

    dx = model.backward_input(dy, ctx)   # "B": the gradient the previous stage is waiting for
    model.backward_weight(dy, ctx)       # "W": weight gradients only, may run later

``backward`` is exactly those two calls. A composite (Block, MLP, ...) cannot get its children's
weight gradients from dy alone: its backward_input saves, inside ctx, the output gradient of
every child that has weights, and its backward_weight hands each child the one saved for it.

Parameters are float64 NumPy arrays drawn from the ``rng`` you pass; ``.to(like)`` converts
them (and the gradients) to the kind, dtype and device of any array ``like``.
"""
from __future__ import annotations

import math

import numpy as np

from ..xp import from_numpy, like_kind, namespace, size, to_numpy
from . import functional as F
from .dropout import SITES

_SAVED = "saved_dy"  # ctx key where a composite's backward_input keeps its children's output grads


class Module:
    """Base class. A layer with weights keeps them in ``params`` (name -> array) and their
    gradients in ``grads`` (same names and shapes). A composite holds its child modules as
    attributes; the order they are assigned in is the order of ``named_parameters()``.

    ``sharded``: the names of the params that a parallel layer splits over its group (each rank
    a different piece); every other param is whole, the same on every rank of the group.
    """

    sharded = ()  # a dense layer splits nothing

    def __init__(self):
        self.params = {}
        self.grads = {}

    def _add_param(self, name, value):
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)

    def children(self):
        """Child modules by name, in the order they were assigned."""
        return {name: m for name, m in vars(self).items() if isinstance(m, Module)}

    # ----------------------------------------------------------------------- forward / backward

    def forward(self, x):
        """Returns (y, ctx)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def backward_input(self, dy, ctx):
        """Returns dx; touches no weight gradient."""
        raise NotImplementedError(f"{type(self).__name__} does not implement this part of the interface")

    def backward_weight(self, dy, ctx):
        """Accumulates weight gradients only; returns None.

        This default serves layers without weights (GeLU: nothing to do) and composites, whose
        backward_input saved each weighted child's output gradient in ctx (popped here, which
        frees it). Layers with weights of their own override it.
        """
        if not self.children():
            return
        if _SAVED not in ctx:
            raise RuntimeError(f"{type(self).__name__}.backward_weight needs backward_input(dy, ctx) "
                               "first: it computes the gradients the inner weights need")
        children = self.children()
        for name, d_out in ctx.pop(_SAVED).items():
            children[name].backward_weight(d_out, ctx[name])

    def backward(self, dy, ctx):
        """Returns dx and accumulates all weight gradients: backward_input, then backward_weight."""
        dx = self.backward_input(dy, ctx)
        self.backward_weight(dy, ctx)
        return dx

    def _backward_child(self, name, dy, ctx):
        """backward_input through child ``name``, saving dy for that child's backward_weight."""
        child = self.children()[name]
        if child.num_params():
            ctx.setdefault(_SAVED, {})[name] = dy
        return child.backward_input(dy, ctx[name])

    # ----------------------------------------------------------------------- parameters

    def named_parameters(self, prefix=""):
        """(qualified name, array) pairs: own params first, then each child's, e.g. "attn.qkv.w"."""
        yield from self._named("params", prefix)

    def named_grads(self, prefix=""):
        """(qualified name, gradient) pairs, in the same order as named_parameters()."""
        yield from self._named("grads", prefix)

    def _named(self, which, prefix):
        for name, a in getattr(self, which).items():
            yield prefix + name, a
        for name, child in self.children().items():
            yield from child._named(which, f"{prefix}{name}.")

    def num_params(self):
        return sum(size(p) for _, p in self.named_parameters())

    def zero_grad(self):
        for _, g in self.named_grads():
            g[...] = 0

    def to(self, like):
        """Convert every param and grad to the kind/dtype/device of array ``like``; returns self.

        The new arrays are fresh copies: updating them never changes arrays you kept from before.
        """
        for d in (self.params, self.grads):
            for name, a in d.items():
                d[name] = from_numpy(np.array(to_numpy(a)), like)
        for child in self.children().values():
            child.to(like)
        return self


# --------------------------------------------------------------------------- layers with weights


class Linear(Module):
    """y = x @ w + b with w of shape (d_in, d_out): a column split of w splits axis 1, a row
    split axis 0. Init: w ~ N(0, 1/d_in), b = 0.
    """

    def __init__(self, d_in, d_out, rng, bias=True):
        super().__init__()
        self._add_param("w", rng.standard_normal((d_in, d_out)) / math.sqrt(d_in))
        if bias:
            self._add_param("b", np.zeros(d_out))

    def forward(self, x):
        return F.linear_forward(x, self.params["w"], self.params.get("b"))

    def backward_input(self, dy, ctx):
        return F.linear_backward_input(dy, ctx)

    def backward_weight(self, dy, ctx):
        dw, db = F.linear_backward_weight(dy, ctx)
        self.grads["w"] += dw
        if db is not None:
            self.grads["b"] += db


class LayerNorm(Module):
    """Normalise the last axis; learned scale ``gamma`` (init 1) and shift ``beta`` (init 0)."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self._add_param("gamma", np.ones(d))
        self._add_param("beta", np.zeros(d))

    def forward(self, x):
        return F.layernorm_forward(x, self.params["gamma"], self.params["beta"], self.eps)

    def backward_input(self, dy, ctx):
        return F.layernorm_backward_input(dy, ctx)

    def backward_weight(self, dy, ctx):
        dgamma, dbeta = F.layernorm_backward_weight(dy, ctx)
        self.grads["gamma"] += dgamma
        self.grads["beta"] += dbeta


class GeLU(Module):
    """The tanh-approximate GeLU; no weights (backward_weight does nothing)."""

    def forward(self, x):
        return F.gelu_forward(x)

    def backward_input(self, dy, ctx):
        return F.gelu_backward(dy, ctx)


class Dropout(Module):
    """Dropout at one site of one layer; without a ``draw`` (or with p = 0) the identity.
    ``draw``: a ``minipar.nn.dropout.Draw``, which makes each element's mask a function of its
    global index (seed, step, layer, site, row, position, column), the same on every grid.

    forward:  y = x * mask / (1 - p), mask from ``draw.keep`` for the global indices x holds
    backward: dx = dy * mask / (1 - p); no weights.

    shape: (T, D) of one global row at this site; positions: the global positions of x's rows
    (None: 0 ... T-1); cols: (lo, hi), the columns of D that x holds (None: all).
    """

    def __init__(self, draw=None, layer: int = 0, site: str = "attn", shape=(0, 0),
                 positions=None, cols=None):
        super().__init__()
        if site not in SITES:
            raise ValueError(f"dropout site {site!r}: choose one of {tuple(SITES)}")
        self.draw, self.layer, self.site, self.shape = draw, layer, site, tuple(shape)
        self.positions = None if positions is None else np.asarray(positions, dtype=np.int64)
        self.cols = cols

    def mask(self, like):
        """The keep mask (bools, 1 byte an element) of the micro-batch ``draw`` is at, in
        ``like``'s kind and device."""
        return like_kind(self.draw.keep(self.layer, self.site, self.shape, self.positions, self.cols), like)  # (b, t, d)

    def forward(self, x):
        if self.draw is None or self.draw.p == 0:
            return x, None
        mask = self.mask(x)
        return F.dropped(x, mask, self.draw.p), mask

    def backward_input(self, dy, mask):
        return dy if mask is None else F.dropped(dy, mask, self.draw.p)


# --------------------------------------------------------------------------- composites


class Sequential(Module):
    """Children run one after the other; named "0", "1", ... (a pipeline stage is one of these)."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i):
        return list(self.children().values())[i]

    def __len__(self):
        return len(self.children())

    def forward(self, x):
        ctx = {}
        for name, layer in self.children().items():
            x, ctx[name] = layer.forward(x)
        return x, ctx

    def backward_input(self, dy, ctx):
        for name in reversed(self.children()):
            dy = self._backward_child(name, dy, ctx)
        return dy


class MLP(Sequential):
    """fc1 (C -> H), GeLU, dropout on the hidden layer (T5's place; the identity unless given a
    draw), fc2 (H -> C): a Sequential whose children have names."""

    def __init__(self, d_model, d_hidden, rng):
        Module.__init__(self)
        self.fc1 = Linear(d_model, d_hidden, rng)
        self.gelu = GeLU()
        self.drop = Dropout(site="hidden")
        self.fc2 = Linear(d_hidden, d_model, rng)


class CausalSelfAttention(Module):
    """qkv = Linear(C, 3C) -> split into q | k | v (in that order along the last axis) and into
    heads -> causal attention per head -> merge heads -> proj = Linear(C, C). x: (B, T, C).

    ``drop``: dropout on the attention probabilities (``minipar.nn.dropout.AttentionDropout``,
    given by the caller; None: none). The keep mask of my heads is kept in the ctx beside p,
    and drawn again in the backward when selective recomputation dropped both.
    """

    drop = None

    def __init__(self, d_model, n_heads, rng):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = Linear(d_model, 3 * d_model, rng)
        self.proj = Linear(d_model, d_model, rng)

    def _split_heads(self, x):  # (B, T, C) -> (B, nh, T, hs)
        xp = namespace(x)
        B, T, C = x.shape
        return xp.permute_dims(xp.reshape(x, (B, T, self.n_heads, C // self.n_heads)), (0, 2, 1, 3))

    def _merge_heads(self, x):  # (B, nh, T, hs) -> (B, T, C)
        xp = namespace(x)
        B, nh, T, hs = x.shape
        return xp.reshape(xp.permute_dims(x, (0, 2, 1, 3)), (B, T, nh * hs))

    def forward(self, x):
        C = x.shape[-1]
        ctx = {}
        qkv, ctx["qkv"] = self.qkv.forward(x)  # (B, T, 3C)
        q, k, v = (self._split_heads(qkv[..., i * C:(i + 1) * C]) for i in range(3))  # (B, nh, T, hs)
        y, ctx["att"] = self._core(q, k, v)  # (B, nh, T, hs)
        out, ctx["proj"] = self.proj.forward(self._merge_heads(y))  # (B, T, C)
        return out, ctx

    def _keep(self, like):
        """The keep mask of my heads' probabilities, every position against every key:
        (B, nh, T, T) bools, or None without dropout."""
        if self.drop is None:
            return None
        pos = np.arange(like.shape[-2])
        return self.drop.keep(like, pos, pos)

    def _core(self, q, k, v):
        """Causal attention of my heads, the probabilities dropped when there is a ``drop``."""
        keep = self._keep(q)  # (B, nh, T, T) or None
        return F.attention_forward(q, k, v, causal=True, keep=keep, rate=0.0 if keep is None else self.drop.rate)

    def backward_input(self, dout, ctx):
        xp = namespace(dout)
        dy = self._split_heads(self._backward_child("proj", dout, ctx))  # (B, nh, T, hs)
        dq, dk, dv = F.attention_backward(dy, ctx["att"], replay=lambda: self._keep(dy))  # (B, nh, T, hs)
        dqkv = xp.concat([self._merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # (B, T, 3C)
        return self._backward_child("qkv", dqkv, ctx)  # (B, T, C)


class Block(Module):
    """Pre-LN transformer block: h = x + drop(attn(ln1(x))); out = h + drop(mlp(ln2(h))).
    x: (B, T, C). The two residual dropouts (GPT-2's resid_pdrop) are the identity unless given
    a draw (``attn_drop``, ``mlp_drop``: ``Dropout``)."""

    def __init__(self, d_model, n_heads, rng, d_hidden=None):
        super().__init__()
        self.ln1 = LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, rng)
        self.ln2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, d_hidden or 4 * d_model, rng)
        self.attn_drop, self.mlp_drop = Dropout(site="attn"), Dropout(site="mlp")

    def forward(self, x):
        ctx = {}
        a, ctx["ln1"] = self.ln1.forward(x)
        a, ctx["attn"] = self.attn.forward(a)
        a, ctx["attn_drop"] = self.attn_drop.forward(a)
        h = x + a  # (B, T, C)
        m, ctx["ln2"] = self.ln2.forward(h)
        m, ctx["mlp"] = self.mlp.forward(m)
        m, ctx["mlp_drop"] = self.mlp_drop.forward(m)
        return h + m, ctx  # (B, T, C)

    def backward_input(self, dout, ctx):
        # a residual sends its gradient down both paths: dh = dout + (gradient through the MLP)
        dm = self._backward_child("mlp_drop", dout, ctx)
        dh = dout + self._backward_child("ln2", self._backward_child("mlp", dm, ctx), ctx)
        da = self._backward_child("attn_drop", dh, ctx)
        return dh + self._backward_child("ln1", self._backward_child("attn", da, ctx), ctx)
