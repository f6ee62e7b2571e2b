"""Planted bug: grouped-query attention ignored in the parameter count

K and V are counted hidden x heads d, as wide as Q, instead of hidden x kv_heads d: a 2021 GPT
block's count, too many parameters for every model with kv_heads < heads (Llama-3-8B: 8.84e9).

EXPECT_TASK: 7.6
EXPECT_MESSAGE: = 1840, expected 1,696 parameters
EXPECT_MESSAGE: you computed K and V as wide as Q
"""
from minipar.labs.lab07_solution import *  # noqa: F401,F403  everything else is right


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    d = hidden // heads
    q = kv = heads * d  # BUG: K and V are kv_heads * d wide
    attention = 2 * hidden * q + 2 * hidden * kv + ((q + 2 * kv + hidden) if bias else 0)
    mlp_in = 2 if mlp == "swiglu" else 1
    ffn_p = (mlp_in + 1) * hidden * ffn + ((mlp_in * ffn + hidden) if bias else 0)
    norm_p = 2 * hidden if norm == "layernorm" else hidden
    return layers * (attention + ffn_p + 2 * norm_p) + vocab * hidden * (1 if tied else 2) + norm_p
