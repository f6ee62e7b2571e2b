"""One configuration, predicted: the function the trainer's measured runs are compared with.

    p = predict(Problem(spec, gpus=4, gpus_per_node=4, hw=this_machine("float64"), batch=8),
                Config(tp=2, dp=2, microbatches=2))
    p.step_time_s, p.memory_bytes["total"], p.parts["tp_comm"]
    p = predict_run(train_config, this_machine("float64"))   # one of lesson 05's runs, as it ran

For minipar's own ranks use the ``this-machine`` preset (measured by ``minipar bench machine``):
float64 everywhere, Adam's m and v in the training dtype, one "node" whose ranks share the cores
and the RAM; and for lesson 05's GPT ``models.minipar_gpt(GPTConfig)`` (no dropout, no QKV bias,
minipar's saved tensors). ``ends`` has the memory of the first and the last pipeline rank;
``memory_errors`` compares it with the bytes the trainer counts (``minipar bench plan`` runs
every grid, lesson 07's checks a few).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import PLAN_FIELDS, Config, Problem
from .models import minipar_gpt
from .pipeline import makespans
from .timing import evaluate


@dataclass
class Prediction:
    config: Config
    fits: bool
    memory_bytes: dict  # params, grads, optimizer, activations, total, host, transient (worst pipeline rank)
    step_time_s: float
    parts: dict  # seconds per step: timing.PARTS (compute, tp_comm, pp_bubble, dp_comm, ... optimizer)
    tflops_per_gpu: float
    mfu: float
    ends: dict  # {"first": {...}, "last": {...}}: memory_bytes' keys (+ transient) at each end of the pipeline


def predict(prob: Problem, config) -> Prediction:
    """Memory per GPU and step time of one configuration, any ``Layout`` (a Config, or the
    trainer's TrainConfig), its pipeline simulated. A configuration the search would not consider
    valid raises UsageError, naming the rule."""
    from .search import enumerate_configs

    cfg, _ = enumerate_configs(prob, {k: getattr(config, k, 1) for k in PLAN_FIELDS}, allow_cross_node_tp=True)
    ev = evaluate(prob, cfg)
    res = evaluate(prob, cfg, makespans(cfg, ev, [0]))
    keys = ("params", "grads", "optimizer", "activations", "total", "host", "transient")
    mem = {k: float(res["mem"][k][0]) for k in keys}
    ends = {end: {k: float(np.asarray(res["mem"][end][k])[0]) for k in keys} for end in ("first", "last")}
    return Prediction(cfg.config(0), bool(res["mem"]["fits"][0]), mem, float(res["step"][0]),
                      {k: float(np.asarray(v)[0]) for k, v in res["parts"].items()},
                      float(res["tflops_per_gpu"][0]), float(res["mfu"][0]), ends)


# --------------------------------------------------------------------------- lesson 05's runs

MEMORY_KEYS = ("params", "grads", "optimizer", "activations")


def predict_run(cfg, hw) -> Prediction:
    """The prediction for a run of lesson 05's trainer (a ``TrainConfig``) on this machine's ranks
    (one node). The trainer averages the gradients once, after the pipeline's flush: nothing hides
    the DP collective."""
    n = cfg.ranks
    return predict(Problem(minipar_gpt(cfg.model), n, n, hw, cfg.batch, overlap_dp=False), cfg)


def memory_errors(cfg, pred: Prediction, measured) -> dict:
    """Bytes predicted minus bytes counted (``measured``: [(grid coords, ``Trainer.memory()``)] of
    every rank), per key, at the first and the last pipeline rank (every tp and dp coordinate of
    it): all zero when the model is exact."""
    out = {}
    for end, p in (("first", 0), ("last", cfg.pp - 1)):
        want = pred.ends[end]
        for coords, mem in measured:
            if coords[1] != p:
                continue
            for k in MEMORY_KEYS:
                w = want[k] - (want["transient"] if k == "activations" else 0)
                out[f"{end} {k}"] = max(out.get(f"{end} {k}", 0.0), abs(w - mem[k]))
    return out
