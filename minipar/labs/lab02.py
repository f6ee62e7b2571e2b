"""Lab 02 (tensor parallelism): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs or which rule was broken. The
expected value is always a slice of the dense single-process result. The rules
(``minipar.labs.checks``):

* own shard only: every rank is handed whole-shaped weights and inputs, but the parts other
  ranks own are NaN (a result computed with them is NaN), and the arrays are watched, so a
  rank that multiplies the whole matrix and slices the product afterwards (right values, p
  times the work) is caught too;
* traffic: exactly the one ring all-reduce each task needs (of the output, or of dx), or
  nothing at all; gathering instead of reducing, a second collective, or a builtin (0 bytes
  through comm) fail; ``comm.builtin`` is refused inside the learner's call;
* the messages are the learner's: sent by their code through minipar.collectives, not by
  minipar's own tensor-parallel layers (``minipar.tensor_parallel``) called from the exercise;
* typical mistakes get their own message: the bias added on every rank before the all-reduce,
  a missing all-reduce of the input gradient.

Dimensions are multiples of 12, so that 1, 2, 3 and 4 ranks all split them evenly. The inputs
are drawn in NumPy (float64) and handed to the learner in the backend's kind (``comm.asarray``:
NumPy arrays, or torch tensors of the same dtype, watched as such); the expected values stay
NumPy's dense float64 results.

The core tasks (2.7 sequence parallelism, 2.8 attention's backward) are checked in
``minipar.labs.lab02_core``; the shards and rules both modules use are ``minipar.labs.lab02_rules``.
"""
from __future__ import annotations

import numpy as np

from ..nn import CausalSelfAttention
from ..nn.functional import gelu_forward
from .checks import COLLECTIVES, compare, draw, graded, no_builtin, ranks, sent_by_learner, used_only_own
from .grader import Task
from .lab02_rules import INSTEAD, _bias_once, _close, cols, mine, no_message, one_all_reduce, rows, shard

TITLE = ("tensor parallelism: column and row splits, f and g, Megatron MLP, heads-split attention, sequence "
         "parallelism, attention's backward")
HERE = "minipar.labs.lab02"
CORE = "minipar.labs.lab02_core"  # the core tasks' checks (2.7, 2.8)

TASKS = [
    Task("2.1", "column split, forward", "column_forward", f"{HERE}:check_column_forward"),
    Task("2.2", "row split, forward", "row_forward", f"{HERE}:check_row_forward"),
    Task("2.3", "column split, backward (f)", "column_backward", f"{HERE}:check_column_backward"),
    Task("2.4", "row split, backward (g)", "row_backward", f"{HERE}:check_row_backward"),
    Task("2.5", "Megatron MLP", "megatron_mlp", f"{HERE}:check_megatron_mlp"),
    Task("2.6", "heads-split attention", "heads_attention", f"{HERE}:check_heads_attention"),
    Task("2.7", "sequence parallelism", "sequence_parallel_mlp", f"{CORE}:check_sequence_parallel", tier="core",
         reference=tuple(f"minipar.tensor_parallel.ops:{f}" for f in (
             "sp_gather_forward", "sp_gather_backward", "sp_scatter_forward", "sp_scatter_backward", "_gather_axis",
             "_reduce_scatter_axis"))),
    Task("2.8", "attention backward", "heads_attention_backward",
         f"{CORE}:check_heads_attention_backward", tier="core",
         reference=("minipar.nn.functional:attention_backward", "minipar.nn.functional:softmax_backward",
                    "minipar.nn.layers:CausalSelfAttention.backward_input")),
]

# Hints, stage by stage (`minipar check 02 --hint 2.2`): a nudge naming the idea and what to read,
# the shape of the computation, then near-pseudocode. The answer: `minipar lab solution 02 --task 2.2`.
HINTS = {
    "2.1": (
        """A column split needs no message: each rank owns a block of w's columns (and the same entries
        of b), and its output is exactly those columns of Y. Which part of the product can a rank
        compute with nothing but its own block?""",
        """Your block: lo, hi = chunk_bounds(d_out, comm.size)[comm.rank], with d_out = w.shape[1]. Slice
        w's columns lo:hi and b[lo:hi]; one matmul. The result has shape (N, hi - lo).""",
        """
        lo, hi = chunk_bounds(w.shape[1], comm.size)[comm.rank]
        return x @ w[:, lo:hi] + b[lo:hi]
        """,
    ),
    "2.2": (
        """A row split: rank r owns rows lo:hi of w and multiplies them with the same columns of x;
        each rank's product is one term of Y, and one all-reduce adds the terms
        (minipar.collectives.all_reduce(comm, x)). Where does the bias go, so that it is added once?""",
        """lo, hi over d_in = w.shape[0]; partial = x[:, lo:hi] @ w[lo:hi], shape (N, d_out); then
        all_reduce(comm, partial) + b. A bias added before the all-reduce would be added p times.""",
        """
        lo, hi = chunk_bounds(w.shape[0], comm.size)[comm.rank]
        return all_reduce(comm, x[:, lo:hi] @ w[lo:hi]) + b
        """,
    ),
    "2.3": (
        """Each rank's columns of Y were computed from all of x, so x's gradient gets a contribution
        through every rank's columns; the gradients of A_r and b_r involve only this rank's own
        columns. Which of the three needs the other ranks, and what adds their contributions?""",
        """Y_r = x A_r + b_r. dw_r = x^T dY_r and db_r (dY_r summed over the rows) are local. But
        dx = sum over r of dY_r A_r^T: every rank holds one term, so dx needs one all-reduce. That is
        f's backward (f: the identity going forward, an all-reduce going back).""",
        """
        lo, hi = chunk_bounds(w.shape[1], comm.size)[comm.rank]   # your columns of w
        return all_reduce(comm, dy_r @ w[:, lo:hi].T), x.T @ dy_r, dy_r.sum(axis=0)
        """,
    ),
    "2.4": (
        """g's forward is the all-reduce of 2.2, so its backward is the identity: dY arrives whole on
        every rank, and each rank's gradients touch only its own rows of w and columns of x. How many
        messages, then?""",
        """None. lo, hi over w.shape[0] as in 2.2; dx_r = dy @ w[lo:hi].T, shape (N, d_in/p);
        dw_r = x[:, lo:hi].T @ dy; db = dy.sum(axis=0), whole like the bias.""",
        """
        lo, hi = chunk_bounds(w.shape[0], comm.size)[comm.rank]
        return dy @ w[lo:hi].T, x[:, lo:hi].T @ dy, dy.sum(axis=0)
        """,
    ),
    "2.5": (
        """Megatron's MLP: fc1 split by columns (2.1), so each rank's GeLU runs on its own hidden
        columns without talking; fc2 split by rows (2.2), so its partial sums need one all-reduce.
        gelu_forward (minipar.nn.functional) returns (y, cache): take [0].""",
        """One lo, hi = chunk_bounds(H, p)[rank] with H = w1.shape[1] cuts w1's columns, b1, and w2's
        rows alike: h = GeLU(x @ w1[:, lo:hi] + b1[lo:hi]), shape (N, H/p); Y = all_reduce(h @ w2[lo:hi])
        + b2.""",
        """
        lo, hi = chunk_bounds(w1.shape[1], comm.size)[comm.rank]
        h = gelu_forward(x @ w1[:, lo:hi] + b1[lo:hi])[0]
        return all_reduce(comm, h @ w2[lo:hi]) + b2
        """,
    ),
    "2.6": (
        """Heads are independent: give each rank its own heads, and everything up to the output
        projection runs without a message. But w_qkv holds Wq, Wk and Wv side by side, so a rank's
        heads are one block of columns in each of the three. And the output projection's rows belong
        to heads too: which split is it, and what does that split need?""",
        """Your heads' columns: lo, hi = chunk_bounds(C, p)[r] of EACH of Wq, Wk, Wv (w_qkv's column
        blocks 0:C, C:2C, 2C:3C). For j = 0, 1, 2 (q, k, v): x @ w_qkv[:, j*C + lo : j*C + hi] +
        b_qkv[j*C + lo : j*C + hi], shape (B, T, C/p); reshape to (B, T, nh_r, hs) with hs = C // n_heads,
        nh_r = (hi - lo) // hs, and permute to (B, nh_r, T, hs) with xp.permute_dims(a, (0, 2, 1, 3))
        (xp = namespace(x): NumPy's or torch's). y = attention_forward(q, k, v)[0], permuted back and
        reshaped to (B, T, C/p); your heads' outputs meet your rows of w_proj: a row split (2.2),
        all_reduce(comm, y @ w_proj[lo:hi]) + b_proj.""",
        """
        B, T, C = x.shape; lo, hi = chunk_bounds(C, p)[r]; hs = C // n_heads; nh = (hi - lo) // hs
        xp = namespace(x)
        q, k, v = [xp.permute_dims((x @ w_qkv[:, j*C+lo:j*C+hi] + b_qkv[j*C+lo:j*C+hi]).reshape(B, T, nh, hs),
                                   (0, 2, 1, 3)) for j in range(3)]
        y = xp.permute_dims(attention_forward(q, k, v)[0], (0, 2, 1, 3)).reshape(B, T, hi - lo)
        return all_reduce(comm, y @ w_proj[lo:hi]) + b_proj
        """,
    ),
    "2.7": (
        """The f/g block keeps x whole on every rank and all-reduces fc2's partial sums. A ring
        all-reduce is a reduce-scatter followed by an all-gather: sequence parallelism keeps the two
        halves apart. The block is left through the reduce-scatter alone (each rank keeps its own
        tokens of the sum) and entered through the all-gather alone (the column split needs every
        token). What runs between them, on the tokens, needs nothing but this rank's own: the
        LayerNorm, the residual, the bias after the sum.""",
        """Your tokens: t_lo, t_hi = chunk_bounds(T, p)[r] on axis 1 of x; your hidden columns: lo, hi =
        chunk_bounds(H, p)[r]. h = norm(x[:, t_lo:t_hi]), (B, T/p, C). minipar.collectives' all_gather
        and reduce_scatter work along axis 0: put the tokens there first (xp.permute_dims(h, (1, 0, 2)),
        then minipar.xp.contiguous) and back afterwards. All T tokens through fc1 (your columns), GeLU,
        fc2 (your rows): a (B, T, C) partial sum; reduce-scatter it along the tokens, then add b2 once
        and the residual, x's own tokens.""",
        """
        xp = namespace(x); B, T, C = x.shape
        t_lo, t_hi = chunk_bounds(T, p)[r]; lo, hi = chunk_bounds(w1.shape[1], p)[r]
        mine = x[:, t_lo:t_hi]                                                     # (B, T/p, C)
        h = all_gather(comm, contiguous(xp.permute_dims(norm(mine), (1, 0, 2))))   # (T, B, C)
        h = xp.permute_dims(h, (1, 0, 2))                                          # (B, T, C)
        partial = gelu_forward(h @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]        # (B, T, C)
        out = reduce_scatter(comm, contiguous(xp.permute_dims(partial, (1, 0, 2))))  # (T/p, B, C)
        return xp.permute_dims(out, (1, 0, 2)) + b2 + mine
        """,
    ),
    "2.8": (
        """Run the forward of your own heads again (it is local up to the projection), then walk it
        backwards. The projection is a row split: its backward is g's, the identity, since dout is
        already whole everywhere. Inside a head, attention is softmax(q k^T * scale) @ v: go back
        through the product with v, the softmax, and q k^T. The input x fed every head's q, k and v:
        which of your gradients is only a share?""",
        """y (B, T, C/p): your heads' outputs, merged. dw_proj = y^T dout and db_proj = dout, each summed
        over B and T; dy = dout @ w_proj[lo:hi].T, split into your heads (B, nh/p, T, hs). With P the
        probabilities (attention_forward's ctx: (q, k, v, P, scale, ...)): dv = P^T dy; dP = dy v^T;
        dS = P * (dP - sum(dP * P, last axis, keepdims)) * scale, the softmax's backward, its row-sum
        term included; dq = dS k; dk = dS^T q. Merge dq, dk, dv back to (B, T, C/p) each and set them
        side by side: dqkv (B, T, 3C/p). dw_qkv = x^T dqkv, db_qkv = dqkv summed; dx = your share
        dqkv @ (your columns of w_qkv)^T, all-reduced: the one message.""",
        """
        cols = [range(j*C + lo, j*C + hi) for j in range(3)]  # your heads' columns of Wq, Wk, Wv
        q, k, v = your heads, as in 2.6; y, (_, _, _, P, scale, _, _) = attention_forward(q, k, v)
        ym = merge(y); dy = split(dout @ w_proj[lo:hi].T)
        dv = swap(P) @ dy; dP = dy @ swap(v); dS = P * (dP - xp.sum(dP * P, axis=-1, keepdims=True)) * scale
        dqkv = xp.concat([merge(dS @ k), merge(swap(dS) @ q), merge(dv)], axis=-1)   # (B, T, 3C/p)
        return (all_reduce(comm, dqkv @ w_qkv[:, cols].T), flat(x).T @ flat(dqkv), sum(dqkv),
                flat(ym).T @ flat(dout), sum(dout))       # flat: (B*T, ...); sum: over B and T
        """,
    ),
}


def check_column_forward(comm, fn):
    x, w, b = draw(5, 12), draw(12, 24), draw(24)
    lo, hi = mine(comm, 24)
    W, w_own = shard(comm, w, (slice(None), slice(lo, hi)), f"columns {lo}:{hi}")
    B, b_own = shard(comm, b, slice(lo, hi), f"elements {lo}:{hi}")
    g = graded(comm, lambda: fn(comm, comm.asarray(x), W, B))
    return (no_builtin(comm, g, "column_forward", "no communication at all")
            or compare(comm, g.out, cols(comm, x @ w + b), f"Y_{comm.rank} = x @ A_{comm.rank} + b_{comm.rank} "
                       f"(its columns of Y)", f"x (5, 12), w (12, 24) on {ranks(comm.size)}",
                       owns=f"columns {lo}:{hi} of w and b (chunk_bounds(d_out, p)[comm.rank])")
            or no_message(comm, g, "the column split's forward (x is on every rank)")
            or used_only_own(comm, {"w": w_own, "b": b_own}, "column_forward"))


def check_row_forward(comm, fn):
    x, w, b = draw(5, 24), draw(24, 12), draw(12)
    lo, hi = mine(comm, 24)
    X, x_own = shard(comm, x, (slice(None), slice(lo, hi)), f"columns {lo}:{hi}")
    W, w_own = shard(comm, w, slice(lo, hi), f"rows {lo}:{hi}")
    g = graded(comm, lambda: fn(comm, X, W, comm.asarray(b)))
    want = x @ w + b
    return (no_builtin(comm, g, "row_forward", INSTEAD)
            or _bias_once(comm, g.out, want, b, "Y")
            or compare(comm, g.out, want, "Y = sum_r X_r @ A_r + b", f"x (5, 24), w (24, 12) on {ranks(comm.size)}",
                       owns=f"columns {lo}:{hi} of x and rows {lo}:{hi} of w")
            or one_all_reduce(comm, g, (5, 12), "partial sums X_r @ A_r")
            or used_only_own(comm, {"x": x_own, "w": w_own}, "row_forward")
            or sent_by_learner(comm, g, fn, "row_forward", INSTEAD, COLLECTIVES))


def check_column_backward(comm, fn):
    x, w, dy = draw(5, 12), draw(12, 24), draw(5, 24)
    lo, hi = mine(comm, 24)
    W, w_own = shard(comm, w, (slice(None), slice(lo, hi)), f"columns {lo}:{hi}")
    dy_r = np.ascontiguousarray(cols(comm, dy))
    g = graded(comm, lambda: fn(comm, comm.asarray(dy_r), comm.asarray(x), W))
    if not isinstance(g.out, tuple) or len(g.out) != 3:
        return [f"rank {comm.rank}: column_backward must return a tuple (dx, dw_r, db_r), got {type(g.out).__name__}"]
    dx, dw, db = g.out
    if comm.size > 1 and _close(dx, dy_r @ cols(comm, w).T):
        return [f"rank {comm.rank}: dx is only this rank's partial sum dY_r @ A_r^T: every rank's columns used x, "
                f"so dx is the sum over ranks (f's backward is an all-reduce)"]
    case, owns = f"x (5, 12), w (12, 24) on {ranks(comm.size)}", f"columns {lo}:{hi} of w and of dY"
    return (no_builtin(comm, g, "column_backward", INSTEAD)
            or compare(comm, dx, dy @ w.T, "dx (the whole input gradient)", case, owns=owns)
            or compare(comm, dw, x.T @ dy_r, "dw_r = x^T dY_r (its columns of dw)", case, owns=owns)
            or compare(comm, db, dy_r.sum(0), "db_r = sum of dY_r over rows", case, owns=owns)
            or one_all_reduce(comm, g, (5, 12), "input gradient dx")
            or used_only_own(comm, {"w": w_own}, "column_backward")
            or sent_by_learner(comm, g, fn, "column_backward", INSTEAD, COLLECTIVES))


def check_row_backward(comm, fn):
    x, w, dy = draw(5, 24), draw(24, 12), draw(5, 12)
    lo, hi = mine(comm, 24)
    X, x_own = shard(comm, x, (slice(None), slice(lo, hi)), f"columns {lo}:{hi}")
    W, w_own = shard(comm, w, slice(lo, hi), f"rows {lo}:{hi}")
    g = graded(comm, lambda: fn(comm, comm.asarray(dy), X, W))
    if not isinstance(g.out, tuple) or len(g.out) != 3:
        return [f"rank {comm.rank}: row_backward must return a tuple (dx_r, dw_r, db), got {type(g.out).__name__}"]
    dx, dw, db = g.out
    case, owns = f"x (5, 24), w (24, 12) on {ranks(comm.size)}", f"columns {lo}:{hi} of x and rows {lo}:{hi} of w"
    return (no_builtin(comm, g, "row_backward", "no communication at all")
            or compare(comm, dx, cols(comm, dy @ w.T), "dx_r = dY @ A_r^T (the gradient of X_r only)", case, owns=owns)
            or compare(comm, dw, rows(comm, x.T @ dy), "dw_r = X_r^T dY (its rows of dw)", case, owns=owns)
            or compare(comm, db, dy.sum(0), "db = sum of dY over rows (whole on every rank)", case, owns=owns)
            or no_message(comm, g, "the row split's backward (g's backward is the identity: dY is already on "
                                   "every rank)")
            or used_only_own(comm, {"x": x_own, "w": w_own}, "row_backward"))


def check_megatron_mlp(comm, fn):
    x, w1, b1, w2, b2 = draw(5, 12), draw(12, 48), draw(48), draw(48, 12), draw(12)
    lo, hi = mine(comm, 48)
    W1, w1_own = shard(comm, w1, (slice(None), slice(lo, hi)), f"columns {lo}:{hi}")
    B1, b1_own = shard(comm, b1, slice(lo, hi), f"elements {lo}:{hi}")
    W2, w2_own = shard(comm, w2, slice(lo, hi), f"rows {lo}:{hi}")
    g = graded(comm, lambda: fn(comm, comm.asarray(x), W1, B1, W2, comm.asarray(b2)))
    want = gelu_forward(x @ w1 + b1)[0] @ w2 + b2
    return (no_builtin(comm, g, "megatron_mlp", INSTEAD)
            or _bias_once(comm, g.out, want, b2, "Y")
            or compare(comm, g.out, want, "Y = GeLU(x @ w1 + b1) @ w2 + b2", f"x (5, 12), hidden 48 on {ranks(comm.size)}",
                       owns=f"columns {lo}:{hi} of w1 and b1, rows {lo}:{hi} of w2")
            or one_all_reduce(comm, g, (5, 12), "output", "fc1's columns feed the GeLU on the same rank, so fc1 "
                                                          "needs no message")
            or used_only_own(comm, {"w1": w1_own, "b1": b1_own, "w2": w2_own}, "megatron_mlp")
            or sent_by_learner(comm, g, fn, "megatron_mlp", INSTEAD, COLLECTIVES))


def check_heads_attention(comm, fn):
    B, T, C, nh = 2, 5, 24, 12
    x = draw(B, T, C)
    ref = CausalSelfAttention(C, nh, np.random.default_rng(0))
    for name, a in (("qkv", ref.qkv), ("proj", ref.proj)):
        a.params["w"], a.params["b"] = draw(*a.params["w"].shape, seed=1), draw(*a.params["b"].shape, seed=1)
    want, _ = ref.forward(x)
    hs = C // nh
    h_lo, h_hi = mine(comm, nh)
    lo, hi = h_lo * hs, h_hi * hs  # my heads' columns of each of Wq, Wk, Wv; my rows of w_proj
    qkv = np.concatenate([np.arange(lo, hi) + k * C for k in range(3)])
    Wqkv, wqkv_own = shard(comm, ref.qkv.params["w"], (slice(None), qkv), f"columns {lo}:{hi} of each of Wq, Wk, Wv")
    Bqkv, bqkv_own = shard(comm, ref.qkv.params["b"], qkv, f"elements {lo}:{hi} of each of bq, bk, bv")
    Wproj, wproj_own = shard(comm, ref.proj.params["w"], slice(lo, hi), f"rows {lo}:{hi}")
    bproj = ref.proj.params["b"]
    g = graded(comm, lambda: fn(comm, comm.asarray(x), Wqkv, Bqkv, Wproj, comm.asarray(bproj), nh))
    return (no_builtin(comm, g, "heads_attention", INSTEAD)
            or _bias_once(comm, g.out, want, bproj, "the output")
            or compare(comm, g.out, want, "the attention output", f"x (2, 5, 24), {nh} heads on {ranks(comm.size)}",
                       owns=f"heads {h_lo}:{h_hi}: columns {lo}:{hi} of each of Wq, Wk, Wv (and of b_qkv), "
                            f"rows {lo}:{hi} of w_proj")
            or one_all_reduce(comm, g, (B, T, C), "output", "the heads themselves need no message")
            or used_only_own(comm, {"w_qkv": wqkv_own, "b_qkv": bqkv_own, "w_proj": wproj_own}, "heads_attention")
            or sent_by_learner(comm, g, fn, "heads_attention", INSTEAD, COLLECTIVES))
