"""Step time: compute, tensor/context-parallel communication, the pipeline, data parallelism.

    t = stage_times(prob, cfgs)        # per micro-batch F and B of a pipeline stage, and the rest
    step = step_times(prob, cfgs, t)   # simulated pipeline + what data parallelism leaves exposed

Per block and micro-batch on one rank:

- this machine, with lesson 05's GPT's operations measured (``Hardware.ops``,
  ``measured_ops``): a block's forward and backward, and the ends', are the seconds measured at
  the configuration's (ranks, tp, b), in place of the two items below; with more ranks than
  cores, so are its TP collectives (the ring steps as the group met them, k ranks computing),
  in place of the ring formula below;
- matmuls: their FLOPs (``models.layer_flops``) / (peak x matmul_fraction);
- memory-bound operations (LayerNorm, GeLU, softmax, dropout, residuals): every activation the
  forward stores is written and read once there (2 passes over the block's activation bytes),
  read, and its gradient written and read, in the backward (3 passes); a recomputed forward
  writes and reads again (2 passes). Time = bytes / memory bandwidth;
- tensor parallelism: 2 all-reduces of the block output (b s h e bytes) forward, 2 backward, 2
  more when recomputing the forward; with sequence parallelism each is an all-gather and a
  reduce-scatter of the same bytes. Ring formulas of ``minipar.costmodel`` on the intra-node link
  (inter-node when tp > GPUs per node), nothing overlapped;
- context parallelism: the K, V ring (cp - 1 steps of 2 b (s/cp) h e / tp bytes forward, twice
  that backward) hidden behind the attention-score matmuls as far as they last.

The pipeline runs m micro-batches through pp stages of ceil(L/pp) blocks; the last stage adds
the LM head. Its makespan comes from lesson 03's simulator (``minipar.pipeline.simulate``) for
the chosen schedule, with a point-to-point time of b (s/cp) h e / tp bytes (Megatron's
scatter/gather) between stages. Then data parallelism: the gradient all-reduce, hierarchical
when the dp group spans nodes (reduce-scatter inside the node, all-reduce across, all-gather
inside), overlapped with the backward of the last micro-batch. ZeRO-1 adds the all-gather of the
updated parameters after the step; ZeRO-2 reduce-scatters every micro-batch's gradients during
its backward; ZeRO-3 gathers each block's parameters before its forward, again before its
backward and before its recomputed forward, and reduce-scatters its gradients: one collective
each per block, by the engine's conventions (``config.ENGINES``: FSDP's two-level rings over
every NIC, DeepSpeed's flat ring over each rank's own link), prefetched behind the previous
block's compute as far as that compute lasts and the engine's live-parameter bound lets the
gather start (``prefetch_share``). The optimizer step reads and writes its state once at memory bandwidth
(on the host with offload, after the gradients crossed PCIe).
"""
from __future__ import annotations

import numpy as np

from .. import costmodel as cm
from .config import DEEPSPEED_MAX_LIVE, Configs, Problem, layers_per_rank, microbatch_size
from .machine import op_seconds, ops_apply
from .memory import layer_activations, memory
from .models import executed_flops, layer_flops, model_flops
from .pipeline import makespan_estimate, makespan_lower_bound

PARTS = ("compute", "tp_comm", "pp_bubble", "dp_comm", "zero3_gathers", "cp_ring", "ep_alltoall", "optimizer")


def expert_alltoall_bytes(tokens, hidden, top_k, ep, itemsize):
    """Bytes one rank sends in one all-to-all of expert parallelism (a dispatch, or a combine):
    each of its ``tokens`` goes to ``top_k`` experts, spread evenly over the ep ranks (the
    load-balancing loss's aim, no token dropped), and the (ep-1)/ep of those rows that leave the
    rank carry ``hidden`` values each. A layer sends four per micro-batch: dispatch and combine
    forward, and their backwards (the combine's backward is a dispatch of the gradients). The
    counts the ranks exchange first (a few integers) are not counted."""
    return top_k * tokens * (ep - 1) / ep * hidden * itemsize


def expert_alltoall_time(prob: Problem, cfg: Configs, n_bytes):
    """One all-to-all over the ep ranks (stride tp x cp, inside a node first): the k of them on a
    node exchange over the intra-node link, the rest over each GPU's own inter-node link, both at
    once (pairwise messages, one per peer)."""
    ep, f = cfg.ep, prob.hw.link_fraction
    k = np.clip(prob.gpus_per_node // (cfg.tp * cfg.cp), 1, ep)
    peers = np.maximum(ep - 1, 1)
    intra = (k - 1) * prob.intra.alpha + n_bytes * (k - 1) / peers * prob.intra.beta(f)
    inter = (ep - k) * prob.inter.alpha + n_bytes * (ep - k) / peers * prob.inter.beta(f)
    return np.where(ep > 1, np.maximum(intra, inter), 0.0)


def _ring(n_bytes, p, lk, frac, kind):
    """Ring collective time over p ranks on link ``lk`` (arrays welcome; 0 when p == 1)."""
    alpha, beta = lk.alpha, lk.beta(frac)
    if kind == "all_gather":
        return cm.all_gather_time(n_bytes, p, alpha, beta)
    if kind == "reduce_scatter":
        return cm.reduce_scatter_time(n_bytes, p, alpha, beta)
    # the ring all-reduce is a reduce-scatter then an all-gather: 2(p-1) alpha + 2(p-1)/p n beta
    return cm.reduce_scatter_time(n_bytes, p, alpha, beta) + cm.all_gather_time(n_bytes, p, alpha, beta)


def dp_collective(prob: Problem, cfg: Configs, n_bytes, kind):
    """A collective over the dp x cp ranks holding the same weights, hierarchical across nodes.

    k of the group's ranks share a node (stride tp); the group spans n/k nodes. all_reduce =
    reduce-scatter inside + all-reduce of 1/k across + all-gather inside; reduce_scatter and
    all_gather are the matching halves."""
    hw = prob.hw
    n = cfg.dp * cfg.cp
    k = np.minimum(n, np.maximum(1, prob.gpus_per_node // cfg.tp))
    nodes = np.maximum(1, n // k)
    f = hw.link_fraction
    rs_in, ag_in = _ring(n_bytes, k, prob.intra, f, "reduce_scatter"), _ring(n_bytes, k, prob.intra, f, "all_gather")
    rs_out, ag_out = _ring(n_bytes / k, nodes, prob.inter, f, "reduce_scatter"), _ring(n_bytes / k, nodes, prob.inter, f, "all_gather")
    return {"all_reduce": rs_in + rs_out + ag_out + ag_in, "reduce_scatter": rs_in + rs_out,
            "all_gather": ag_out + ag_in}[kind]


def _group_on_node(prob: Problem, cfg: Configs):
    """(k, nodes): ranks of the dp x cp group on one node (stride tp), and the nodes it spans."""
    n = cfg.dp * cfg.cp
    k = np.minimum(n, np.maximum(1, prob.gpus_per_node // cfg.tp))
    return k, np.maximum(1, n // k)


def zero3_collective(prob: Problem, cfg: Configs, n_bytes, kind):
    """One ZeRO-3 all-gather or reduce-scatter of a block's ``n_bytes`` over the dp x cp ranks.
    FSDP (and minipar): NCCL's rings use every NIC of a node, which ``dp_collective``'s two
    levels model. DeepSpeed: each rank's ring over its own link, every byte across the node
    boundary once the group spans nodes (``config.ENGINES``)."""
    if prob.engine != "deepspeed":
        return dp_collective(prob, cfg, n_bytes, kind)
    n = cfg.dp * cfg.cp
    k, _ = _group_on_node(prob, cfg)  # k < n: the group spans nodes
    return np.where(k < n, _ring(n_bytes, n, prob.inter, prob.hw.link_fraction, kind),
                    _ring(n_bytes, n, prob.intra, prob.hw.link_fraction, kind))


def zero3_traffic(prob: Problem, cfg: Configs, psi, gathers_per_block):
    """(intra, inter) bytes one GPU sends per step in ZeRO-3's collectives: each block's
    parameters gathered ``gathers_per_block`` times per micro-batch (forward, backward, and the
    recomputed forward), its gradients reduce-scattered once; a ring over n ranks sends
    (n-1)/n of them. FSDP's two levels send (k-1)/k inside the node and 1/k x (nodes-1)/nodes
    across; DeepSpeed's flat ring sends them all across once the group spans nodes."""
    bp, bg, _ = prob.bytes_per_param()
    n = cfg.dp * cfg.cp
    k, nodes = _group_on_node(prob, cfg)
    total = cfg.microbatches * (gathers_per_block * bp + bg) * psi
    if prob.engine == "deepspeed":
        inter = np.where(k < n, total * (n - 1) / n, 0.0)
        intra = total * (n - 1) / n - inter
    else:
        intra, inter = total * (k - 1) / k, total / k * (nodes - 1) / nodes
    on = cfg.zero == 3
    return np.where(on, intra, 0.0), np.where(on, inter, 0.0)


def prefetch_share(prob: Problem, cfg: Configs):
    """(forward, backward): the share of a block's gathers that may start while the unit before
    it computes. FSDP: all (the next block is prefetched whole, two units live). DeepSpeed: its
    coordinator prefetches the next module only while fewer than stage3_max_live_parameters are
    live (then at least that module's parameter whole): the modules that follow one larger than the
    bound wait for it to be released (forward order; reversed in the backward)."""
    if prob.engine != "deepspeed":
        return np.ones(len(cfg)), np.ones(len(cfg))
    out = {}
    for t in set(cfg.tp.tolist()):
        p = np.array(prob.model.linears(), dtype=float) / t
        nxt = np.roll(p, -1)  # the module after each one (the last one's: the next block's first)
        out[t] = (nxt[p < DEEPSPEED_MAX_LIVE].sum() / p.sum(), p[nxt < DEEPSPEED_MAX_LIVE].sum() / p.sum())
    return tuple(np.array([out[t][j] for t in cfg.tp.tolist()]) for j in (0, 1))


def measured_ops(prob: Problem, cfg: Configs, b):
    """This machine, its model's operations measured (``Hardware.ops``, ``machine.measure_ops``):
    {block_f, block_b, ends_f, ends_b} arrays (seconds per micro-batch, the TP collectives left
    out), {comm_f, comm_b} (one block's TP collectives, forward and backward, as measured) and
    ``found``, where a configuration's shapes were measured (cp = 1, no sequence parallelism, its
    (ranks, tp, b)); None when the record has none for this model. Measured with k ranks computing
    at once, they hold what sharing the cores costs; without the oversubscription model they are
    scaled back to a core each (x cores / k), and ``comm_found`` is False: each rank its own core,
    the ring formula prices the collectives."""
    hw = prob.hw
    if not ops_apply(hw.ops, prob.model):
        return None
    k = prob.ranks_on_node
    rows = [op_seconds(hw.ops, k, int(t), int(bb)) if c == 1 and not s else None
            for t, bb, c, s in zip(np.broadcast_to(cfg.tp, (len(cfg),)), np.broadcast_to(b, (len(cfg),)),
                                   np.broadcast_to(cfg.cp, (len(cfg),)), np.broadcast_to(cfg.sequence_parallel, (len(cfg),)))]
    scale = min(1.0, hw.cores / k) if hw.cores and not hw.oversubscription else 1.0
    out = {key: np.array([r[key] * scale if r else 0.0 for r in rows]) for key in ("block_f", "block_b", "ends_f", "ends_b",
                                                                                   "comm_f", "comm_b")}
    out["found"] = np.array([r is not None for r in rows])
    out["comm_found"] = out["found"] & bool(hw.oversubscription and hw.cores and k > hw.cores)
    return out


def stage_times(prob: Problem, cfg: Configs, mem=None) -> dict:
    """Per micro-batch times of a pipeline stage (arrays): F, B (compute + exposed communication),
    the LM head's extra on the last stage, point-to-point, and their parts."""
    m, hw = prob.model, prob.hw
    b, tp, cp, sp, rec = microbatch_size(prob, cfg), cfg.tp, cfg.cp, cfg.sequence_parallel, cfg.recompute
    share = hw.compute_share(prob.ranks_on_node)
    rate = prob.matmul_peak * hw.matmul_fraction * share  # fp8: the fp8 rate
    bw = hw.hbm_bandwidth * share
    f = hw.link_fraction
    e = hw.dtype_bytes
    L = layers_per_rank(prob, cfg.pp)

    mm, att = layer_flops(m, m.seq / cp)
    fwd = b * (mm + att) / tp  # FLOPs per block per micro-batch on this rank
    att_f = b * att / tp
    redo = np.select([rec == "full", rec == "selective"], [fwd, att_f], 0.0)
    full, scores = layer_activations(prob, b, tp, cp, sp)
    redo_bytes = np.select([rec == "full", rec == "selective"], [2 * full, 2 * scores], 0.0)
    cf = fwd / rate + 2 * full / bw  # compute, forward
    cb = (2 * fwd + redo) / rate + (3 * full + redo_bytes) / bw  # compute, backward (+ recompute)
    ops = measured_ops(prob, cfg, b)
    if ops is not None:  # this machine: the block's forward and backward as measured at this shape
        redo_m = np.select([rec == "full", rec == "selective"], [ops["block_f"], ops["block_f"] * att_f / fwd], 0.0)
        cf = np.where(ops["found"], ops["block_f"], cf)
        cb = np.where(ops["found"], ops["block_b"] + redo_m, cb)

    tp_link = np.where(tp <= prob.gpus_per_node, 0, 1)
    block_bytes = b * m.seq / cp * m.hidden * e
    one = np.where(tp_link == 0, _ring(block_bytes, tp, prob.intra, f, "all_reduce"),
                   _ring(block_bytes, tp, prob.inter, f, "all_reduce"))  # SP: all-gather + reduce-scatter, same ring
    n_fwd = np.where(rec == "full", 4, 2)
    tp_f, tp_b = 2 * one, n_fwd * one
    if ops is not None:  # this machine, ranks > cores: the ring steps as measured among ranks computing
        tp_f = np.where(ops["comm_found"], ops["comm_f"], tp_f)
        tp_b = np.where(ops["comm_found"], ops["comm_b"] + np.where(rec == "full", ops["comm_f"], 0), tp_b)

    cp_intra = tp * cp <= prob.gpus_per_node
    kv = 2 * b * (m.seq / cp) * m.kv * m.d * e / tp  # K and V: kv_heads x head_dim wide (h without GQA)
    lk_a = np.where(cp_intra, prob.intra.alpha, prob.inter.alpha)
    lk_b = np.where(cp_intra, prob.intra.beta(f), prob.inter.beta(f))
    ring_f = (cp - 1) * (lk_a + kv * lk_b)
    ring_b = (cp - 1) * (lk_a + 2 * kv * lk_b) + np.where(rec == "full", ring_f, 0)
    cp_f = np.maximum(0, ring_f - att_f / rate)
    cp_b = np.maximum(0, ring_b - (2 * att_f + np.where(rec == "none", 0, att_f)) / rate)

    head_flops = 2 * b * (m.seq / cp) * m.hidden * m.vocab / tp
    logits = (4 if hw.mixed_precision else e) * b * (m.seq / cp) * m.vocab / tp
    head_f = head_flops / rate + 2 * logits / bw
    head_b = 2 * head_flops / rate + 3 * logits / bw
    if ops is not None:  # measured: the embedding's too, charged to the last stage with the head
        head_f = np.where(ops["found"], ops["ends_f"], head_f)
        head_b = np.where(ops["found"], ops["ends_b"], head_b)

    nmb = cfg.microbatches
    mem = memory(prob, cfg) if mem is None else mem
    bp, bg, _ = prob.bytes_per_param()
    psi = np.maximum(mem["psi_first"], mem["psi_last"])
    F_c, B_c = L * cf, L * cb
    # ZeRO-2: each micro-batch's gradients are reduce-scattered during its backward.
    z2 = np.where(cfg.zero == 2, np.maximum(0, dp_collective(prob, cfg, bg * psi, "reduce_scatter") - B_c), 0)

    # expert parallelism: dispatch + combine in the forward, their backwards, and the forward's
    # again under full recomputation; nothing overlapped. A rank dispatches its 1/tp of the tokens.
    a2a = 2 * expert_alltoall_time(prob, cfg, expert_alltoall_bytes(b * m.seq / (cp * tp), m.hidden, m.top_k, cfg.ep, e))
    ep_f, ep_b = a2a, np.where(rec == "full", 2, 1) * a2a

    # ZeRO-3: each block's parameters gathered for its forward, again for its backward and for
    # its recomputed forward, its gradients reduce-scattered. The next block's gathers are
    # prefetched behind this block's compute: hidden as far as that compute lasts, and as far as
    # the engine's live-parameter bound lets them start (``prefetch_share``).
    ag = zero3_collective(prob, cfg, bp * psi / L, "all_gather")  # one block's
    rs = zero3_collective(prob, cfg, bg * psi / L, "reduce_scatter")
    link_f, link_b = ag, ag * np.where(rec == "full", 2, 1) + rs
    share_f, share_b = prefetch_share(prob, cfg)
    busy_f, busy_b = cf + tp_f + cp_f + ep_f, cb + tp_b + cp_b + ep_b  # one block's, per micro-batch
    z3_f = np.where(cfg.zero == 3, L * (link_f - np.minimum(busy_f, share_f * link_f)), 0)
    z3_b = np.where(cfg.zero == 3, L * (link_b - np.minimum(busy_b, share_b * link_b)), 0)

    F = F_c + L * (tp_f + cp_f + ep_f) + z3_f
    B = B_c + L * (tp_b + cp_b + ep_b) + z3_b + z2
    spans_nodes = prob.gpus > prob.gpus_per_node
    p2p_lk = prob.inter if spans_nodes else prob.intra
    p2p = np.where(cfg.pp > 1, p2p_lk.alpha + block_bytes / tp * p2p_lk.beta(f), 0.0)
    z3_intra, z3_inter = zero3_traffic(prob, cfg, psi, np.where(rec == "full", 3, 2))
    return dict(F=F, B=B, head_f=head_f, zero3_intra_bytes=z3_intra, zero3_inter_bytes=z3_inter, head_b=head_b, p2p=p2p, nmb=nmb, mem=mem,
                compute=nmb * (F_c + B_c + head_f + head_b), tp_comm=nmb * L * (tp_f + tp_b),
                cp_ring=nmb * L * (cp_f + cp_b), ep_alltoall=nmb * L * (ep_f + ep_b), zero3_gathers=nmb * (z3_f + z3_b), zero2=nmb * z2, psi=psi)


def tail_times(prob: Problem, cfg: Configs, st: dict) -> dict:
    """What follows the pipeline: exposed data-parallel communication and the optimizer step."""
    hw = prob.hw
    bp, bg, k = prob.bytes_per_param()
    psi = st["psi"]
    last_b = (st["B"] + st["head_b"]) * prob.overlap_dp  # the backward the gradient all-reduce can hide behind
    ar = dp_collective(prob, cfg, bg * psi, "all_reduce")
    rs = dp_collective(prob, cfg, bg * psi, "reduce_scatter")
    ag = dp_collective(prob, cfg, bp * psi, "all_gather")
    dp = np.select([cfg.zero == 0, cfg.zero == 1, cfg.zero == 2],
                   [np.maximum(0, ar - last_b), np.maximum(0, rs - last_b) + ag, ag], 0.0) + st["zero2"]
    shard = np.where(cfg.zero >= 1, cfg.dp * cfg.cp, 1)
    touched = (2 * k + bp + bg) * psi / shard  # read+write state, read grad, write param
    if prob.offload:
        opt = (bp + bg) * psi / shard * hw.host.beta(1.0) + touched / hw.host_bandwidth
    else:
        opt = touched / (hw.hbm_bandwidth * hw.compute_share(prob.ranks_on_node))
    adam = hw.ops.get("adam", {}).get(str(prob.ranks_on_node)) if ops_apply(hw.ops, prob.model) else None
    if adam is not None and not prob.offload:  # this machine: FlatAdam's update timed on k ranks at once
        k = prob.ranks_on_node
        scale = min(1.0, hw.cores / k) if hw.cores and not hw.oversubscription else 1.0
        opt = (adam["overhead"] + adam["per_param"] * psi / shard) * scale
    return dict(dp_comm=dp, optimizer=opt)


def evaluate(prob: Problem, cfg: Configs, makespan=None) -> dict:
    """Everything for the columns: memory, the per-stage times, a lower bound of the step (the
    pipeline at its closed form, no point-to-point), and the step itself when ``makespan`` (the
    simulated pipeline, per configuration) is given."""
    st = stage_times(prob, cfg)
    tail = tail_times(prob, cfg, st)
    rest = tail["dp_comm"] + tail["optimizer"]
    out = dict(st, **tail, lower_bound=makespan_lower_bound(cfg, st) + rest, estimate=makespan_estimate(cfg, st) + rest)
    if makespan is not None:
        out.update(finish(prob, cfg, out, np.asarray(makespan, dtype=float)))
    return out


def finish(prob: Problem, cfg: Configs, ev: dict, makespan) -> dict:
    """Step time, its breakdown (PARTS, seconds per step), TFLOP/s per GPU and MFU."""
    busy = ev["nmb"] * (ev["F"] + ev["B"] + ev["head_f"] + ev["head_b"])
    step = makespan + ev["dp_comm"] + ev["optimizer"]
    parts = {"compute": ev["compute"], "tp_comm": ev["tp_comm"], "pp_bubble": makespan - busy,
             "dp_comm": ev["dp_comm"], "zero3_gathers": ev["zero3_gathers"], "cp_ring": ev["cp_ring"],
             "ep_alltoall": ev["ep_alltoall"], "optimizer": ev["optimizer"]}
    m = prob.model
    exe = np.array([executed_flops(m, prob.batch, r) for r in np.atleast_1d(cfg.recompute)])
    tflops = exe / prob.gpus / step / 1e12
    mfu = model_flops(m, prob.batch) / prob.gpus / step / prob.hw.peak_flops
    return dict(step=step, parts=parts, tflops_per_gpu=tflops, mfu=mfu, makespan=makespan)
