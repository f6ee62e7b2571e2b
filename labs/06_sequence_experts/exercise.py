"""Lab 06: long sequences and many experts.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 3 python -m mpi4py minipar-labs/06_sequence_experts/exercise.py   # see what your code does
    torchrun --standalone --nproc-per-node 3 minipar-labs/06_sequence_experts/exercise.py   # the same, torch
    minipar check 06                                                     # grade every task
    minipar check 06 --task 6.2                                          # grade one task
    minipar check 06 --backend torch                                     # grade it on torch tensors

Part 1, context parallelism: the sequence is split over the ranks. Rank r holds positions
r*t ... (r+1)*t - 1 of q, k and v (each (B, nh, t, hs), t = T/p: the contiguous split).
Part 2, expert parallelism: E experts, rank r owns experts r*E/p ... (r+1)*E/p - 1, and every
rank routes its own N tokens.

One code, two backends: q, k, v, x and the weights are NumPy arrays under MPI and torch tensors
under torch.distributed. Compute through their array namespace, xp = namespace(q) (minipar.xp):
xp.maximum, xp.exp, xp.where, xp.stack, xp.concat, xp.reshape, xp.permute_dims, xp.tril; allocate
with empty(shape, like=x) / zeros(shape, like=x); contiguous(x) before sending a permuted array;
comm.asarray(a) turns a NumPy array into the backend's kind. The routing decisions (which token
goes where) are integers: make them on the host with NumPy, on to_numpy(probs), as
minipar.experts.routing does: choice, keep and the counts are NumPy arrays.

Communicate with comm.isend / comm.irecv (the ring) and minipar.collectives (all_to_all,
all_to_all_v); comm.builtin is off limits. The grader counts every byte each rank sends, and
hands ring and Ulysses attention a kernel `attend` that records what it is given, and when.

attend(q, k, v, mask=None) -> (acc, m, l): one block of queries against one block of keys.
    acc (B, nh, tq, hs) = sum_j exp(s_j - m) v_j    the unnormalised output
    m   (B, nh, tq, 1)  = max_j s_j                  the running max of the scores s = q k^T / sqrt(hs)
    l   (B, nh, tq, 1)  = sum_j exp(s_j - m)         the running sum
mask: None (every pair allowed) or a (tq, tk) bool array (NumPy or the backend's), True where
query i may see key j.
A query row whose keys are all masked comes back as "nothing seen": acc = 0, m = -inf, l = 0.
The attention output is acc / l once every key has been seen.
"""
import numpy as np

import minipar
from minipar.collectives import all_to_all, all_to_all_v  # rows of x to every rank; see their docstrings
from minipar.nn.functional import attention_forward, gelu_forward, softmax_forward  # x -> (y, ctx)
from minipar.xp import contiguous, empty, namespace, to_numpy, zeros  # follow their argument's kind and device


# --------------------------------------------------------------------------- context parallelism

def merge(a, b):
    """The exact merge of two partial states a = (acc_a, m_a, l_a), b = (acc_b, m_b, l_b) of
    the same queries over two disjoint sets of keys: the state over the union.

    Each block's sums are relative to its own max. Rescale both to m = max(m_a, m_b):
        acc = acc_a * exp(m_a - m) + acc_b * exp(m_b - m),   l likewise.
    A row that saw no key in either block (m_a = m_b = -inf) must stay "nothing seen"
    (acc = 0, m = -inf, l = 0), not NaN. No communication: array math only (xp = namespace(acc_a)).
    """
    # TODO(lab6.1): m = xp.maximum(m_a, m_b); the two scale factors (careful where m = -inf); combine
    raise NotImplementedError("lab 6.1")


def ring_attention(comm, q, k, v, attend, causal):
    """Ring attention, forward: this rank's output rows, (B, nh, t, hs).

    K and V travel around the ring to the right: in step s = 0 ... p-1 rank r holds the K/V
    block of rank (r - s) % p. Each step: post the transfer of the block you hold (isend to
    rank r+1, irecv of the next one from rank r-1; K and V stacked into ONE message,
    kv = xp.stack([k, v])), attend your queries to the block you hold and merge() the result
    into your running state, THEN wait: the transfer hides behind the compute. The last step
    sends nothing. No rank ever holds more than two K/V blocks.

    causal: query position i sees key positions j <= i only. Blocks of later ranks are then
    entirely in the future (skip them); your own block needs mask = xp.tril(xp.ones((t, t), dtype=xp.bool));
    earlier blocks need no mask.
    """
    # TODO(lab6.2): a loop of p steps; state = merge(state, attend(q, kv[0], kv[1], mask)); out = acc / l
    raise NotImplementedError("lab 6.2")


def ulysses_attention(comm, q, k, v, attend, causal):
    """Ulysses (DeepSpeed-Ulysses), forward: this rank's output rows, (B, nh, t, hs).

    Trade the sequence split for a heads split: with h = nh / p, rank j gets head group j
    (heads j*h ... (j+1)*h - 1) of your rows, and you get your head group of every rank's rows.
    1. one all_to_all: q, k, v (B, nh, t, hs) -> (B, h, T, hs), positions in order (rank i's
       rows are positions i*t ...). all_to_all(comm, x) sends row j of x (axis 0) to rank j and
       returns the rows every rank sent you, row i from rank i: put the head groups on axis 0.
    2. attend ONCE to all T positions of your h heads (causal: mask = xp.tril(xp.ones((T, T), dtype=xp.bool))),
       out = acc / l
    3. one all_to_all back: (B, h, T, hs) -> (B, nh, t, hs).
    """
    # TODO(lab6.3): reshape/transpose so that axis 0 is the destination rank, all_to_all, and back
    raise NotImplementedError("lab 6.3")


# --------------------------------------------------------------------------- expert parallelism

def route(comm, probs, k, capacity_factor):
    """Top-k routing with a capacity, for this rank's N tokens: (choice, keep).

    probs (N, E): the router's probabilities (the backend's kind: the decisions are integers,
    make them on the host, on to_numpy(probs)). choice (N, k) int: each token's k most probable
    experts, best first (ties: the lower expert index). keep (N, k) bool: whether the choice
    fits in its expert's capacity = ceil(capacity_factor * k * N / E) assignments from THIS
    rank's tokens. Priority: every token's first choice before any second choice, and within a
    choice the earlier token first. No communication: every rank decides its own drops.
    """
    # TODO(lab6.4): np.argsort(-to_numpy(probs), axis=1, kind="stable"); then grant capacity in priority order
    raise NotImplementedError("lab 6.4")


def dispatch(comm, x, choice, keep, n_experts):
    """Send every kept (token, choice) row of x (N, C) to the rank of its expert: (rows, counts).

    x is the backend's kind; choice and keep (N, k) are NumPy (route's host decisions).
    The rows a rank sends are its kept assignments expert by expert, each expert's in priority
    order (first choices token by token, then second choices). Rank j owns experts
    j*E/p ... (j+1)*E/p - 1, so the rows for rank j are consecutive.
      1. my counts (E,) -> (p, E/p): rows for each local expert of each rank. Exchange them with
         one all_to_all (int64, comm.asarray(...)): counts[i, e] = rows rank i sends to my local expert e.
      2. one all_to_all_v(comm, rows, send_counts) -> the rows every rank sent me, by source rank.
    Return rows grouped by my local expert (expert 0's from rank 0, 1, ..., then expert 1's ...),
    and counts (p, E/p) (NumPy: to_numpy of what the all_to_all returns).
    """
    # TODO(lab6.5): kept rows in order, the counts exchange, the all-to-all-v, regroup by expert
    raise NotImplementedError("lab 6.5")


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    """The mixture-of-experts layer, expert parallel: y (N, C) for this rank's tokens x (N, C).

    probs = softmax(x @ w_router) (w_router (C, E)); route (6.4); dispatch (6.5); each local
    expert e runs on its rows: GeLU(rows @ w1 + b1) @ w2 + b2 with (w1, b1, w2, b2) = experts[e]
    (only your own experts are real: the others are NaN); then the combine, the dispatch
    reversed: one all_to_all_v that returns every row to the rank it came from, in the order
    that rank sent it. y[n] = sum over token n's kept choices c of probs[n, e_c] * output;
    a token whose choices were all dropped gets 0 (the block's residual carries it).
    """
    # TODO(lab6.6): route, dispatch, experts, back to source-rank order, all_to_all_v, gate and add
    raise NotImplementedError("lab 6.6")


if __name__ == "__main__":
    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(0)  # the same draw on every rank
    q, k, v = (rng.standard_normal((1, 2 * p, 3 * p, 4)) for _ in range(3))  # (B, nh, T, hs)
    want, _ = attention_forward(q, k, v, causal=True)  # dense, the whole sequence (NumPy, one process)
    rows = slice(3 * r, 3 * (r + 1))
    from minipar.context_parallel.blocks import block_attention as attend  # the grader's kernel, uninstrumented

    for name, fn in (("ring_attention", ring_attention), ("ulysses_attention", ulysses_attention)):
        try:
            got = fn(comm, *(comm.asarray(a[..., rows, :]) for a in (q, k, v)), attend, True)  # my rows
            print(f"rank {r}: {name} -> {tuple(got.shape)}, max error vs dense causal attention "
                  f"{np.abs(to_numpy(got) - want[..., rows, :]).max():.1e}", flush=True)
        except NotImplementedError as e:
            print(f"rank {r}: {name} not implemented yet ({e})", flush=True)
    try:
        logits = comm.asarray(np.random.default_rng(r).standard_normal((8, 2 * p)))  # my 8 tokens, 2p experts
        choice, keep = route(comm, softmax_forward(logits)[0], 2, 1.0)
        keep = to_numpy(keep)
        print(f"rank {r}: route kept {int(keep.sum())} of {keep.size} choices", flush=True)
    except NotImplementedError as e:
        print(f"rank {r}: route not implemented yet ({e})", flush=True)
    if r == 0:
        print("now grade it: minipar check 06")
