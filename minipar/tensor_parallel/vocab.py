"""The vocabulary split across the TP group: embedding, tied LM head, cross-entropy.

    emb = VocabParallelEmbedding(comm, dense_emb)           # rank r: rows r*V/p ... of wte
    head = VocabParallelHead(comm, tied=emb)                # the same shard, transposed
    x, ctx = emb.forward(ids)                               # (B, T) ints -> (B, T, C)
    logits, hctx = head.forward(h)                          # (B, T, V/p): my vocabulary only
    loss, dlogits = vocab_parallel_cross_entropy(comm, logits, labels, emb.vocab_start)

No rank ever holds the full (B, T, V) logits: with a real vocabulary (50k-250k) they are the
largest activation of the model. What travels instead (N = B*T tokens):

    embedding  forward: each rank looks up the tokens in its rows (zero rows for the others),
               then g: all-reduce (N, C) -- or, sequence parallel, a reduce-scatter of the tokens
               backward: nothing to send (ids have no gradient); the weight gradient is a
               scatter-add of dy into my rows (sequence parallel: all-gather dy first, and
               all-gather the position embedding's rows, each computed on one rank)
    head       forward: f (identity) -- sequence parallel: all-gather the tokens
               backward: f: all-reduce dx (N, C) -- sequence parallel: reduce-scatter
    loss       all-reduce the max (N,), then one all-reduce of [sum of exps, target logit] (2, N);
               backward: none, every rank has all it needs for its own columns

Why the max first: softmax needs exp(z) for every logit z, and exp overflows above ~709
(float64) or ~88 (float32); subtracting the row's max keeps every exponent <= 0. The shift must
be *the same on every rank*: sum_r sum_v exp(z_v - m_r) adds terms measured in different units
unless every m_r is the global max. So the max is all-reduced first, then the partial sums.
"""
from __future__ import annotations

from .. import nn
from ..collectives import all_gather, all_reduce
from ..nn.embedding import lookup_backward_weight
from ..xp import copy, device, namespace, size
from . import ops


def vocab_range(vocab: int, comm) -> tuple[int, int]:
    """[lo, hi): the rows of the vocabulary this rank holds (V/p each, V divisible by p)."""
    n = ops.check_divisible(vocab, comm.size, "vocab")
    return comm.rank * n, (comm.rank + 1) * n


def global_max(comm, m):
    """The max over the TP group of each row's local max: (N, 1) in, (N, 1) out."""
    return all_reduce(comm, m, op="max")


def vocab_parallel_cross_entropy(comm, logits, labels, lo: int):
    """(loss, dlogits) for the mean over tokens of -log softmax(logits)[label], the vocabulary
    split across ``comm``: logits (..., V/p) hold columns lo ... lo + V/p - 1.

    forward: all-reduce(max) of the row maxima; then one all-reduce(sum) of the stacked
    [sum_v exp(z_v), z_label] (the label's logit lives on one rank; the others add 0).
    loss = mean(log(sum exp) - z_label). dlogits = (softmax - onehot) / N for my columns only:
    the backward needs no message.
    """
    xp = namespace(logits)
    n_local = logits.shape[-1]
    m = global_max(comm, xp.max(logits, axis=-1, keepdims=True))  # (..., 1), the same on every rank
    z = logits - m  # (..., V/p), all <= 0
    e = xp.exp(z)  # (..., V/p)
    cols = xp.arange(lo, lo + n_local, device=device(logits))
    onehot = xp.astype(labels[..., None] == cols, logits.dtype)  # (..., V/p): zero unless the label is mine
    both = xp.stack([xp.sum(e, axis=-1), xp.sum(z * onehot, axis=-1)])  # (2, ...)
    both = all_reduce(comm, both)  # sums over the whole vocabulary
    s, z_label = both[0], both[1]  # (...), (...)
    N = size(labels)
    loss = xp.sum(xp.log(s) - z_label) / N
    return loss, (e / s[..., None] - onehot) / N  # (..., V/p)


class VocabParallelEmbedding(nn.Embedding):
    """wte split by rows: rank r holds rows lo ... hi-1 (V/p of them).

    forward: look up the ids that fall in my rows (the others give zero rows) -> g: all-reduce,
    so every rank has wte[ids] (sequence_parallel: reduce-scatter instead, rank r keeps tokens
    r*T/p ... of the sum).
    backward_weight: (sequence_parallel: all-gather dy over the tokens first) my rows of dwte by
    scatter-add, ids outside my rows skipped.
    """

    sharded = ("wte",)

    def __init__(self, comm, dense: nn.Embedding, sequence_parallel=False):
        nn.Module.__init__(self)
        self.comm, self.sp = comm, sequence_parallel
        self.vocab_start, self.vocab_stop = vocab_range(dense.params["wte"].shape[0], comm)
        self._add_param("wte", self.shard("wte", dense.params["wte"]))

    def shard(self, name, full):
        """Rows chunk r of wte: (V/p, C)."""
        return ops.shard(full, self.comm.size, self.comm.rank, axis=0, what="vocab")

    def _mine(self, ids):
        """(local row of each id, True where the id is one of my rows)."""
        xp = namespace(ids)
        inside = (ids >= self.vocab_start) & (ids < self.vocab_stop)  # (B, T)
        return xp.where(inside, ids - self.vocab_start, 0), inside

    def forward(self, ids):
        w = self.params["wte"]
        local, inside = self._mine(ids)
        part = w[local] * namespace(w).astype(inside, w.dtype)[..., None]  # (B, T, C): zero rows but mine
        if self.sp:
            return ops.sp_scatter_forward(self.comm, part), {"ids": ids}  # (B, T/p, C), summed
        return ops.g_forward(self.comm, part), {"ids": ids}  # (B, T, C)

    def backward_weight(self, dy, ctx):
        xp = namespace(dy)
        dy = ops.sp_scatter_backward(self.comm, dy) if self.sp else ops.g_backward(self.comm, dy)  # (B, T, C)
        local, inside = self._mine(ctx["ids"])
        keep = xp.reshape(inside, (-1,))
        rows = xp.reshape(dy, (-1, dy.shape[-1]))[keep]  # (n_mine, C)
        self.grads["wte"] += lookup_backward_weight(rows, xp.reshape(local, (-1,))[keep], self.grads["wte"].shape[0])


class SequenceParallelPositionEmbedding(nn.PositionEmbedding):
    """Sequence parallel: x holds my T/p tokens, so add wpe's rows r*T/p ... (wpe is whole on
    every rank). Each rank's gradient covers only its rows, and each row's gradient lives on one
rank: backward_weight all-gathers them (T x C per micro-batch)."""

    def __init__(self, comm, dense: nn.PositionEmbedding):
        nn.Module.__init__(self)
        self.comm = comm
        self._add_param("wpe", copy(dense.params["wpe"]))

    def shard(self, name, full):
        return copy(full)  # replicated

    def rows(self, x):
        n = x.shape[-2]  # T/p
        return self.comm.rank * n, (self.comm.rank + 1) * n

    def backward_weight(self, dy, ctx):
        a, b, g = self.row_grads(dy)  # (T/p, C): the gradient of my rows, complete
        self.grads["wpe"][:self.comm.size * (b - a)] += all_gather(self.comm, g)  # (T, C): everyone's rows


class VocabParallelHead(nn.LMHead):
    """logits for my V/p columns: x @ wte_r.T, wte_r my rows of the token embedding.

    forward: f (identity; sequence_parallel: all-gather the tokens) -> (B, T, V/p)
    backward_input: dx = dlogits_r @ wte_r is my vocabulary's share -> f backward: all-reduce
    (sequence_parallel: reduce-scatter the tokens). backward_weight: my rows, no message.
    ``tied``: the VocabParallelEmbedding on this rank; else ``dense`` (an nn.Embedding) gives
    this rank's copy of its rows.
    """

    sharded = ("wte",)  # its own copy's rows (pipeline: the last stage), or none (tied)

    def __init__(self, comm, tied=None, dense: nn.Embedding | None = None, sequence_parallel=False):
        nn.Module.__init__(self)
        self.comm, self.sp = comm, sequence_parallel
        self.tied = (tied,) if tied is not None else ()
        if tied is None:
            self._add_param("wte", self.shard("wte", dense.params["wte"]))

    def shard(self, name, full):
        return ops.shard(full, self.comm.size, self.comm.rank, axis=0, what="vocab")

    def forward(self, x):
        x = ops.sp_gather_forward(self.comm, x) if self.sp else ops.f_forward(self.comm, x)  # (B, T, C)
        return super().forward(x)  # (B, T, V/p)

    def backward_input(self, dlogits, ctx):
        dx = super().backward_input(dlogits, ctx)  # (B, T, C), my vocabulary's share
        return ops.sp_gather_backward(self.comm, dx) if self.sp else ops.f_backward(self.comm, dx)
