"""Lab 02 solved as a learner would: slices of the shard first, minipar.collectives.all_reduce
where the task needs it, nothing else (no solution module). Must pass `minipar check 02 --file`."""

from minipar.collectives import all_gather, all_reduce, reduce_scatter
from minipar.nn.functional import attention_forward, gelu_forward
from minipar.xp import chunk_bounds, contiguous, namespace


def _mine(comm, n):
    return chunk_bounds(n, comm.size)[comm.rank]


def column_forward(comm, x, w, b):
    lo, hi = _mine(comm, w.shape[1])
    return x @ w[:, lo:hi] + b[lo:hi]  # (N, d_out/p)


def row_forward(comm, x, w, b):
    lo, hi = _mine(comm, w.shape[0])
    return all_reduce(comm, x[:, lo:hi] @ w[lo:hi]) + b  # the bias once, after the sum


def column_backward(comm, dy_r, x, w):
    lo, hi = _mine(comm, w.shape[1])
    dx = all_reduce(comm, dy_r @ w[:, lo:hi].T)  # f's backward
    return dx, x.T @ dy_r, dy_r.sum(axis=0)


def row_backward(comm, dy, x, w):
    lo, hi = _mine(comm, w.shape[0])
    return dy @ w[lo:hi].T, x[:, lo:hi].T @ dy, dy.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    lo, hi = _mine(comm, w1.shape[1])
    h = gelu_forward(x @ w1[:, lo:hi] + b1[lo:hi])[0]  # (N, H/p): my columns of the hidden layer
    return all_reduce(comm, h @ w2[lo:hi]) + b2


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    B, T, C = x.shape
    lo, hi = _mine(comm, C)  # my heads' columns (p divides n_heads)
    hs, nh = C // n_heads, (hi - lo) // (C // n_heads)
    xp = namespace(x)  # NumPy's or torch's array API
    q, k, v = [xp.permute_dims((x @ w_qkv[:, j * C + lo:j * C + hi] + b_qkv[j * C + lo:j * C + hi])
                               .reshape(B, T, nh, hs), (0, 2, 1, 3)) for j in range(3)]  # (B, nh/p, T, hs)
    y = xp.permute_dims(attention_forward(q, k, v)[0], (0, 2, 1, 3)).reshape(B, T, hi - lo)
    return all_reduce(comm, y @ w_proj[lo:hi]) + b_proj


def _tokens_first(a):  # (B, t, C) <-> (t, B, C): the collectives work along axis 0
    return contiguous(namespace(a).permute_dims(a, (1, 0, 2)))


def sequence_parallel_mlp(comm, x, norm, w1, b1, w2, b2):
    t_lo, t_hi = _mine(comm, x.shape[1])  # my tokens
    lo, hi = _mine(comm, w1.shape[1])  # my hidden columns
    mine = x[:, t_lo:t_hi]  # (B, T/p, C)
    h = _tokens_first(all_gather(comm, _tokens_first(norm(mine))))  # (B, T, C): every token, normalised by its rank
    partial = gelu_forward(h @ w1[:, lo:hi] + b1[lo:hi])[0] @ w2[lo:hi]  # (B, T, C): my share of the sum
    return _tokens_first(reduce_scatter(comm, _tokens_first(partial))) + b2 + mine  # (B, T/p, C)


def _split(a, n):  # (B, T, n * hs) -> (B, n, T, hs)
    B, T, c = a.shape
    return namespace(a).permute_dims(a.reshape(B, T, n, c // n), (0, 2, 1, 3))


def _merge(a):  # (B, n, T, hs) -> (B, T, n * hs)
    B, n, T, hs = a.shape
    return namespace(a).permute_dims(a, (0, 2, 1, 3)).reshape(B, T, n * hs)


def _flat(a):  # (B, T, c) -> (B * T, c)
    return a.reshape(-1, a.shape[-1])


def heads_attention_backward(comm, dout, x, w_qkv, b_qkv, w_proj, n_heads):
    B, T, C = x.shape
    xp = namespace(x)
    lo, hi = _mine(comm, C)  # my heads' columns (p divides n_heads)
    nh = (hi - lo) // (C // n_heads)
    w_mine = xp.concat([w_qkv[:, j * C + lo:j * C + hi] for j in range(3)], axis=1)  # (C, 3C/p)
    b_mine = xp.concat([b_qkv[j * C + lo:j * C + hi] for j in range(3)])  # (3C/p,)
    a = x @ w_mine + b_mine  # (B, T, 3C/p)
    c = hi - lo
    q, k, v = [_split(a[..., j * c:(j + 1) * c], nh) for j in range(3)]  # (B, nh/p, T, hs)
    y, (_, _, _, P, scale, _, _) = attention_forward(q, k, v)  # P: (B, nh/p, T, T)
    ym = _merge(y)  # (B, T, C/p)
    dy = _split(dout @ w_proj[lo:hi].T, nh)  # g's backward is the identity
    dv = xp.matrix_transpose(P) @ dy
    dP = dy @ xp.matrix_transpose(v)
    dS = P * (dP - xp.sum(dP * P, axis=-1, keepdims=True)) * scale  # the softmax's backward
    dqkv = xp.concat([_merge(dS @ k), _merge(xp.matrix_transpose(dS) @ q), _merge(dv)], axis=-1)  # (B, T, 3C/p)
    dx = all_reduce(comm, contiguous(dqkv @ w_mine.T))  # every rank's heads' share: f's backward
    return (dx, _flat(x).T @ _flat(dqkv), xp.sum(_flat(dqkv), axis=0), _flat(ym).T @ _flat(dout),
            xp.sum(_flat(dout), axis=0))
