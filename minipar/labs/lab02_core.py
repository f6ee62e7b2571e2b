"""Lab 02's core tasks: the learner writes the technique's communication from a contract (the rest
of the lab's checks: ``minipar.labs.lab02``; the shards and rules they share:
``minipar.labs.lab02_rules``).

* 2.7 **sequence parallelism** (Megatron-SP, Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models"): the MLP half of a block, entered with this rank's
  tokens only. Graded by the shard each rank is handed (the other ranks' tokens NaN, watched)
  and the one it returns (its own tokens of the dense block's output); by the tokens the
  LayerNorm is given (``norm``, the grader's, records them: this rank's T/p tokens, never all
  T); by the bytes (an all-gather and a reduce-scatter of the activations: exactly the bytes of
  the one all-reduce they replace; gathering x and all-reducing the output sends 1.5 times
  that); and against the dense block.
* 2.8 **attention's backward under the head split**: the gradients of the input and of this
  rank's shards, against the dense layer's hand-written backward
  (``minipar.nn.CausalSelfAttention.backward``), by the bytes (one all-reduce, of dx), and with
  the other ranks' heads NaN. Two classic mistakes are named by their values: dx without its
  all-reduce (this rank's heads' share only), and a softmax backward without its row-sum term.
  minipar's own attention backward (``minipar.nn.functional``) is refused inside the call.

Shapes are multiples of 12 where they are split, so that 1, 2, 3 and 4 ranks split them evenly.
The expected values are NumPy's dense float64 results (tolerance 1e-12: only the order of the
sums differs).
"""
from __future__ import annotations

import numpy as np

from ..nn import CausalSelfAttention
from ..nn.functional import attention_forward, gelu_forward, layernorm_forward
from .checks import (COLLECTIVES, chunk_counts, compare, draw, expect_traffic, graded, no_builtin, ranks,
                     ring_traffic, sent_by_learner, used_only_own)
from .lab02_rules import INSTEAD, _bias_once, _close, mine, one_all_reduce, shard

SP_INSTEAD = "minipar.collectives' all_gather and reduce_scatter (rings on send/recv)"


# ---------------------------------------------------------------- 2.7: sequence parallelism

def dense_mlp_half(x, gamma, beta, w1, b1, w2, b2):
    """The dense block's MLP half: x + GeLU(LayerNorm(x) @ w1 + b1) @ w2 + b2, x (B, T, C)."""
    h = layernorm_forward(x, gamma, beta)[0]  # (B, T, C)
    return x + gelu_forward(h @ w1 + b1)[0] @ w2 + b2


def norm_seen(comm, rows, t, T, B):
    """A failure when the LayerNorm was not given exactly this rank's B * T/p rows (token
    positions): ``rows``, the rows of each call of ``norm``."""
    r, lo_hi = comm.rank, mine(comm, T)
    own = B * t
    if not rows:
        return [f"rank {r} never called norm: the block's LayerNorm runs on this rank's tokens, before they "
                f"enter the tensor-parallel region"]
    if max(rows) > own or sum(rows) > own:
        most = max(max(rows), sum(rows))
        return [f"rank {r}: the LayerNorm ran on {most} token rows (norm was called on {rows} rows); with sequence "
                f"parallelism each rank normalises only its own tokens, {lo_hi[0]}:{lo_hi[1]} of T = {T} "
                f"({own} rows for a batch of {B}): run norm before the all-gather, so that its input, its output and "
                f"what it keeps for the backward take 1/p of the memory, and the all-gather moves its output"]
    return []


def check_sequence_parallel(comm, fn):
    B, T, C, H = 2, 12, 12, 24
    p, r = comm.size, comm.rank
    x, w1, b1, w2, b2 = draw(B, T, C), draw(C, H), draw(H), draw(H, C), draw(C)
    gamma, beta = 1.0 + 0.1 * draw(C, seed=2), draw(C, seed=3)
    t_lo, t_hi = mine(comm, T)
    h_lo, h_hi = mine(comm, H)
    X, x_own = shard(comm, x, (slice(None), slice(t_lo, t_hi)), f"tokens {t_lo}:{t_hi} (axis 1)")
    W1, w1_own = shard(comm, w1, (slice(None), slice(h_lo, h_hi)), f"columns {h_lo}:{h_hi}")
    B1, b1_own = shard(comm, b1, slice(h_lo, h_hi), f"elements {h_lo}:{h_hi}")
    W2, w2_own = shard(comm, w2, slice(h_lo, h_hi), f"rows {h_lo}:{h_hi}")
    G, Bt = comm.asarray(gamma), comm.asarray(beta)
    rows = []

    def norm(a):
        """The block's LayerNorm of the last axis of ``a`` (B, t, C); the grader counts its rows."""
        rows.append(int(np.prod(a.shape[:-1])))
        return layernorm_forward(a, G, Bt)[0]

    g = graded(comm, lambda: fn(comm, X, norm, W1, B1, W2, comm.asarray(b2)))
    want = dense_mlp_half(x, gamma, beta, w1, b1, w2, b2)[:, t_lo:t_hi]  # (B, T/p, C): my tokens
    case = f"x ({B}, {T}, {C}), hidden {H} on {ranks(p)}"
    got_shape = None if g.out is None else tuple(g.out.shape)
    fails = no_builtin(comm, g, "sequence_parallel_mlp", SP_INSTEAD)
    if not fails and p > 1 and got_shape == (B, T, C):
        fails = [f"rank {r} returned all {T} tokens, shape {got_shape}; with sequence parallelism each rank leaves "
                 f"the block with its own tokens only, {t_lo}:{t_hi}: shape {want.shape} (what the reduce-scatter "
                 f"leaves it)"]
    fails = fails or norm_seen(comm, rows, t_hi - t_lo, T, B)
    fails = fails or _bias_once(comm, g.out, want, b2, "the output")
    fails = fails or compare(comm, g.out, want, f"this rank's tokens {t_lo}:{t_hi} of x + MLP(LayerNorm(x))", case,
                             owns=f"tokens {t_lo}:{t_hi} of x, columns {h_lo}:{h_hi} of w1 and b1, rows {h_lo}:{h_hi} "
                                  f"of w2")
    nbytes, msgs = ring_traffic(chunk_counts(B * T * C, p), r, 8)  # = an all-gather + a reduce-scatter
    fails = fails or expect_traffic(
        comm, g, f"sequence parallelism (an all-gather and a reduce-scatter of the ({B}, {T}, {C}) activations along "
                 f"the tokens: the bytes of one ring all-reduce)", nbytes, msgs,
        hint="gathering x and all-reducing the output (the f/g block, sliced afterwards) sends 1.5 times that; gather "
             "the normalised tokens before fc1 and reduce-scatter fc2's partial sums, nothing else")
    fails = fails or used_only_own(comm, {"x": x_own, "w1": w1_own, "b1": b1_own, "w2": w2_own},
                                   "sequence_parallel_mlp")
    return fails or sent_by_learner(comm, g, fn, "sequence_parallel_mlp", SP_INSTEAD, COLLECTIVES)


# ---------------------------------------------------------------- 2.8: attention's backward, heads split

def heads_of(comm, C, nh):
    """(lo, hi, the columns of w_qkv this rank owns): its heads' columns of each of Wq, Wk, Wv."""
    hs = C // nh
    h_lo, h_hi = mine(comm, nh)
    lo, hi = h_lo * hs, h_hi * hs
    return lo, hi, np.concatenate([np.arange(lo, hi) + k * C for k in range(3)])


def qkv_gradient(x, w_qkv, b_qkv, w_proj, dout, nh, row_sum=True):
    """The gradient of the dense attention's qkv projection output, (B, T, 3C), written out:
    ``row_sum=False`` is the softmax backward that forgets its row-sum term, p * dp instead of
    p * (dp - sum(dp * p) over the row), the mistake this check names."""
    B, T, C = x.shape
    hs = C // nh
    heads = [(x @ w_qkv[:, j * C:(j + 1) * C] + b_qkv[j * C:(j + 1) * C]).reshape(B, T, nh, hs).transpose(0, 2, 1, 3)
             for j in range(3)]  # q, k, v: (B, nh, T, hs)
    q, k, v = heads
    _, (_, _, _, probs, scale, _, _) = attention_forward(q, k, v)  # probs (B, nh, T, T)
    dy = (dout @ w_proj.T).reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
    dv = probs.swapaxes(-1, -2) @ dy
    dp = dy @ v.swapaxes(-1, -2)  # (B, nh, T, T)
    ds = probs * (dp - (dp * probs).sum(-1, keepdims=True)) if row_sum else probs * dp
    dq, dk = (ds * scale) @ k, (ds * scale).swapaxes(-1, -2) @ q
    return np.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, C) for d in (dq, dk, dv)], axis=-1)


def check_heads_attention_backward(comm, fn):
    B, T, C, nh = 2, 5, 24, 12
    p, r = comm.size, comm.rank
    x, dout = draw(B, T, C), draw(B, T, C, seed=4)
    ref = CausalSelfAttention(C, nh, np.random.default_rng(0))
    for a in (ref.qkv, ref.proj):
        a.params["w"], a.params["b"] = draw(*a.params["w"].shape, seed=1), draw(*a.params["b"].shape, seed=1)
    w_qkv, b_qkv, w_proj = ref.qkv.params["w"], ref.qkv.params["b"], ref.proj.params["w"]
    _, ctx = ref.forward(x)
    dx = ref.backward(dout, ctx)  # the dense layer's hand-written backward
    grads = dict(ref.named_grads())
    lo, hi, qkv = heads_of(comm, C, nh)
    h_lo, h_hi = lo // (C // nh), hi // (C // nh)
    want = {"dx": dx, "dw_qkv": grads["qkv.w"][:, qkv], "db_qkv": grads["qkv.b"][qkv],
            "dw_proj": grads["proj.w"][lo:hi], "db_proj": grads["proj.b"]}
    Wqkv, wqkv_own = shard(comm, w_qkv, (slice(None), qkv), f"columns {lo}:{hi} of each of Wq, Wk, Wv")
    Bqkv, bqkv_own = shard(comm, b_qkv, qkv, f"elements {lo}:{hi} of each of bq, bk, bv")
    Wproj, wproj_own = shard(comm, w_proj, slice(lo, hi), f"rows {lo}:{hi}")
    g = graded(comm, lambda: fn(comm, comm.asarray(dout), comm.asarray(x), Wqkv, Bqkv, Wproj, nh))
    function = "heads_attention_backward"
    fails = no_builtin(comm, g, function, INSTEAD)
    if fails:
        return fails
    if not isinstance(g.out, tuple) or len(g.out) != 5:
        return [f"rank {r}: {function} must return a tuple (dx, dw_qkv, db_qkv, dw_proj, db_proj), got "
                f"{type(g.out).__name__}" + (f" of {len(g.out)}" if isinstance(g.out, (tuple, list)) else "")]
    got = dict(zip(want, g.out))
    dqkv = qkv_gradient(x, w_qkv, b_qkv, w_proj, dout, nh)
    if p > 1 and _close(got["dx"], dqkv[..., qkv] @ w_qkv[:, qkv].T):
        return [f"rank {r}: dx is only this rank's heads' share of the input gradient: every head's q, k and v were "
                f"computed from all of x, so dx is the sum over the ranks' heads (the column split's backward: one "
                f"all-reduce)"]
    wrong = qkv_gradient(x, w_qkv, b_qkv, w_proj, dout, nh, row_sum=False)
    if _close(got["dw_qkv"], x.reshape(-1, C).T @ wrong.reshape(-1, 3 * C)[:, qkv]):
        return [f"rank {r}: dw_qkv matches a softmax backward without its row-sum term: the gradients of q and k are "
                f"wrong, v's are right. The softmax's Jacobian is diag(p) - p p^T: from each row of p * dp subtract p "
                f"times that row's sum of dp * p"]
    case = f"x ({B}, {T}, {C}), {nh} heads on {ranks(p)}"
    owns = (f"heads {h_lo}:{h_hi}: columns {lo}:{hi} of each of Wq, Wk, Wv (and of b_qkv), rows {lo}:{hi} of "
            f"w_proj")
    said = {"dx": "dx (the whole input gradient)", "dw_qkv": "dw_qkv (its heads' columns of Wq | Wk | Wv)",
            "db_qkv": "db_qkv (its heads' elements of bq | bk | bv)", "dw_proj": "dw_proj (its rows of w_proj)",
            "db_proj": "db_proj (whole)"}
    for name, value in want.items():
        fails = fails or compare(comm, got[name], value, said[name], case, owns=owns)
    fails = fails or one_all_reduce(comm, g, (B, T, C), "input gradient dx",
                                    "the heads and the row split's backward need no message")
    fails = fails or used_only_own(comm, {"w_qkv": wqkv_own, "b_qkv": bqkv_own, "w_proj": wproj_own}, function)
    return fails or sent_by_learner(comm, g, fn, function, INSTEAD, COLLECTIVES)
