"""Neural-network layers with hand-written backward: the dense single-process reference that
every parallel lesson (tensor, pipeline, data/ZeRO) must reproduce.

    functional.py   pure forward/backward pairs: linear, gelu, softmax, layernorm, attention, losses
    layers.py       Module classes holding params/grads: Linear, GeLU, LayerNorm,
                    CausalSelfAttention, MLP, Block, Sequential, Dropout
    embedding.py    token Embedding (scatter-add backward), PositionEmbedding, LMHead tied to wte
    dropout.py      the counter-based (Philox) draw that makes a dropout mask the same on every grid
    recompute.py    activation recomputation of a block: none, selective, full

    python -c "import numpy as np, minipar.nn as nn; rng = np.random.default_rng(0); \
        m = nn.Block(16, 4, rng); y, ctx = m.forward(rng.standard_normal((2, 5, 16))); \
        m.backward(np.ones_like(y), ctx); print(m.num_params(), [n for n, _ in m.named_parameters()])"

Works on NumPy arrays and torch tensors alike; importing it does not import torch.
"""
from .functional import (
    attention_backward,
    attention_forward,
    attention_probs,
    drop_probs,
    cross_entropy,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_backward_input,
    layernorm_backward_weight,
    layernorm_forward,
    linear_backward_input,
    linear_backward_weight,
    linear_forward,
    mse_loss,
    softmax_backward,
    softmax_forward,
)
from .layers import GeLU, Block, CausalSelfAttention, Dropout, LayerNorm, Linear, MLP, Module, Sequential
from .embedding import Embedding, LMHead, PositionEmbedding, lookup_backward_weight, lookup_forward

__all__ = [
    "linear_forward", "linear_backward_input", "linear_backward_weight",
    "gelu_forward", "gelu_backward",
    "softmax_forward", "softmax_backward",
    "layernorm_forward", "layernorm_backward", "layernorm_backward_input", "layernorm_backward_weight",
    "attention_forward", "attention_backward", "attention_probs", "drop_probs",
    "lookup_forward", "lookup_backward_weight",
    "mse_loss", "cross_entropy",
    "Module", "Linear", "GeLU", "Dropout", "LayerNorm", "CausalSelfAttention", "MLP", "Block", "Sequential",
    "Embedding", "PositionEmbedding", "LMHead",
]
