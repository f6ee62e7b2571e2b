"""Planted bug: SwiGLU counted as a GeLU MLP

The gate is forgotten: two MLP matrices (and one first-layer bias) instead of gate, up and down.
Every SwiGLU model comes out a third of its MLP short (Llama-3-8B: 6.15e9 instead of 8.03e9).

EXPECT_TASK: 7.6
EXPECT_MESSAGE: model_params(layers=2, hidden=8, heads=4, kv_heads=2, ffn=24, vocab=10, mlp='swiglu'
EXPECT_MESSAGE: you computed two MLP matrices: SwiGLU has three
"""
from minipar.labs.lab07_solution import *  # noqa: F401,F403  everything else is right


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    d = hidden // heads
    q, kv = heads * d, kv_heads * d
    attention = 2 * hidden * q + 2 * hidden * kv + ((q + 2 * kv + hidden) if bias else 0)
    ffn_p = 2 * hidden * ffn + ((ffn + hidden) if bias else 0)  # BUG: swiglu has a gate too (3 matrices)
    norm_p = 2 * hidden if norm == "layernorm" else hidden
    return layers * (attention + ffn_p + 2 * norm_p) + vocab * hidden * (1 if tied else 2) + norm_p
