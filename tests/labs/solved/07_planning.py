"""Lab 07 solved as a learner would: the formulas counted term by term, the in-flight set walked,
the three rings added up, a search through ``predict``; nothing from minipar.
Must pass `minipar check 07 --file`."""


def activation_bytes(s, b, h, a, t=1, sp=False, recompute="none"):
    sbh, scores = s * b * h, a * s * s * b
    whole = 4 * sbh + 2 * sbh + 2 * sbh + sbh + sbh  # 2 LayerNorm inputs, QKV input, fc1 input, 2 masks: 10 sbh
    split = (2 * sbh + 2 * sbh + 2 * sbh + 2 * sbh   # Q, K, V, projection input
             + 8 * sbh + 8 * sbh)                    # GeLU input, fc2 input (4h wide)
    attn = 2 * scores + scores + 2 * scores          # softmax output, its dropout mask, dropout output
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    if recompute == "selective":
        attn = 0
    if sp:
        return (whole + split + attn) / t
    return whole + (split + attn) / t


def peak_inflight(actions):
    out = []
    for ops in actions:
        held, most = set(), 0
        for stage, kind, mb in ops:
            if kind == "F":
                held.add((stage, mb))
            elif kind in ("B", "W"):
                held.discard((stage, mb))
            most = max(most, len(held))
        out.append(most)
    return out


def _ring(p, nbytes, alpha, beta):
    """A reduce-scatter (or an all-gather) over p ranks."""
    return (p - 1) * alpha + (p - 1) / p * nbytes * beta


def dp_all_reduce_time(nbytes, n, per_node, intra, inter):
    k = min(n, per_node)
    nodes = n // k
    inside = _ring(k, nbytes, *intra)          # reduce-scatter inside the node
    across = 2 * _ring(nodes, nbytes / k, *inter)  # all-reduce of my 1/k across the nodes
    return inside + across + _ring(k, nbytes, *intra)  # all-gather inside the node


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_config(job, predict):
    best, best_key = None, None
    for tp in _divisors(job["gpus_per_node"]):
        if job["gpus"] % tp or job["heads"] % tp or job["ffn"] % tp:
            continue
        for pp in _divisors(job["layers"]):
            if job["gpus"] % (tp * pp):
                continue
            dp = job["gpus"] // (tp * pp)
            for mb in _divisors(job["batch"]):
                if job["batch"] % (dp * mb):
                    continue
                for rec in ("none", "selective", "full"):
                    est = predict(tp, pp, dp, mb, rec)
                    if est.memory_bytes > job["capacity_bytes"]:
                        continue
                    if best is None or (est.step_s, est.memory_bytes) < best_key:
                        best, best_key = dict(tp=tp, pp=pp, dp=dp, microbatch=mb, recompute=rec), (est.step_s, est.memory_bytes)
    return best


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    read = weight_bytes / t / bandwidth  # this rank's 1/t of the weights, from its own memory
    compute = 2 * batch * (weight_bytes / dtype_bytes) / t / peak_flops  # a multiply-add per weight and sequence
    n = batch * hidden * dtype_bytes  # the layer's output, summed over the t ranks
    ring = 2 * (t - 1) * alpha + 2 * (t - 1) / t * n * beta
    return max(read, compute) + 2 * layers * ring


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    d = hidden // heads
    q, kv = heads * d, kv_heads * d
    attention = hidden * q + 2 * hidden * kv + q * hidden      # Q, K and V, the projection
    mlp_in = 2 if mlp == "swiglu" else 1                       # gate and up, or fc1
    ffn_p = mlp_in * hidden * ffn + ffn * hidden               # + down (fc2)
    if bias:
        attention += q + 2 * kv + hidden
        ffn_p += mlp_in * ffn + hidden
    norm_p = 2 * hidden if norm == "layernorm" else hidden
    block = attention + ffn_p + 2 * norm_p
    ends = vocab * hidden + (0 if tied else vocab * hidden) + norm_p
    return layers * block + ends
