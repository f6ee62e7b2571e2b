"""Skips the technique by calling minipar's own tensor-parallel layers (minipar.tensor_parallel)
from functions written in the exercise: the right values, the right shards, one ring all-reduce
each, but the layers, not the learner, make every message. The trace records who did: minipar's
tensor_parallel code, which the exercise only called.

EXPECT 2.2: was made by minipar's own code, minipar/tensor_parallel/
EXPECT 2.2: called at tests/labs/skips/02_minipar_reference.py:26: write row_forward's messages yourself, with minipar.collectives.all_reduce
EXPECT 2.3: called at tests/labs/skips/02_minipar_reference.py:31: write column_backward's messages yourself
EXPECT 2.5: called at tests/labs/skips/02_minipar_reference.py:36: write megatron_mlp's messages yourself
EXPECT 2.6: called at tests/labs/skips/02_minipar_reference.py:42: write heads_attention's messages yourself
"""
import numpy as np

from minipar import tensor_parallel as tp
from minipar.nn import MLP, CausalSelfAttention


def _with(module, **params):
    for name, (w, b) in params.items():
        layer = getattr(module, name)
        layer.params["w"], layer.params["b"] = w, b
    return module


def row_forward(comm, x, w, b):
    return tp.row_parallel_matmul(comm, *tp.row_shards(comm, x, w)) + b


def column_backward(comm, dy_r, x, w):
    w_r = tp.column_shard(comm, w)
    return tp.f_backward(comm, dy_r @ w_r.T), x.T @ dy_r, dy_r.sum(axis=0)


def megatron_mlp(comm, x, w1, b1, w2, b2):
    dense = _with(MLP(w1.shape[0], w1.shape[1], np.random.default_rng(0)), fc1=(w1, b1), fc2=(w2, b2))
    return tp.ParallelMLP(comm, dense).forward(x)[0]


def heads_attention(comm, x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    dense = _with(CausalSelfAttention(w_qkv.shape[0], n_heads, np.random.default_rng(0)),
                  qkv=(w_qkv, b_qkv), proj=(w_proj, b_proj))
    return tp.ParallelSelfAttention(comm, dense).forward(x)[0]
