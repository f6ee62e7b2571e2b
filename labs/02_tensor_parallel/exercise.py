"""Lab 02: tensor parallelism.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/02_tensor_parallel/exercise.py   # see what your code does
    torchrun --standalone --nproc-per-node 4 minipar-labs/02_tensor_parallel/exercise.py   # the same, torch
    minipar check 02                                                    # grade every task
    minipar check 02 --task 2.3                                         # grade one task
    minipar check 02 --backend torch                                    # grade it on torch tensors

Every rank holds the FULL weights (drawn from the same seed) and takes its own shard:
rank r owns chunk r, with chunks from chunk_bounds(n, p). Weights are (d_in, d_out) and a
linear layer is y = x @ w + b. Communicate with minipar.collectives (all_reduce, all_gather);
comm.builtin is off limits.

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
from minipar.collectives import all_reduce  # all_reduce(comm, x): the sum of every rank's x
from minipar.nn.functional import attention_forward, gelu_forward  # (q, k, v) -> (out, ctx); x -> (y, ctx)
from minipar.xp import chunk_bounds  # chunk_bounds(n, p)[r] = (start, stop) of rank r's chunk
from minipar.xp import namespace  # namespace(x): the array API of x (NumPy's, or torch's)


def column_forward(comm, x, w, b):
    """Column split, forward: Y = X · [A_1 ... A_p].

    x (N, d_in), w (d_in, d_out) and b (d_out,) are whole on every rank. Rank r takes
    A_r = columns chunk r of w and b_r = chunk r of b, and returns Y_r = x @ A_r + b_r, of
    shape (N, d_out/p): its own columns of Y. No communication.
    """
    # TODO(lab2.1): slice your columns with chunk_bounds(d_out, p)[comm.rank], then one matmul
    raise NotImplementedError("lab 2.1")


def row_forward(comm, x, w, b):
    """Row split, forward: Y = X_1 · A_1 + ... + X_p · A_p + b.

    x (N, d_in), w (d_in, d_out), b (d_out,) whole on every rank. Rank r takes X_r = columns
    chunk r of x and A_r = rows chunk r of w, computes its partial sum X_r @ A_r (N, d_out),
    and the ranks add them up with one all-reduce. Return Y (N, d_out) on every rank.
    Where does the bias go?
    """
    # TODO(lab2.2): slice X_r and A_r, one matmul, all_reduce, then the bias
    raise NotImplementedError("lab 2.2")


def column_backward(comm, dy_r, x, w):
    """Backward of column_forward. dy_r (N, d_out/p) is the gradient of this rank's Y_r.

    Return (dx, dw_r, db_r):
      dx   (N, d_in)      the gradient of the whole input x. Every rank's columns used all of x,
                          so each rank only has a share dY_r @ A_r^T: this is f's backward.
      dw_r (d_in, d_out/p) = x^T dY_r, the gradient of A_r
      db_r (d_out/p,)      = dY_r summed over the rows
    """
    # TODO(lab2.3): the three gradients; dx needs one collective
    raise NotImplementedError("lab 2.3")


def row_backward(comm, dy, x, w):
    """Backward of row_forward. dy (N, d_out) is whole on every rank (g's backward: identity).

    Return (dx_r, dw_r, db):
      dx_r (N, d_in/p)     = dY @ A_r^T, the gradient of X_r (this rank's columns of x)
      dw_r (d_in/p, d_out) = X_r^T dY, the gradient of A_r
      db   (d_out,)        = dY summed over the rows (the bias is whole on every rank)
    How many messages does this need?
    """
    # TODO(lab2.4): slice X_r and A_r as in 2.2, then three local products
    raise NotImplementedError("lab 2.4")


def megatron_mlp(comm, x, w1, b1, w2, b2):
    """Megatron's MLP, forward: Y = GeLU(x @ w1 + b1) @ w2 + b2 with w1 split by columns and
    w2 by rows, so that each rank's GeLU runs on its own columns of the hidden layer.

    x (N, d), w1 (d, H), b1 (H,), w2 (H, d), b2 (d,) whole on every rank. Return Y (N, d) on
    every rank using exactly one all-reduce.
    """
    # TODO(lab2.5): column_forward for fc1, gelu_forward(h)[0], then a row split for fc2
    raise NotImplementedError("lab 2.5")


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    """Causal self-attention with the heads split across ranks: rank r runs heads chunk r.

    x (B, T, C); w_qkv (C, 3C) = [Wq | Wk | Wv] side by side and b_qkv (3C,) likewise; head h
    uses columns h*hs:(h+1)*hs of each of Wq, Wk, Wv (hs = C // n_heads). w_proj (C, C),
    b_proj (C,). Steps on rank r:
      1. q, k, v of my heads: my chunk of the columns of EACH of Wq, Wk, Wv (not of w_qkv as a whole)
      2. reshape each (B, T, C/p) -> (B, T, nh/p, hs), swap axes 1 and 2 -> (B, nh/p, T, hs)
         (xp.permute_dims(a, (0, 2, 1, 3))) and run attention_forward(q, k, v)[0]
      3. back to (B, T, C/p): my heads' outputs are my rows of w_proj -> a row split + all-reduce
    Return (B, T, C) on every rank. The dense version: minipar.nn.CausalSelfAttention.forward.
    """
    # TODO(lab2.6): q, k, v shards, per-head attention, row-parallel projection
    raise NotImplementedError("lab 2.6")


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
