"""Skips the technique: the engine's own all-to-all (comm.builtin) for Ulysses and the
dispatch. The right values; the grader refuses comm.builtin inside the learner's function.

BACKENDS: mpi torch  (torch's all_to_all_v builtin calls another builtin inside)

EXPECT 6.3: rank 0 called comm.builtin.all_to_all inside ulysses_attention: comm.builtin is the engine's own collective
EXPECT 6.5: rank 0 called comm.builtin.all_to_all, comm.builtin.all_to_all_v inside dispatch
"""
import numpy as np

from minipar.xp import contiguous, namespace, to_numpy


def ulysses_attention(comm, q, k, v, attend, causal):
    p = comm.size
    B, nh, t, hs = q.shape
    h, T, xp = nh // p, p * t, namespace(q)
    send = xp.permute_dims(xp.reshape(xp.stack([q, k, v]), (3, B, p, h, t, hs)), (2, 0, 1, 3, 4, 5))
    got = comm.builtin.all_to_all(contiguous(send))  # (p, 3, B, h, t, hs)
    qh, kh, vh = xp.reshape(xp.permute_dims(got, (1, 2, 3, 0, 4, 5)), (3, B, h, T, hs))
    acc, _, l = attend(qh, kh, vh, xp.tril(xp.ones((T, T), dtype=xp.bool)) if causal else None)
    out = contiguous(xp.permute_dims(xp.reshape(acc / l, (B, h, p, t, hs)), (2, 0, 1, 3, 4)))
    return xp.reshape(xp.permute_dims(comm.builtin.all_to_all(out), (1, 0, 2, 3, 4)), (B, nh, t, hs))


def dispatch(comm, x, choice, keep, n_experts):
    p, per = comm.size, n_experts // comm.size
    N, k = choice.shape
    kept = [(n, e) for e in range(n_experts) for c in range(k) for n in range(N) if keep[n, c] and choice[n, c] == e]
    mine = np.bincount([e for _, e in kept], minlength=n_experts).reshape(p, per).astype(np.int64)
    counts = to_numpy(comm.builtin.all_to_all(comm.asarray(mine)))
    got, _ = comm.builtin.all_to_all_v(x[[n for n, _ in kept]], mine.sum(axis=1).tolist())
    at = np.cumsum(np.concatenate([[0], counts.reshape(-1)]))
    blocks = [got[at[i * per + e]:at[i * per + e + 1]] for e in range(per) for i in range(p)]
    return namespace(x).concat(blocks, axis=0), counts
