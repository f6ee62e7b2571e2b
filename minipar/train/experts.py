"""The trainer's mixture-of-experts bookkeeping: which parameters are experts, what the MoE layers report.

    split_experts(child, "s0.h", units, experts)   # the experts apart from the DP units (the router stays)
    log = ExpertLog(stages, microbatches)          # on every rank, for the MoE layers of its stages
    log.record(action)                             # after every pipeline action
    log.aux, log.counts                            # this step: aux loss, (kept, routed) tokens per expert
    expert_totals([(coords, log.counts), ...])     # over the grid: {layer: {"kept", "routed"}}

With E experts per layer sharded over the dp group (ep = dp), each expert lives on one rank of
it: the DP engines must not average it with the others' (``split_experts``), and its gradient
needs no message at all (``Trainer.sync_experts``). The MoE layers log, per forward, their aux
loss and the tokens each expert kept and was routed; the trainer reports them per step.
"""
from __future__ import annotations

import numpy as np

from .model import moe_layers


def split_experts(module, name, units, experts):
    """Put ``module`` (named ``name``) into ``units``, or, when it holds MoE layers, its experts
    into ``experts`` and everything else (the routers too) into ``units``."""
    if not moe_layers(module):
        units[name] = module
    elif hasattr(module, "experts"):  # a MoE: the router is replicated, the experts are not
        units[f"{name}.router"] = module.router
        experts.update({f"{name}.expert{e}": m for e, m in module.experts().items()})
    else:
        for child_name, child in module.children().items():
            split_experts(child, f"{name}.{child_name}", units, experts)


class ExpertLog:
    """What the MoE layers of a rank's stages logged this step: ``aux``, the mean over the m
    micro-batches of their aux losses, and ``counts`` {layer: (kept, routed) tokens per expert}."""

    def __init__(self, stages: dict, microbatches: int):
        self.layers = {s: [(f"h.{name}.mlp", blk.mlp) for name, blk in st.blocks() if moe_layers(blk.mlp)]
                       for s, st in stages.items()}
        for layers in self.layers.values():
            for _, layer in layers:
                layer.aux_scale, layer.log = 1.0 / microbatches, []  # m micro-batches are averaged
        self.reset()

    def reset(self):
        self.aux, self.counts = 0.0, {}

    def record(self, action):
        """After a pipeline action: what the MoE layers of its stage logged. A forward's (aux loss,
        kept and routed tokens per expert) count; what full recomputation's second forward (inside
        B or I) logs is the same and is dropped."""
        for name, layer in self.layers.get(action.stage, ()):
            if action.kind == "F":
                for aux, kept, routed in layer.log:
                    self.aux += aux * layer.aux_scale
                    k, r = self.counts.setdefault(name, (np.zeros(len(kept), int), np.zeros(len(kept), int)))
                    k += kept
                    r += routed
            layer.log.clear()


def expert_totals(parts) -> dict:
    """{MoE layer: {"kept": tokens per expert, "routed": ...}} over the global batch: the sum of
    every rank's counts (TP rank 0: its TP partners route the same tokens)."""
    out = {}
    for (d, p, t), counts in parts:
        for name, (kept, routed) in counts.items() if t == 0 else ():
            k, r = out.setdefault(name, (np.zeros(len(kept), int), np.zeros(len(kept), int)))
            k += kept
            r += routed
    return {name: {"kept": k.tolist(), "routed": r.tolist()} for name, (k, r) in sorted(out.items(), key=_layer_order)}


def _layer_order(item):
    return int(item[0].split(".")[1])
