"""Automatic parallelization: FlexFlow's strategy search with an execution simulator, on real ranks.

    sharding      Shard / Replicate / Partial per mesh axis, the Mesh, the blocks a rank holds
    transitions   the steps between two placements, redistribute(): one function per transition, on
                  minipar's collectives, with its cost
    placement     the names lab 08's exercise imports (from sharding and transitions)
    ops, graph    operators with their parallelizable dims (SOAP); the MLP and transformer-block graphs
    models        preset sizes and the dense minipar.nn reference of each
    execute       a strategy as a program of instructions, run on the ranks
    simulate      the same program as a task graph on the ranks' clocks: predicted step time
    calibrate     this machine's operator times and alpha-beta fit, measured once and cached
    search        Markov-chain Monte Carlo over strategies (Metropolis on the simulated time)

The search on the ranks, then predicted vs measured step times and the report (``minipar
search``), is the benchmark ``minipar.bench.autoparallel``.

    python -m minipar search --model block --ranks 4 --budget 20

Importing this package imports neither torch nor matplotlib.
"""
from .execute import Executor, build_program
from .graph import block_graph, describe, hand_written, layout, mlp_graph, space
from .models import PRESETS, build
from .sharding import P, R, Mesh, Partial, Replicate, Shard, assemble, block, fmt, local_block
from .transitions import redistribute, redistribution_steps, step_bytes, step_time
from .search import mcmc
from .simulate import Costs, Simulator, predicted_bytes

__all__ = ["Shard", "Replicate", "Partial", "R", "P", "Mesh", "block", "local_block", "assemble", "fmt",
           "redistribution_steps", "redistribute", "step_bytes", "step_time", "mlp_graph", "block_graph", "layout", "space",
           "hand_written", "describe", "PRESETS", "build", "Executor", "build_program", "Simulator", "Costs", "predicted_bytes", "mcmc"]
