"""Planted bugs: each one a plausible mistake of 3D parallelism, each caught by a named check.

    with planted("tied_not_summed"):
        ...   # train: the check "tied embedding bitwise equal on the first and last stage" fails

    tied_not_summed        the tied embedding's gradient is not summed across the first and last
                           stage: the two copies drift apart (losses, parameters, tied copies)
    dp_sync_per_microbatch gradients averaged over DP after every micro-batch's backward, not
                           once after the flush: the numbers barely change (averaging is
                           linear), the traffic is m+1 times the formula ("dp bytes per step")
    local_max              the vocab-parallel softmax shifts by each rank's own max: the partial
                           sums of exps are in different units (losses)
    dp_wrong_axis          the DP group built along the TP axis: shards of different matrices
                           averaged together (losses, parameters, replicas)
    selective_keeps_probs  selective recomputation that forgets to drop the attention
                           probabilities: the same numbers, more memory ("activation bytes")
    local_argmax           greedy decoding that takes each rank's own best column as the next
                           token: tokens differ between TP sizes ("identical at TP = 1, 2, 4")
    cp_grads_not_summed    gradients averaged over dp only, not over dp x cp: each cp rank steps
                           with the gradient of its own positions (losses, replicas)
    cp_position_offset     the dense position embedding on a cp rank's rows: positions
                           0 ... T/cp-1 on every rank instead of its zigzag chunks (losses)
    cp_gathered_kv         skips the ring: all-gather every K and V, attend to the whole sequence
                           at once, reduce-scatter dK and dV (the same losses; "activation bytes",
                           "cp bytes per step")
    experts_averaged       expert gradients averaged over the ep (dp) ranks, which hold different
                           experts: each expert steps with the others' gradients mixed in (losses)
    experts_everywhere     every rank holds every expert, no dispatch (the expert count)
    recompute_counted      the forward that full recomputation runs again inside the backward is
                           counted in the report: tokens per expert and aux loss twice over

Clipping by the global gradient norm (``clip``), which must count every parameter once:

    clip_replicated_per_tp parameters whole on every TP rank (LayerNorms, row-parallel biases,
                           wpe) counted on each of them: tp times (gradient norm, losses)
    clip_tied_twice        the tied embedding counted on the first and on the last stage
    clip_every_replica     DDP's averaged gradient counted on every dp replica: dp times
    clip_skipped_on_one_rank  the last rank computes the norm but steps unclipped: its weights
                           drift from the others' (losses, parameters, replicas)
    clip_pp_sum_missing    the sum of squares added over tp and dp but not over pp: every stage
                           clips by its own layers' norm (gradient norm, losses, parameters)
    clip_before_dp_average each replica clips its own gradient by its own norm, then DDP averages:
                           the norm of a replica, not of the average (gradient norm, losses)
    clip_zero_shards_not_summed  ZeRO-1/2/3: each rank's norm from its own gradient shard, the
                           sum over the dp x cp ranks, whose shards the others are, missing: every
                           shard clipped by another factor (gradient norm, losses, parameters)
    clip_inf_summed        ``clip_norm_type`` inf: each rank's largest |element| added over the
                           ranks instead of the max taken (gradient norm, losses, parameters)

Dropout (``dropout``), whose masks must be one process's on every grid:

    dropout_shared_in_tp   Megatron's RNG tracker with one seed inside the TP region: every TP rank
                           draws the mask of TP rank 0's columns for its own shard of the MLP's
                           hidden layer (losses; the masks: shards identical across TP ranks)
    dropout_per_rank_seed  each rank seeds its own generator (seed + world rank) and draws for its
                           local indices: the masks change with the grid (losses)
    dropout_replay_redraws the forward that full recomputation runs inside B draws at the
                           micro-batch the generator is at now (the last F's), not its own F's:
                           torch.utils.checkpoint's preserve_rng_state guards this; the same
                           for what selective recomputation and ring attention's backward draw
                           again, the attention probabilities' masks (losses)
    dropout_probs_local_head  the attention probabilities' mask drawn at the head's index on its
                           TP rank (0 ... nh/tp - 1 on every rank): the shared seed's bug inside
                           the attention (losses)
    dropout_probs_local_key   ... drawn at the key's index in the block at hand (ring attention:
                           0 ... c-1 in every chunk; Ulysses: the all-to-all's order) (losses)
    dropout_embed_per_rank the embedding's dropout drawn by a generator seeded with the world
                           rank at the rank's local indices (losses)

Mixed precision (``precision`` fp16), whose overflow must make every rank skip the step:

    overflow_seen_locally  the found-inf flag is not all-reduced over the world: a rank skips a
                           step only when its own gradients overflowed, its tp, pp and dp peers
                           step ("every rank skipped", weights, replicas)
    main_grad_16_bit       (bf16, fp16) the gradients accumulated and reduced in the 16-bit dtype,
                           not float32: small micro-batch gradients round away (the gradient
                           dtype, and the bytes per parameter against the planner's table)
    activation_in_float32  (bf16, fp16) every LayerNorm keeps its normalized input xhat in float32,
                           as a kernel that promotes a 16-bit input does: 2 more bytes an element
                           held to the backward ("activation bytes at the peak")
    loss_in_compute_dtype  (bf16, fp16) the cross-entropy on the 16-bit logits, not on a float32
                           copy: its two all-reduces over tp in 2 bytes an element, not 4 ("tp
                           bytes per step"; and the softmax loses its small probabilities)

ZeRO-2/3 (``zero``), whose gradients are reduce-scattered once per step, after the flush:

    zero_reduce_per_microbatch  each micro-batch's gradient reduce-scattered as its backward ends
                           and added into the shards (DeepSpeed's ZeRO-2 under gradient
                           accumulation): the same average up to rounding, m+1 reduce-scatters a
                           step ("dp bytes per step", "bitwise ZeRO-1's")
    zero3_context_keeps_weights  ``--reshard`` frees a stage's gathered weights after an action
                           but leaves them in the micro-batch's forward context: they stay alive
                           until its backward ("activation bytes", the ledger = ``zero_bytes``)

They patch the library inside the rank that runs them (tests and the lab's grader use them).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from ..collectives import all_gather, all_reduce, reduce_scatter
from ..optim import clip_scale
from ..xp import contiguous, dtype_named, like_kind, namespace, to_numpy

MUTANTS = ("tied_not_summed", "dp_sync_per_microbatch", "local_max", "dp_wrong_axis", "selective_keeps_probs",
           "local_argmax", "cp_grads_not_summed", "cp_position_offset", "cp_gathered_kv", "experts_averaged",
           "experts_everywhere", "recompute_counted", "clip_replicated_per_tp", "clip_tied_twice",
           "clip_every_replica", "clip_skipped_on_one_rank", "clip_pp_sum_missing", "clip_before_dp_average",
           "clip_zero_shards_not_summed", "clip_inf_summed", "dropout_shared_in_tp", "dropout_per_rank_seed",
           "dropout_replay_redraws", "dropout_probs_local_head", "dropout_probs_local_key",
           "dropout_embed_per_rank", "overflow_seen_locally", "main_grad_16_bit",
           "activation_in_float32", "loss_in_compute_dtype", "zero_reduce_per_microbatch",
           "zero3_context_keeps_weights")


@contextlib.contextmanager
def planted(name):
    """Patch the bug ``name`` in (None: no bug) for the duration of the block."""
    if name is None:
        yield
        return
    if name not in MUTANTS:
        raise ValueError(f"no mutant {name!r}; choose one of {MUTANTS}")
    from .. import grid
    from .. import nn as layers
    from ..context_parallel import layer
    from ..data_parallel import ddp
    from ..nn import recompute
    from ..tensor_parallel import vocab
    from . import generate, model, parallelize, trainer

    saved = []

    def patch(obj, attr, value):
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    if name == "tied_not_summed":
        patch(trainer.Trainer, "sync_tied", lambda self: None)
    elif name == "dp_sync_per_microbatch":
        original = trainer.Trainer.sample

        def sample(self, action, held):
            original(self, action, held)
            if action.kind in "BW":
                for e in self.engines:
                    e.sync_grads()

        patch(trainer.Trainer, "sample", sample)
    elif name == "local_max":
        patch(vocab, "global_max", lambda comm, m: m)
    elif name == "selective_keeps_probs":
        patch(recompute, "drop_probs", lambda ctx: ctx)
    elif name == "local_argmax":
        def greedy_token(comm, logits, lo):
            xp = namespace(logits)
            return xp.astype(xp.argmax(logits, axis=-1), xp.int64) + lo

        patch(generate, "greedy_token", greedy_token)
    elif name == "dp_wrong_axis":
        right = grid.axis_color
        patch(grid, "axis_color", lambda shape, coords, axis: right(shape, coords, "tp" if axis == "dp" else axis))
    elif name == "cp_grads_not_summed":
        right = grid.axis_color
        patch(grid, "axis_color", lambda shape, coords, axis: right(shape, coords, "dp" if axis == "dp+cp" else axis))
    elif name == "cp_position_offset":
        patch(model, "cp_position_embedding", lambda dense_pos, positions, tp: model._replicated(dense_pos))
    elif name == "cp_gathered_kv":
        patch(layer, "METHODS", dict(layer.METHODS, ring=(gathered_forward, gathered_backward)))
    elif name == "experts_averaged":
        def sync_experts(self):
            for _, g in self.experts.named_grads():
                g[...] = all_reduce(self.ep, g) / self.ep.size

        patch(trainer.Trainer, "sync_experts", sync_experts)
    elif name == "experts_everywhere":
        build = model.build_stage
        patch(parallelize, "build_stage", lambda *a, ep=None, **kw: build(*a, ep=None, **kw))
    elif name == "recompute_counted":
        original = trainer.Trainer.sample
        patch(trainer.Trainer, "sample", lambda self, action, held: original(self, action._replace(kind="F"), held))
    elif name == "clip_replicated_per_tp":
        patch(trainer.Trainer, "counted_here", lambda self, module, name: module is not self.tied_copy)
    elif name == "clip_tied_twice":
        patch(trainer.Trainer, "counted_here",
              lambda self, module, name: name in module.sharded or self.grid.coords[2] == 0)
    elif name == "clip_every_replica":
        def grad_pieces(self):  # every replica answers for the whole average
            return [(mod, n, G[a:b]) for _, flat, _, G, _ in self.buckets for mod, n, _, a, b in flat.slots]

        patch(ddp.DDP, "grad_pieces", grad_pieces)
    elif name == "clip_skipped_on_one_rank":
        original = trainer.Trainer.scale_grads
        patch(trainer.Trainer, "scale_grads",
              lambda self, scale: None if self.comm.rank == self.comm.size - 1 else original(self, scale))
    elif name == "clip_pp_sum_missing":
        patch(trainer.Trainer, "grad_norm", lambda self: norm_within(self, self.grid.coords[1], self.cfg.pp))
    elif name == "clip_before_dp_average":
        sync = trainer.Trainer.sync_dp

        def clip_then_sync(self):
            with planted("clip_every_replica"):  # before the average, every replica's gradient is its own
                self._norm = norm_within(self, replica(self), self.cfg.dp * self.cfg.cp)
            self.scale_grads(clip_scale(self._norm, self.cfg.clip))
            sync(self)

        patch(trainer.Trainer, "sync_dp", clip_then_sync)
        patch(trainer.Trainer, "clip_grads", lambda self: self._norm)
    elif name == "clip_zero_shards_not_summed":
        patch(trainer.Trainer, "grad_norm", lambda self: norm_within(self, replica(self), self.cfg.dp * self.cfg.cp))
    elif name == "clip_inf_summed":
        patch(trainer.Trainer, "grad_norm", lambda self: float(to_numpy(all_reduce(
            self.comm, self.comm.asarray(np.array([self.largest_here()]))))[0]))
    elif name == "dropout_shared_in_tp":
        def mask(self, like):  # my shard's mask drawn at columns 0 ... hi-lo: TP rank 0's, on every TP rank
            cols = None if self.cols is None else (0, self.cols[1] - self.cols[0])
            return like_kind(self.draw.keep(self.layer, self.site, self.shape, self.positions, cols), like)

        patch(layers.Dropout, "mask", mask)
    elif name == "dropout_per_rank_seed":
        patch(layers.Dropout, "mask", per_rank_mask)
    elif name in ("dropout_probs_local_head", "dropout_probs_local_key"):
        from ..nn.dropout import AttentionDropout

        if name == "dropout_probs_local_head":
            patch(AttentionDropout, "global_heads",
                  lambda self, heads=None: np.arange(len(self.heads))[slice(None) if heads is None else heads])
        else:
            keep = AttentionDropout.keep
            patch(AttentionDropout, "keep",
                  lambda self, like, q_pos, k_pos, heads=None: keep(self, like, q_pos, np.arange(len(k_pos)), heads))
    elif name == "dropout_embed_per_rank":
        mask = layers.Dropout.mask
        patch(layers.Dropout, "mask", lambda self, like: per_rank_mask(self, like) if self.site == "embed"
              else mask(self, like))
    elif name == "dropout_replay_redraws":
        original = trainer.Trainer.before
        patch(trainer.Trainer, "before", lambda self, action: original(self, action) if action.kind == "F" else None)
    elif name == "overflow_seen_locally":
        from .precision import nonfinite

        patch(trainer.Trainer, "found_inf", lambda self: nonfinite(self.grads()))
    elif name == "main_grad_16_bit":
        from ..data_parallel import engine

        init = engine.Engine.__init__
        patch(engine.Engine, "__init__", lambda self, *a, main_grad=False, **kw: init(self, *a, main_grad=False, **kw))
    elif name == "activation_in_float32":
        from ..nn import functional

        layernorm = functional.layernorm_forward

        def layernorm_forward(x, gamma, beta, eps=1e-5):
            y, (xhat, rstd, g) = layernorm(x, gamma, beta, eps)
            wide = namespace(x).astype(xhat, dtype_named("float32", x)) if x.dtype.itemsize == 2 else xhat
            return y, (wide, rstd, g)

        patch(functional, "layernorm_forward", layernorm_forward)
    elif name == "loss_in_compute_dtype":
        patch(trainer, "loss_in_master", lambda loss, logits, labels, pol, scale=1.0: loss_scaled(loss(logits, labels), scale))
    elif name == "zero_reduce_per_microbatch":
        from ..zero import ZeRO2

        original, zero_grad = trainer.Trainer.sample, ZeRO2.zero_grad

        def sample(self, action, held):
            original(self, action, held)
            if action.kind in "BW":  # this micro-batch's gradient: into the shards now, the buffers zeroed
                for e in self.engines:
                    for u, full in getattr(e, "full_grads", {}).items() if self.plan.zero >= 2 else ():
                        e.grad_shards[u] += reduce_scatter(e.comm, full) / e.comm.size
                        full[...] = 0

        def zero_grads_and_shards(self):
            zero_grad(self)
            for shard in self.grad_shards.values():
                shard[...] = 0

        patch(trainer.Trainer, "sample", sample)
        patch(ZeRO2, "zero_grad", zero_grads_and_shards)
        patch(ZeRO2, "close_grad", lambda self, u: (self.ledger.sample(), self.full_grads.pop(u),
                                                    self.flats[u].unbind("grads")))  # (zeros left: nothing to add)
    elif name == "zero3_context_keeps_weights":
        def reshard_after(self, action, held):
            self._ctxs = held["ctx"]
            for e in self.zero3:
                e.free_group(action.stage)  # freed here, but the context still holds the weights

        patch(trainer.Trainer, "reshard_after", reshard_after)
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def loss_scaled(value_and_grad, scale):
    """(loss, its gradient times ``scale``), in the gradient's dtype."""
    from ..nn.functional import kept

    value, d = value_and_grad
    return value, kept(d * scale, d)


def replica(tr) -> int:
    """The index of the rank's dp x cp replica (0 ... dp*cp - 1): the ranks of one model copy share it."""
    return tr.grid.coords[0] * tr.cfg.cp + tr.grid.cp_rank


def norm_within(tr, key: int, n: int) -> float:
    """sqrt of the sum of ``tr.squares_here()`` over the ranks whose ``key`` (0 ... n-1) is this
    rank's only: one all-reduce over the world of an n-vector, each rank's sum in its key's slot."""
    v = np.zeros(n)
    v[key] = tr.squares_here()
    return math.sqrt(float(to_numpy(all_reduce(tr.comm, tr.comm.asarray(v)))[key]))


def _positions_first(x):  # (B, nh, t, hs) -> (t, B, nh, hs), contiguous: all_gather works on axis 0
    return contiguous(namespace(x).permute_dims(x, (2, 0, 1, 3)))


def gathered_forward(comm, q, k, v, layout, causal=True, drop=None):
    """All-gather every rank's K and V and attend to the whole sequence at once (no ring)."""
    from ..context_parallel.blocks import allowed, block_attention, finish

    xp = namespace(q)
    everyone = np.concatenate([layout.positions(j) for j in range(comm.size)])
    kv = all_gather(comm, xp.stack([_positions_first(k), _positions_first(v)], axis=1))  # (T, 2, B, nh, hs)
    K, V = (xp.permute_dims(kv[:, i], (1, 2, 0, 3)) for i in (0, 1))  # (B, nh, T, hs)
    mask = allowed(layout.positions(comm.rank), everyone, layout.T, causal)
    keep = None if drop is None else drop.keep(q, layout.positions(comm.rank), everyone)
    out, lse = finish(block_attention(q, K, V, mask, keep=keep, rate=drop.rate if drop else 0.0))
    return out, (q, K, V, out, lse, mask, keep, drop.rate if drop else 0.0)


def gathered_backward(comm, dout, ctx):
    from ..context_parallel.blocks import block_attention_backward, row_delta

    q, K, V, out, lse, mask, keep, rate = ctx
    xp = namespace(q)
    dq, dK, dV = block_attention_backward(q, K, V, dout, lse, row_delta(dout, out), mask, keep=keep, rate=rate)
    mine = reduce_scatter(comm, xp.stack([_positions_first(dK), _positions_first(dV)], axis=1))  # (t, 2, B, nh, hs)
    dk, dv = (xp.permute_dims(mine[:, i], (1, 2, 0, 3)) for i in (0, 1))
    return dq, dk, dv


def per_rank_mask(self, like):
    """A mask from a generator seeded by the world rank, over the indices this rank holds (local
    rows, positions, columns): what a per-rank seed gives, one process's only on one rank."""
    from mpi4py import MPI

    seed = self.draw.seed + MPI.COMM_WORLD.Get_rank()
    key = np.random.SeedSequence([seed, self.draw.step, self.layer]).generate_state(2, np.uint64)
    t = len(self.positions) if self.positions is not None else self.shape[0]
    d = self.cols[1] - self.cols[0] if self.cols is not None else self.shape[1]
    u = np.random.Generator(np.random.Philox(key=key)).random((len(self.draw.rows), t, d))
    return like_kind(u >= self.draw.p, like)
