"""Lesson 5's features on the representative grids: each feature of ``minipar train`` (bf16,
fp16, ``--clip``, ``--dropout``, ZeRO-2, ZeRO-3) trained on each grid and compared with one process.

    out = launch(8, "minipar.lessons.train_matrix:check_matrix", steps=2,
                 cases=[(dict(dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2), ("fp64", "bf16", "zero3"))])

Each (grid, feature) is its own training run: the grid with that one feature on and everything
else float64 without it, so a failing row names one feature, first ("clip: dp2 pp2 tp2 (1f1b m=2,
clip 0.5): gradient norm ..."; the row's "feature" says it too). The rows, per feature:

    every feature  losses, parameters, replicas (bitwise), tied copies (bitwise), tokens per
                   expert against one process at the feature's precision
                   (``train_precision.compared_rows``: float64 1e-12, 16 bits u); every engine's
                   params, grads and optimizer bytes = ``zero_bytes`` of its stage, to the byte
    fp64           nothing more: the grid without any feature (ZeRO-0), for the ZeRO rows
    bf16, fp16     + the losses against one float64 process (2u); the bytes per parameter = the
                   planner's ``memory.Precision`` (16-bit weights, float32 gradients, float32
                   master weights and Adam); fp16: every rank skipped the steps one process
                   skipped, with its loss scales
    clip           + every step's global gradient norm = one process's (each parameter counted
                   once, 1e-12) and the first step clipped
    dropout        + the masks were drawn: the first loss differs from one process's without
                   dropout (the losses equal one process's with it at 1e-12: every mask is its)
    zero2, zero3   + losses = ZeRO-0's on the same grid (when the grid runs "fp64" too: 1e-12); the
                   dp bytes of the last step (traced) = ``accounting.comm_bytes``; ZeRO-3's
                   all-gathers per step = ``accounting.unit_gathers``

The one-process references (one per feature, and per grid only with experts, whose routing groups
follow dp and m) are trained once, on world rank 0, and sent to the other ranks.
"""
from __future__ import annotations

import time

import numpy as np

from ..memory import Precision
from .common import rel_error
from .train import first_ranks, label, make_config, ranks_of, row, wait_politely
from .train_zero import dp_traffic_rows, ledger_rows
from .train_precision import compared_rows, reference

FEATURES = {
    "fp64": {},
    "bf16": dict(precision="bf16"),
    "fp16": dict(precision="fp16"),
    "clip": dict(clip=0.5),  # the short model's norms are 1.3 to 2.1 on the first steps: every step clips
    "dropout": dict(dropout=0.1),
    "zero2": dict(zero=2),
    "zero3": dict(zero=3),
}


def reference_key(cfg) -> tuple:
    """What one process's run depends on: the model, the data, the optimizer, the features; with
    experts also dp and m (the routing groups)."""
    key = (cfg.model, cfg.batch, cfg.lr, cfg.seed, cfg.data, cfg.data_seed, cfg.steps, cfg.precision, cfg.clip,
           cfg.dropout, cfg.initial_scale, cfg.growth_interval)
    return key + ((cfg.dp, cfg.microbatches) if cfg.model.n_experts else ())


def runs_of(cases, steps):
    """[(case index, feature, TrainConfig)] of ``cases`` [(grid dict, features)], in order."""
    out = []
    for i, (grid, features) in enumerate(cases):
        base = make_config(**dict(grid, steps=steps))
        out += [(i, f, base.with_(**FEATURES[f])) for f in features]
    return out


def references(comm, runs) -> dict:
    """{reference_key: train_precision.reference} of every run (and of each dropout run without
    dropout), trained on world rank 0 while the others sleep, then sent to every rank."""
    refs = {}
    if comm.rank == 0:
        for _, f, cfg in runs:
            for c in (cfg, cfg.with_(dropout=0.0)) if f == "dropout" else (cfg,):
                if reference_key(c) not in refs:
                    refs[reference_key(c)] = reference(c)
    wait_politely(comm)
    return comm.builtin.bcast_object(refs, 0)


def check_matrix(comm, cases, steps=2, mutants=None):
    """Train every grid of ``cases`` [(grid dict of TrainConfig fields, features)] with each of
    its features (names of ``FEATURES``) on the first ranks, and compare (module docstring).
    ``mutants`` {feature: planted bug of ``minipar.train.mutants``}: planted in that feature's
    runs only. Returns this rank's rows, each named "feature: grid: check"."""
    from ..train.mutants import planted
    from ..train.trainer import train

    mutants = mutants or {}
    runs = runs_of(cases, steps)
    refs = references(comm, runs)
    rows = []
    for i, (grid, _) in enumerate(cases):
        mine = [(f, cfg) for j, f, cfg in runs if j == i]
        sub = first_ranks(comm, ranks_of(mine[0][1]), f"matrix{i}")
        if sub is not None:
            zero0 = None
            for f, cfg in mine:
                t0 = time.perf_counter()
                with planted(mutants.get(f)):
                    tr, losses, _ = train(sub, cfg, trace_step=steps - 1 if cfg.zero else None)
                got = compared_rows(sub, cfg, tr, losses, refs[reference_key(cfg)])
                what = label(cfg)
                if f == "fp64":
                    zero0 = losses
                if f == "dropout":
                    free = refs[reference_key(cfg.with_(dropout=0.0))]["losses"]
                    got.append(row(f"{what}: masks drawn (the first loss {losses[0]:.6g} is not one process's "
                                   f"without dropout, {free[0]:.6g})", 0.0 if losses[0] != free[0] else 1.0, 0.0))
                got += ledger_rows(what, tr)
                if cfg.precision in ("bf16", "fp16"):
                    table = Precision(cfg.precision, "fp32").bytes
                    wrong = [e.bytes_per_param() for e in tr.engines if e.bytes_per_param() != table]
                    got.append(row(f"{what}: bytes per parameter (weights, gradients, optimizer) = the planner's "
                                   f"{table}" + (f", not {wrong[0]}" if wrong else ""), float(len(wrong)), 0.0))
                if cfg.zero >= 2:
                    if zero0 is not None:
                        got.append(row(f"{what}: losses = ZeRO-0's", rel_error(np.array(losses), np.array(zero0)), 1e-12))
                    got += dp_traffic_rows(sub, cfg, tr, steps - 1 not in tr.skipped)
                    sub.tracer.clear()
                seconds = time.perf_counter() - t0  # this rank's wall time of the run and its checks
                rows += [dict(r, what=f"{f}: {r['what']}", feature=f, seconds=seconds) for r in got]
        wait_politely(comm)
    return rows
