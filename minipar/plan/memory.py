"""Memory per GPU: model states (ZeRO's formulas) + activations (Korthikanti et al. 2022).

    mem = memory(prob, cfgs)          # dict of arrays: params, grads, optimizer, activations, total, host

Model states come from ``minipar.memory.zero_bytes`` (the calculator of lesson 04) for the
parameters the worst pipeline rank holds: its blocks (split by tp), and the embedding on the
first rank, the output layer (the tied LM head's copy, or an untied model's own V x h) and the
final norm on the last. ZeRO shards over the dp x cp
ranks that hold the same weights.

Activations of one block for one micro-batch of b sequences come from the table of the model's
block type (``minipar.activations``, ``ModelSpec.saves``). Megatron's (Korthikanti et al. 2022,
sec. 4, in bytes, e = bytes per element, masks 1 byte per element when there is dropout):

    attention   Q, K, V, QKV input, projection input  5e sbh,  softmax output e as^2 b
                (+ dropout: mask sbh after the projection, mask as^2 b + dropout output e as^2 b)
    MLP         fc1 input e sbh, GeLU input and fc2 input 2e sb ffn   (+ dropout mask sbh)
    LayerNorms  2e sbh

which is sbh (34 + 5as/h) for e = 2 with dropout. Today's blocks (``megatron_block``'s q, kv,
mlp, copies): grouped-query attention keeps K and V kv_heads x head_dim wide; SwiGLU keeps gate
and up and the product, 3e sb ffn; a mixture of experts keeps one MLP's tensors per expert a
token visits (top_k + shared), the router's logits and the permutation's indices not counted. Tensor parallelism splits all but the
LayerNorm inputs, the inputs of QKV and fc1 and the masks (10 sbh: eq. 2, sbh (10 + 24/t +
5as/ht)); sequence parallelism splits those too (sbh/t (34 + 5as/h)). Selective recomputation
drops the as^2 b terms; full recomputation keeps only each block's input (e sbh, / t with
sequence parallelism) and rebuilds one block's activations at a time in the backward. Context
parallelism divides everything by cp (each rank holds s/cp queries).

minipar's own layers (``ModelSpec(saves="minipar")``, lesson 05's GPT) keep a little more: each
LayerNorm its normalized input and 1/std, s b (h + 1); the GeLU its tanh beside its input (3e sb
ffn for the MLP); with sequence parallelism the gathered QKV and fc1 inputs, whole (2e sbh on
every TP rank); with context parallelism the attention core's output and log-sum-exp instead of
the probabilities. The first stage keeps the int64 token ids, the last the final LayerNorm's,
the head's input and the logits' gradient. The trainer counts the same table against its arrays
(``minipar.train.accounting``), and the planner's bytes equal its count (lesson 07's checks,
``minipar bench plan``).

A rank keeps the activations of every micro-batch in flight. How many is the schedule's
business: lesson 03's generators state it per rank (``Schedule.inflight_limit``), and we read it
there, for the first rank (it holds the most, and the embedding) and the last (the LM head and
its fp32 logits). The embedding's tensors (its dropout mask, the token ids) belong to the first
stage only: with v chunks per rank, only that stage's micro-batches in flight keep them (pp = 8,
v = 2: at most 16 of the 23), and the LM head's only the last stage's.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..activations import SCORES, block_input, megatron_block, megatron_ends, minipar_block, minipar_ends
from ..memory import zero_bytes
from ..pipeline.schedules import make_schedule
from .config import DEEPSPEED_MAX_LIVE, DEEPSPEED_REDUCE_BUCKET, Configs, Problem, layers_per_rank, microbatch_size

GB = 1e9


def block_tensors(prob: Problem, b, tp, cp, sp) -> dict:
    """{tensor: bytes} one block of the model keeps per micro-batch on one rank, no recomputation."""
    m, e = prob.model, prob.hw.dtype_bytes
    if m.saves == "minipar":
        return minipar_block(b, m.seq, m.hidden, m.f, m.heads, tp, cp, sp, e)
    copies = m.top_k + m.shared_experts if m.experts else 1  # the MLPs a token visits
    return megatron_block(b, m.seq, m.hidden, m.ef if m.experts else m.f, m.heads, tp, cp, sp, e, m.dropout,
                          q=m.heads * m.d, kv=m.kv * m.d, mlp=m.mlp, copies=copies)


def layer_activations(prob: Problem, b, tp, cp, sp):
    """(all, scores) bytes of one block's activations for one micro-batch, no recomputation:
    ``all`` is what the forward leaves for the backward, ``scores`` its as^2 b part (per rank)."""
    tensors = block_tensors(prob, b, tp, cp, sp)
    return sum(tensors.values()), sum(tensors.get(k, 0) for k in SCORES[prob.model.saves])  # no mask without dropout


def stored_activations(prob: Problem, b, tp, cp, sp, recompute):
    """Bytes of one block's activations kept per micro-batch in flight."""
    full, scores = layer_activations(prob, b, tp, cp, sp)
    kept_input = block_input(b, prob.model.seq, prob.model.hidden, tp, cp, sp, prob.hw.dtype_bytes)
    return np.select([recompute == "none", recompute == "selective"], [full, full - scores], kept_input)


@lru_cache(maxsize=None)
def _limits(schedule: str, pp: int, nmb: int, chunks: int) -> tuple:
    """(limit per rank, (first rank's stage-0 micro-batches, last rank's last-stage ones): the
    most of them held while the rank holds its limit)."""
    s = make_schedule(schedule, pp, nmb, chunks)
    ends = []
    for rank, stage in ((0, 0), (pp - 1, pp * chunks - 1)):
        held, most = set(), 0
        for a in s.actions[rank]:
            (held.add if a.kind == "F" else held.discard)((a.stage, a.microbatch))
            if len(held) == s.inflight_limit[rank]:
                most = max(most, sum(1 for st, _ in held if st == stage))
        ends.append(most)
    return s.inflight_limit, tuple(ends)


def inflight(schedule: str, pp: int, nmb: int, chunks: int) -> tuple[int, int, int, int]:
    """(first rank, last rank) activations in flight, as lesson 03's generator bounds them, and
    how many of them are the first stage's (which alone keeps the embedding's tensors) and the last
    stage's (the LM head's) at that peak: with v chunks per rank only some are.

    The 1F1B and interleaved bounds stop growing once there are more micro-batches than the
    warm-up takes; we ask the generator for min(nmb, 2 pp) micro-batches and for all of them only
    when the answer is capped by the number asked (GPipe: always)."""
    probe = min(nmb, 2 * pp)
    limit, ends = _limits(schedule, pp, probe, chunks)
    if probe < nmb and max(limit) >= probe * chunks:
        limit, ends = _limits(schedule, pp, nmb, chunks)
    return limit[0], limit[-1], ends[0], ends[1]


def inflight_columns(prob: Problem, cfg: Configs):
    """In-flight counts per configuration (``inflight``'s four columns), one generator call per
    distinct (schedule, pp, nmb, v)."""
    keys = list(zip(cfg.schedule.tolist(), cfg.pp.tolist(), cfg.microbatches.tolist(), cfg.chunks.tolist()))
    table = {k: inflight(*k) for k in set(keys)}
    return tuple(np.array([table[k][j] for k in keys]) for j in range(4))


def rank_params(prob: Problem, cfg: Configs):
    """(first rank, last rank, one block) parameters held, after tp splits them and ep the
    routed experts (``expert_rank_params`` is their part of it)."""
    m = prob.model
    split, rep = m.layer_params()
    e_split, e_rep = m.expert_params()
    block = (split - e_split) / cfg.tp + rep - e_rep + (e_split / cfg.tp + e_rep) / cfg.ep
    emb, pos = m.embedding_params()
    blocks = layers_per_rank(prob, cfg.pp) * block
    norm, head = m.final_norm_params(), m.head_params()
    first = blocks + emb / cfg.tp + pos
    # the last rank: its output layer (the tied LM head's copy of the embedding when pp > 1), final norm
    out_layer = head / cfg.tp if head else np.where(cfg.pp > 1, emb / cfg.tp, 0)
    last = blocks + out_layer + norm
    first = np.where(cfg.pp == 1, first + norm + head / cfg.tp, first)
    return first, last, block


def expert_rank_params(prob: Problem, cfg: Configs):
    """The routed experts' parameters on every pipeline rank (its blocks' share after tp and ep):
    their data-parallel group is the dp x cp / ep ranks that hold the same experts."""
    e_split, e_rep = prob.model.expert_params()
    return layers_per_rank(prob, cfg.pp) * (e_split / cfg.tp + e_rep) / cfg.ep


def live_params(prob: Problem, block, largest):
    """(gathered, unit_grad): parameters ZeRO-3 holds whole beside its shards, and gradient
    elements ZeRO-2/3 holds whole while reducing them, by engine (``config.ENGINES``). FSDP (and
    minipar's engine): the block computing and the one prefetched, the block's gradients.
    DeepSpeed: at most stage3_max_live_parameters, but at least the module computing (``largest``,
    its largest Linear on this rank); gradients a reduce bucket at a time."""
    if prob.engine == "deepspeed":
        return (np.maximum(largest, np.minimum(DEEPSPEED_MAX_LIVE, 2 * block)),
                np.maximum(largest, np.minimum(DEEPSPEED_REDUCE_BUCKET, block)))
    return 2 * block, block


def states(prob: Problem, psi, n, zero, block, extras=True, largest=0):
    """Model-state bytes per rank (zero_bytes' keys), one ZeRO stage at a time over the columns.
    ``extras``: what ZeRO-3 holds gathered and ZeRO-2/3 holds of the gradients being reduced
    (``live_params``: the block it computes plus the one it prefetches, and the block's
    gradients, as minipar's engine and FSDP hold them at their peak)."""
    bp, bg, k = prob.bytes_per_param()
    out = {key: np.zeros(np.shape(psi)) for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "host_bytes")}
    gathered, unit_grad = (np.broadcast_to(a, np.shape(psi)) for a in live_params(prob, block, largest))
    for stage in (0, 1, 2, 3):
        sel = zero == stage
        if not np.any(sel):
            continue
        r = zero_bytes(psi[sel], n[sel], stage, bp, bg, k, prob.offload,
                       gathered=(gathered[sel] if extras and stage == 3 else 0),
                       unit_grad=(unit_grad[sel] if extras and stage >= 2 else 0))
        for key in out:
            out[key][sel] = r.get(key, 0)
    return out


def memory(prob: Problem, cfg: Configs) -> dict:
    """Bytes per GPU on the worst pipeline rank (first or last), with its breakdown; ``first`` and
    ``last`` hold each end's. ``transient``: the part of ``activations`` that exists only inside a
    backward (the block full recomputation rebuilds), which a count taken between pipeline
    actions (lesson 05's trainer) does not see."""
    m, hw = prob.model, prob.hw
    b, tp, cp, sp = microbatch_size(prob, cfg), cfg.tp, cfg.cp, cfg.sequence_parallel
    v = cfg.chunks
    per_chunk = layers_per_rank(prob, cfg.pp) / v
    stored = stored_activations(prob, b, tp, cp, sp, cfg.recompute)
    full, _ = layer_activations(prob, b, tp, cp, sp)
    working = np.where(cfg.recompute == "full", full, 0)  # one block rebuilt in the backward
    fl, ll, f_end, l_end = inflight_columns(prob, cfg)  # the ends' tensors: only their own stage's micro-batches
    ends = (minipar_ends(b, m.seq, m.hidden, m.vocab, tp, cp, sp, hw.dtype_bytes) if m.saves == "minipar" else
            megatron_ends(b, m.seq, m.hidden, m.vocab, tp, cp, sp, hw.dtype_bytes, m.dropout,
                          logit_bytes=4 if hw.mixed_precision else hw.dtype_bytes))  # fp32 cross-entropy
    first_extra, last_extra = (sum(end.values()) for end in ends)
    act_first = fl * per_chunk * stored + f_end * first_extra + working
    act_last = ll * per_chunk * stored + l_end * last_extra + working
    act_first = np.where(cfg.pp == 1, act_first + fl * last_extra, act_first)
    act_last = np.where(cfg.pp == 1, act_first, act_last)  # one pipeline rank: both ends are it

    psi_first, psi_last, block = rank_params(prob, cfg)
    psi_last = np.where(cfg.pp == 1, psi_first, psi_last)
    n = cfg.dp * cfg.cp
    out = {}
    experts = expert_rank_params(prob, cfg)
    for name, psi, act in (("first", psi_first, act_first), ("last", psi_last, act_last)):
        s = states(prob, psi - experts, n, cfg.zero, block, largest=prob.model.largest_linear() / cfg.tp)
        if prob.model.experts:  # the experts' states, sharded by ZeRO over their own dp group
            es = states(prob, experts, n // cfg.ep, cfg.zero, block, extras=False)
            s = {k: s[k] + es[k] for k in s}
        tot = s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"] + act
        out[name] = dict(params=s["params_bytes"], grads=s["grads_bytes"], optimizer=s["optimizer_bytes"],
                         activations=act, total=tot, host=s["host_bytes"], psi=psi, transient=working)
    worst_first = out["first"]["total"] >= out["last"]["total"]
    res = {k: np.where(worst_first, out["first"][k], out["last"][k]) for k in out["first"]}
    res["psi_first"], res["psi_last"], res["block"] = psi_first, psi_last, block
    res["first"], res["last"] = out["first"], out["last"]  # each end of the pipeline (the same rank when pp = 1)
    res["fits"] = res["total"] <= prob.capacity
    return res
