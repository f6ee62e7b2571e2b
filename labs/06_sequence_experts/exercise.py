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
from minipar.collectives import all_reduce, all_to_all, all_to_all_v  # rows of x to every rank; see their docstrings
from minipar.nn.functional import attention_forward, gelu_backward, gelu_forward, softmax_backward, softmax_forward  # (y, ctx)
from minipar.xp import contiguous, empty, namespace, to_numpy, zeros  # follow their argument's kind and device


# --------------------------------------------------------------------------- context parallelism

def merge(a, b):
    """The exact merge of two partial states a = (acc_a, m_a, l_a), b = (acc_b, m_b, l_b) of
    the same queries over two disjoint sets of keys: the state over the union.

    Returns (acc, m, l), exactly the state attend would have returned for the union of the keys
    (only the rounding may differ): m the max over both sets, acc and l relative to that m. Each
    block's sums are relative to its own max (the README's Background). Nothing may overflow, however
    far apart the two blocks' scores are; a row that saw no key in either block (m_a = m_b = -inf)
    must stay "nothing seen" (acc = 0, m = -inf, l = 0), not NaN. No communication: array math
    only (xp = namespace(acc_a)).
    """
    # TODO(lab6.1): bring both states to the common max, then add
    raise NotImplementedError("lab 6.1")


def ring_attention(comm, q, k, v, attend, causal):
    """Ring attention, forward: this rank's output rows, (B, nh, t, hs).

    Before: this rank holds its own rows of q, k and v. After: its queries' attention output over
    the whole sequence's keys, out = acc / l of the state merged (6.1) from one attend call per
    K/V block. No rank ever holds more than two K/V blocks at once.

    What may be sent: K/V blocks only, around a ring to the right (each rank sends to the next
    rank, the last one to rank 0, and receives from the previous one): K and V stacked into ONE
    message per block (xp.stack([k, v])), p - 1 messages per rank (a block that has visited every
    rank goes no further). Overlap: every block but the last is attended to while the transfer of
    the next one is in flight (comm.isend / comm.irecv posted before attend, waited for after).

    causal: query position i sees key positions j <= i only. A block entirely in your queries'
    future adds nothing (skip it); your own block needs the lower-triangular mask,
    xp.tril(xp.ones((t, t), dtype=xp.bool)); a block entirely in the past needs none.
    """
    # TODO(lab6.2): p steps, each with one K/V block in hand: start its transfer, attend and merge, then wait
    raise NotImplementedError("lab 6.2")


def ulysses_attention(comm, q, k, v, attend, causal):
    """Ulysses (DeepSpeed-Ulysses), forward: this rank's output rows, (B, nh, t, hs).

    Trade the sequence split for a heads split, and back. With h = nh / p, head group j is heads
    j*h ... (j+1)*h - 1.
    When it attends, this rank holds head group r of EVERY position: q, k, v (B, h, T, hs),
    positions in order. It calls attend ONCE, on all T positions (causal: the (T, T)
    lower-triangular mask, xp.tril(xp.ones((T, T), dtype=xp.bool))); out = acc / l.
    After: its own rows of every head again, (B, nh, t, hs).

    What may be sent: minipar.collectives.all_to_all, there and back; each keeps the 1/p of its
    input that stays on this rank and sends the rest, so (p-1)/p of q, k, v and of the output
    leave the rank. all_to_all(comm, x) sends row j of x (axis 0) to rank j and returns the rows
    every rank sent you, row i from rank i.
    """
    # TODO(lab6.3): to the heads split, attend once, back to the sequence split
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
    # TODO(lab6.4): each token's k best experts, then the capacity, granted in priority order
    raise NotImplementedError("lab 6.4")


def dispatch(comm, x, choice, keep, n_experts):
    """Send every kept (token, choice) row of x (N, C) to the rank of its expert: (rows, counts).

    x is the backend's kind; choice and keep (N, k) are NumPy (route's host decisions). Rank j
    owns experts j*E/p ... (j+1)*E/p - 1.
    A rank sends its kept assignments expert by expert, each expert's in priority order (first
    choices token by token, then second choices): the rows for one rank are consecutive.
    After: rows, every row any rank sent to one of my experts, grouped by my local expert (expert
    0's from rank 0, 1, ..., then expert 1's ...), each source's in the order it sent them; and
    counts (p, E/p), NumPy int: counts[i, e] = the rows rank i sent to my local expert e.

    What may be sent: the counts first (one all_to_all of int64, comm.asarray(...): no rank knows
    what the others will send it), then the rows, each kept row once, to its expert's rank (one
    all_to_all_v). Nothing else.
    """
    # TODO(lab6.5): which rows go where, the counts, the rows, then your experts' order
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
    # TODO(lab6.6): the whole layer, with the combine's order the dispatch's reversed
    raise NotImplementedError("lab 6.6")


# --------------------------------------------------------------------------- the backward passes (core)

def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    """Ring attention, backward: (dq, dk, dv) of this rank's rows, each (B, nh, t, hs).

    Before: this rank holds only its own rows: q, k, v, the forward's output out and the loss's
    gradient dout, all (B, nh, t, hs), and lse (B, nh, t, 1), what the forward saved: each of its
    queries' log-sum-exp of scores, m + log(l) of the final state.
    After: dq, the gradient of its queries; dk and dv, the gradients of ITS keys and values,
    which every rank's queries that saw them contribute to.

    attend_backward(q, k, v, dout, lse, delta, mask=None) -> (dq, dk, dv): one block of queries
    against one block of keys: what this pair adds to the queries' dq and to the keys' dk, dv.
    lse and delta belong to the queries; delta (B, nh, tq, 1) is the sum over hs of dout * out.
    mask: as attend's in 6.2 (causal: the same pairs as the forward). Compute every pair of
    blocks through it, one block of t keys at a time, each pair once.

    What may be sent: K/V blocks and partial sums of dK/dV blocks, only to the next rank of the
    ring (the last one's is rank 0): per rank, p - 1 K|V blocks and p - 1 dK|dV blocks, 4 (p-1)
    B nh t hs numbers; nothing else (lse, out and dout stay home). comm.isend / comm.irecv or
    comm.sendrecv; a blocking comm.send is synchronous (it waits for the receiver): a ring in
    which every rank sends first never ends.
    """
    # TODO(lab6.7): every block pair once, K/V around the ring, each block's gradient home to its owner
    raise NotImplementedError("lab 6.7")


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    """The expert-parallel MoE layer with the load-balancing loss, forward and backward:
    (y, aux, dx, d_router, d_experts) for this rank's tokens x (N, C).

    The forward is 6.6's (y (N, C), the same routing, dispatch and combine), plus the Switch
    Transformer's load-balancing loss over every rank's tokens together (one balancing group of
    p N tokens): aux = aux_weight * E * sum_e f_e P_e, f_e the fraction of the k p N choices
    (before capacity drops) that picked expert e, P_e the mean router probability of e. f counts
    choices: no gradient flows through it. aux is one float, the same on every rank.

    The loss is L = sum over every rank's tokens of dy . y, plus aux; dy (N, C) is dL/dy for
    your tokens. Return its gradients:
      dx (N, C)       dL/dx of your tokens
      d_router (C, E) the part of dL/dw_router that comes through your tokens (summed over the
                      ranks it is the whole gradient; that sum is not part of this task)
      d_experts       one (dw1, db1, dw2, db2) per expert you own, in order: dL/d of its
                      weights, every rank's tokens included
    You are handed every expert's weights, but only your own are real (the others are NaN).

    What may be sent: 6.6's messages (the counts, each kept row to its expert's rank and its
    output back), one all_reduce of 2E numbers for the loss (minipar.collectives), and in the
    backward each kept row's gradient once to its expert's rank and once back. Nothing else.
    """
    # TODO(lab6.8): the forward as 6.6, keeping what the backward needs; then back the way it came
    raise NotImplementedError("lab 6.8")


if __name__ == "__main__":
    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(0)  # the same draw on every rank
    q, k, v = (rng.standard_normal((1, 2 * p, 3 * p, 4)) for _ in range(3))  # (B, nh, T, hs)
    want, ctx = attention_forward(q, k, v, causal=True)  # dense, the whole sequence (NumPy, one process)
    rows = slice(3 * r, 3 * (r + 1))
    from minipar.context_parallel.blocks import block_attention as attend  # the grader's kernels, uninstrumented
    from minipar.context_parallel.blocks import block_attention_backward as attend_backward
    from minipar.nn.functional import attention_backward

    for name, fn in (("ring_attention", ring_attention), ("ulysses_attention", ulysses_attention)):
        try:
            got = fn(comm, *(comm.asarray(a[..., rows, :]) for a in (q, k, v)), attend, True)  # my rows
            print(f"rank {r}: {name} -> {tuple(got.shape)}, max error vs dense causal attention "
                  f"{np.abs(to_numpy(got) - want[..., rows, :]).max():.1e}", flush=True)
        except NotImplementedError as e:
            print(f"rank {r}: {name} not implemented yet ({e})", flush=True)
    dout = rng.standard_normal(q.shape)  # the loss's gradient of the output
    grads = attention_backward(dout, ctx)  # dense (dq, dk, dv)
    acc, m, l = attend(q, k, v, np.tril(np.ones((3 * p, 3 * p), dtype=bool)))
    lse = m + np.log(l)  # (B, nh, T, 1): what the forward saves
    try:
        got = ring_attention_backward(comm, *(comm.asarray(a[..., rows, :]) for a in (q, k, v, want, dout, lse)),
                                      attend_backward, True)
        error = max(np.abs(to_numpy(g) - w[..., rows, :]).max() for g, w in zip(got, grads))
        print(f"rank {r}: ring_attention_backward, max error of dq, dk, dv vs dense {error:.1e}", flush=True)
    except NotImplementedError as e:
        print(f"rank {r}: ring_attention_backward not implemented yet ({e})", flush=True)
    try:
        logits = comm.asarray(np.random.default_rng(r).standard_normal((8, 2 * p)))  # my 8 tokens, 2p experts
        choice, keep = route(comm, softmax_forward(logits)[0], 2, 1.0)
        keep = to_numpy(keep)
        print(f"rank {r}: route kept {int(keep.sum())} of {keep.size} choices", flush=True)
    except NotImplementedError as e:
        print(f"rank {r}: route not implemented yet ({e})", flush=True)
    if r == 0:
        print("now grade it: minipar check 06")
