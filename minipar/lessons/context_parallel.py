"""Lesson 6, part 1, on real ranks: ring attention and Ulysses against dense attention.

    from minipar import launch
    out = launch(4, "minipar.lessons.context_parallel:verify")                        # float64, MPI
    out = launch(3, "minipar.lessons.context_parallel:verify", backend="torch", dtypes=("float32",))
    out = launch(4, "minipar.lessons.context_parallel:balance")                      # busy time per rank

Every case draws q, k, v and dout for the whole sequence (the same seeded draw on every rank),
runs the dense reference (``nn.functional.attention_forward/backward``) on all of it, hands each
rank its rows (``SeqLayout.shard``) and compares that rank's output, dq, dk and dv with the same
rows of the dense result. Padded rows are not compared (they are not part of the sequence).

Numerics: float64 against the float64 dense reference to 1e-12 relative (max |got - want| /
max |want|): the online softmax adds the same terms in a different order (block by block,
rescaled by exp(m_old - m_new)), a few ulps. float32 to 1e-5: sums of <= 40 terms of size ~1
and one exp/log per block, each rounding at 6e-8 (measured: ~1e-7).

Beside the numbers, each run is read from its trace and its memory: bytes sent per rank equal
the formula to the byte (``ring.traffic``, ``ulysses.traffic``); every K/V transfer but the last
is in flight while its step computes (overlap); the activations kept for backward are 1/cp of a
one-rank run's; and (NumPy) the peak of everything allocated during forward + backward stays
within a few score blocks, far below one T/cp x T score matrix.
"""
from __future__ import annotations

import tracemalloc

import numpy as np

from .. import nn
from ..collectives import all_reduce
from ..context_parallel import (ContextParallelSelfAttention, SeqLayout, ring_attention_backward,
                                ring_attention_forward, ulysses_attention_backward, ulysses_attention_forward)
from ..context_parallel import ring, ulysses
from ..nn import functional as F
from ..trace import bytes_sent
from ..xp import nbytes, to_numpy
from .common import Checks, expect_error, randomize, rel_error, traced

METHODS = {"ring": (ring_attention_forward, ring_attention_backward, ring.traffic),
           "ulysses": (ulysses_attention_forward, ulysses_attention_backward, ulysses.traffic)}
B, HS = 2, 3  # batch, head size of the checks


def draw(rng, nh, T, hs=HS, b=B):
    """q, k, v, dout: (b, nh, T, hs) each, fresh standard normal draws."""
    return [rng.standard_normal((b, nh, T, hs)) for _ in range(4)]


def run_case(comm, method, layout, arrays, causal, dtype="float64"):
    """Forward + backward of ``method`` on this rank's rows; returns (results, fwd events, bwd events, ctx)."""
    fwd, bwd, _ = METHODS[method]
    q, k, v, dout = (comm.asarray(layout.shard(a, comm.rank).astype(dtype)) for a in arrays)
    (out, ctx), ev_f = traced(comm, fwd, comm, q, k, v, layout, causal)
    grads, ev_b = traced(comm, bwd, comm, dout, ctx)
    return (out, *grads), ev_f, ev_b, ctx


def check_case(ch, method, kind, T, nh, causal, rng):
    """One row: output, dq, dk, dv of this rank's real rows against the dense result."""
    comm = ch.comm
    arrays = draw(rng, nh, T)
    y, dctx = F.attention_forward(*arrays[:3], causal=causal)
    want = (y, *F.attention_backward(arrays[3], dctx))
    lay = SeqLayout(T, comm.size, kind)
    got, ev_f, ev_b, ctx = run_case(comm, method, lay, arrays, causal, ch.dtype)
    rows = lay.real_rows(comm.rank)
    pos = lay.positions(comm.rank)[rows]
    errs = [max(rel_error(to_numpy(g)[..., rows, :], w[..., pos, :]) for g, w in zip(got, want))]
    pad = f", padded to {lay.padded}" if lay.padded != T else ""
    ch.flag(f"{method} {kind} {'causal' if causal else 'full'} T={T}{pad}, {nh} heads: out, dq, dk, dv",
            max(errs), _tol(ch))
    return lay, ev_f, ev_b, ctx


def _tol(ch):
    return {"float64": 1e-12, "float32": 1e-5}[ch.dtype]


def ctx_bytes(ctx):
    """Bytes of the arrays an attention ctx keeps alive until backward."""
    return sum(nbytes(a) for a in ctx if hasattr(a, "shape"))


def overlapped(events, phase, p):
    """How many of the steps 0 .. p-2 computed while an irecv posted before them was still open."""
    steps = sorted((e for e in events if e.kind == "compute" and e.name.startswith(f"ring_attention:{phase} step")),
                   key=lambda e: e.t_start)
    recvs = [e for e in events if e.kind == "irecv"]
    return sum(any(r.t_start <= s.t_start and r.t_end >= s.t_end for r in recvs) for s in steps[:p - 1])


def peak_bytes(fn, *args):
    """(fn(*args), peak bytes allocated above the starting point while it ran). tracemalloc
    sees NumPy's buffers (not torch's): the instrument of the no-T x T-matrix check."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        out = fn(*args)
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- the drivers


def verify(comm, dtypes=("float64",), seed=0):
    """Every check on this world size, per dtype (see the module docstring); float32 rows
    are named "float32: ..."."""
    return [{**r, "what": ("" if dtype == "float64" else f"{dtype}: ") + r["what"]}
            for dtype in dtypes for r in verify_dtype(comm, dtype, seed)]


def verify_dtype(comm, dtype="float64", seed=0):
    p, ch = comm.size, Checks(comm, dtype)
    rng = np.random.default_rng([seed, 6])
    even, odd = 4 * p, 4 * p + 3  # 4p splits into 2p chunks; 4p+3 needs padding

    # 1. every method, split, mask and length against dense attention
    runs = {}
    for kind in ("zigzag", "contiguous"):
        for causal in (True, False):
            for T in (even, odd):
                runs["ring", kind, causal, T] = check_case(ch, "ring", kind, T, 2, causal, rng)
    for kind, causal, T in (("contiguous", True, even), ("contiguous", False, odd), ("zigzag", True, odd)):
        runs["ulysses", kind, causal, T] = check_case(ch, "ulysses", kind, T, 2 * p, causal, rng)

    # 2. traffic per rank (from the trace) against the formula, to the byte
    for key, nh in ((("ring", "zigzag", True, even), 2), (("ulysses", "contiguous", True, even), 2 * p)):
        method, (lay, ev_f, ev_b, _) = key[0], runs[key]
        want = METHODS[method][2](lay, B, nh, HS, np.dtype(dtype).itemsize)
        for phase, ev in (("forward", ev_f), ("backward", ev_b)):
            got = bytes_sent(ev, comm.world_rank(comm.rank))
            ch.flag(f"{method} {phase}: {got} B sent per rank = formula {want[phase]} B", abs(got - want[phase]))

    # 3. overlap: the next K/V block is on its way while the current one is used
    lay, ev_f, ev_b, ctx = runs["ring", "zigzag", True, even]
    for phase, ev in (("forward", ev_f), ("backward", ev_b)):
        n = overlapped(ev, phase, p)
        ch.flag(f"ring {phase}: {n} of {p - 1} steps compute while the next block travels", p - 1 - n)

    # 4. activations kept for backward: 1/cp of the same attention on one rank
    one = comm.split(comm.rank, name="self")  # a one-rank communicator
    full = [comm.asarray(a.astype(dtype)) for a in draw(rng, 2, even)]
    _, ctx1 = ring_attention_forward(one, *full[:3], SeqLayout(even, 1), True)
    mine, whole = ctx_bytes(ctx), ctx_bytes(ctx1)
    _, dctx = F.attention_forward(*full[:3])
    dense = ctx_bytes(dctx)
    ch.flag(f"ring activations per rank {mine} B = one rank's {whole} B / {p} (dense attention keeps {dense} B)",
            abs(mine * p - whole))
    if dtype == "float64" and isinstance(full[0], np.ndarray):  # tracemalloc sees NumPy's buffers only
        memory_rows(ch, rng)

    # 5. the attention layer of a transformer block, its sequence split over the ranks
    layer_rows(ch, rng, dtype)

    # 6. what is refused, with one clear line
    if p > 1:
        q = comm.asarray(rng.standard_normal((1, p + 1, SeqLayout(p, p).local, 2)))
        expect_error(ch, f"Ulysses with n_heads={p + 1}",
                     lambda: ulysses_attention_forward(comm, q, q, q, SeqLayout(p, p)), f"n_heads={p + 1}", f"cp={p}")
        expect_error(ch, "a layout for another cp", lambda: ring_attention_forward(comm, q, q, q, SeqLayout(p, p + 1)),
                     f"cp={p + 1}")
    expect_error(ch, "seq_len=0", lambda: SeqLayout(0, p), "seq_len=0")
    return ch.rows


def memory_rows(ch, rng, nh=1, hs=1, chunk=48):
    """Peak bytes allocated during ring forward + backward (NumPy buffers, seen by tracemalloc)
    against a bound of 6 score blocks (c x c per head: a step holds a few of them at once) and
    24 K-sized arrays (the K|V and dK|dV slots, q, k, v, out, the gradients). One T/cp x T score
    matrix is 4cp blocks by itself: from cp = 2 on it cannot fit under the bound."""
    comm, p = ch.comm, ch.comm.size
    T = 2 * p * chunk
    lay = SeqLayout(T, p, "zigzag")
    q, k, v, dout = (lay.shard(a, comm.rank) for a in draw(rng, nh, T, hs, 1))
    was, comm.tracer.enabled = comm.tracer.enabled, False
    try:
        _, peak = peak_bytes(lambda: ring_attention_backward(comm, dout, ring_attention_forward(comm, q, k, v, lay)[1]))
    finally:
        comm.tracer.enabled = was
    block = nh * chunk * chunk * 8
    bound, wide = 6 * block + 24 * nbytes(q), nh * lay.local * T * 8
    # a bound, not a value: the row's error is the relative excess over it (0 when the peak is under)
    ch.flag(f"ring peak allocation <= 6 score blocks + 24 K = {bound} B (a T/cp x T score alone: {wide} B)",
            max(peak / bound - 1.0, 0.0))


def layer_rows(ch, rng, dtype):
    """ContextParallelSelfAttention (ring and Ulysses) against nn.CausalSelfAttention: output,
    input gradient, and the weight gradients summed over the cp group. T = 2cp + 1 (padded)."""
    comm = ch.comm
    nh, T = 2 * comm.size, 2 * comm.size + 1
    C = 2 * nh
    dense = randomize(nn.CausalSelfAttention(C, nh, rng), rng)
    x, dy = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    y, ctx = dense.forward(x)
    dx = dense.backward(dy, ctx)
    want = dict(dense.named_grads())
    for method in ("ring", "ulysses"):
        layer = ContextParallelSelfAttention(comm, dense, T, method).to(comm.asarray(np.zeros(1, dtype)))
        layer.zero_grad()
        lay, A = layer.layout, lambda a: comm.asarray(lay.shard(a, comm.rank, axis=1).astype(dtype))  # noqa: E731
        rows = lay.real_rows(comm.rank)
        pos = lay.positions(comm.rank)[rows]
        yl, c = layer.forward(A(x))
        dxl = layer.backward(A(dy), c)
        errs = [rel_error(to_numpy(yl)[:, rows], y[:, pos]), rel_error(to_numpy(dxl)[:, rows], dx[:, pos])]
        errs += [rel_error(all_reduce(comm, g), want[name]) for name, g in layer.named_grads()]
        ch.flag(f"CP attention layer ({method}, T={T}): output, dx, weight grads summed over cp", max(errs), _tol(ch))


def against_torch(comm, seed=0, T=None, nh=2):
    """PyTorch's own context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
    on the torch backend: {"rows": checks, "sdpa": "ran" or why it did not}.

    The layout is compared on any device: inside ``context_parallel(mesh, buffers=[x])`` torch
    shards x in place with its head-tail load balancer, and rank r's shard must be exactly our
    zigzag rows. Its attention is compared where it runs: on CPU, SDPA dispatches to
    ``aten._scaled_dot_product_flash_attention_for_cpu``, for which CP registers no sharding
    strategy (it handles the CUDA flash / efficient / cuDNN kernels only), so the call raises and
    the reason is returned instead.
    """
    import torch
    import torch.nn.functional as tF
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    ch, p = Checks(comm, "float64"), comm.size
    T = T or 4 * p
    rng = np.random.default_rng([seed, 7])
    q, k, v, _ = (torch.tensor(a) for a in draw(rng, nh, T))
    lay = SeqLayout(T, p, "zigzag")
    mine = [lay.shard(a, comm.rank) for a in (q, k, v)]
    mesh = init_device_mesh("cpu", (p,))
    status = "ran"
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        ch.flag(f"torch context_parallel shards T={T} like our zigzag layout (bitwise)",
                max(rel_error(a, b) for a, b in zip((q, k, v), mine)), 0.0)
        try:
            y = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
        except (NotImplementedError, RuntimeError) as err:
            status = f"{type(err).__name__}: {err}"
    if status == "ran":
        ours, _ = ring_attention_forward(comm, *mine, lay, True)
        ch.add("torch context_parallel attention = ours", y, ours)
    return {"rows": ch.rows, "sdpa": status}


def tour(comm, seed=0):
    """The lesson's checks in float64."""
    return verify(comm, ("float64",), seed)


# --------------------------------------------------------------------------- for the figures


def ring_schedule(comm, T=None):
    """Which rank's K/V block each rank held in each forward step, read from the trace of a
    real run: [(step, kv owner)] of this rank."""
    T = T or 4 * comm.size
    rng = np.random.default_rng(0)
    lay = SeqLayout(T, comm.size, "zigzag")
    _, ev, _, _ = run_case(comm, "ring", lay, draw(rng, 2, T), True)
    steps = [e.name.split() for e in ev if e.kind == "compute"]
    return [(int(s[2]), int(s[3][2:])) for s in steps]


def traffic_table(comm, T=512, nh=8, hs=16, dtype="float32"):
    """Bytes this rank sent in one attention layer's forward and backward, ring (zigzag) and
    Ulysses, measured from the trace, beside each method's formula."""
    arrays = draw(np.random.default_rng(2), nh, T, hs, 1)
    out = {}
    for method, kind in (("ring", "zigzag"), ("ulysses", "contiguous")):
        lay = SeqLayout(T, comm.size, kind)
        _, ev_f, ev_b, _ = run_case(comm, method, lay, arrays, True, dtype)
        me = comm.world_rank(comm.rank)
        out[method] = {"forward": bytes_sent(ev_f, me), "backward": bytes_sent(ev_b, me),
                       "formula": METHODS[method][2](lay, 1, nh, hs, np.dtype(dtype).itemsize)}
    return out


def balance(comm, T=None, nh=4, hs=64):
    """Ring forward + backward of one causal sequence, split zigzag and contiguous: this rank's
    compute regions [(name, start, end)] (perf_counter seconds, one clock for the whole host),
    the seconds it computed, and the seconds from its first event to its last (after a warm-up
    run). Computing less than the others shows up as time spent waiting for them."""
    T = T or 256 * comm.size
    arrays = draw(np.random.default_rng(1), nh, T, hs, 1)
    out = {}
    for kind in ("contiguous", "zigzag"):
        lay = SeqLayout(T, comm.size, kind)
        for _ in range(2):  # the first run warms up
            comm.barrier()
            _, ev_f, ev_b, _ = run_case(comm, "ring", lay, arrays, True)
        ev = ev_f + ev_b
        regions = [(e.name, e.t_start, e.t_end) for e in ev if e.kind == "compute"]
        out[kind] = {"regions": regions, "busy": sum(b - a for _, a, b in regions),
                     "wall": max(e.t_end for e in ev) - min(e.t_start for e in ev)}
    return out
