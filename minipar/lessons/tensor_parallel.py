"""Lesson 2 on real ranks: every tensor-parallel piece against the dense single-process model.

    from minipar import launch
    out = launch(4, "minipar.lessons.tensor_parallel:tour")                        # float64, MPI
    out = launch(2, "minipar.lessons.tensor_parallel:verify", backend="torch", dtypes=("float32",))
    out = launch(2, "minipar.lessons.tensor_parallel:against_torch_tp", backend="torch")

Every check builds the dense model from a seeded rng (the same draw on every rank), slices it
into this rank's shards, runs forward and backward on both, and compares the output, the input
gradient and every weight-gradient shard with the same slice of the dense result. It also reads
the trace: how many all-reduces the forward and the backward of each layer issued.

Numerics: the dense reference always computes in float64. A float64 run must match it to 1e-12
relative (max |got - want| / max |want|): only the order of a few sums differs (the p partial
products of a row split, BLAS blocking), a few ulps. A float32 run is compared with the same
float64 reference to 1e-5: float32 rounds at 6e-8 per operation and the chains here (matmuls
of length <= 144, softmax over <= 24 positions, LayerNorm over 48 channels) stay well below
1e-5 (measured: ~1e-6).
"""
from __future__ import annotations

import numpy as np

from .. import nn
from .. import tensor_parallel as tp
from ..trace import bytes_sent, count
from ..xp import chunk_bounds, to_numpy
from ..errors import UsageError
from .common import TOLERANCE, Checks, expect_error, randomize, traced
from .common import format_rows, rel_error  # noqa: F401  (format_rows: re-exported)
from .common import merge_rows as summarize  # noqa: F401  (re-exported for notebooks and tests)

SIZES = dict(B=2, T=24, d_model=48, n_heads=24, d_hidden=96)  # divisible by p = 1, 2, 3, 4, 6, 8, 12, 24


def mine(comm, a, axis):
    """This rank's chunk of a NumPy array along ``axis`` (for the expected values)."""
    lo, hi = chunk_bounds(a.shape[axis], comm.size)[comm.rank]
    return np.take(a, np.arange(lo, hi), axis=axis)


def check_layer(ch, what, dense, make_parallel, x, rng, x_in=None, y_out=None):
    """Forward + backward of ``dense`` (NumPy float64) and of ``make_parallel(dense)`` (this
    rank's shards, as ``ch.dtype`` arrays of the comm's kind); compare everything.

    x_in / y_out map a dense input / output to what this rank holds (default: all of it).
    Returns {"forward": events, "backward": events} of the parallel run.
    """
    comm, ident = ch.comm, (lambda a: a)
    x_in, y_out = x_in or ident, y_out or ident
    par = make_parallel(dense)
    y, ctx = dense.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = dense.backward(dy, ctx)

    like = comm.asarray(np.zeros(1, ch.dtype))
    par.to(like)
    (yp, pctx), fwd = traced(comm, par.forward, comm.asarray(x_in(x).astype(ch.dtype)))
    dxp, bwd = traced(comm, par.backward, comm.asarray(y_out(dy).astype(ch.dtype)), pctx)
    ch.add(f"{what}: output", yp, y_out(y))
    ch.add(f"{what}: input gradient", dxp, x_in(dx))
    want = tp.local_shards(par, {k: v for k, v in dense.named_grads()})
    errs = {name: rel_error(g, want[name]) for name, g in par.named_grads()}
    worst, tol = max(errs, key=errs.get), TOLERANCE[ch.dtype]  # name it only when it fails: rows line up across ranks
    ch.flag(f"{what}: {len(errs)} weight-gradient shards" + (f" (worst {worst})" if errs[worst] > tol else ""), errs[worst], tol)
    return {"forward": fwd, "backward": bwd, "model": par, "ctx": pctx}


def count_row(ch, what, events, name, expected):
    n = count(events, kind="collective", name=name)
    ch.flag(f"{what}: {n} {name} (expected {expected})", abs(n - expected))


# --------------------------------------------------------------------------- the drivers


def verify(comm, dtypes=("float64",), seed=0, sizes=None, torch_tp=False):
    """Every check of the lesson on this world size, once per dtype; returns the rows of ``Checks``.

    torch_tp=True (torch backend only) adds ``against_torch_tp``'s rows.
    """
    rows = [row for dtype in dtypes for row in verify_dtype(comm, dtype, seed, sizes)]
    return rows + (against_torch_tp(comm, seed) if torch_tp else [])


def verify_dtype(comm, dtype="float64", seed=0, sizes=None):
    """The checks in one dtype (see the module docstring for the tolerances)."""
    s = {**SIZES, **(sizes or {})}
    B, T, C, H, nh = s["B"], s["T"], s["d_model"], s["d_hidden"], s["n_heads"]
    p, ch = comm.size, Checks(comm, dtype)
    rng = np.random.default_rng([seed, 2])  # same stream on every rank: same weights, inputs
    A = lambda a: comm.asarray(a.astype(dtype))  # noqa: E731  NumPy -> this backend's arrays

    # 1. the matrix product split by columns and by rows
    x, a = rng.standard_normal((5, C)), rng.standard_normal((C, 3 * C))
    a_r = tp.column_shard(comm, A(a))  # (C, 3C/p): my columns
    ch.add("column split X·[A_1..A_p], all-gathered", tp.column_parallel_matmul(comm, A(x), a_r), x @ a)
    ch.add("column split, my columns only", tp.column_parallel_matmul(comm, A(x), a_r, False), mine(comm, x @ a, 1))
    ch.add("row split sum_r X_r·A_r (all-reduce)", tp.row_parallel_matmul(comm, *tp.row_shards(comm, A(x), A(a))), x @ a)

    # 2. the parallel linear layers, forward and backward
    x3 = rng.standard_normal((B, T, C))
    lin = lambda d_in, d_out: randomize(nn.Linear(d_in, d_out, rng), rng)  # noqa: E731
    for gather in (False, True):
        check_layer(ch, f"ColumnParallelLinear(gather_output={gather})", lin(C, H),
                    lambda d: tp.ColumnParallelLinear(comm, d, gather_output=gather), x3, rng,
                    y_out=None if gather else (lambda y: mine(comm, y, -1)))
    xh = rng.standard_normal((B, T, H))
    for parallel_in in (True, False):
        check_layer(ch, f"RowParallelLinear(input_is_parallel={parallel_in})", lin(H, C),
                    lambda d: tp.RowParallelLinear(comm, d, input_is_parallel=parallel_in), xh, rng,
                    x_in=(lambda v: mine(comm, v, -1)) if parallel_in else None)

    # 3. Megatron MLP and heads-split attention: one all-reduce forward, one backward
    mlp = check_layer(ch, "Megatron MLP", randomize(nn.MLP(C, H, rng), rng), lambda d: tp.ParallelMLP(comm, d), x3, rng)
    count_row(ch, "Megatron MLP forward", mlp["forward"], "all_reduce", 1)
    count_row(ch, "Megatron MLP backward", mlp["backward"], "all_reduce", 1)
    att = check_layer(ch, f"attention, {nh // p} of {nh} heads per rank", randomize(nn.CausalSelfAttention(C, nh, rng), rng),
                      lambda d: tp.ParallelSelfAttention(comm, d), x3, rng)
    count_row(ch, "attention forward", att["forward"], "all_reduce", 1)
    count_row(ch, "attention backward", att["backward"], "all_reduce", 1)

    # 4. a transformer block, tensor parallel and sequence parallel
    block = randomize(nn.Block(C, nh, rng, d_hidden=H), rng)
    tokens = lambda v: mine(comm, v, -2)  # noqa: E731  my T/p tokens
    tpb = check_layer(ch, "TP block", block, lambda d: tp.ParallelBlock(comm, d), x3, rng)
    block.zero_grad()
    spb = check_layer(ch, "SP block", block, lambda d: tp.ParallelBlock(comm, d, sequence_parallel=True), x3, rng,
                      x_in=tokens, y_out=tokens)
    count_row(ch, "TP block forward", tpb["forward"], "all_reduce", 2)
    count_row(ch, "TP block backward", tpb["backward"], "all_reduce", 2)
    for phase, ag, rs, ar in (("forward", 2, 2, 0), ("backward", 2, 2, 2)):
        for name, n in (("all_gather", ag), ("reduce_scatter", rs), ("all_reduce", ar)):
            count_row(ch, f"SP block {phase}", spb[phase], name, n)
    b_tp = bytes_sent(tpb["forward"], comm.tracer.rank)
    b_sp = bytes_sent(spb["forward"], comm.tracer.rank)
    ch.flag(f"SP forward sends the bytes of TP's all-reduces ({b_sp} vs {b_tp} B)", abs(b_sp - b_tp) / max(b_tp, 1))
    ln_bytes = lambda run: sum(tp.activation_bytes(run["ctx"][k], run["model"]) for k in ("ln1", "ln2"))  # noqa: E731
    ln_tp, ln_sp = ln_bytes(tpb), ln_bytes(spb)  # xhat (B, T, C) + rstd (B, T, 1), or T/p tokens
    ch.flag(f"LayerNorm activations per rank: SP {ln_sp} B = TP {ln_tp} B / p", abs(ln_tp - p * ln_sp) / ln_tp)

    # 5. block products on a q x q grid
    ab, bb = rng.standard_normal((6, 4)), rng.standard_normal((4, 8))
    if p == 4:
        _, i, j = tp.grid_shape(comm)
        ch.add("2x2 blocks: C_ij = A_i1·B_1j + A_i2·B_2j", tp.block_product_2x2(comm, A(ab), A(bb)),
               (ab @ bb)[3 * i:3 * i + 3, 4 * j:4 * j + 4])
    if int(p**0.5) ** 2 == p:
        c_ij = tp.summa(comm, tp.grid_block(comm, A(ab)), tp.grid_block(comm, A(bb)))
        ch.add(f"SUMMA on a {int(p**0.5)}x{int(p**0.5)} grid, assembled", tp.assemble_grid(comm, c_ij), ab @ bb)
        ch.add("SUMMA loop on one process", tp.summa_dense(ab, bb, int(p**0.5)), ab @ bb)
    else:
        expect_error(ch, f"SUMMA on p={p}", lambda: tp.summa(comm, A(ab), A(bb)), "square", f"p={p}")

    # 6. shapes that do not split evenly
    if p > 1:
        odd_heads = nn.CausalSelfAttention(p + 1, p + 1, rng)
        odd_tokens = A(rng.standard_normal((1, p + 1, 2)))  # (B, T, C) with T = p + 1
        expect_error(ch, "column split, d_out = 3p+1", lambda: tp.ColumnParallelLinear(comm, lin(C, 3 * p + 1)),
                     "d_out", f"p={p}")
        expect_error(ch, "row split, d_in = 3p+1", lambda: tp.RowParallelLinear(comm, lin(3 * p + 1, C)), "d_in", f"p={p}")
        expect_error(ch, "attention, n_heads = p+1", lambda: tp.ParallelSelfAttention(comm, odd_heads), "n_heads", f"p={p}")
        expect_error(ch, "sequence parallel, T = p+1", lambda: tp.sp_scatter_forward(comm, odd_tokens), "tokens", f"p={p}")
    return ch.rows


def tour(comm, seed=0):
    """The lesson's checks in float64 (see ``verify``)."""
    return verify(comm, ("float64",), seed)


def megatron_mlp_step(comm, dtype="float64", seed=0, tokens=6, d_model=16, d_hidden=64):
    """One forward + backward of the Megatron MLP. Returns this rank's output, input gradient
    and gradient shards as NumPy arrays: the same on the mpi and the torch backend."""
    rng = np.random.default_rng([seed, 4])
    dense = randomize(nn.MLP(d_model, d_hidden, rng), rng)
    x, dy = rng.standard_normal((tokens, d_model)), rng.standard_normal((tokens, d_model))
    A = lambda a: comm.asarray(a.astype(dtype))  # noqa: E731
    model = tp.ParallelMLP(comm, dense).to(A(x))
    y, ctx = model.forward(A(x))
    dx = model.backward(A(dy), ctx)
    return {"y": to_numpy(y).copy(), "dx": to_numpy(dx).copy(),
            **{name: to_numpy(g).copy() for name, g in model.named_grads()}}


def against_torch_tp(comm, seed=0, tokens=6, d_model=16, d_hidden=64):
    """minipar's Megatron MLP vs PyTorch's own tensor parallelism, on the torch backend.

    The same weights in a ``torch.nn.Sequential(Linear, GELU(tanh), Linear)`` parallelised by
    ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on a CPU DeviceMesh
    (DTensor). torch's Linear weight is (out, in) = our w.T, so its column shard is a row shard
    of its weight. Output, input gradient and every local weight-gradient shard must agree to
    1e-12 (float64; both sum the same p partial products, in possibly different orders).
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    ch, rng = Checks(comm, "float64"), np.random.default_rng([seed, 3])
    dense = randomize(nn.MLP(d_model, d_hidden, rng), rng)
    x, dy = rng.standard_normal((tokens, d_model)), rng.standard_normal((tokens, d_model))
    T = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731

    ours = tp.ParallelMLP(comm, dense).to(T(x))
    y, ctx = ours.forward(T(x))
    dx = ours.backward(T(dy), ctx)

    model = torch.nn.Sequential(torch.nn.Linear(d_model, d_hidden), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(d_hidden, d_model)).double()
    with torch.no_grad():
        for layer, src in ((model[0], dense.fc1), (model[2], dense.fc2)):
            layer.weight.copy_(T(src.params["w"].T))  # (out, in)
            layer.bias.copy_(T(src.params["b"]))
    mesh = init_device_mesh("cpu", (comm.size,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    xt = T(x).requires_grad_(True)
    yt = model(xt)
    yt.backward(T(dy))
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731  DTensor -> my shard
    ch.add("torch TP MLP: output", y, local(yt).detach())
    ch.add("torch TP MLP: input gradient", dx, xt.grad)
    for ours_name, layer, tname in (("fc1", model[0], "0"), ("fc2", model[2], "2")):
        g = getattr(ours, ours_name).grads
        ch.add(f"torch TP MLP: {ours_name}.w shard = torch {tname}.weight.grad.to_local().T", g["w"], local(layer.weight.grad).T)
        ch.add(f"torch TP MLP: {ours_name}.b shard = torch {tname}.bias.grad.to_local()", g["b"], local(layer.bias.grad))
    return ch.rows


# --------------------------------------------------------------------------- what fits on n ranks


def split_sizes(sizes=None) -> dict:
    """What ``verify`` splits over the ranks: {name: length}; every one must divide by p."""
    s = {**SIZES, **(sizes or {})}
    return {"d_model": s["d_model"], "n_heads": s["n_heads"], "d_hidden": s["d_hidden"], "tokens T": s["T"]}


def check_world_size(n: int, sizes=None):
    """Raise UsageError, before any rank starts, when ``verify`` cannot split its model over n ranks."""
    split = split_sizes(sizes)
    if any(v % n for v in split.values()):
        fits = [str(p) for p in range(1, max(split.values()) + 1) if all(v % p == 0 for v in split.values())]
        shape = ", ".join(f"{k}={v}" for k, v in split.items())
        raise UsageError(f"-n {n}: the tensor-parallel model ({shape}) does not split over {n} ranks; "
                         f"use -n {', '.join(fits[:-1])} or {fits[-1]}")
