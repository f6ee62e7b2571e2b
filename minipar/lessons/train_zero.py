"""Lesson 5's ZeRO on real ranks: every ZeRO stage of the trainer on a grid, against each other and
against the formulas.

    from minipar import launch
    out = launch(4, "minipar.lessons.train_zero:check_zero", configs=[dict(dp=2, pp=2, microbatches=2)])

On each grid, the trainer runs ZeRO-0 (DDP with one bucket per unit, ``minipar.zero.STAGES``), 1, 2
and 3 (and ZeRO-3 ``reshard`` with a pipeline), and ``check_zero`` compares the losses and weights,
each engine's memory ledger with ``minipar.memory.zero_bytes`` and the bytes sent over dp x cp
with ``minipar.train.accounting``, to the byte. The grids and the harness: ``minipar.lessons.train``.
"""
from __future__ import annotations

import numpy as np

from .common import rel_error
from .train import TOL, dp_units, first_ranks, label, make_config, ranks_of, row, wait_politely


def zero_stages(cfg) -> list:
    """The ZeRO stages to compare on ``cfg``'s grid: 0, 1, 2, 3; with a pipeline also ZeRO-3
    resharding around every action, as (zero, reshard) pairs."""
    return [(z, False) for z in (0, 1, 2, 3)] + ([(3, True)] if cfg.pp > 1 else [])


def check_zero(comm, configs, steps=2, mutant=None):
    """ZeRO-0 ... 3 on each grid of ``configs`` (dicts as for :func:`check_grids`; ``mutant``
    planted into the stages >= 2 only), every rank's rows:

    losses      ZeRO-2 and 3 bitwise equal to ZeRO-1 (the same reduce-scatter per unit, then the
                same elementwise Adam), and to ZeRO-0 (DDP with one bucket per unit: its ring adds in
                the reduce-scatter's order, so bitwise too; checked here to 1e-12)
    weights     the final weights bitwise ZeRO-1's (each replica's, ZeRO-3 gathered for reading)
    memory      each engine's peak params / grads / optimizer bytes = ``zero_bytes`` of its stage
                with the padding, the full gradients open until the flush and (ZeRO-3) the
                weights gathered: every unit once per step, or one stage's units resharding
    dp bytes    sent over dp x cp in one traced step = ``accounting.comm_bytes`` (RS + AG per
                unit; resharding: an AG per action), and the all-gathers counted per step
    """
    from ..train.mutants import planted
    from ..train.trainer import Trainer, train

    rows = []
    for i, kw in enumerate(configs):
        base = make_config(**dict(kw, steps=steps))
        sub = first_ranks(comm, ranks_of(base), f"zero{i}")
        if sub is not None:
            runs = {}
            for zero, reshard in zero_stages(base):
                cfg = base.with_(zero=zero, reshard=reshard)
                with planted(mutant if zero >= 2 else None):
                    tr, losses, _ = train(sub, cfg)
                    params = tr.local_params()
                    runs[zero, reshard] = losses, params
                    what = label(cfg)
                    if zero >= 2:
                        ref_losses, ref_params = runs[1, False]
                        same = losses == ref_losses and all(np.array_equal(a, ref_params[n]) for n, a in params.items())
                        rows.append(row(f"{what}: losses and weights bitwise ZeRO-1's", 0.0 if same else 1.0, 0.0))
                    if zero:
                        rows.append(row(f"{what}: losses = ZeRO-0's", rel_error(np.array(losses),
                                                                                np.array(runs[0, False][0])), TOL))
                    rows += ledger_rows(what, tr)
                    fresh = Trainer(sub, cfg.with_(steps=1))
                    sub.tracer.clear()
                    sub.tracer.enabled = True
                    fresh.step(0)
                    sub.tracer.enabled = False
                    rows += dp_traffic_rows(sub, cfg, fresh, not fresh.skipped, memory=tr.memory())
                    sub.tracer.clear()
        wait_politely(comm)
    return rows


def ledger_rows(what, tr):
    """Each of ``tr``'s engines: its peak params / grads / optimizer bytes = ``zero_bytes`` of its
    stage (the padding, the full gradients open until the flush, ZeRO-3's gathered weights)."""
    keys = ("params_bytes", "grads_bytes", "optimizer_bytes")
    return [row(f"{what}: {type(e).__name__} params, grads, optimizer bytes = zero_bytes",
                max(abs(e.measured_memory()[k] - e.predicted_memory()[k]) for k in keys), 0) for e in tr.engines]


def dp_traffic_rows(sub, cfg, tr, stepped=True, **extra):
    """The step of ``tr`` traced in ``sub.tracer``: the bytes this rank sent over dp x cp =
    ``accounting.comm_bytes`` (``stepped``: the step updated; fp16 skips one on an overflow) and,
    with ZeRO-3, its all-gathers = ``accounting.unit_gathers``. The first row carries dp_bytes,
    gathers and ``extra`` (docs/train.md's table)."""
    from ..train import accounting as acc

    me = sub.world_rank(sub.rank)
    gathers = sum(1 for ev in sub.tracer.events
                  if ev.rank == me and ev.kind == "collective" and ev.name == "all_gather:ring")
    units, stages = dp_units(tr)
    dp = acc.measured_comm(sub.tracer.events, me)["dp"]
    want = acc.comm_bytes(cfg, tr.grid.coords, units, stages, stepped)["dp"]
    what = label(cfg)
    rows = [dict(row(f"{what}: dp bytes per step = formula", abs(dp - want), 0), dp_bytes=dp, gathers=gathers, **extra)]
    if cfg.zero == 3:
        want = sum(acc.unit_gathers(cfg, tr.grid.coords, tr.unit_stage[u])
                   for e in tr.engines for u in e.flats)  # the experts' too (no bytes: a group of one)
        rows.append(row(f"{what}: all-gathers per step = formula", abs(gathers - want), 0))
    return rows
