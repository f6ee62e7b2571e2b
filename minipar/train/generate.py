"""Greedy generation from a checkpoint on a TP group, with a KV cache.

    model = load_model(comm, "ckpt/")                   # comm: the TP group (any size dividing
    ids, seconds = generate(comm, model, prompt, 20)    # heads and vocab); one stage, no pipeline

Prefill runs the prompt through every block once, keeping each block's keys and values (the
KV cache: (B, nh/p, t, hs) per block and rank, the heads split like the weights). Each new
token then runs alone: its q, k, v; k and v appended to the cache; attention of its q over all
cached keys (no mask needed: they are all in its past); the same TP layers as training, so each
token costs 2 all-reduces per block (attention and MLP) of (B, 1, C) -- tiny messages, where
latency, not bandwidth, is the cost.

The next token is the argmax over the whole vocabulary, which no rank holds: each rank's best of
its V/p logits, then an all-reduce(max) of the values and an all-reduce(min) of the indices that
reach it (the smallest index wins a tie, as ``numpy.argmax``).

Does TP make decoding faster? A token reads every weight once and does 2 FLOPs per weight: it
is bound by memory bandwidth, and each of p ranks reads only its 1/p of the weights, while every
block adds two all-reduces of latency. Which wins depends on the width: ``minipar generate``
prints the time per token, and docs/inference.md measures it from cache-resident to DRAM-bound
widths (``minipar bench inference``) beside the roofline's prediction.
"""
from __future__ import annotations

import time

import numpy as np

from ..collectives import all_reduce
from ..nn import functional as F
from ..xp import device, namespace, to_numpy
from .model import GPTConfig, build_stage


def load_model(comm, directory, dtype="float64"):
    """The checkpoint's GPT as one stage on the TP group ``comm`` (float64 by default)."""
    from .checkpoint import dense_model, load_full

    index, full = load_full(directory)
    cfg = GPTConfig(**index["model"])
    stage = build_stage(comm, dense_model(index, full), 0, 1)
    return stage.to(comm.asarray(np.zeros(1, dtype=dtype))), cfg


def block_decode(blk, x, cache):
    """One block on the new positions x (B, n, C), their keys and values appended to ``cache``
    (a dict: "k", "v" of shape (B, nh/p, t, hs)). Queries at positions t ... t+n-1 attend to
    every cached key at or before their own position."""
    xp = namespace(x)
    attn = blk.attn
    a, _ = blk.ln1.forward(x)
    qkv, _ = attn.qkv.forward(a)  # (B, n, 3C/p)
    c = qkv.shape[-1] // 3
    q, k, v = (attn._split_heads(qkv[..., i * c:(i + 1) * c]) for i in range(3))  # (B, nh/p, n, hs)
    cache["k"] = k if "k" not in cache else xp.concat([cache["k"], k], axis=2)  # (B, nh/p, t+n, hs)
    cache["v"] = v if "v" not in cache else xp.concat([cache["v"], v], axis=2)
    n, total = q.shape[2], cache["k"].shape[2]
    att = (q @ xp.matrix_transpose(cache["k"])) / np.sqrt(q.shape[-1])  # (B, nh/p, n, t+n)
    qpos = xp.arange(total - n, total, device=device(x))
    kpos = xp.arange(total, device=device(x))
    att = xp.where(kpos[None, :] > qpos[:, None], -xp.inf, att)
    p, _ = F.softmax_forward(att)
    y, _ = attn.proj.forward(attn._merge_heads(p @ cache["v"]))  # (B, n, C): all-reduced
    h = x + y
    m, _ = blk.ln2.forward(h)
    m, _ = blk.mlp.forward(m)
    return h + m


def greedy_token(comm, logits, lo):
    """argmax over the vocabulary split across ``comm``: logits (B, V/p) hold columns lo ...."""
    xp = namespace(logits)
    best = xp.max(logits, axis=-1)  # (B,)
    top = all_reduce(comm, best, op="max")  # (B,)
    idx = xp.astype(xp.argmax(logits, axis=-1), logits.dtype) + lo  # (B,) my best column
    mine = xp.where(best == top, idx, float(2 ** 52))  # only ranks holding the max compete
    return xp.astype(all_reduce(comm, mine, op="min"), xp.int64)  # (B,)


def forward_cached(model, ids, caches, start):
    """Logits (B, n, V/p) of positions start ... start+n-1, extending the caches."""
    x, _ = model.embed.forward(ids)
    x = x + model.pos.params["wpe"][start:start + ids.shape[-1]]
    for name, blk in model.blocks():
        x = block_decode(blk, x, caches.setdefault(name, {}))
    x, _ = model.ln_f.forward(x)
    return model.head.forward(x)[0]


def generate(comm, model, prompt, n_new, use_cache=True, times=None):
    """(ids (B, T0 + n_new) as NumPy, seconds per new token). ``use_cache=False`` runs the whole
    sequence through the model for every token instead (the reference the cache must equal).
    ``times``: a list that gets each decoded token's (wall, CPU) seconds, the prefill's excluded."""
    xp = namespace(model.embed.params["wte"])
    lo = model.head.owner().vocab_start
    ids = comm.asarray(np.asarray(prompt, dtype=np.int64))  # (B, T0)
    caches = {}
    t0 = None
    for i in range(n_new):
        if i == 1:
            t0 = time.perf_counter()  # after the prefill: decoding only
        w, c = time.perf_counter(), time.process_time()
        if use_cache:
            new = ids if i == 0 else ids[:, -1:]
            logits = forward_cached(model, new, caches, ids.shape[1] - new.shape[1])
        else:
            logits, _ = model.forward(ids)
        nxt = greedy_token(comm, logits[:, -1, :], lo)  # (B,)
        ids = xp.concat([ids, nxt[:, None]], axis=1)
        if times is not None and i >= 1:
            times.append((time.perf_counter() - w, time.process_time() - c))
    per_token = (time.perf_counter() - t0) / (n_new - 1) if n_new > 1 else 0.0
    return to_numpy(ids), per_token


def generate_rank(comm, directory, prompts, tokens):
    """What every rank runs for ``minipar generate``: the checkpoint in ``directory`` on the TP
    group ``comm``, ``tokens`` new tokens after each of ``prompts`` (text). Returns [(ids, seconds
    per token)] per prompt."""
    from .data import encode

    model, _ = load_model(comm, directory)
    out = []
    for text in prompts:
        ids, per_token = generate(comm, model, encode(text)[None, :], tokens)
        out.append((ids[0].tolist(), per_token))
    return out
