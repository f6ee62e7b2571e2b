"""The two ends of a GPT: token + position embedding in, an LM head tied to the embedding out.

    emb, pos = Embedding(vocab=32, d_model=16, rng=rng), PositionEmbedding(max_len=8, d_model=16, rng=rng)
    x, ctx = emb.forward(ids)                 # ids: (B, T) ints -> (B, T, C) = wte[ids]
    x, _ = pos.forward(x)                     # + wpe[:T]
    head = LMHead(emb)                        # logits = x @ wte.T: the same array, no copy
    logits, hctx = head.forward(x)            # (B, T, V)

A lookup ``w[ids]`` picks rows; its backward puts each output row's gradient back into the row
it came from, *adding* when a token repeats: a scatter-add (``minipar.xp.index_add``), not an
assignment. The ids themselves get no gradient, so ``backward_input`` returns None.

Tied weights (GPT-2, Press & Wolf 2017): the head multiplies by the transpose of the token
embedding. ``LMHead(emb)`` reads ``emb.params["wte"]`` whenever it runs and adds into
``emb.grads["wte"]``, so the two uses accumulate into one gradient. When the head sits on
another rank than the embedding (pipeline parallelism), ``LMHead(None, wte=copy)`` holds its
own copy, and the trainer sums the two gradients across the stages (``minipar.train``).
"""
from __future__ import annotations

import math

import numpy as np

from ..xp import index_add, namespace, zeros
from .functional import matmul
from .layers import Module


def lookup_forward(w, ids):
    """Rows ``ids`` of ``w``: (..., C). Saved for backward: the ids."""
    return w[ids], ids


def lookup_backward_weight(dy, ids, n_rows):
    """dw (n_rows, C): row v is the sum of dy over every position whose id is v."""
    xp = namespace(dy)
    C = dy.shape[-1]
    dw = zeros((n_rows, C), like=dy)
    return index_add(dw, xp.reshape(ids, (-1,)), xp.reshape(dy, (-1, C)))


class Embedding(Module):
    """x = wte[ids]: one row of wte (V, C) per token. Init: wte ~ N(0, 1/C), so tied logits
    start O(1). Saved for backward: the ids."""

    def __init__(self, vocab, d_model, rng):
        super().__init__()
        self._add_param("wte", rng.standard_normal((vocab, d_model)) / math.sqrt(d_model))

    def forward(self, ids):
        return lookup_forward(self.params["wte"], ids)[0], {"ids": ids}  # (B, T, C)

    def backward_input(self, dy, ctx):
        return None  # token ids have no gradient

    def backward_weight(self, dy, ctx):
        self.grads["wte"] += lookup_backward_weight(dy, ctx["ids"], self.grads["wte"].shape[0])


class PositionEmbedding(Module):
    """x + wpe[:T]: a learned row per position (max_len, C), init N(0, 0.01). Nothing saved."""

    def __init__(self, max_len, d_model, rng):
        super().__init__()
        self._add_param("wpe", 0.1 * rng.standard_normal((max_len, d_model)))

    def rows(self, x):
        """The positions x holds: 0 ... T-1."""
        return 0, x.shape[-2]

    def forward(self, x):
        a, b = self.rows(x)
        return x + self.params["wpe"][a:b], {}  # (B, T, C)

    def backward_input(self, dy, ctx):
        return dy

    def row_grads(self, dy):
        """(a, b, the sum over the batch of dy): the gradient of rows a ... b-1."""
        xp = namespace(dy)
        a, b = self.rows(dy)
        return a, b, xp.sum(xp.reshape(dy, (-1, b - a, dy.shape[-1])), axis=0)  # (T, C)

    def backward_weight(self, dy, ctx):
        a, b, g = self.row_grads(dy)
        self.grads["wpe"][a:b] += g


class LMHead(Module):
    """logits = x @ wte.T, (B, T, C) -> (B, T, V), with wte the token embedding.

    ``LMHead(emb)``: tied to the Embedding ``emb`` on this rank (no parameter of its own).
    ``LMHead(None, wte=array)``: its own copy, named "wte" like the embedding's.
    Saved for backward: x.
    """

    def __init__(self, tied=None, wte=None):
        super().__init__()
        self.tied = (tied,) if tied is not None else ()  # a tuple, so it is not a child module
        if tied is None:
            self._add_param("wte", np.array(wte, copy=True) if not hasattr(wte, "clone") else wte.clone())

    def owner(self):
        """The module whose "wte" this head uses: the tied embedding, or itself."""
        return self.tied[0] if self.tied else self

    def forward(self, x):
        w = self.owner().params["wte"]  # (V, C)
        return matmul(x, namespace(w).matrix_transpose(w)), {"x": x}  # (B, T, V)

    def backward_input(self, dlogits, ctx):
        return matmul(dlogits, self.owner().params["wte"])  # (B, T, C)

    def backward_weight(self, dlogits, ctx):
        xp = namespace(dlogits)
        g = self.owner().grads["wte"]  # (V, C)
        V, C = g.shape
        g += matmul(xp.matrix_transpose(xp.reshape(dlogits, (-1, V))), xp.reshape(ctx["x"], (-1, C)))
