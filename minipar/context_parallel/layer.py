"""Context-parallel layers: ``nn.CausalSelfAttention`` and the position embedding on this rank's
rows of the sequence.

    layer = ContextParallelSelfAttention(cp_comm, dense_attn, seq_len=T, method="ring")
    y, ctx = layer.forward(x_local)          # x_local = layer.layout.shard(x, rank, axis=1)

    # in a transformer with tensor parallelism too (minipar train --cp 2 --tp 2):
    layer = ContextParallelSelfAttention(cp_comm, dense_attn, T, tp=tp_comm, sequence_parallel=True)
    pos = ContextParallelPositionEmbedding(dense_pos, layer.layout.positions(cp_rank), tp=tp_comm)

qkv and proj act on each token by itself, so they run on my T/cp rows with no communication
over cp; only the attention core needs the other ranks (ring attention or Ulysses over the cp
group). Every rank holds all the weights, and its weight gradients cover its own tokens: summing
them over the cp group (an all-reduce, as data parallelism does) gives the dense gradients.

With a TP group the projections are Megatron's (``ParallelSelfAttention``'s qkv and proj: heads
split over tp, one all-reduce forward and one backward, or SP's all-gather / reduce-scatter);
the core then runs on my nh/tp heads of my T/cp rows: the two splits are independent, tokens
over cp and heads over tp. Ulysses needs cp to divide the heads of one TP rank, nh/tp.
"""
from __future__ import annotations

import copy

import numpy as np

from .. import nn
from ..collectives import all_gather
from ..xp import device, index_add, namespace
from .layout import SeqLayout
from .ring import ring_attention_backward, ring_attention_forward
from .ulysses import ulysses_attention_backward, ulysses_attention_forward

METHODS = {"ring": (ring_attention_forward, ring_attention_backward),
           "ulysses": (ulysses_attention_forward, ulysses_attention_backward)}


class ContextParallelSelfAttention(nn.CausalSelfAttention):
    """The dense layer's weights (copied, or with ``tp`` split by heads), its sequence split by
    ``layout`` over ``comm``. The core's context is kept under ctx["core"]: it holds q, k, v,
    the output and the log-sum-exp per row, never probabilities nor their dropout mask (nothing
    for selective recomputation to drop: the backward recomputes both, block by block).
    ``drop`` (as ``nn.CausalSelfAttention``'s) goes to the core."""

    def __init__(self, comm, dense: nn.CausalSelfAttention, seq_len, method="ring", layout="zigzag",
                 tp=None, sequence_parallel=False):
        nn.Module.__init__(self)
        self.comm, self.method = comm, method
        self.layout = SeqLayout(seq_len, comm.size, layout)
        if tp is None:
            self.n_heads = dense.n_heads
            self.qkv, self.proj = copy.deepcopy(dense.qkv), copy.deepcopy(dense.proj)
        else:
            from ..tensor_parallel import ParallelSelfAttention

            split = ParallelSelfAttention(tp, dense, sequence_parallel=sequence_parallel)
            self.n_heads, self.qkv, self.proj = split.n_heads, split.qkv, split.proj  # nh/tp heads

    def forward(self, x):  # x: (B, T/cp, C), my rows ((B, T/cp/tp, C) sequence parallel)
        ctx = {}
        qkv, ctx["qkv"] = self.qkv.forward(x)  # (B, T/cp, 3C/tp): q | k | v of my heads
        c = qkv.shape[-1] // 3
        q, k, v = (self._split_heads(qkv[..., i * c:(i + 1) * c]) for i in range(3))  # (B, nh/tp, T/cp, hs)
        y, ctx["core"] = METHODS[self.method][0](self.comm, q, k, v, self.layout, causal=True, drop=self.drop)
        out, ctx["proj"] = self.proj.forward(self._merge_heads(y))  # (B, T/cp, C)
        return out, ctx

    def backward_input(self, dout, ctx):
        xp = namespace(dout)
        dy = self._backward_child("proj", dout, ctx)  # (B, T/cp, C/tp)
        dq, dk, dv = METHODS[self.method][1](self.comm, self._split_heads(dy), ctx["core"])
        dqkv = xp.concat([self._merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # (B, T/cp, 3C/tp)
        return self._backward_child("qkv", dqkv, ctx)


class ContextParallelPositionEmbedding(nn.PositionEmbedding):
    """x + wpe[positions]: the rows of the positions this rank holds (a ``SeqLayout``'s
    ``positions(cp_rank)``, two chunks with zigzag), not rows 0 ... T/cp - 1.

    wpe is whole on every rank. backward_weight adds each row's gradient into the row of its
    position; the rows of the other cp ranks' positions get theirs there, and the gradient
    all-reduce over the cp group (with dp: the dp x cp group) adds them up.

    ``tp`` (sequence parallelism): x holds only TP rank t's share of my rows, positions
    [t*n, (t+1)*n) of ``positions``; backward_weight all-gathers the rows' gradients over tp
    first, so every TP rank holds the gradient of all of my rows (as
    ``SequenceParallelPositionEmbedding`` does without cp).
    """

    def __init__(self, dense: nn.PositionEmbedding, positions, tp=None):
        nn.Module.__init__(self)
        self.tp = tp
        self.positions = np.asarray(positions, dtype=np.int64)  # global position of each of my rows
        self._add_param("wpe", copy.deepcopy(dense.params["wpe"]))

    def my_positions(self):
        """The positions of the rows x holds here (my TP rank's share with sequence parallelism)."""
        if self.tp is None:
            return self.positions
        n = len(self.positions) // self.tp.size
        return self.positions[self.tp.rank * n:(self.tp.rank + 1) * n]

    def _index(self, like, positions):
        return namespace(like).asarray(positions, device=device(like))

    def forward(self, x):
        w = self.params["wpe"]
        return x + namespace(w).take(w, self._index(w, self.my_positions()), axis=0), {}  # (B, T/cp, C)

    def backward_weight(self, dy, ctx):
        xp = namespace(dy)
        g = xp.sum(xp.reshape(dy, (-1, dy.shape[-2], dy.shape[-1])), axis=0)  # (rows here, C)
        if self.tp is not None:
            g = all_gather(self.tp, g)  # (T/cp, C): every TP rank's rows, in order
        w = self.grads["wpe"]
        index_add(w, self._index(w, self.positions if self.tp is not None else self.my_positions()), g)
