"""What a rank holds and sends in one step, as formulas the measured runs must equal to the byte.

    activation_peak(cfg, coords)   bytes of activations held between pipeline actions, at the peak
    comm_bytes(cfg, coords)        bytes sent per step, by group: {"tp", "pp", "dp", "emb", "cp"}
    held_bytes(held), measured_comm(events, rank)   what a run measures, to compare with them

Notation (docs/train.md): b micro-batch rows, T tokens of a rank (the sequence length over cp),
C width, H MLP width, a heads, V vocab, t = tp, Ts = T/t with sequence parallelism (else T),
e bytes per element of the compute dtype (8, 4, or 2 in bf16 and fp16), f of the master dtype
(8 in fp64, else 4), m micro-batches.

In 16 bits (``--precision bf16 | fp16``) every activation kept and everything sent over tp, pp and
cp is 16-bit (e = 2), as Megatron keeps them; three things are float32 (f = 4), as Megatron keeps
them too:

    the cross-entropy's two all-reduces over tp    the logits are cast to float32 before the
        (the row maxima (b, T), then [sum exp,       vocab-parallel softmax (16-bit logits would
        label logit] (2, b, T))                      lose the small probabilities), so its sums are
    the dp reductions (DDP's all-reduce, ZeRO's    the gradients are float32 main_grad: every
        reduce-scatter) and the tied embedding's     micro-batch's gradient is added into float32,
        sum over emb                                 and reduced from there
    (the weights ZeRO all-gathers are the 16-bit copies: e.)

Where minipar differs from Megatron in 16 bits, and the formula follows minipar: with sequence
parallelism the LayerNorms' weight gradients are all-reduced over tp inside each backward, in the
compute dtype (e), where Megatron all-reduces their float32 main_grad once per step; and the cp
attention core keeps its log-sum-exp in the compute dtype, where flash attention keeps it float32.
The logits' gradient is kept in the compute dtype (cast back after the float32 softmax). NumPy's
bfloat16 (ml_dtypes) promotes a matmul and any op with a Python float to float32; the kernels of
``minipar.nn.functional`` return their input's dtype (``kept``), as a 16-bit GPU kernel computes in
float32 registers and writes 16 bits: otherwise the bf16 run held float32 activations and
all-reduced float32 over tp, twice these bytes, which no real engine does.

Activations are counted per memory block (a view and its base once), as ``Trainer.sample``
counts them: the forward contexts the executor keeps, and the output gradients it keeps for W.
What one block keeps is ``minipar.activations.minipar_block`` (the table the planner reads too).
A (stage, micro-batch) holds A bytes from its F to its B; with the backward split (zb-h1) it
holds A + G from its I to its W (G: the output gradients saved for the weight gradients). The
peak is the largest sum over the rank's action list: per saved tensor, times the schedule's
in-flight count.
"""
from __future__ import annotations

from ..activations import block_input, drop_scores, minipar_block, minipar_ends
from ..xp import storage
from ..mixed_precision import BYTES as WORKING_BYTES  # noqa: F401 (bytes of an element of each dtype, re-exported)
from .parallelize import parallelize


def master_bytes(cfg) -> int:
    """Bytes of an element kept in the master dtype: 8 in float64, else 4 (float32, in a 16-bit run
    too): main_grad and what reduces it (dp, emb), and the cross-entropy's all-reduces."""
    return parallelize(cfg).precision.master_bytes


def dims(cfg):
    M = cfg.model
    b = cfg.microbatch_size(cfg.batch)
    T = M.seq_len // cfg.cp  # my positions of each sequence
    Ts = T // cfg.tp if cfg.sequence_parallel else T
    e = parallelize(cfg).precision.compute_bytes
    return b, T, Ts, M.d_model, M.hidden, M.n_heads, M.vocab, cfg.tp, e


def layer_saved(cfg) -> dict:
    """Bytes one block keeps from its F to its backward, by tensor (recompute mode applied)."""
    b, T, Ts, C, H, a, V, t, e = dims(cfg)
    s, cp, sp = cfg.model.seq_len, cfg.cp, cfg.sequence_parallel
    if cfg.recompute == "full":
        return {"block input x": block_input(b, s, C, t, cp, sp, e)}
    out = minipar_block(b, s, C, H, a, t, cp, sp, e, dropout=bool(cfg.dropout), experts=bool(cfg.model.n_experts))
    # ring attention and Ulysses keep no probabilities: nothing more for selective to drop
    return drop_scores("minipar", out) if cfg.recompute == "selective" else out


def layer_grads(cfg) -> dict:
    """Bytes one block keeps from its I to its W (zb-h1): the output gradients of its layers
    with weights, which backward_weight needs (with full recompute: also the rebuilt ctx)."""
    b, T, Ts, C, H, a, V, t, e = dims(cfg)
    out = {
        "block output grad": e * b * Ts * C,
        "mlp input grad (ln2's output grad)": e * b * Ts * C,
        "attention output grad dh": e * b * Ts * C,
        "attention input grad (ln1's output grad)": e * b * Ts * C,
        "fc1 output grad": e * b * T * H // t,
        "qkv output grad": 3 * e * b * T * C // t,
    }
    if cfg.sequence_parallel:
        out["fc2, proj output grads all-gathered"] = 2 * e * b * T * C
    if cfg.dropout:  # the MLP's output grad is dropout's backward's, no longer the block's (the attention's
        out["mlp output grad (through dropout)"] = e * b * Ts * C  # replaces dh, which is then not kept)
    if cfg.recompute == "full":
        out.update({"rebuilt " + k: v for k, v in layer_saved(cfg.with_(recompute="none")).items()})
    return out


def stage_bytes(cfg, stage: int, n_stages: int):
    """(A, G) in bytes for one micro-batch of ``stage``."""
    b, T, Ts, C, H, a, V, t, e = dims(cfg)
    layers = cfg.model.n_layers // n_stages
    A = layers * sum(layer_saved(cfg).values())
    G = layers * sum(layer_grads(cfg).values())
    first, last = minipar_ends(b, cfg.model.seq_len, C, V, t, cfg.cp, cfg.sequence_parallel, e, dropout=bool(cfg.dropout))
    if stage == 0:
        A += sum(first.values())
        G += e * b * Ts * C  # the embedding's output grad
    if stage == n_stages - 1:
        A += sum(last.values())
        G += e * b * Ts * C  # ln_f's output grad
    return int(A), int(G)


def activation_peak(cfg, coords) -> int:
    """The largest activation bytes held after any action of the rank at ``coords``."""
    s = parallelize(cfg).schedule
    S = s.total_stages
    held, peak = {}, 0
    for act in s.actions[coords[1]]:
        A, G = stage_bytes(cfg, act.stage, S)
        key = (act.stage, act.microbatch)
        if act.kind == "F":
            held[key] = A
        elif act.kind == "I":
            held[key] = A + G
        else:
            held.pop(key)
        peak = max(peak, sum(held.values()))
    return peak


def arrays_in(obj):
    """Every array inside nested dicts, tuples and lists (a forward context)."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from arrays_in(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from arrays_in(v)
    elif hasattr(obj, "shape") and hasattr(obj, "dtype"):
        yield obj


def held_bytes(obj, exclude=()) -> int:
    """What ``Trainer.sample`` measures: the bytes of the memory blocks the arrays inside ``obj``
    live in, each block once (a view and its base count once); blocks whose key is in ``exclude``
    (the parameters') not at all."""
    blocks = dict(storage(a) for a in arrays_in(obj))
    return sum(n for key, n in blocks.items() if key not in exclude)


# --------------------------------------------------------------------------- communication


def ring(kind, n, p, e) -> int:
    """Bytes one rank sends in a ring collective over p ranks on n elements (p divides n)."""
    if p == 1:
        return 0
    share = (p - 1) * n // p * e
    return 2 * share if kind == "all_reduce" else share


def cp_layer_bytes(cfg) -> int:
    """Bytes a rank sends over the cp group per layer per micro-batch: the attention core's
    forward and backward (``context_parallel.ring.traffic`` / ``ulysses.traffic``), and the
    forward once more with full recomputation."""
    if cfg.cp == 1:
        return 0
    from ..context_parallel import SeqLayout, ring, ulysses

    b, T, Ts, C, H, a, V, t, e = dims(cfg)
    core = ring if cfg.cp_attention == "ring" else ulysses
    per = core.traffic(SeqLayout(cfg.model.seq_len, cfg.cp), b, a // t, C // a, e)
    return per["forward"] * (2 if cfg.recompute == "full" else 1) + per["backward"]


def unit_gathers(cfg, coords, stage, stepped=True) -> int:
    """All-gathers of one unit of pipeline ``stage`` per step on the rank at ``coords`` (ZeRO):
    one (ZeRO-1 and 2 after the update, none in a step fp16 skipped; ZeRO-3 before the first
    micro-batch), or, ZeRO-3 resharding, one before each action of the stage (F and B; F, I and W
    with zb-h1): 2m or 3m."""
    plan = parallelize(cfg)
    if plan.zero in (1, 2):
        return 1 if stepped else 0
    if not plan.reshard:
        return 1
    return sum(1 for a in plan.schedule.actions[coords[1]] if a.stage == stage)


def comm_bytes(cfg, coords, unit_sizes=None, unit_stages=None, stepped=True) -> dict:
    """Bytes the rank at ``coords`` sends in one step, by group.

    tp   per layer per micro-batch: 2 all-reduces of (b, T, C) forward and 2 backward (full
         recompute: the forward's 2 again); SP: an all-gather + a reduce-scatter in place of
         each (the same bytes) + the LayerNorms' (2C,) gradient all-reduces. Embedding, head,
         cross-entropy on the first / last stage.
    pp   per micro-batch: each F sends (b, Ts, C) to the next stage, each B/I (b, Ts, C) back.
    dp   once per step: a ring all-reduce (DDP) or reduce-scatter + all-gather (ZeRO-1, 2, 3) of
         each DP engine's flat buffers (``unit_sizes``: their padded lengths) over the dp x cp
         ranks; ZeRO-3 with ``reshard``: one reduce-scatter and an all-gather per action of the
         unit's stage (``unit_stages``: the pipeline stage of each), ``unit_gathers``; a step
         that fp16 skipped (``stepped`` False) gathers no updated weights.
    emb  once per step: the tied wte shard (V/t, C) all-reduced by the first and last stage.
    cp   per layer per micro-batch: the attention core's K/V traffic (``cp_layer_bytes``).
    """
    b, T, Ts, C, H, a, V, t, e = dims(cfg)
    m, sp, f = cfg.microbatches, cfg.sequence_parallel, master_bytes(cfg)
    plan = parallelize(cfg)
    s = plan.schedule
    S, p = s.total_stages, coords[1]
    mine = [k for k in range(S) if s.stage_to_rank[k] == p]
    layers = cfg.model.n_layers // S * len(mine)
    act = b * T * C
    per_layer = 4 * ring("all_reduce", act, t, e) + (2 * ring("all_reduce", act, t, e) if cfg.recompute == "full" else 0)
    if sp:
        per_layer += 2 * ring("all_reduce", 2 * C, t, e)
    tp = m * layers * per_layer
    if 0 in mine:  # embedding: all-reduce (SP: reduce-scatter + all-gather, and wpe's rows)
        tp += m * (ring("all_reduce", act, t, e) + (ring("all_gather", T * C, t, e) if sp else 0))
    if S - 1 in mine:  # head input: SP all-gather + reduce-scatter, else f's all-reduce; ln_f; loss
        tp += m * (ring("all_reduce", act, t, e) + (ring("all_reduce", 2 * C, t, e) if sp else 0)
                   + ring("all_reduce", b * T, t, f) + ring("all_reduce", 2 * b * T, t, f))
    owner = s.stage_to_rank
    sends = sum(1 for k in mine if k < S - 1 and owner[k + 1] != p) + sum(1 for k in mine if k > 0 and owner[k - 1] != p)
    pp = m * sends * b * Ts * C * e
    d = cfg.dp * cfg.cp
    stages = unit_stages or [0] * len(unit_sizes or [])
    eg, ew = f, e  # gradients (main_grad), weights
    if plan.zero:  # ZeRO-1, 2, 3: reduce-scatter the gradients, all-gather the weights
        dp = sum(ring("reduce_scatter", n, d, eg) + unit_gathers(cfg, coords, k, stepped) * ring("all_gather", n, d, ew)
                 for n, k in zip(unit_sizes or [], stages))
    else:
        dp = sum(ring("all_reduce", n, d, eg) for n in (unit_sizes or []))
    emb = ring("all_reduce", V // t * C, 2, f) if cfg.pp > 1 and (0 in mine or S - 1 in mine) else 0
    return {"tp": tp, "pp": pp, "dp": dp, "emb": emb, "cp": m * layers * cp_layer_bytes(cfg)}


def measured_comm(events, rank) -> dict:
    """Bytes ``rank`` sent, by group, read from the trace (communicator names tp(...), pp(...), ...)."""
    from ..trace import SEND_KINDS

    out = {"tp": 0, "pp": 0, "dp": 0, "emb": 0, "cp": 0}
    for ev in events:
        if ev.rank == rank and ev.kind in SEND_KINDS:
            fam = ev.name.split("(")[0]
            if fam in out:
                out[fam] += ev.bytes
    return out
