"""Serving a model: per-token decode latency, prefill time and throughput against TP and PP.

    m, hw = model("llama3-70b"), preset("a100-80gb")
    decode_step(m, hw, tp=4, batch=1, context=1024)   # one decode step: seconds, bytes, FLOPs, bound
    prefill(m, hw, tp=4, batch=1, prompt=1024)         # the prompt, all T tokens at once
    serving(m, hw, tp=4, pp=1, batch=1, context=1024)  # latency, throughput, largest batch that fits
    tp_stops_paying(m, hw)                             # the tp past which doubling it no longer helps

    minipar infer --model llama3-70b --hardware a100-80gb --tp 1 2 4 8

Decoding one token at batch B reads **every weight once** (and the KV cache of every sequence)
and does 2 FLOPs per weight and sequence: its arithmetic intensity is about B FLOPs per weight,
2B / w FLOPs per byte for w-byte weights. A GPU does hundreds of FLOPs in the time it reads one
byte (A100: 312e12 / 2.04e12 = 153), so at small B a decode step is bound by memory bandwidth,
and its time is the bytes read over the bandwidth. The roofline (Williams, Waterman and Patterson
2009) per step and rank:

    step = max(FLOPs / (peak x matmul_fraction), bytes / bandwidth) + 2 L all-reduces + head's 2

    bytes  = (L x (split / t + replicated) + V h / t) w     each rank reads its 1/t of the weights
           + B x context x kv_bytes_per_token(t)            and its heads' part of the KV cache
    FLOPs  = 2 B (L P_matmul + V h) / t + 4 B context L heads d / t
    comm   = 2 L ring all-reduces of a (B x h) activation, e bytes each (costmodel.allreduce_time,
             the intra-node link at link_fraction): what TP adds, alpha per ring step

Tensor parallelism divides the weight bytes by t and adds all-reduces of B h e bytes: a few KB,
pure latency on NVLink (2 (t-1) alpha per all-reduce). It stops paying where the all-reduce
latency a doubling of t adds to a layer exceeds the weight read time it saves,
W_layer / (2 t bandwidth). Decode turns compute-bound at B* = peak x matmul_fraction / bandwidth
x w / 2 sequences (``critical_batch``); prefill, with B T tokens a step, is compute-bound
already at one prompt of a few hundred tokens.

Pipeline parallelism for serving: a token still passes every layer, one stage after the other,
so the latency is one device's (each stage reads 1/p of the weights, in turn) plus p - 1
point-to-point hops; with p batches in flight the throughput is p times one batch's. What both
buy is memory: the weights per GPU fall to 1/(t p), and the KV cache, which grows with batch x
context, gets the rest (``max_batch``): a larger batch at the same latency, the throughput gain
beside TP's latency gain.

The same functions predict this machine (``preset("this-machine")``, with ``bandwidth`` the rate
a rank reads at, measured): ``minipar.bench.inference`` measures lesson 05's generation against
them, passing the read probe each job takes around its token loop (a vector times a matrix far
past the cache, the product a decode step runs). Units: bytes, seconds, FLOP/s.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import costmodel as cm
from ..errors import UsageError
from .hardware import Hardware
from .models import ModelSpec


@dataclass(frozen=True)
class Step:
    """One step (a decode step, or a whole prefill) on one rank, its parts in seconds."""

    seconds: float  # the step: max(compute, memory) + comm (+ pipeline hops)
    compute_s: float  # FLOPs / (peak x matmul_fraction)
    memory_s: float  # bytes / bandwidth
    comm_s: float  # TP all-reduces (and PP hops)
    weight_bytes: float  # weights one rank reads
    kv_bytes: float  # KV cache one rank reads
    flops: float  # FLOPs one rank does
    tokens: int  # tokens the step produces (decode: the batch) or consumes (prefill: batch x prompt)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def intensity(self) -> float:
        """FLOPs per byte read: the roofline's x axis."""
        return self.flops / (self.weight_bytes + self.kv_bytes)


def check_tp(m: ModelSpec, tp: int, pp: int = 1):
    if tp < 1 or pp < 1:
        raise UsageError(f"tp={tp}, pp={pp}: both must be >= 1")
    if not m.tp_splits(tp):
        raise UsageError(f"tp={tp} does not divide the {m.heads} heads, {m.kv} KV heads and MLP width {m.f} of {m.name}")
    if m.layers % pp:
        raise UsageError(f"pp={pp} does not divide the {m.layers} layers of {m.name}")


def weight_bytes(m: ModelSpec, tp: int, wbytes: float, pp: int = 1) -> float:
    """Weights one rank reads for one decode step: its 1/t of every split matrix of its L/p layers,
    the replicated norms and biases whole, its V/t rows of the output layer and the final norm
    (the last stage's: with pp > 1 an average stage's share), and one row of each embedding (not
    counted: a few KB)."""
    split, rep = m.layer_params(active=True)
    last = m.vocab * m.hidden / tp + m.final_norm_params()
    return (m.layers * (split / tp + rep) + last) / pp * wbytes


def kv_bytes_per_token(m: ModelSpec, tp: int, ebytes: float, pp: int = 1) -> float:
    """KV cache bytes one token of one sequence adds on one rank: K and V of its kv/t heads of
    width d, in each of its L/p layers."""
    return 2 * m.layers / pp * (m.kv // tp) * m.d * ebytes


def _all_reduce(hw: Hardware, nbytes: float, tp: int, algorithm: str) -> float:
    lk = hw.intra if tp <= hw.gpus_per_node else hw.inter
    return cm.allreduce_time(algorithm, nbytes, tp, lk.alpha, lk.beta(hw.link_fraction))


def decode_step(m: ModelSpec, hw: Hardware, tp: int = 1, batch: int = 1, context: int = 0, pp: int = 1,
                bandwidth: float | None = None, algorithm: str = "ring", wbytes: float | None = None) -> Step:
    """One decode step: each of ``batch`` sequences, ``context`` tokens already cached, gets its next
    token. ``bandwidth``: bytes/s one rank reads at (default the preset's ``hbm_bandwidth``);
    ``wbytes``: bytes per weight and activation element (default the preset's ``dtype_bytes``).
    With ``pp`` > 1 the step is one stage's; ``serving`` adds up the stages."""
    check_tp(m, tp, pp)
    w = hw.dtype_bytes if wbytes is None else wbytes
    bw = hw.hbm_bandwidth if bandwidth is None else bandwidth
    wb = weight_bytes(m, tp, w, pp)
    kv = batch * context * kv_bytes_per_token(m, tp, w, pp)
    flops = 2 * batch * (m.layers / pp * m.matmul_params() + m.vocab * m.hidden / pp) / tp \
        + 4 * batch * context * m.layers / pp * m.heads * m.d / tp
    compute = flops / (hw.peak_flops * hw.matmul_fraction)
    memory = (wb + kv) / bw
    # 2 all-reduces per layer (attention, MLP) of the (B, h) output; the greedy argmax 2 more of B
    comm = (2 * m.layers / pp * _all_reduce(hw, batch * m.hidden * w, tp, algorithm)
            + 2 * _all_reduce(hw, batch * w, tp, algorithm) / pp)
    return Step(max(compute, memory) + comm, compute, memory, comm, wb, kv, flops, batch)


def prefill(m: ModelSpec, hw: Hardware, tp: int = 1, batch: int = 1, prompt: int = 128, pp: int = 1,
            bandwidth: float | None = None, algorithm: str = "ring", wbytes: float | None = None) -> Step:
    """The prompt's ``prompt`` tokens of ``batch`` sequences at once (causal: a query attends to
    the half of the scores at or before it): the weights are read once for B T tokens, so the
    FLOPs, 2 B T per weight, dominate."""
    check_tp(m, tp, pp)
    w = hw.dtype_bytes if wbytes is None else wbytes
    bw = hw.hbm_bandwidth if bandwidth is None else bandwidth
    n = batch * prompt
    wb = weight_bytes(m, tp, w, pp)
    kv = n * kv_bytes_per_token(m, tp, w, pp)  # written once
    flops = 2 * n * (m.layers / pp * m.matmul_params() + m.vocab * m.hidden / pp) / tp \
        + 2 * batch * prompt * prompt * m.layers / pp * m.heads * m.d / tp
    compute = flops / (hw.peak_flops * hw.matmul_fraction)
    memory = (wb + kv) / bw
    comm = 2 * m.layers / pp * _all_reduce(hw, n * m.hidden * w, tp, algorithm)
    return Step(max(compute, memory) + comm, compute, memory, comm, wb, kv, flops, n)


def critical_batch(hw: Hardware, wbytes: float | None = None, bandwidth: float | None = None) -> float:
    """The batch at which decode turns compute-bound: 2 B FLOPs per weight of w bytes meet the
    ridge point peak / bandwidth FLOPs per byte, B* = peak x matmul_fraction / bandwidth x w / 2."""
    w = hw.dtype_bytes if wbytes is None else wbytes
    bw = hw.hbm_bandwidth if bandwidth is None else bandwidth
    return hw.peak_flops * hw.matmul_fraction / bw * w / 2


def max_batch(m: ModelSpec, hw: Hardware, tp: int, context: int, pp: int = 1, wbytes: float | None = None) -> int:
    """The most sequences of ``context`` tokens whose KV cache fits beside one rank's weights
    (0: the weights alone do not fit)."""
    w = hw.dtype_bytes if wbytes is None else wbytes
    split, rep = m.layer_params()  # every expert's weights are held, not only the active ones
    held = (m.layers / pp * (split / tp + rep) + m.vocab * m.hidden / tp / pp * (1 if m.tied else 2)) * w
    free = hw.memory_bytes - held
    return max(0, int(free // (context * kv_bytes_per_token(m, tp, w, pp))))


@dataclass(frozen=True)
class Serving:
    tp: int
    pp: int
    batch: int
    context: int
    token_s: float  # per-token latency of one sequence: a decode step through every stage
    prefill_s: float  # the prompt of every sequence of the batch
    tokens_per_s: float  # generated tokens per second of the whole group (pp batches in flight)
    fits_batch: int  # the largest batch whose KV cache fits at this context
    decode: Step  # one stage's decode step

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


def serving(m: ModelSpec, hw: Hardware, tp: int = 1, pp: int = 1, batch: int = 1, context: int = 1024,
            prompt: int = 128, algorithm: str = "ring", wbytes: float | None = None) -> Serving:
    """Latency and throughput of ``tp`` x ``pp`` GPUs serving ``batch`` sequences at ``context``:
    a token crosses the pp stages in turn (pp - 1 hops of B h bytes); with pp batches in flight,
    one per stage, the group makes pp x batch tokens per token latency."""
    w = hw.dtype_bytes if wbytes is None else wbytes
    st = decode_step(m, hw, tp, batch, context, pp, algorithm=algorithm, wbytes=w)
    lk = hw.intra if tp * pp <= hw.gpus_per_node else hw.inter
    hops = (pp - 1) * (lk.alpha + batch * m.hidden * w * lk.beta(hw.link_fraction))
    token = pp * st.seconds + hops
    pre = pp * prefill(m, hw, tp, batch, prompt, pp, algorithm=algorithm, wbytes=w).seconds + hops
    return Serving(tp, pp, batch, context, token, pre, pp * batch / token, max_batch(m, hw, tp, context, pp, w), st)


def tp_stops_paying(m: ModelSpec, hw: Hardware, batch: int = 1, context: int = 0, algorithm: str = "ring",
                    most: int | None = None) -> dict:
    """The largest tp (powers of two within a node, dividing the heads) still faster than half of it,
    and per doubling what it saves and what it adds per layer: {"best": t, "steps": [...]}."""
    most = most or hw.gpus_per_node
    steps, best = [], 1
    t = 1
    while 2 * t <= most and m.tp_splits(2 * t):
        a, b = (decode_step(m, hw, x, batch, context, algorithm=algorithm) for x in (t, 2 * t))
        saved = (a.memory_s if a.bound == "memory" else a.compute_s) - (b.memory_s if b.bound == "memory" else b.compute_s)
        added = b.comm_s - a.comm_s
        steps.append({"from": t, "to": 2 * t, "saved_per_layer_s": saved / m.layers, "added_per_layer_s": added / m.layers,
                      "pays": b.seconds < a.seconds})
        if b.seconds < a.seconds and best == t:
            best = 2 * t
        t *= 2
    return {"best": best, "steps": steps}


def table(m: ModelSpec, hw: Hardware, tps=(1, 2, 4, 8), pps=(1,), batch: int = 1, context: int = 1024,
          prompt: int = 128, algorithm: str = "ring") -> list[Serving]:
    """``serving`` for every (tp, pp) that splits the model, in order."""
    out = []
    for pp in pps:
        for tp in tps:
            if m.tp_splits(tp) and m.layers % pp == 0:
                out.append(serving(m, hw, tp, pp, batch, context, prompt, algorithm))
    if not out:
        raise UsageError(f"no tp in {list(tps)} x pp in {list(pps)} splits {m.name}")
    return out


# --------------------------------------------------------------------------- published serving numbers

# Llama 2 (Touvron et al. 2023, Table 1 and the Hugging Face config.json of each): RMSNorm, SwiGLU,
# RoPE, no biases, untied output layer, vocabulary 32000, 4096 tokens; 70B has 8 KV heads.
_LLAMA2 = dict(positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, qkv_bias=False, dropout=False, tied=False)
LLAMA2 = {"llama2-7b": ModelSpec(32, 4096, 32, 4096, 32000, ffn=11008, name="llama2-7b", **_LLAMA2),
          "llama2-70b": ModelSpec(80, 8192, 64, 4096, 32000, ffn=28672, kv_heads=8, name="llama2-70b", **_LLAMA2)}

PUBLISHED_SOURCE = ("gpt-fast README, 'Tensor Parallelism' table (PyTorch team, https://github.com/pytorch-labs/gpt-fast; "
                    "blog post 'Accelerating Generative AI with PyTorch II: GPT, Fast'): bf16, batch 1, a 5-token "
                    "prompt, 200 new tokens (generate.py's default), tokens/s = new tokens / whole generation, "
                    "8 x A100-80GB power-limited to 330 W")
# (model, tp, tokens/s published), all on the A100-80GB
PUBLISHED = [("llama2-7b", 1, 104.9), ("llama2-7b", 2, 168.84), ("llama2-7b", 4, 254.02), ("llama2-7b", 8, 328.43),
             ("llama2-70b", 2, 21.32), ("llama2-70b", 4, 38.01), ("llama2-70b", 8, 62.50)]
PROMPT, OUTPUT = 5, 200


def request_seconds(m: ModelSpec, hw: Hardware, tp: int, prompt: int = PROMPT, output: int = OUTPUT,
                    algorithm: str = "ring") -> float:
    """One request end to end at batch 1: the prefill makes the first new token, then
    ``output`` - 1 decode steps, the context growing from ``prompt``."""
    total = prefill(m, hw, tp, 1, prompt, algorithm=algorithm).seconds
    for i in range(1, output):
        total += decode_step(m, hw, tp, 1, prompt + i, algorithm=algorithm).seconds
    return total


def against_published(hw: Hardware, algorithm: str = "ring") -> list[dict]:
    """Every ``PUBLISHED`` row beside the prediction on ``hw`` (an A100 preset): tokens/s and
    ms per token, the error (predicted / published - 1), and the weight-read bandwidth per GPU
    the published rate implies (close to gpt-fast's own "memory bandwidth" column)."""
    rows = []
    for name, tp, published in PUBLISHED:
        m = LLAMA2[name]
        pred = OUTPUT / request_seconds(m, hw, tp, algorithm=algorithm)
        rows.append({"model": name, "hardware": hw.name, "tp": tp, "published_tokens_per_s": published,
                     "predicted_tokens_per_s": pred, "published_ms": 1e3 / published, "predicted_ms": 1e3 / pred,
                     "error": (1 / pred) / (1 / published) - 1,
                     "achieved_bandwidth": weight_bytes(m, tp, hw.dtype_bytes) * published})
    return rows


def with_bandwidth(hw: Hardware, bandwidth: float, peak: float | None = None) -> Hardware:
    """``hw`` with a measured memory bandwidth (and matmul rate): this machine's ranks sharing DRAM."""
    return replace(hw, hbm_bandwidth=bandwidth, peak_flops=peak or hw.peak_flops)


def token_seconds(weight_bytes: float, layers: int, hidden: int, tp: int, batch: int, bandwidth: float,
                  peak_flops: float, alpha: float, beta: float, wbytes: float = 2) -> float:
    """A decode step in its simplest form (lab 07, task 7.5): every weight split over ``tp``, no KV
    cache. Each rank reads weight_bytes / tp at ``bandwidth`` and does 2 x batch FLOPs per weight
    it holds at ``peak_flops``, the slower of the two (the roofline); then 2 ring all-reduces per
    layer of the (batch x hidden) activation, wbytes per element, on a link of ``alpha``, ``beta``."""
    read = weight_bytes / tp / bandwidth
    compute = 2 * batch * (weight_bytes / wbytes) / tp / peak_flops
    return max(read, compute) + 2 * layers * cm.allreduce_time("ring", batch * hidden * wbytes, tp, alpha, beta)
