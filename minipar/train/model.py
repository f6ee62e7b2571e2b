"""The small GPT: the dense one-process model, and one pipeline stage of it on a TP group.

    cfg = GPTConfig(vocab=32, d_model=16, n_heads=8, n_layers=8, seq_len=8)
    gpt = GPT(cfg, seed=0)                        # dense, float64: the reference
    logits, ctx = gpt.forward(ids)                 # (B, T) -> (B, T, V)
    loss, dlogits = cross_entropy(logits, labels)
    gpt.backward(dlogits, ctx)                     # grads in gpt.named_grads()

    stage = build_stage(tp_comm, gpt, stage=1, n_stages=4, sequence_parallel=True, recompute="full")

Pre-LN GPT-2 layout, every backward written by hand:

    ids (B, T) -> embed: wte[ids] -> pos: + wpe[:T] -> emb_drop -> h.0 ... h.{L-1} (Blocks) -> ln_f
               -> head: x @ wte.T -> logits (B, T, V) -> cross-entropy with the next tokens

A stage is the same module holding a slice of it: stage 0 also the embeddings, the last stage
also ln_f and the head. The dense GPT *is* the one stage of a one-stage pipeline built from
``minipar.nn`` layers; a stage on a TP group is built from it by slicing
(``minipar.tensor_parallel``: ParallelBlock, VocabParallelEmbedding, VocabParallelHead), so every
parameter keeps its dense name ("h.3.attn.qkv.w") and ``local_shards`` finds its piece.

The blocks are held in ``h`` by their global index. Each block is any module with the usual
interface (forward -> (y, ctx), backward_input, backward_weight), and so are the attention and
the MLP inside it: ``build_stage(..., cp=group)`` puts lesson 06's context-parallel attention
(ring or Ulysses on my heads of my positions) in each block and the position embedding of my
positions in front; a GPT with ``n_experts`` > 0 has a mixture of experts for every MLP, which
``build_stage(..., ep=group)`` shards over the ep group.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import nn
from ..context_parallel import ContextParallelPositionEmbedding, ContextParallelSelfAttention, SeqLayout
from ..experts import ExpertParallelMoE, MoE
from ..layout import knob
from ..nn import recompute as rc
from ..nn.dropout import AttentionDropout
from ..tensor_parallel import ParallelBlock, SequenceParallelLayerNorm
from ..tensor_parallel.vocab import (SequenceParallelPositionEmbedding, VocabParallelEmbedding,
                                     VocabParallelHead)
from ..xp import namespace


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 32  # V, padded: divisible by every TP size used
    d_model: int = 16  # C
    n_heads: int = 8
    n_layers: int = 8
    seq_len: int = 8  # T: tokens per sample (rows of wpe)
    d_hidden: int = 0  # MLP width; 0 means 4 C
    # E > 0: every block's MLP is a mixture of E experts (minipar.experts)
    n_experts: int = knob(0, "E > 0: every MLP is a mixture of E experts, sharded over the dp ranks")
    top_k: int = knob(1, "experts per token (default {default})")
    # an expert takes ceil(f k N / E) of a group's N tokens
    capacity_factor: float = knob(1.25, "tokens an expert takes: f x k x N / E (default {default})")
    aux_weight: float = knob(0.01, "weight of the load-balancing loss (default {default})")  # alpha

    @property
    def hidden(self) -> int:
        return self.d_hidden or 4 * self.d_model

    def as_dict(self):
        return asdict(self)

    def num_params(self) -> int:
        V, C, H, L, T, E = self.vocab, self.d_model, self.hidden, self.n_layers, self.seq_len, self.n_experts
        mlp = (C * H + H) + (H * C + C)
        ffn = C * E + E * mlp if E else mlp  # the router (no bias) and E MLPs
        block = 2 * 2 * C + 3 * C * C + (C * C + C) + ffn
        return V * C + T * C + L * block + 2 * C


class Layers(nn.Module):
    """Blocks by their global layer index ("3"), so names match the dense model's."""

    def __init__(self, blocks: dict):
        super().__init__()
        for i, b in blocks.items():
            setattr(self, str(i), b)


class GPTStage(nn.Module):
    """Some consecutive blocks, with the embedding first and/or ln_f + head last.

    forward(x): ids (B, T) on the first stage, else the previous stage's (B, T, C)
    [(B, T/p, C) sequence parallel]; returns the next stage's input, or on the last stage the
    logits (B, T, V/p). ``recompute`` applies to every block (``minipar.nn.recompute``).
    backward_input keeps each child's output gradient in ctx for backward_weight (the W of a
    zero-bubble schedule may run much later).

    ``compute``: None, or a 16-bit dtype (mixed precision, ``minipar.train.precision``) to which
    the stage rounds what it hands on: its output forward, its input gradient backward.
    """

    compute = None

    def _round(self, x):
        """``x`` in the compute dtype (a guard: the kernels of ``nn.functional`` keep their input's
        dtype, NumPy's bfloat16 too); unchanged outside mixed precision."""
        if self.compute is None or x is None or x.dtype == self.compute:
            return x
        return namespace(x).astype(x, self.compute)

    def __init__(self, blocks: dict, embed=None, pos=None, ln_f=None, head=None, recompute="none"):
        super().__init__()
        if recompute not in rc.MODES:
            raise ValueError(f"recompute={recompute!r}: choose one of {rc.MODES}")
        if embed is not None:
            self.embed, self.pos = embed, pos
            self.emb_drop = nn.Dropout(site="embed")  # GPT-2's embd_pdrop: the identity unless given a draw
        self.h = Layers(blocks)
        if head is not None:
            self.ln_f, self.head = ln_f, head
        self.recompute = recompute
        self.first, self.last = embed is not None, head is not None

    def blocks(self):
        return list(self.h.children().items())

    def forward(self, x):
        ctx = {}
        if self.first:
            x, ctx["embed"] = self.embed.forward(x)  # (B, T, C): wte[ids]
            x, ctx["pos"] = self.pos.forward(x)  # + wpe
            x, ctx["emb_drop"] = self.emb_drop.forward(x)  # (B, T, C)
        for name, blk in self.blocks():
            x, ctx[name] = rc.forward(blk, x, self.recompute)  # (B, T, C)
        if self.last:
            x, ctx["ln_f"] = self.ln_f.forward(x)
            x, ctx["head"] = self.head.forward(x)  # (B, T, V/p)
        return self._round(x), ctx

    def backward_input(self, dy, ctx):
        saved = ctx["dy"] = {}  # output gradient of every child, for backward_weight
        if self.last:
            saved["head"] = dy
            dy = self.head.backward_input(dy, ctx["head"])
            saved["ln_f"] = dy
            dy = self.ln_f.backward_input(dy, ctx["ln_f"])
        for name, blk in reversed(self.blocks()):
            saved[name] = dy
            dy = rc.backward_input(blk, dy, ctx[name], self.recompute)
        if self.first:
            dy = self.emb_drop.backward_input(dy, ctx["emb_drop"])
            saved["pos"] = dy
            dy = saved["embed"] = self.pos.backward_input(dy, ctx["pos"])
            dy = self.embed.backward_input(dy, ctx["embed"])  # None: ids have no gradient
        return self._round(dy)

    def backward(self, dy, ctx):
        """dx, and every weight gradient: a fused B action, one child at a time, input then weight
        backward, each child's ctx dropped as soon as it is used. So one block's backward tensors
        (and, under full recomputation, one rebuilt ctx) are alive at a time, where
        ``backward_input`` over the stage then ``backward_weight`` would keep every block's output
        gradient, and every rebuilt ctx, until the last block is done (what a split I/W needs).
        The gradients are added in the same order as the split's: bitwise the same."""
        if self.last:
            dy = self.head.backward(dy, ctx.pop("head"))  # (B, T, C)
            dy = self.ln_f.backward(dy, ctx.pop("ln_f"))
        for name, blk in reversed(self.blocks()):
            dy = rc.backward(blk, dy, ctx.pop(name), self.recompute)  # (B, T, C)
        if self.first:
            dy = self.emb_drop.backward_input(dy, ctx.pop("emb_drop"))
            dy = self.pos.backward(dy, ctx.pop("pos"))
            dy = self.embed.backward(dy, ctx.pop("embed"))  # None: ids have no gradient
        return self._round(dy)

    def backward_weight(self, dy, ctx):
        saved = ctx.pop("dy")
        if self.last:
            self.head.backward_weight(saved["head"], ctx["head"])
            self.ln_f.backward_weight(saved["ln_f"], ctx["ln_f"])
        for name, blk in reversed(self.blocks()):
            rc.backward_weight(blk, saved[name], ctx[name], self.recompute)
        if self.first:
            self.pos.backward_weight(saved["pos"], ctx["pos"])
            self.embed.backward_weight(saved["embed"], ctx["embed"])


def GPT(cfg: GPTConfig, seed: int = 0) -> GPTStage:
    """The dense GPT (float64 NumPy): one stage holding everything, head tied to the embedding.

    Every parameter is a seeded random draw (LayerNorm gains around 1, biases around 0, not
    exactly 1 and 0, so every gradient is exercised).

    The attention's qkv projection has no bias (as in PaLM and LLaMA). A key bias adds q.b_k to
    every score of a row, which the softmax ignores: its gradient is zero in exact arithmetic,
    and Adam, dividing by sqrt(v) + eps, would turn the rounding noise in it into updates of
    size lr * noise / eps, different on every grid.
    """
    rng = np.random.default_rng(seed)
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}")
    embed = nn.Embedding(cfg.vocab, cfg.d_model, rng)
    pos = nn.PositionEmbedding(cfg.seq_len, cfg.d_model, rng)
    blocks = {i: nn.Block(cfg.d_model, cfg.n_heads, rng, cfg.hidden) for i in range(cfg.n_layers)}
    for b in blocks.values():  # no qkv bias: the key's part has a gradient that is 0 in exact arithmetic
        del b.attn.qkv.params["b"], b.attn.qkv.grads["b"]
        if cfg.n_experts:
            b.mlp = MoE(cfg.d_model, cfg.hidden, cfg.n_experts, rng, k=cfg.top_k,
                        capacity_factor=cfg.capacity_factor, aux_weight=cfg.aux_weight)
    model = GPTStage(blocks, embed, pos, nn.LayerNorm(cfg.d_model), nn.LMHead(embed))
    for name, p in model.named_parameters():
        if name.endswith(("gamma",)):
            p[...] = 1.0 + 0.1 * rng.standard_normal(p.shape)
        elif name.endswith(("beta", ".b")):
            p[...] = 0.1 * rng.standard_normal(p.shape)
    return model


def dense_name(name: str) -> str:
    """The dense model's name of a stage parameter: the head's own copy of wte is embed.wte."""
    return "embed.wte" if name == "head.wte" else name


def is_expert(name: str) -> bool:
    """Whether a qualified name ("h.3.mlp.expert5.fc1.") is inside an expert of a MoE layer."""
    return ".expert" in name


def _replicated(dense):
    """A copy of a layer every TP rank holds whole (a LayerNorm, the position embedding)."""
    import copy

    return copy.deepcopy(dense)


def moe_layers(module):
    """Every mixture-of-experts layer inside ``module`` (its blocks' MLPs, when E > 0)."""
    if isinstance(module, MoE):
        return [module]
    return [m for child in module.children().values() for m in moe_layers(child)]


def cp_position_embedding(dense_pos, positions, tp):
    """The position embedding of a context-parallel rank: the rows of its positions."""
    return ContextParallelPositionEmbedding(dense_pos, positions, tp)


def place_dropout(stage: GPTStage, draw, seq_len: int, positions=None, tp=None, sequence_parallel=False):
    """Give every dropout site of ``stage`` the shared ``draw`` (``minipar.nn.dropout``) and the
    global indices of what it holds: the positions ``positions`` (a cp rank's zigzag chunks;
    None: all T) and, where the tensor is split over ``tp``, which part. The embedding's output
    (first stage) and the residual sites after the attention and after the MLP hold every column
    of my positions (only my TP rank's T/tp share of them with sequence parallelism); the MLP's
    hidden layer, inside the TP region, holds my positions and my TP rank's H/tp columns; the
    attention probabilities, inside it too, my TP rank's heads (the core says which queries and
    keys). A mixture of experts has no hidden site (its tokens are dispatched by the router, not
    held by global index). The dense GPT is one rank holding everything:
    ``place_dropout(gpt, draw, T)``."""
    pos = np.arange(seq_len) if positions is None else np.asarray(positions)
    t, p = (tp.rank, tp.size) if tp is not None else (0, 1)
    n = len(pos) // p
    residual = pos[t * n:(t + 1) * n] if sequence_parallel else pos  # my T/tp tokens under SP
    if stage.first:
        C = stage.pos.params["wpe"].shape[1]
        stage.emb_drop = nn.Dropout(draw, 0, "embed", (seq_len, C), residual)  # (b, T or T/tp, C)
    for name, blk in stage.blocks():
        i, C = int(name), blk.ln1.params["gamma"].shape[0]
        h = blk.attn.n_heads  # nh/tp
        blk.attn.drop = AttentionDropout(draw, i, np.arange(t * h, (t + 1) * h), seq_len)
        blk.attn_drop = nn.Dropout(draw, i, "attn", (seq_len, C), residual)
        blk.mlp_drop = nn.Dropout(draw, i, "mlp", (seq_len, C), residual)
        if isinstance(blk.mlp, nn.MLP):
            H = blk.mlp.fc1.params["w"].shape[1] * p  # the dense hidden width
            blk.mlp.drop = nn.Dropout(draw, i, "hidden", (seq_len, H), pos, cols=(t * H // p, (t + 1) * H // p))
    return stage


def build_stage(tp, dense: GPTStage, stage: int, n_stages: int, sequence_parallel=False,
                recompute="none", tied=None, cp=None, cp_attention="ring", ep=None, draw=None) -> GPTStage:
    """Stage ``stage`` of ``n_stages`` on the TP group ``tp``, sliced from the dense GPT.

    ``tied``: the first stage's VocabParallelEmbedding when it lives on this rank too (one
    pipeline rank); then the head uses it. Otherwise the last stage gets its own copy of its
    rows of wte, kept equal to the first stage's by summing their gradients.

    ``cp``: the context-parallel group. This rank then holds the positions
    ``SeqLayout(T, cp, "zigzag").positions(cp.rank)`` of every sequence; the attention core is
    ``cp_attention`` ("ring" or "ulysses") over cp on my heads, the position embedding adds the
    rows of my positions. ``ep``: the expert-parallel group over which a mixture-of-experts MLP
    is sharded (each rank holds E/ep experts; without it every rank holds all of them). ``draw``:
    dropout's shared ``minipar.nn.dropout.Draw`` (None: no dropout), placed by ``place_dropout``.
    """
    sp = sequence_parallel
    cfg_layers = len(dense.blocks())
    per = cfg_layers // n_stages
    seq_len = dense.pos.params["wpe"].shape[0]  # T (the dense model holds every part)
    blocks = {}
    for i in range(stage * per, (stage + 1) * per):
        blk = dense.h.children()[str(i)]
        attn = mlp = None
        if cp is not None:
            attn = ContextParallelSelfAttention(cp, blk.attn, seq_len, cp_attention, tp=tp, sequence_parallel=sp)
        if isinstance(blk.mlp, MoE):
            mlp = ExpertParallelMoE(ep, blk.mlp) if ep is not None else _replicated(blk.mlp)
        blocks[i] = ParallelBlock(tp, blk, sequence_parallel=sp, attn=attn, mlp=mlp)
    embed = pos = ln_f = head = None
    if stage == 0:
        embed = VocabParallelEmbedding(tp, dense.embed, sequence_parallel=sp)
        if cp is not None:
            pos = cp_position_embedding(dense.pos, SeqLayout(seq_len, cp.size).positions(cp.rank), tp if sp else None)
        else:
            pos = SequenceParallelPositionEmbedding(tp, dense.pos) if sp else _replicated(dense.pos)
    if stage == n_stages - 1:
        ln_f = SequenceParallelLayerNorm(tp, dense.ln_f) if sp else _replicated(dense.ln_f)
        tied = embed if embed is not None else tied
        head = (VocabParallelHead(tp, tied=tied, sequence_parallel=sp) if tied is not None
                else VocabParallelHead(tp, dense=dense.embed, sequence_parallel=sp))
    out = GPTStage(blocks, embed, pos, ln_f, head, recompute)
    if draw is not None:
        place_dropout(out, draw, seq_len, SeqLayout(seq_len, cp.size).positions(cp.rank) if cp is not None else None,
                      tp, sp)
    return out
