"""What a transformer block keeps from its forward for its backward: one table per block type.

    minipar_block(b=4, s=32, h=64, f=256, a=8, t=2, sp=True, e=8)     # {tensor: bytes}, lesson 05's GPT
    megatron_block(b=1, s=2048, h=12288, f=49152, a=96, t=8)        # Megatron's GPT layer, 16-bit
    sum(megatron_block(b, s, h, 4 * h, a).values())                 # 34 s b h + 5 a s^2 b

Two readers, one table each: lesson 05's trainer checks the bytes it counts between pipeline
actions against ``minipar_block`` (``minipar.train.accounting``, to the byte), and the planner
predicts with whichever block its model has (``minipar.plan.memory``, ``ModelSpec.saves``).
Every argument may be a number or a numpy column of them (the planner's configurations).

Notation: b micro-batch rows (sequences), s sequence length, h width, f MLP width, a heads,
t tensor-parallel ranks, cp context-parallel ranks (a rank holds T = s/cp positions of each
sequence, and attends to all s of them), sp sequence parallelism (the tensors outside the TP
region split over t as well), e bytes per element.

Recomputation: "selective" drops the attention-score tensors (``SCORES``) and computes them
again in the backward; "full" keeps only each block's input (``block_input``) and rebuilds the
rest, one block at a time, inside the backward.

Megatron's layer (Korthikanti et al. 2022, sec. 4 and table 2): 16-bit activations, 1-byte
dropout masks, the LayerNorms' *inputs* kept (not xhat and 1/std), the GeLU's input only; the
tensors outside the TP region are divided by t only with sequence parallelism (Megatron keeps
the all-gathered inputs sharded and gathers them again in the backward). minipar's layers keep
a little more: each LayerNorm its normalized input and 1/std, s b (h + 1); the GeLU its tanh
beside its input; with sequence parallelism the gathered QKV and fc1 inputs, whole; with cp > 1
the attention core (ring attention or Ulysses) its output and log-sum-exp instead of the
probabilities.
"""
from __future__ import annotations

import numpy as np

# the attention-score tensors of each block: what selective recomputation drops
SCORES = {"minipar": ("attention probabilities p", "attention dropout mask"),
          "megatron": ("softmax output", "attention dropout mask", "attention dropout output")}


def minipar_block(b, s, h, f, a, t=1, cp=1, sp=False, e=8, dropout=False, experts=False) -> dict:
    """Bytes one block of lesson 05's GPT keeps per micro-batch, by tensor, on one rank; with
    ``dropout`` also its keep masks (``minipar_masks``)."""
    T = s / cp  # my positions of each sequence
    Ts = T / np.where(sp, t, 1)  # ... outside the TP region
    cp_core = np.asarray(cp) > 1
    return {
        "ln1 xhat, rstd": e * b * Ts * (h + 1),
        "qkv input (ln1 output; SP: all-gathered)": e * b * T * h,
        "q, k, v": 3 * e * b * T * h / t,
        "attention probabilities p": np.where(cp_core, 0, e * b * a * T * T / t),
        "attention output, log-sum-exp (CP core)": np.where(cp_core, e * (b * T * h + b * a * T) / t, 0),
        "proj input (merged heads)": e * b * T * h / t,
        "ln2 xhat, rstd": e * b * Ts * (h + 1),
        "fc1 input (ln2 output; SP: all-gathered)": e * b * T * h,
        "GeLU input, tanh": 2 * e * b * T * f / t,
        "fc2 input (GeLU output)": e * b * T * f / t,
    } | (minipar_masks(b, s, h, f, a, t, cp, sp, experts) if dropout else {})


def minipar_masks(b, s, h, f, a, t=1, cp=1, sp=False, experts=False) -> dict:
    """Bytes of the dropout keep masks one block of lesson 05's GPT keeps (bools, 1 byte an
    element): after the attention and after the MLP (outside the TP region), in the MLP's hidden
    layer (inside it; a mixture of ``experts`` has none), and on the attention probabilities,
    b a T^2 / t per layer: as many elements as p itself, which selective recomputation drops
    with p (``SCORES``). Ring attention and Ulysses (cp > 1) keep none: their backward draws each
    block's mask again."""
    T = s / cp
    Ts = T / np.where(sp, t, 1)
    return {"dropout masks after attention and after the MLP": 2 * b * Ts * h,
            "attention dropout mask": np.where(np.asarray(cp) > 1, 0, b * a * T * T / t)} \
        | ({"hidden-layer dropout mask": b * T * f / t} if not experts else {})


def megatron_block(b, s, h, f, a, t=1, cp=1, sp=False, e=2, dropout=True, q=None, kv=None, mlp="gelu", copies=1) -> dict:
    """Bytes one block of Megatron's GPT keeps per micro-batch, by tensor, on one rank. With e = 2,
    f = 4h and dropout the sum is 34 s b h + 5 a s^2 b (t = 1); s b h (10 + 24/t) + 5 a s^2 b / t
    with TP; 34 s b h / t + 5 a s^2 b / t with TP and SP; 34 s b h / t with selective
    recomputation as well (Korthikanti et al. 2022, table 2).

    Today's blocks: ``q`` the width of Q and of the projection's input (heads x head_dim, default
    h), ``kv`` the width of K and of V (kv_heads x head_dim, default h: grouped-query attention
    keeps 2 e s b kv of them instead of 2 e s b h); the scores have a (q) heads whatever kv is.
    ``mlp="swiglu"``: the first layer makes gate and up (2 f wide: both kept, the product's
    backward needs each), and the product silu(gate) * up is the second layer's input (f): 3 e s b f
    where GeLU keeps 2 (its input, the second layer's input). ``copies``: MLPs a token visits (a
    mixture of experts: top_k + shared, each with its own first-layer input copy of the token;
    ``f`` is then one expert's width)."""
    T = s / cp  # queries of a rank; the scores are T x s
    r = np.where(sp, t, 1)  # what the tensors outside the TP region are divided by
    mask = 1 if dropout else 0  # bytes per element of a dropout mask
    drop = e if dropout else 0
    q = h if q is None else q
    kv = h if kv is None else kv
    act = ({"GeLU input": e * T * b * f * copies / t} if mlp == "gelu" else
           {"SwiGLU input (gate, up)": 2 * e * T * b * f * copies / t})
    return {
        "ln1 input": e * T * b * h / r, "qkv input": e * T * b * h / r,
        "q, k": e * T * b * (q + kv) / t, "softmax output": e * a * T * s * b / t,
        "attention dropout mask": mask * a * T * s * b / t, "attention dropout output": drop * a * T * s * b / t,
        "v": e * T * b * kv / t, "proj input": e * T * b * q / t, "proj dropout mask": mask * T * b * h / r,
        "ln2 input": e * T * b * h / r, "fc1 input": e * T * b * h * copies / r,
        **act, "fc2 input": e * T * b * f * copies / t, "mlp dropout mask": mask * T * b * h / r,
    }


def drop_scores(block: str, tensors: dict) -> dict:
    """A block's ``tensors`` under selective recomputation: without its attention scores."""
    return {k: v for k, v in tensors.items() if k not in SCORES[block]}


def block_input(b, s, h, t=1, cp=1, sp=False, e=2):
    """Bytes of a block's input (b, T, h), split over t with SP: all that full recomputation keeps."""
    return e * b * (s / cp) / np.where(sp, t, 1) * h


# --------------------------------------------------------------------------- the ends of the model


def minipar_ends(b, s, h, vocab, t=1, cp=1, sp=False, e=8, dropout=False) -> tuple[dict, dict]:
    """(first stage, last stage): bytes lesson 05's GPT keeps per micro-batch besides its blocks;
    with ``dropout`` the embedding's keep mask (1 byte an element, on my T/tp tokens under SP)."""
    T = s / cp
    first = {"token ids (int64), for the embedding's scatter-add": 8 * b * T} \
        | ({"embedding dropout mask": b * T / np.where(sp, t, 1) * h} if dropout else {})
    last = {"ln_f xhat, rstd": e * b * T / np.where(sp, t, 1) * (h + 1), "head input": e * b * T * h,
            "logits' gradient": e * b * T * vocab / t}
    return first, last


def megatron_ends(b, s, h, vocab, t=1, cp=1, sp=False, e=2, dropout=True, logit_bytes=4) -> tuple[dict, dict]:
    """(first stage, last stage): bytes Megatron's GPT keeps per micro-batch besides its blocks;
    ``logit_bytes``: 4, the cross-entropy runs in fp32 under mixed precision."""
    T, r = s / cp, np.where(sp, t, 1)
    first = {"embedding dropout mask": (1 if dropout else 0) * T * b * h / r}
    last = {"ln_f input": e * T * b * h / r, "LM head input": e * T * b * h / r, "logits": logit_bytes * T * b * vocab / t}
    return first, last
