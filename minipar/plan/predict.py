"""One configuration, predicted: the function the trainer's measured runs are compared with.

    p = predict(Problem(spec, gpus=4, gpus_per_node=4, hw=this_machine("float64"), batch=8),
                Config(tp=2, dp=2, microbatch=2))
    p.step_time_s, p.memory_bytes["total"], p.parts["tp_comm"]

For minipar's own ranks use the ``this-machine`` preset (measured by ``minipar bench machine``):
float64 everywhere, Adam's m and v in the training dtype, one "node" whose ranks share the cores
and the RAM; and for lesson 05's GPT ``models.minipar_gpt(GPTConfig)`` (no dropout, no QKV bias,
minipar's saved tensors). ``ends`` has the memory of the first and the last pipeline rank;
``minipar.plan.here`` compares all of it with the trainer's measured runs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .config import Config, Problem
from .pipeline import makespans
from .timing import evaluate


@dataclass
class Prediction:
    config: Config
    fits: bool
    memory_bytes: dict  # params, grads, optimizer, activations, total, host, transient (worst pipeline rank)
    step_time_s: float
    parts: dict  # seconds per step: compute, tp_comm, pp_bubble, dp_comm, zero3_gathers, cp_ring, optimizer
    tflops_per_gpu: float
    mfu: float
    ends: dict  # {"first": {...}, "last": {...}}: memory_bytes' keys (+ transient) at each end of the pipeline


def predict(prob: Problem, config: Config) -> Prediction:
    """Memory per GPU and step time of one configuration (its pipeline simulated). A configuration
    the search would not consider valid raises UsageError, naming the rule."""
    from .search import enumerate_configs

    cfg, _ = enumerate_configs(prob, asdict(config), allow_cross_node_tp=True)
    ev = evaluate(prob, cfg)
    res = evaluate(prob, cfg, makespans(cfg, ev, [0]))
    keys = ("params", "grads", "optimizer", "activations", "total", "host", "transient")
    mem = {k: float(res["mem"][k][0]) for k in keys}
    ends = {end: {k: float(np.asarray(res["mem"][end][k])[0]) for k in keys} for end in ("first", "last")}
    return Prediction(config, bool(res["mem"]["fits"][0]), mem, float(res["step"][0]),
                      {k: float(np.asarray(v)[0]) for k, v in res["parts"].items()},
                      float(res["tflops_per_gpu"][0]), float(res["mfu"][0]), ends)
