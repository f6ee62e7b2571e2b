"""Lab 02: tensor parallelism.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/02_tensor_parallel/exercise.py   # see what your code does
    torchrun --standalone --nproc-per-node 4 minipar-labs/02_tensor_parallel/exercise.py   # the same, torch
    minipar check 02                                                    # grade every task
    minipar check 02 --task 2.3                                         # grade one task
    minipar check 02 --backend torch                                    # grade it on torch tensors

Every rank holds the FULL weights (drawn from the same seed) and takes its own shard:
rank r owns chunk r, with chunks from chunk_bounds(n, p). Weights are (d_in, d_out) and a
linear layer is y = x @ w + b. Communicate with minipar.collectives (all_reduce, all_gather,
reduce_scatter); comm.builtin is off limits.

Two tiers: the guided tasks (2.1-2.6) build tensor parallelism one split at a time; the core
tasks (2.7, 2.8) give only a contract (what each rank holds before and after, what it may send)
and leave the technique's communication to you.

One code, two backends: the arrays are NumPy arrays under MPI and torch tensors under
torch.distributed. Slicing, @, + and .reshape read the same on both; for the rest use the array
API of your input, xp = namespace(x) (xp.permute_dims, xp.sum, ...).

The grader hands each rank the parts of the weights (and inputs) that other ranks own as NaN,
and watches what your code multiplies: slice your shard first, then compute with it only. It
also counts what each rank sends: exactly one ring all-reduce where the task needs one, and
nothing where it needs none.
"""
import numpy as np

import minipar
from minipar.collectives import all_gather, all_reduce, reduce_scatter  # rings along axis 0 (lab 01)
from minipar.nn.functional import attention_forward, gelu_forward  # (q, k, v) -> (out, ctx); x -> (y, ctx)
from minipar.xp import chunk_bounds  # chunk_bounds(n, p)[r] = (start, stop) of rank r's chunk
from minipar.xp import contiguous, namespace  # contiguous(a): a C-ordered copy if needed; namespace(x): x's array API


# ---------------------------------------------------------------- guided: the splits, one at a time

def column_forward(comm, x, w, b):
    """Column split, forward: Y = X · [A_1 ... A_p].

    Before: x (N, d_in), w (d_in, d_out) and b (d_out,) whole-shaped on every rank; rank r owns
    A_r, its chunk of w's columns, and b_r, the same chunk of b (the rest is another rank's).
    After: Y_r = x @ A_r + b_r, shape (N, d_out/p): rank r's own columns of Y.
    Messages: none.
    """
    # TODO(lab2.1)
    raise NotImplementedError("lab 2.1")


def row_forward(comm, x, w, b):
    """Row split, forward: Y = X_1 · A_1 + ... + X_p · A_p + b.

    Before: x (N, d_in), w (d_in, d_out), b (d_out,) whole-shaped on every rank; rank r owns
    X_r, its chunk of x's columns, and A_r, the same chunk of w's rows; b is whole everywhere.
    After: Y = x @ w + b, shape (N, d_out), on every rank.
    Messages: one all-reduce of an (N, d_out) array. Where does the bias go?
    """
    # TODO(lab2.2)
    raise NotImplementedError("lab 2.2")


def column_backward(comm, dy_r, x, w):
    """Backward of column_forward. dy_r (N, d_out/p) is the gradient of this rank's Y_r; x and w
    as in column_forward (rank r owns A_r only).

    Return (dx, dw_r, db_r):
      dx   (N, d_in)        the gradient of the whole input x, the same on every rank
      dw_r (d_in, d_out/p)  the gradient of A_r
      db_r (d_out/p,)       the gradient of b_r
    Messages: at most one all-reduce of an (N, d_in) array. Which gradient needs it?
    """
    # TODO(lab2.3)
    raise NotImplementedError("lab 2.3")


def row_backward(comm, dy, x, w):
    """Backward of row_forward. dy (N, d_out), the gradient of Y, is whole on every rank; x and w
    as in row_forward (rank r owns X_r and A_r only).

    Return (dx_r, dw_r, db):
      dx_r (N, d_in/p)      the gradient of X_r (this rank's columns of x)
      dw_r (d_in/p, d_out)  the gradient of A_r
      db   (d_out,)         the gradient of b (whole, as b is)
    How many messages does this need?
    """
    # TODO(lab2.4)
    raise NotImplementedError("lab 2.4")


def megatron_mlp(comm, x, w1, b1, w2, b2):
    """Megatron's MLP, forward: Y = GeLU(x @ w1 + b1) @ w2 + b2.

    Before: x (N, d) and b2 (d,) whole; w1 (d, H) and b1 (H,): rank r owns its chunk of the H
    columns; w2 (H, d): rank r owns the same chunk of its rows.
    After: Y (N, d) on every rank.
    Messages: exactly one all-reduce of an (N, d) array.
    """
    # TODO(lab2.5)
    raise NotImplementedError("lab 2.5")


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    """Causal self-attention with the heads split across ranks.

    Layout: x (B, T, C); w_qkv (C, 3C) = [Wq | Wk | Wv] side by side and b_qkv (3C,) likewise;
    head h uses columns h*hs:(h+1)*hs of each of Wq, Wk, Wv (hs = C // n_heads), and its output
    meets the same rows of w_proj (C, C); b_proj (C,).
    Before: x, b_proj whole; rank r owns the heads of its chunk of the n_heads: their columns of
    Wq, Wk and Wv (and of b_qkv), their rows of w_proj (the rest is another rank's).
    After: the (B, T, C) output of minipar.nn.CausalSelfAttention.forward, on every rank.
    Messages: one all-reduce of a (B, T, C) array.
    """
    # TODO(lab2.6)
    raise NotImplementedError("lab 2.6")


# ---------------------------------------------------------------- core: the technique's messages, yours

def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    """The MLP half of a transformer block with sequence parallelism (Megatron-SP):
    out = x + GeLU(norm(x) @ w1 + b1) @ w2 + b2, norm being the block's LayerNorm.

    Before: x (B, T, C) is whole-shaped, but rank r holds only its chunk of the T tokens
    (axis 1): the other ranks' tokens are NaN. w1 (C, H) and b1 (H,): rank r owns its chunk
    of the H columns; w2 (H, C): the same chunk of its rows; b2 (C,) is whole. norm(a) is the
    block's LayerNorm over the last axis of any (B, t, C) array.
    After: rank r returns its own tokens of out, shape (B, T/p, C).
    Messages: no more bytes than the one all-reduce of a (B, T, C) array that the tensor-parallel
    MLP sends, spent on an all-gather of the tokens where the column split needs all of them and
    a reduce-scatter of the tokens where the row split's partial sums leave. minipar.collectives'
    all_gather and reduce_scatter work along axis 0.
    Memory: whatever runs on the tokens outside those two (the LayerNorm above all) runs on this
    rank's T/p tokens only; the grader counts the rows norm is given.
    """
    # TODO(lab2.7)
    raise NotImplementedError("lab 2.7")


def heads_attention_backward(comm, dout, x, w_qkv, b_qkv, w_proj, n_heads):
    """The backward of heads_attention (2.6): given dout (B, T, C), the gradient of its output,
    the gradients of its input and of this rank's weights.

    Before: the layout and ownership of 2.6 (rank r owns its heads' columns of Wq, Wk, Wv and of
    b_qkv, their rows of w_proj; the rest is NaN); x and dout whole on every rank.
    After, on rank r:
      dx      (B, T, C)   the gradient of the whole input x, the same on every rank
      dw_qkv  (C, 3C/p)   the gradient of its columns of w_qkv: [q | k | v] of its heads, side by side
      db_qkv  (3C/p,)     the gradient of its elements of b_qkv, in the same order
      dw_proj (C/p, C)    the gradient of its rows of w_proj
      db_proj (C,)        the gradient of b_proj (whole, as b_proj is)
    Messages: at most one all-reduce of a (B, T, C) array.
    Write the attention's backward yourself (minipar.nn.functional.attention_backward and
    softmax_backward are the grader's reference, refused inside this call); attention_forward
    is yours to use, for the forward of your heads again.
    """
    # TODO(lab2.8)
    raise NotImplementedError("lab 2.8")


if __name__ == "__main__":
    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    rng = np.random.default_rng(0)  # the same draw on every rank
    x, w, b = (comm.asarray(rng.standard_normal(shape)) for shape in ((3, 8), (8, 8), (8,)))
    for name, call, want in [("column_forward", lambda: column_forward(comm, x, w, b), None),
                             ("row_forward", lambda: row_forward(comm, x, w, b), x @ w + b)]:
        try:
            got = call()
            err = "" if want is None else f"  (max error vs x @ w + b: {float(abs(got - want).max()):.1e})"
            print(f"rank {comm.rank}: {name} -> shape {tuple(got.shape)}{err}", flush=True)
        except NotImplementedError as e:
            print(f"rank {comm.rank}: {name} not implemented yet ({e})", flush=True)
    if comm.rank == 0:
        print("now grade it: minipar check 02")
