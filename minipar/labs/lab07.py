"""Lab 07 (which strategy when): the tasks and their checks.

The six tasks are pieces of the planner (``minipar.plan``), graded in one process
(``sizes=(1,)``) against the planner itself on many cases, smallest first. When a wrong answer
equals what a typical mistake gives, the message names the mistake:

* 7.1 ``activation_bytes``: one block's activations per micro-batch (Korthikanti et al. 2022),
  against ``plan.memory.stored_activations``;
* 7.2 ``peak_inflight``: the activations each rank holds at most, counted from the schedule's
  actions, against ``pipeline.schedules.inflight_profile`` (the count the planner's generators
  bound); hand-made schedules no formula describes are among the cases;
* 7.3 ``dp_all_reduce_time``: the hierarchical all-reduce on a two-level network, against
  ``plan.timing.dp_collective``;
* 7.4 ``choose_config``: a search with the planner's ``predict`` handed in (``lab07_choose``);
* 7.5 ``decode_time``: one decode step at TP = t, the memory-bandwidth roofline plus the
  all-reduces, against ``plan.inference.token_seconds``;
* 7.6 ``model_params``: the parameters of today's shapes (GQA, SwiGLU, RMSNorm, untied output),
  against ``plan.models.ModelSpec.params`` (``lab07_params``).

The planner is the grader's reference, not the learner's tool: a graded function that calls into
``minipar.plan``, the pipeline's in-flight counters or the lab's reference solution is refused,
whatever it returns (``sys.setprofile`` watches the call, ``lab07_reference``). The ``predict`` of 7.4
is the one door.
"""
from __future__ import annotations

import math

import numpy as np

from .. import plan  # noqa: F401  imported before any graded call: the watch sees calls, not imports
from ..comm.link import LINKS
from ..lessons.planning import hierarchical_time
from ..pipeline import gpipe, interleaved_1f1b, naive, one_f_one_b, zero_bubble_h1
from ..pipeline.schedules import Action, inflight_profile
from ..plan.inference import token_seconds
from .grader import Task
from .lab07_params import PARAMS_HINTS
from .lab07_reference import Watch, call_watched, reference_activation_bytes, refused

TITLE = "which strategy when: the planner's memory, pipeline, network and search"
HERE = "minipar.labs.lab07"

TASKS = [
    Task("7.1", "activation bytes of a block", "activation_bytes", f"{HERE}:check_activation_bytes", sizes=(1,)),
    Task("7.2", "in flight per rank", "peak_inflight", f"{HERE}:check_peak_inflight", sizes=(1,)),
    Task("7.3", "two-level all-reduce time", "dp_all_reduce_time", f"{HERE}:check_dp_all_reduce_time", sizes=(1,)),
    Task("7.4", "choose a configuration", "choose_config", "minipar.labs.lab07_choose:check_choose_config", sizes=(1,),
         budget=20),  # 1.3 s
    Task("7.5", "per-token decode time at TP = t", "decode_time", f"{HERE}:check_decode_time", sizes=(1,)),
    Task("7.6", "parameters of today's models", "model_params", "minipar.labs.lab07_params:check_model_params",
         sizes=(1,)),
]

# Hints, stage by stage (`minipar check 07 --hint 7.1`): a nudge naming the idea and what to read,
# the shape of the computation, then near-pseudocode. The answer: `minipar lab solution 07 --task 7.1`.
HINTS = {
    "7.1": (
        """Korthikanti et al. 2022 (section 4), term by term: a block keeps sbh (34 + 5as/h) bytes.
        Tensor parallelism splits all but 10 sbh of it (the two LayerNorm inputs, the QKV and fc1
        inputs, the two dropout masks); the README's table lists every term.""",
        """whole = 10 sbh (4 + 2 + 2 + 1 + 1); split = 24 sbh (Q, K, V and the projection's input,
        2 sbh each; the GeLU input and fc2's input, 8 sbh each); scores = 5 as^2 b (the softmax
        output 2, its dropout mask 1, the dropout output 2). Selective drops the scores; full keeps
        only 2 sbh (split by t with sp). With sp everything is split by t; without, whole + (split +
        scores) / t.""",
        """
        if recompute == "full": return 2 * sbh / (t if sp else 1)
        if recompute == "selective": scores = 0
        return (whole + split + scores) / t if sp else whole + (split + scores) / t
        """,
    ),
    "7.2": (
        """Walk each rank's actions, keeping the set of (stage, microbatch) whose activations are
        held: an F adds one, a B frees it (with a split backward the I keeps it and the W frees it).
        The answer is the largest size the set reaches.""",
        """Per rank: held = set(), most = 0; for stage, kind, mb in ops: "F" -> held.add((stage, mb));
        "B" or "W" -> held.discard((stage, mb)); most = max(most, len(held)). One int per rank.""",
        """
        out = []
        for ops in actions:
            held, most = set(), 0
            for stage, kind, mb in ops:
                if kind == "F": held.add((stage, mb))
                elif kind in ("B", "W"): held.discard((stage, mb))
                most = max(most, len(held))
            out.append(most)
        return out
        """,
    ),
    "7.3": (
        """Three rings, each on its own link: a reduce-scatter inside each node (k ranks, intra), an
        all-reduce across the nodes of the 1/k each rank holds (n/k ranks, inter), an all-gather
        inside the node (intra). Count a ring's steps and the size of each step's message.""",
        """k = min(n, per_node); a reduce-scatter or all-gather over p ranks of m bytes on (alpha, beta):
        ring(p, m) = (p-1) alpha + (p-1)/p m beta; an all-reduce is twice that (minipar.costmodel's
        ring formulas are allowed). On one node the across term is 0 (n/k = 1).""",
        """
        k = min(n, per_node)
        return ring(k, nbytes, *intra) + 2 * ring(n // k, nbytes / k, *inter) + ring(k, nbytes, *intra)
        """,
    ),
    "7.4": (
        """A search: every valid (tp, pp, dp, microbatch, recompute) through predict, keeping the
        fastest whose memory_bytes fits capacity_bytes (ties: the smaller memory). The docstring lists
        the rules a configuration must follow.""",
        """tp over the divisors of gpus_per_node that divide gpus, heads and ffn; pp over the divisors
        of layers with gpus % (tp * pp) == 0; dp = gpus // (tp * pp); microbatch over the divisors of
        batch with batch % (dp * microbatch) == 0; recompute in ("none", "selective", "full").
        Compare (est.step_s, est.memory_bytes); None if nothing fits.""",
        """
        best = None
        for tp, pp, dp, mb, rec in the valid configurations:
            est = predict(tp, pp, dp, mb, rec)
            if est.memory_bytes <= job["capacity_bytes"] and (best is None or (est.step_s, est.memory_bytes) < best key):
                best = dict(tp=tp, pp=pp, dp=dp, microbatch=mb, recompute=rec), with its key
        return best
        """,
    ),
    "7.5": (
        """Decoding one token reads every weight once and does 2 FLOPs per weight and sequence: at
        small batch it is bound by memory bandwidth, not by compute (the roofline). With
        tensor parallelism each rank reads only its 1/t of the weights; what TP adds is the
        all-reduce of each layer's output, a (batch x hidden) activation, not of any weight.""",
        """read = weight_bytes / t / bandwidth; compute = 2 x batch x (weight_bytes / dtype_bytes) / t
        / peak_flops; the step takes the slower of the two (the roofline). Then 2 all-reduces per
        layer (attention, MLP), each a ring over t ranks of n = batch x hidden x dtype_bytes bytes:
        2 (t-1) alpha + 2 (t-1)/t n beta (0 when t = 1).""",
        """
        n = batch * hidden * dtype_bytes
        ring = 2 * (t - 1) * alpha + 2 * (t - 1) / t * n * beta
        return max(read, compute) + 2 * layers * ring
        """,
    ),
    **PARAMS_HINTS,
}


def close(got, want, rel=1e-12) -> bool:
    try:
        return math.isclose(float(got), float(want), rel_tol=rel, abs_tol=1e-300)
    except (TypeError, ValueError):
        return False


def hint(got, mistakes: dict) -> str:
    """'; you computed <the first mistake whose value equals got>' or ''."""
    for text, value in mistakes.items():
        if value is not None and close(got, value, 1e-9):
            return f"; you computed {text}"
    return ""


# ---------------------------------------------------------------- 7.1: activation bytes of a block

ACT_CASES = [  # (s, b, h, a, t, sp, recompute), smallest first
    (4, 1, 12, 2, 1, False, "none"),
    (4, 2, 12, 2, 2, False, "none"),
    (4, 2, 12, 2, 2, True, "none"),
    (6, 3, 12, 3, 3, False, "selective"),
    (6, 3, 12, 3, 3, True, "selective"),
    (8, 1, 16, 4, 4, False, "full"),
    (8, 2, 16, 4, 4, True, "full"),
    (2048, 4, 6144, 64, 8, False, "none"),       # Korthikanti's 22B, Table 3
    (2048, 1, 12288, 96, 8, True, "selective"),  # GPT-3 175B, Table 3
    (2048, 1, 20480, 128, 8, True, "full"),      # 530B
    (4096, 2, 8192, 64, 4, True, "none"),
]


def activation_mistakes(s, b, h, a, t, sp, rec) -> dict:
    """{what the typical mistake is: the bytes it gives} for one case."""
    ref = reference_activation_bytes
    sbh = s * b * h
    out = {}
    if sp and t > 1 and rec != "full":
        out["no split of the 10 sbh that tensor parallelism leaves whole (LayerNorm inputs, QKV and fc1 inputs, "
            "dropout masks): with sequence parallelism each rank holds s/t of the sequence there, so they are "
            "split by t too"] = ref(s, b, h, a, t, False, rec)
    if not sp and t > 1:
        out["everything split by t: without sequence parallelism the 10 sbh of LayerNorm inputs, QKV and fc1 "
            "inputs and dropout masks stay whole on every tensor-parallel rank"] = ref(s, b, h, a, t, True, rec)
    if t > 1 and rec != "full":
        out["nothing split by t: tensor parallelism splits Q, K, V, the scores, the projection input and the "
            "MLP's 4h-wide activations over t ranks"] = ref(s, b, h, a, 1, False, rec)
    if rec == "none":
        out["no attention scores: without recomputation the softmax output, its dropout mask and the dropout "
            "output are kept, 5as^2b bytes (/t)"] = ref(s, b, h, a, t, sp, "selective")
    if rec == "selective":
        out["the scores kept: selective recomputation drops exactly the 5as^2b of softmax, its mask and "
            "dropout, and recomputes them in the backward"] = ref(s, b, h, a, t, sp, "none")
    if rec == "full":
        out["everything kept: full recomputation keeps only each block's input, 2sbh (/t with sequence "
            "parallelism), and rebuilds the rest in the backward"] = ref(s, b, h, a, t, sp, "none")
        out["nothing kept: full recomputation still keeps the block's input, 2sbh (/t with sequence "
            "parallelism), to run the forward again from"] = 0.0
        if sp and t > 1:
            out["the whole block input: with sequence parallelism a rank holds s/t of it, 2sbh/t"] = 2.0 * sbh
    out["no dropout masks: Megatron's GPT has dropout, 1 byte per element (sbh after attention and MLP, "
        "as^2b on the scores) plus the scores' dropout output"] = _no_dropout(s, b, h, a, t, sp, rec)
    if b > 1:
        out["one sequence: every activation grows with the micro-batch b"] = ref(s, 1, h, a, t, sp, rec)
    return out


def _no_dropout(s, b, h, a, t, sp, rec) -> float:
    from ..plan import ModelSpec, Problem, preset
    from ..plan.memory import stored_activations

    prob = Problem(ModelSpec(1, h, a, s, 0, dropout=False), 1, 1, preset("a100-80gb"), 1)
    return float(stored_activations(prob, b, t, 1, np.array(sp), np.array(rec)))


def check_activation_bytes(comm, fn):
    watch = Watch()
    for s, b, h, a, t, sp, rec in ACT_CASES:
        call = f"activation_bytes(s={s}, b={b}, h={h}, a={a}, t={t}, sp={sp}, recompute={rec!r})"
        got, calls = call_watched(fn, s, b, h, a, t, sp, rec, watch=watch)
        if calls:
            return refused("activation_bytes", calls, "count the block's activations yourself (README: the table)")
        want = reference_activation_bytes(s, b, h, a, t, sp, rec)
        if close(got, want):
            continue
        return [f"{call} = {got}, expected {want:.12g} bytes = {want / (s * b * h):.6g} sbh"
                + hint(got, activation_mistakes(s, b, h, a, t, sp, rec))]
    return []


# ---------------------------------------------------------------- 7.2: activations in flight

def eager_1f1b(p, m, extra=1):
    """1F1B with ``extra`` more warm-up forwards on every rank (valid, and holds more)."""
    out = []
    for r in range(p):
        warm = min(p - 1 - r + extra, m)
        ops = [Action(r, "F", i) for i in range(warm)]
        for i in range(m - warm):
            ops += [Action(r, "F", warm + i), Action(r, "B", i)]
        out.append(ops + [Action(r, "B", i) for i in range(m - warm, m)])
    return out


def lifo_gpipe(p, m):
    """GPipe with its backwards last in, first out."""
    return [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in reversed(range(m))] for r in range(p)]


def inflight_cases():
    """(label, p, m, v, actions), smallest first."""
    out = [(f"{s.name} p={s.ranks} m={s.microbatches} v={s.chunks}", s.ranks, s.microbatches, s.chunks, s.actions)
           for s in (naive(2), gpipe(2, 3), one_f_one_b(1, 3), one_f_one_b(3, 2), one_f_one_b(4, 8))]
    out += [("1f1b with one more warm-up forward, p=4 m=6 v=1", 4, 6, 1, eager_1f1b(4, 6)),
            ("gpipe with backwards last-in first-out, p=3 m=4 v=1", 3, 4, 1, lifo_gpipe(3, 4))]
    out += [(f"{s.name} p={s.ranks} m={s.microbatches} v={s.chunks}", s.ranks, s.microbatches, s.chunks, s.actions)
            for s in (interleaved_1f1b(2, 4, 2), interleaved_1f1b(3, 3, 3), zero_bubble_h1(4, 6), zero_bubble_h1(3, 2))]
    return out


def _count(ops, key=lambda a: (a.stage, a.microbatch), frees="BW"):
    """The most activations held at once on one rank, counted with a rule (the hints' variants)."""
    held, most = set(), 0
    for a in ops:
        if a.kind == "F":
            held.add(key(a))
        elif a.kind in frees:
            held.discard(key(a))
        most = max(most, len(held))
    return most


def inflight_mistakes(p, m, v, actions) -> dict:
    def per_rank(**kw):
        return [_count(ops, **kw) for ops in actions]

    return {  # the most specific first: several mistakes can give the same counts
        "the activations freed at I: after a split backward W still needs the stage's saved inputs": per_rank(frees="BIW"),
        "only B frees: with a split backward (I, then W) it is W that frees": per_rank(frees="B"),
        "micro-batches, not (stage, micro-batch) pairs: with v chunks per rank one micro-batch is held "
        "once in each chunk it has entered": per_rank(key=lambda a: a.microbatch),
        "1F1B's formula min(p - r, m), not this schedule's count: walk the actions (F adds a stage's "
        "micro-batch, B or W frees it)": [min(p - r, m) for r in range(p)],
        "every micro-batch held to the end (m per chunk, GPipe's count): a backward frees its "
        "micro-batch, so 1F1B holds min(p - r, m)": [m * v] * p,
    }


def check_peak_inflight(comm, fn):
    watch = Watch()
    for label, p, m, v, actions in inflight_cases():
        want = [max(inflight_profile(ops), default=0) for ops in actions]
        got, calls = call_watched(fn, [list(ops) for ops in actions], watch=watch)
        if calls:
            return refused("peak_inflight", calls, "count from the actions yourself")
        if isinstance(got, (int, np.integer)):
            return [f"peak_inflight for {label} returned {got}, one number: return one count per rank, a list of "
                    f"p={p} ints (expected {want})"]
        try:
            got = [int(x) for x in got]
        except (TypeError, ValueError):
            return [f"peak_inflight for {label} returned {got!r}, expected a list of p={p} ints: {want}"]
        if got == want:
            continue
        if len(got) != p:
            return [f"peak_inflight for {label} returned {len(got)} counts, expected one per rank: p={p} ({want})"]
        r = next(r for r in range(p) if got[r] != want[r])
        ops = " ".join(map(str, actions[r]))
        msg = (f"peak_inflight for {label}: rank {r} holds at most {want[r]} activations, you said {got[r]} "
               f"(all ranks: expected {want}, got {got}); rank {r} runs {ops}")
        for text, value in inflight_mistakes(p, m, v, actions).items():
            if got == value:
                return [msg + f"; you computed {text}"]
        return [msg]
    return []


# ---------------------------------------------------------------- 7.3: a two-level all-reduce

def _ab(name):
    lk = LINKS[name]
    return (lk.alpha, 1 / lk.bandwidth)


MACHINE = (7.07e-4, 1 / 0.68e9)  # this machine under load: a 707 us ping-pong, 0.68 GB/s
AR_CASES = [  # (label, bytes, n, per node, intra, inter), smallest first
    ("one rank", 1 << 20, 1, 8, _ab("nvlink"), _ab("infiniband")),
    ("2 ranks in one node", 1 << 20, 2, 8, _ab("nvlink"), _ab("infiniband")),
    ("8 ranks, one node", 3 << 20, 8, 8, _ab("nvlink"), _ab("infiniband")),
    ("16 ranks on 2 nodes", 1 << 24, 16, 8, _ab("nvlink"), _ab("infiniband")),
    ("4 ranks, one per node", 1 << 22, 4, 1, _ab("nvlink"), _ab("ethernet")),
    ("6 ranks on 3 nodes of 2", 6 << 20, 6, 2, _ab("pcie"), _ab("ethernet")),
    ("64 ranks on 8 nodes, 7.5B parameters' fp16 gradients", 2 * 7_500_000_000, 64, 8, _ab("nvlink"), _ab("infiniband")),
    ("32 ranks on 8 nodes of 4, tiny message", 4096, 32, 4, _ab("nvlink4"), _ab("infiniband-ndr")),
    ("4 ranks on 2 'nodes' of this machine", 1 << 21, 4, 2, MACHINE, _ab("ethernet")),
]


def all_reduce_mistakes(N, n, k, intra, inter) -> dict:
    (ai, bi), (ao, bo) = intra, inter
    k = min(n, k)
    nodes = n // k

    def ring(p, nbytes, a, b):  # ring all-reduce: a reduce-scatter and an all-gather
        return 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes * b

    def half(p, nbytes, a, b):
        return (p - 1) * a + (p - 1) / p * nbytes * b

    inside = 2 * half(k, N, ai, bi)
    out = {
        f"a flat ring across the nodes: 2(n-1) = {2 * (n - 1)} steps and 2(n-1)/n of the bytes on the inter-node "
        f"link; hierarchically only N/k crosses it, in 2(nodes-1) = {2 * (nodes - 1)} steps": ring(n, N, ao, bo),
        "each ring all-reduce as one pass, (p-1)/p: it is a reduce-scatter and an all-gather, 2(p-1)/p":
            inside / 2 + half(nodes, N / k, ao, bo),
        "no latency: every ring step also pays alpha": hierarchical_time(N, n, k, (0.0, bi), (0.0, bo)),
    }
    if nodes > 1:
        out.update({
            "a flat ring on the intra-node link: the messages between nodes go over the inter-node link":
                ring(n, N, ai, bi),
            "the whole N across the nodes: after the reduce-scatter inside the node each rank holds N/k, and only "
            "that crosses the network": inside + ring(nodes, N, ao, bo),
            f"the inter-node all-reduce over all n = {n} ranks: it runs among the {nodes} ranks that hold the same "
            f"shard, one per node": inside + ring(n, N / k, ao, bo),
            "no all-gather inside the node at the end: after the inter-node all-reduce each rank holds only its "
            "1/k of the sum": half(k, N, ai, bi) + ring(nodes, N / k, ao, bo),
        })
    return out


def check_dp_all_reduce_time(comm, fn):
    watch = Watch()
    for label, N, n, k, intra, inter in AR_CASES:
        call = f"dp_all_reduce_time(nbytes={N}, n={n}, per_node={k}, intra={intra}, inter={inter})"
        got, calls = call_watched(fn, N, n, k, intra, inter, watch=watch)
        if calls:
            return refused("dp_all_reduce_time", calls, "add up the three rings yourself (minipar.costmodel may help)")
        want = hierarchical_time(N, n, k, intra, inter)
        if close(got, want):
            continue
        return [f"{label}: {call} = {got}, expected {want:.9g} s" + hint(got, all_reduce_mistakes(N, n, k, intra, inter))]
    return []


# ---------------------------------------------------------------- 7.5: a decode step at TP = t

_A100 = (2.039e12, 312e12 * 0.71, 3e-6, 1 / (300e9 * 0.82))  # bandwidth, usable peak, NVLink alpha and beta
_H100 = (3.35e12, 989e12 * 0.71, 3e-6, 1 / (450e9 * 0.82))
_HERE = (5.0e9, 1.5e10, 1.4e-5, 2e-10)  # this machine: one core's DRAM share, float64 matmul, shared memory
DECODE_CASES = [  # (label, weight_bytes, layers, hidden, t, batch, (bandwidth, peak, alpha, beta), dtype_bytes), smallest first
    ("lesson 05's GPT, d = 1024, one rank of this machine", 8.05e8, 8, 1024, 1, 1, _HERE, 8),
    ("the same GPT at TP = 2", 8.05e8, 8, 1024, 2, 1, _HERE, 8),
    ("Llama 2 7B on one A100", 13.5e9, 32, 4096, 1, 1, _A100, 2),
    ("Llama 2 7B at TP = 2 on A100s", 13.5e9, 32, 4096, 2, 1, _A100, 2),
    ("Llama 2 7B at TP = 8 on A100s", 13.5e9, 32, 4096, 8, 1, _A100, 2),
    ("Llama 2 7B at TP = 2, batch 512 (past the ridge point: compute-bound)", 13.5e9, 32, 4096, 2, 512, _A100, 2),
    ("Llama 2 70B at TP = 8 on H100s, batch 16", 1.38e11, 80, 8192, 8, 16, _H100, 2),
]


def decode_mistakes(W, L, h, t, B, machine, w) -> dict:
    """{what the typical mistake is: the seconds it gives} for one case."""
    bw, peak, alpha, beta = machine
    read, compute = W / t / bw, 2 * B * (W / w) / t / peak
    ring = lambda n: 2 * (t - 1) * alpha + 2 * (t - 1) / t * n * beta if t > 1 else 0.0  # noqa: E731
    comm = 2 * L * ring(B * h * w)
    return {  # the most specific first: several mistakes can give the same seconds
        "compute-bound arithmetic, FLOPs / peak: at this batch a decode step does 2 FLOPs per weight it reads, "
        "far below the ridge point, so reading the weights at the memory bandwidth takes longer": compute + comm,
        "every rank reading all the weights: with tensor parallelism each rank holds and reads only its 1/t "
        "of every matrix, which is why TP cuts the per-token time": max(W / bw, compute) + comm,
        "an all-reduce of the whole weight: TP all-reduces each layer's output, a (batch x hidden) activation "
        "of a few KB, never a weight": max(read, compute) + 2 * L * ring(W),
        "memory time + compute time: the roofline takes the slower of the two, they overlap":
            read + compute + comm,
        "the memory time only: past the ridge point (batch x 2 / dtype_bytes FLOPs per byte > peak / bandwidth) "
        "the FLOPs take longer than the reading": read + comm,
        "no all-reduce: each layer's attention and MLP outputs are partial sums, all-reduced over the t ranks":
            max(read, compute),
        "one all-reduce per layer: there are two, after the attention and after the MLP": max(read, compute) + comm / 2,
    }


def check_decode_time(comm, fn):
    watch = Watch()
    for label, W, L, h, t, B, machine, w in DECODE_CASES:
        bw, peak, alpha, beta = machine
        call = (f"decode_time(weight_bytes={W:g}, layers={L}, hidden={h}, t={t}, batch={B}, bandwidth={bw:g}, "
                f"peak_flops={peak:g}, alpha={alpha:g}, beta={beta:g}, dtype_bytes={w})")
        got, calls = call_watched(fn, W, L, h, t, B, bw, peak, alpha, beta, w, watch=watch)
        if calls:
            return refused("decode_time", calls, "write the roofline and the all-reduces yourself")
        want = token_seconds_of_case(W, L, h, t, B, machine, w)
        if close(got, want):
            continue
        return [f"{label}: {call} = {got}, expected {want:.9g} s" + hint(got, decode_mistakes(W, L, h, t, B, machine, w))]
    return []


def token_seconds_of_case(W, L, h, t, B, machine, w) -> float:
    """The answer to one of ``DECODE_CASES`` (without its label)."""
    return token_seconds(W, L, h, t, B, *machine, w)
