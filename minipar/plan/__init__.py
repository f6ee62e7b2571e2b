"""The planner (lesson 07): for a model and a cluster, which dp x pp x tp (x cp, ZeRO, micro-batch,
recompute) to run, how much memory per GPU, how long a step, and why.

    from minipar.plan import Problem, Config, model, preset, predict, search
    prob = Problem(model("gpt3-175b"), gpus=1024, gpus_per_node=8, hw=preset("a100-80gb"), batch=1536)
    res = search(prob)                    # every valid configuration, best first
    p = predict(prob, Config(tp=8, pp=16, dp=8, microbatches=192, recompute="full"))   # one of them (b = 1)

    minipar plan --model gpt3-175b --gpus 1024 --hardware a100-80gb --global-batch 1536

A configuration is a ``minipar.layout.Layout`` (the trainer's ``TrainConfig`` is one too).
Modules: ``models`` (parameters, FLOPs), ``hardware`` (presets with sources), ``machine`` (this
machine measured, the file the this-machine preset reads), ``memory`` (ZeRO states + the
activation tables of ``minipar.activations``), ``timing`` (compute, collectives, DP),
``pipeline`` (lesson 03's simulator), ``search``, ``predict`` (one configuration; a trainer
run), ``advice`` (runners-up, the Hugging Face guide's rule of thumb), ``report`` (what ``minipar plan``
prints).
"""
from __future__ import annotations

from .config import Config, Configs, Problem
from .hardware import LINKS, PRESETS, Hardware, Link, preset, this_machine
from .models import MODELS, ModelSpec, executed_flops, model, model_flops
from .predict import Prediction, predict
from .search import search

__all__ = ["Config", "Configs", "Problem", "LINKS", "PRESETS", "Hardware", "Link", "preset", "this_machine",
           "MODELS", "ModelSpec", "executed_flops", "model", "model_flops", "Prediction", "predict", "search"]
