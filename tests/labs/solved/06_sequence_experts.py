"""Lab 06 solved as a learner would: the math through the inputs' array namespace (minipar.xp:
NumPy under MPI, torch under torch.distributed), the routing decisions on the host in NumPy,
comm.isend/irecv for the ring, minipar.collectives' all_to_all / all_to_all_v, nothing else (no
solution module). Must pass `minipar check 06 --file` on both backends."""
import math

import numpy as np

from minipar.collectives import all_reduce, all_to_all, all_to_all_v
from minipar.nn.functional import gelu_backward, gelu_forward, softmax_backward, softmax_forward
from minipar.xp import contiguous, empty, namespace, to_numpy, zeros


def merge(a, b):
    (acc_a, m_a, l_a), (acc_b, m_b, l_b) = a, b
    xp = namespace(acc_a)
    m = xp.maximum(m_a, m_b)
    finite = xp.where(xp.isinf(m), xp.zeros_like(m), m)  # a row that saw nothing: exp(-inf - 0) = 0, not NaN
    ca, cb = xp.exp(m_a - finite), xp.exp(m_b - finite)
    return acc_a * ca + acc_b * cb, m, l_a * ca + l_b * cb


def ring_attention(comm, q, k, v, attend, causal):
    p, r = comm.size, comm.rank
    t, xp = q.shape[-2], namespace(q)
    kv = xp.stack([k, v])  # (2, B, nh, t, hs): the block I hold
    nxt = empty(kv.shape, like=kv)  # the one arriving
    state = None
    for s in range(p):
        j = (r - s) % p  # whose block I hold
        if s < p - 1:
            reqs = [comm.irecv(nxt, (r - 1) % p), comm.isend(kv, (r + 1) % p)]
        if not (causal and j > r):
            mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
            part = attend(q, kv[0], kv[1], mask)
            state = part if state is None else merge(state, part)
        if s < p - 1:
            for req in reqs:
                req.wait()
            kv, nxt = nxt, kv
    acc, _, l = state
    return acc / l


def ulysses_attention(comm, q, k, v, attend, causal):
    p = comm.size
    B, nh, t, hs = q.shape
    h, T, xp = nh // p, p * t, namespace(q)
    qkv = xp.reshape(xp.stack([q, k, v]), (3, B, p, h, t, hs))
    send = xp.permute_dims(qkv, (2, 0, 1, 3, 4, 5))  # (p, 3, B, h, t, hs): head group j -> rank j
    got = all_to_all(comm, contiguous(send))  # (p, 3, B, h, t, hs): row i = positions of rank i
    qh, kh, vh = xp.reshape(xp.permute_dims(got, (1, 2, 3, 0, 4, 5)), (3, B, h, T, hs))  # positions in order
    acc, _, l = attend(qh, kh, vh, xp.tril(xp.ones((T, T), dtype=xp.bool)) if causal else None)
    out = xp.permute_dims(xp.reshape(acc / l, (B, h, p, t, hs)), (2, 0, 1, 3, 4))  # (p, B, h, t, hs): rank j's positions
    back = all_to_all(comm, contiguous(out))  # row i: head group i of my positions
    return xp.reshape(xp.permute_dims(back, (1, 0, 2, 3, 4)), (B, nh, t, hs))


def route(comm, probs, k, capacity_factor):
    probs = to_numpy(probs)  # the decisions are integers: made on the host
    N, E = probs.shape
    cap = math.ceil(capacity_factor * k * N / E)
    choice = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    keep, used = np.zeros((N, k), dtype=bool), np.zeros(E, dtype=int)
    for c in range(k):  # first choices first
        for n in range(N):
            e = choice[n, c]
            if used[e] < cap:
                keep[n, c], used[e] = True, used[e] + 1
    return choice, keep


def _kept(choice, keep, n_experts):
    """(token, expert) of every kept assignment, expert by expert, each in priority order."""
    N, k = choice.shape
    return [(n, e) for e in range(n_experts) for c in range(k) for n in range(N) if keep[n, c] and choice[n, c] == e]


def dispatch(comm, x, choice, keep, n_experts):
    p, per = comm.size, n_experts // comm.size
    kept = _kept(choice, keep, n_experts)
    mine = np.bincount([e for _, e in kept], minlength=n_experts).reshape(p, per).astype(np.int64)
    counts = to_numpy(all_to_all(comm, comm.asarray(mine)))  # counts[i, e]: rows rank i sends to my expert e
    rows = x[[n for n, _ in kept]]  # (kept, C)
    got, _ = all_to_all_v(comm, rows, mine.sum(axis=1))  # by source rank
    at = np.cumsum(np.concatenate([[0], counts.reshape(-1)])).reshape(-1)  # block (i, e) starts at at[i*per + e]
    out = [got[at[i * per + e]:at[i * per + e + 1]] for e in range(per) for i in range(p)]
    return namespace(x).concat(out, axis=0), counts


def moe_forward(comm, x, w_router, experts, k, capacity_factor):
    p, r, E, xp = comm.size, comm.rank, len(experts), namespace(x)
    per = E // p
    probs = softmax_forward(x @ w_router)[0]  # (N, E)
    choice, keep = route(comm, probs, k, capacity_factor)
    rows, counts = dispatch(comm, x, choice, keep, E)
    outs, a = [], 0
    for e in range(per):  # my experts, each on its block
        n = int(counts[:, e].sum())
        w1, b1, w2, b2 = experts[r * per + e]
        outs.append(gelu_forward(rows[a:a + n] @ w1 + b1)[0] @ w2 + b2)
        a += n
    outs = xp.concat(outs, axis=0)
    # back to source-rank order: block (i, e) sits at expert-major position
    at = np.cumsum(np.concatenate([[0], counts.T.reshape(-1)]))
    back = xp.concat([outs[at[e * p + i]:at[e * p + i + 1]] for i in range(p) for e in range(per)], axis=0)
    returned, _ = all_to_all_v(comm, back, counts.sum(axis=1))  # my rows, in the order I sent them
    y = zeros(x.shape, like=x)
    for (n, e), row in zip(_kept(choice, keep, E), returned):
        y[n] += probs[n, e] * row
    return y


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    p, r = comm.size, comm.rank
    t, xp = q.shape[-2], namespace(q)
    right, left = (r + 1) % p, (r - 1) % p
    delta = xp.sum(dout * out, axis=-1, keepdims=True)  # (B, nh, t, 1): per query, the same for every block
    kv = xp.stack([k, v])  # (2, B, nh, t, hs): the block I hold
    nxt = empty(kv.shape, like=kv)  # the one arriving
    carry = empty(kv.shape, like=kv)  # the partial dK|dV arriving from the left
    dq, own = zeros(q.shape, like=q), None
    for s in range(p):
        j = (r - s) % p  # whose block I hold
        if s < p - 1:
            reqs = [comm.irecv(nxt, left, tag=1), comm.isend(kv, right, tag=1)]
        part = zeros(kv.shape, like=kv)  # my queries' part of block j's dK|dV
        if not (causal and j > r):
            mask = xp.tril(xp.ones((t, t), dtype=xp.bool)) if causal and j == r else None
            dq_j, dk_j, dv_j = attend_backward(q, kv[0], kv[1], dout, lse, delta, mask)
            dq = dq + dq_j
            part = xp.stack([dk_j, dv_j])
        if s == 0:
            own = part  # added last, when the others' sum comes home
        else:  # block j's parcel: the ranks since its owner, plus me; then on to the right
            total = part if s == 1 else carry + part
            comm.sendrecv(total, right, carry, left, sendtag=2, recvtag=2)
        if s < p - 1:
            for req in reqs:
                req.wait()
            kv, nxt = nxt, kv
    dkv = own if p == 1 else own + carry
    return dq, dkv[0], dkv[1]


def _expert_forward(rows, w1, b1, w2, b2):
    """(out, what its backward needs): GeLU(rows @ w1 + b1) @ w2 + b2."""
    a, gctx = gelu_forward(rows @ w1 + b1)
    return a @ w2 + b2, (rows, a, gctx)


def _expert_backward(d, saved, w1, w2):
    """(d_rows, (dw1, db1, dw2, db2)) of one expert, d the gradient of its outputs."""
    xp = namespace(d)
    rows, a, gctx = saved
    dh = gelu_backward(d @ xp.matrix_transpose(w2), gctx)
    grads = (xp.matrix_transpose(rows) @ dh, xp.sum(dh, axis=0), xp.matrix_transpose(a) @ d, xp.sum(d, axis=0))
    return dh @ xp.matrix_transpose(w1), grads


def _to_experts(counts, rows_by_source, per, p):
    """Rows received by source rank (each source's by my local expert) -> expert-major order."""
    xp = namespace(rows_by_source)
    at = np.cumsum(np.concatenate([[0], counts.reshape(-1)]))
    return xp.concat([rows_by_source[at[i * per + e]:at[i * per + e + 1]] for e in range(per) for i in range(p)], axis=0)


def _to_sources(counts, rows_by_expert, per, p):
    """The reverse: expert-major rows -> by source rank, each source's by my local expert."""
    xp = namespace(rows_by_expert)
    at = np.cumsum(np.concatenate([[0], counts.T.reshape(-1)]))
    return xp.concat([rows_by_expert[at[e * p + i]:at[e * p + i + 1]] for i in range(p) for e in range(per)], axis=0)


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    p, r, E, xp = comm.size, comm.rank, len(experts), namespace(x)
    N, per = x.shape[0], E // p
    probs, sctx = softmax_forward(x @ w_router)  # (N, E)
    choice, keep = route(comm, probs, k, capacity_factor)
    kept = _kept(choice, keep, E)
    rows, counts = dispatch(comm, x, choice, keep, E)  # expert-major
    outs, saved, a = [], [], 0
    for e in range(per):
        n = int(counts[:, e].sum())
        w1, b1, w2, b2 = experts[r * per + e]
        o, sv = _expert_forward(rows[a:a + n], w1, b1, w2, b2)
        outs.append(o)
        saved.append(sv)
        a += n
    back, _ = all_to_all_v(comm, _to_sources(counts, xp.concat(outs, axis=0), per, p), counts.sum(axis=1))
    y = zeros(x.shape, like=x)
    for (n, e), row in zip(kept, back):
        y[n] += probs[n, e] * row
    # the balancing loss: f and P over every rank's tokens
    routed = np.bincount(choice.reshape(-1), minlength=E).astype(np.float64)
    totals = all_reduce(comm, xp.concat([comm.asarray(routed), xp.sum(probs, axis=0)]))  # (2E,)
    f, P = totals[:E] / (k * N * p), totals[E:] / (N * p)
    aux = float(aux_weight * E * xp.sum(f * P))
    # backward: the gates, then the rows' gradients to the experts and back
    d_probs = zeros(probs.shape, like=probs) + aux_weight * E * f / (N * p)  # d aux / d probs, every token
    d_sent = zeros(back.shape, like=back)  # gate * dy of every row I sent, in the order I sent it
    for i, ((n, e), row) in enumerate(zip(kept, back)):
        d_probs[n, e] += xp.sum(dy[n] * row)
        d_sent[i] = probs[n, e] * dy[n]
    d_rows_by_source, _ = all_to_all_v(comm, d_sent, [int(c) for c in np.bincount(
        [e // per for _, e in kept], minlength=p)])
    d_rows = _to_experts(counts, d_rows_by_source, per, p)
    d_in, d_experts, a = [], [], 0
    for e in range(per):
        n = int(counts[:, e].sum())
        w1, _, w2, _ = experts[r * per + e]
        di, g = _expert_backward(d_rows[a:a + n], saved[e], w1, w2)
        d_in.append(di)
        d_experts.append(g)
        a += n
    returned, _ = all_to_all_v(comm, _to_sources(counts, xp.concat(d_in, axis=0), per, p), counts.sum(axis=1))
    d_logits = softmax_backward(d_probs, sctx)  # (N, E)
    dx = d_logits @ xp.matrix_transpose(w_router)
    for (n, _), row in zip(kept, returned):
        dx[n] += row
    return y, aux, dx, xp.matrix_transpose(x) @ d_logits, d_experts
