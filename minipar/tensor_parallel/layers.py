"""Tensor-parallel layers (Megatron-LM style), each built by slicing its dense twin.

    dense = minipar.nn.MLP(64, 256, np.random.default_rng(0))   # same draw on every rank
    tp = ParallelMLP(comm, dense)                                 # rank r keeps shard r
    y, ctx = tp.forward(x)                                        # x: (B, T, 64) on every rank
    dx = tp.backward(dy, ctx)                                     # == dense, grads == dense slices

Every class here subclasses its dense counterpart in ``minipar.nn`` (the reference it must
equal) and keeps its API: ``params``/``grads``, ``forward(x) -> (y, ctx)``,
``backward(dy, ctx) -> dx`` = ``backward_input`` then ``backward_weight``, ``.to(like)``.
Only the shapes of the weights and the communication (``ops.py``) differ. ``shard(name, full)``
says which piece of the dense parameter ``name`` this rank holds; tests compare the gradient
shards with the same slices of the dense gradients. ``sharded`` names the parameters a class
splits (the others, like RowParallelLinear's bias, are whole on every rank: a global gradient
norm counts them once, not p times).

Building from the dense layer is the simplest way to get identical weights on every rank; it
holds the full weights for a moment (a real system draws each shard directly).

Weights with shape (d_in, d_out), y = x @ w + b (``minipar.nn.Linear``). Shapes that p does not
divide (d_out of a column split, d_in of a row split, n_heads, tokens with sequence
parallelism) raise ``ValueError`` naming the dimension and p.
"""
from __future__ import annotations

from .. import nn
from ..collectives import all_reduce
from ..nn import functional as F
from ..xp import copy, namespace, nbytes
from . import ops


def _copy_params(dst, dense):
    for name, full in dense.params.items():
        dst._add_param(name, dst.shard(name, full))


class ColumnParallelLinear(nn.Linear):
    """Y = X · [A_1 ... A_p]: rank r holds A_r = columns chunk r of w (d_in, d_out/p) and of b.

    forward:  x -> f (identity) -> y_r = x @ A_r + b_r           (..., d_out/p)
              [gather_output: all-gather y_r along the last axis  (..., d_out)]
    backward: dx = dy_r @ A_r^T is a partial sum -> f backward: all-reduce.

    blocks=3 (the attention's qkv): the output is [q | k | v] side by side and rank r takes
    chunk r of each block, so that it holds q, k and v of the same heads.
    sequence_parallel: x holds this rank's T/p tokens; forward all-gathers the tokens
    (sp_gather), backward reduce-scatters dx. Raises ValueError if p does not divide d_out.
    """

    sharded = ("w", "b")  # both split by columns

    def __init__(self, comm, dense: nn.Linear, gather_output=False, blocks=1, sequence_parallel=False):
        nn.Module.__init__(self)
        if gather_output and blocks != 1:
            raise ValueError("gather_output=True with blocks > 1 would interleave the blocks")
        self.comm, self.gather_output, self.blocks, self.sp = comm, gather_output, blocks, sequence_parallel
        _copy_params(self, dense)

    def shard(self, name, full):
        """Columns chunk r of w (d_in, d_out) or b (d_out,), taken from each of ``blocks`` blocks."""
        xp, p, r = namespace(full), self.comm.size, self.comm.rank
        width = ops.check_divisible(full.shape[-1], self.blocks, "d_out (blocks)")
        ops.check_divisible(width, p, "d_out" if self.blocks == 1 else "d_out of each block")
        parts = [ops.shard(full[..., k * width:(k + 1) * width], p, r) for k in range(self.blocks)]
        return copy(xp.concat(parts, axis=-1))  # (d_in, d_out/p) or (d_out/p,)

    def forward(self, x):
        x = ops.sp_gather_forward(self.comm, x) if self.sp else ops.f_forward(self.comm, x)  # (..., d_in)
        y, lin = F.linear_forward(x, self.params["w"], self.params.get("b"))  # (..., d_out/p)
        if self.gather_output:
            y = ops.gather_forward(self.comm, y)  # (..., d_out)
        return y, {"linear": lin}

    def backward_input(self, dy, ctx):
        if self.gather_output:
            dy = ops.gather_backward(self.comm, dy)  # (..., d_out/p)
        ctx["dy"] = dy  # kept for backward_weight
        dx = F.linear_backward_input(dy, ctx["linear"])  # (..., d_in), my columns' share only
        return ops.sp_gather_backward(self.comm, dx) if self.sp else ops.f_backward(self.comm, dx)

    def backward_weight(self, dy, ctx):
        dw, db = F.linear_backward_weight(ctx.pop("dy"), ctx["linear"])  # (d_in, d_out/p), (d_out/p,)
        self.grads["w"] += dw
        if db is not None:
            self.grads["b"] += db


class RowParallelLinear(nn.Linear):
    """Y = X_1 · A_1 + ... + X_p · A_p: rank r holds A_r = rows chunk r of w (d_in/p, d_out);
    the bias b (d_out,) is whole on every rank and is added once, after the sum.

    forward:  [input_is_parallel=False: split x, keep my chunk of d_in]
              y_r = x_r @ A_r (partial, (..., d_out)) -> g: all-reduce -> + b
    backward: g backward (identity): dx_r = dy @ A_r^T, dA_r = x_r^T dy, db = sum(dy)
              [input_is_parallel=False: all-gather dx_r]
    sequence_parallel: the all-reduce becomes a reduce-scatter of the tokens (sp_scatter):
    the output holds this rank's T/p tokens. Raises ValueError if p does not divide d_in.
    """

    sharded = ("w",)  # b is whole on every rank

    def __init__(self, comm, dense: nn.Linear, input_is_parallel=True, sequence_parallel=False):
        nn.Module.__init__(self)
        self.comm, self.input_is_parallel, self.sp = comm, input_is_parallel, sequence_parallel
        _copy_params(self, dense)

    def shard(self, name, full):
        """Rows chunk r of w (d_in, d_out); the bias is replicated."""
        if name == "b":
            return copy(full)  # (d_out,)
        return ops.shard(full, self.comm.size, self.comm.rank, axis=0, what="d_in")  # (d_in/p, d_out)

    def forward(self, x):
        if not self.input_is_parallel:
            x = ops.split_forward(self.comm, x)  # (..., d_in/p)
        y, lin = F.linear_forward(x, self.params["w"])  # (..., d_out): my partial sum, no bias
        y = ops.sp_scatter_forward(self.comm, y) if self.sp else ops.g_forward(self.comm, y)
        if "b" in self.params:
            y = y + self.params["b"]  # once, after the reduction (p times if added before it)
        return y, {"linear": lin}

    def backward_input(self, dy, ctx):
        dy = ops.sp_scatter_backward(self.comm, dy) if self.sp else ops.g_backward(self.comm, dy)
        ctx["dy"] = dy  # (..., d_out), all tokens: kept for backward_weight
        dx = F.linear_backward_input(dy, ctx["linear"])  # (..., d_in/p)
        return dx if self.input_is_parallel else ops.split_backward(self.comm, dx)  # (..., d_in)

    def backward_weight(self, dy, ctx):
        dy = ctx.pop("dy")
        dw, _ = F.linear_backward_weight(dy, ctx["linear"])  # (d_in/p, d_out)
        self.grads["w"] += dw
        if "b" in self.grads:
            xp = namespace(dy)
            self.grads["b"] += xp.sum(xp.reshape(dy, (-1, dy.shape[-1])), axis=0)  # (d_out,), all tokens


class ParallelMLP(nn.MLP):
    """Megatron's MLP: fc1 column-parallel -> GeLU on each rank's own columns -> fc2 row-parallel.

    The GeLU needs no communication because a column split keeps whole columns of the hidden
    layer on one rank. One all-reduce in the forward (g, in fc2) and one in the backward
    (f, in fc1). Raises ValueError if p does not divide d_hidden.
    """

    def __init__(self, comm, dense: nn.MLP, sequence_parallel=False):
        nn.Module.__init__(self)
        self.fc1 = ColumnParallelLinear(comm, dense.fc1, sequence_parallel=sequence_parallel)  # C -> H/p
        self.gelu = nn.GeLU()
        self.drop = nn.Dropout(site="hidden")  # inside the TP region: my columns of the hidden layer
        self.fc2 = RowParallelLinear(comm, dense.fc2, sequence_parallel=sequence_parallel)  # H/p -> C


class ParallelSelfAttention(nn.CausalSelfAttention):
    """Heads split across ranks: rank r runs heads r*nh/p ... (r+1)*nh/p - 1.

    qkv is column-parallel (each rank computes q, k, v of its heads only), attention runs per
    head with no communication, and the output projection is row-parallel (its input rows are
    exactly this rank's heads). One all-reduce forward (proj), one backward (qkv).
    ``backward_input`` is the dense one, unchanged. Raises ValueError if p does not divide n_heads.
    """

    def __init__(self, comm, dense: nn.CausalSelfAttention, sequence_parallel=False):
        nn.Module.__init__(self)
        self.n_heads = ops.check_divisible(dense.n_heads, comm.size, "n_heads")  # heads on this rank
        self.qkv = ColumnParallelLinear(comm, dense.qkv, blocks=3, sequence_parallel=sequence_parallel)  # C -> 3C/p
        self.proj = RowParallelLinear(comm, dense.proj, sequence_parallel=sequence_parallel)  # C/p -> C

    def forward(self, x):
        ctx = {}
        qkv, ctx["qkv"] = self.qkv.forward(x)  # (B, T, 3C/p): q | k | v of my heads
        c = qkv.shape[-1] // 3  # C/p
        q, k, v = (self._split_heads(qkv[..., i * c:(i + 1) * c]) for i in range(3))  # (B, nh/p, T, hs)
        y, ctx["att"] = self._core(q, k, v)  # (B, nh/p, T, hs); dropout: at my heads' global index
        out, ctx["proj"] = self.proj.forward(self._merge_heads(y))  # (B, T, C) after the all-reduce
        return out, ctx


class SequenceParallelLayerNorm(nn.LayerNorm):
    """A LayerNorm on this rank's T/p tokens. gamma and beta are whole on every rank, but each
    rank's gradient covers only its tokens: backward_weight all-reduces them (one message)."""

    def __init__(self, comm, dense: nn.LayerNorm):
        nn.LayerNorm.__init__(self, dense.params["gamma"].shape[0], dense.eps)
        self.comm = comm
        _copy_params(self, dense)

    def shard(self, name, full):
        return copy(full)  # replicated

    def backward_weight(self, dy, ctx):
        xp = namespace(dy)
        dgamma, dbeta = F.layernorm_backward_weight(dy, ctx)  # (C,) each: my tokens only
        both = all_reduce(self.comm, xp.concat([dgamma, dbeta]))  # (2C,): every token
        C = dgamma.shape[0]
        self.grads["gamma"] += both[:C]
        self.grads["beta"] += both[C:]


def _replicated_layernorm(dense: nn.LayerNorm):
    ln = nn.LayerNorm(dense.params["gamma"].shape[0], dense.eps)
    ln.params = {k: copy(v) for k, v in dense.params.items()}
    return ln


class ParallelBlock(nn.Block):
    """The pre-LN transformer block with tensor-parallel attention and MLP.

    sequence_parallel=False: x (B, T, C) is whole on every rank; LayerNorms run replicated;
    2 all-reduces forward, 2 backward.
    sequence_parallel=True (Megatron-SP, Korthikanti et al. 2022): x is this rank's (B, T/p, C);
    LayerNorms and residuals run on T/p tokens, so their activations take 1/p of the memory.
    Each all-reduce becomes an all-gather entering the TP region and a reduce-scatter leaving
    it (same bytes), plus one small all-reduce of each LayerNorm's gamma/beta gradients.
    ``attn`` / ``mlp``: a module to use instead of the tensor-parallel one, built by the caller
    (a context-parallel attention, a mixture of experts).
    """

    def __init__(self, comm, dense: nn.Block, sequence_parallel=False, attn=None, mlp=None):
        nn.Module.__init__(self)
        sp = sequence_parallel
        norm = (lambda ln: SequenceParallelLayerNorm(comm, ln)) if sp else _replicated_layernorm
        self.ln1 = norm(dense.ln1)
        self.attn = attn if attn is not None else ParallelSelfAttention(comm, dense.attn, sequence_parallel=sp)
        self.ln2 = norm(dense.ln2)
        self.mlp = mlp if mlp is not None else ParallelMLP(comm, dense.mlp, sequence_parallel=sp)
        self.attn_drop, self.mlp_drop = nn.Dropout(site="attn"), nn.Dropout(site="mlp")


# --------------------------------------------------------------------------- comparing with the dense twin


def modules(model, prefix=""):
    """(qualified prefix, module) for the model and every module inside it."""
    yield prefix, model
    for name, child in model.children().items():
        yield from modules(child, f"{prefix}{name}.")


def local_shards(model, full: dict) -> dict:
    """{qualified name: this rank's piece of full[name]} for every parameter of ``model``.

    ``full`` maps the dense twin's names to arrays (its params, or its grads); layers without a
    ``shard`` method (GeLU, a replicated LayerNorm) hold the whole array.
    """
    out = {}
    for prefix, m in modules(model):
        for name in m.params:
            whole = full[prefix + name]
            out[prefix + name] = m.shard(name, whole) if hasattr(m, "shard") else whole
    return out


def activation_bytes(ctx, model=None) -> int:
    """Bytes of the arrays a ctx keeps alive until the backward (parameters of ``model`` excluded)."""
    params = {id(p) for _, p in model.named_parameters()} if model is not None else set()
    seen, total, stack = set(), 0, [ctx]
    while stack:
        c = stack.pop()
        if isinstance(c, dict):
            stack.extend(c.values())
        elif isinstance(c, (tuple, list)):
            stack.extend(c)
        elif hasattr(c, "shape") and id(c) not in seen and id(c) not in params:
            seen.add(id(c))
            total += nbytes(c)
    return total
