"""Tensor parallelism: one layer's matrices split across the ranks of a TP group.

    from minipar import launch
    out = launch(4, "minipar.lessons.tensor_parallel:tour")      # every check, on 4 real ranks

    matmul.py   Y = X·A split by columns, by rows, and by blocks on a q x q grid (2x2, SUMMA)
    ops.py      the conjugate communication pairs: f / g, split / gather, and the
                sequence-parallel all-gather / reduce-scatter along the tokens
    layers.py   ColumnParallelLinear, RowParallelLinear, ParallelMLP (Megatron: one all-reduce
                forward, one backward), ParallelSelfAttention (heads split), ParallelBlock
                (optionally sequence parallel), each built by slicing its dense twin in minipar.nn

Why: a weight matrix that does not fit one device is cut into p shards, and each rank holds
1/p of the weights (always). Whether it is also *faster* depends on whether each rank's
1/p of the compute outweighs the all-reduce that stitches the pieces back together: see
``minipar bench tp`` and docs/benchmarks_tp.md.

Every function takes the communicator first: the world, or the TP row of a process grid.
"""
from .layers import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    SequenceParallelLayerNorm,
    activation_bytes,
    local_shards,
)
from .matmul import (
    assemble_grid,
    block_product_2x2,
    column_parallel_matmul,
    column_shard,
    grid_block,
    grid_comms,
    grid_shape,
    matmul_dense,
    row_parallel_matmul,
    row_shards,
    summa,
    summa_dense,
)
from .ops import (
    check_divisible,
    f_backward,
    f_forward,
    g_backward,
    g_forward,
    gather_backward,
    gather_forward,
    shard,
    sp_gather_backward,
    sp_gather_forward,
    sp_scatter_backward,
    sp_scatter_forward,
    split_backward,
    split_forward,
)

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention",
    "SequenceParallelLayerNorm", "ParallelBlock", "local_shards", "activation_bytes",
    "matmul_dense", "column_shard", "row_shards", "column_parallel_matmul", "row_parallel_matmul",
    "grid_shape", "grid_block", "grid_comms", "block_product_2x2", "summa", "summa_dense",
    "assemble_grid",
    "check_divisible", "shard", "f_forward", "f_backward", "g_forward", "g_backward",
    "split_forward", "split_backward", "gather_forward", "gather_backward",
    "sp_gather_forward", "sp_gather_backward", "sp_scatter_forward", "sp_scatter_backward",
]
