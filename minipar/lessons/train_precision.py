"""Lesson 5 in mixed precision on real ranks: every grid against one process at the same precision
(tight) and against float64 (the dtype's tolerance); fp16's loss scale, decided by every rank
together.

    out = launch(8, "minipar.lessons.train_precision:check_precision", configs=[dict(dp=2, pp=2, tp=2,
                 schedule="1f1b", microbatches=2, precision="bf16")], steps=4)
    out = launch(4, "minipar.lessons.train_precision:check_overflow", config=dict(dp=2, tp=2, precision="fp16"))

The tolerances, per precision: ``minipar.train.precision.tolerances`` (docs/train.md derives them).
"""
from __future__ import annotations

import numpy as np

from ..train.precision import tolerances
from .common import rel_error
from .train import first_ranks, grid_rows, label, make_config, ranks_of, row, wait_politely


def check_precision(comm, configs, steps=4, mutant=None):
    """Train every configuration (dicts of TrainConfig fields, with ``precision``) on the first
    ranks and compare it with one process at its precision (losses, parameters, norms, replicas,
    tied copies: ``train.grid_rows``) and with one float64 process (losses); with fp16, every
    rank's skipped steps and loss scales against one process's."""
    from ..train.mutants import planted
    from ..train.trainer import train

    rows = []
    for i, kw in enumerate(configs):
        cfg = make_config(**dict(kw, steps=steps))
        ref = reference(cfg)
        sub = first_ranks(comm, ranks_of(cfg), f"cfg{i}")
        if sub is not None:
            with planted(mutant):
                tr, losses, _ = train(sub, cfg)
            rows += compared_rows(sub, cfg, tr, losses, ref)
        wait_politely(comm)
    return rows


def reference(cfg) -> dict:
    """One process trained as ``cfg`` says, at its precision: {"losses", "params", "record" (tokens
    per expert), "norms" (with clip), "skipped" (fp16's skipped steps), "f64" (the losses of one
    float64 process; None in float64, and when a step was skipped, as float64 takes every step)}."""
    from ..train.reference import train_dense

    record, norms, skipped = [], [], []
    losses, params = train_dense(cfg, record=record, norms=norms, skipped=skipped)
    f64 = train_dense(cfg.with_(precision="fp64"))[0] if not skipped and cfg.precision != "fp64" else None
    return dict(losses=losses, params=params, record=record, norms=norms, skipped=skipped, f64=f64)


def compared_rows(sub, cfg, tr, losses, ref):
    """The rows of one trained configuration against :func:`reference`'s one process: ``train.grid_rows``
    at the tolerances of ``cfg.precision`` (``minipar.train.precision.tolerances``), the losses
    against one float64 process (when no step was skipped), and with fp16 every rank's skipped steps
    and loss scales against one process's."""
    skipped = ref["skipped"]
    smallest = min(float(np.max(np.abs(a.astype(np.float64)))) for a in ref["params"].values())
    same, f64, ptol = tolerances(cfg, cfg.steps - len(skipped), smallest)
    rows = grid_rows(sub, cfg, tr, losses, ref["losses"], ref["params"], tol=same, param_tol=ptol,
                     ref_experts=ref["record"], ref_norms=ref["norms"])
    what = label(cfg)
    if ref["f64"] is not None:
        rows.append(row(f"{what}: losses of {len(losses)} steps vs one float64 process",
                        rel_error(np.array(losses), np.array(ref["f64"])), f64))
    if tr.scaler is not None:
        everyone = sub.builtin.allgather_object((tr.skipped, tr.scales))
        agree = all(e == everyone[0] for e in everyone) and tr.skipped == skipped
        rows.append(row(f"{what}: every rank skipped the steps one process skipped ({skipped or 'none'}), "
                        f"with the same loss scales", 0.0 if agree else 1.0, 0.0))
    return rows


def check_overflow(comm, config, at=1, rank=None, steps=3, mutant=None):
    """fp16: an inf planted in one gradient of one rank (world rank ``rank``, default the last)
    at step ``at``, after the dp reduction, where no other rank's gradients can see it. Every
    rank must skip that step (its weights unchanged) and halve its loss scale; the steps around
    it train."""
    from ..train.mutants import planted
    from ..train.trainer import Trainer

    cfg = make_config(**dict(config, steps=steps))
    rank = comm.size - 1 if rank is None else rank
    weights = []
    with planted(mutant):
        tr = Trainer(comm, cfg)
        for s in range(steps):
            weights.append(tr.local_params())
            tr.step(s) if s != at or comm.rank != rank else poisoned_step(tr, s)
        weights.append(tr.local_params())
    unchanged = all(np.array_equal(a, weights[at + 1][n]) for n, a in weights[at].items())
    moved = all(any(not np.array_equal(a, weights[s + 1][n]) for n, a in weights[s].items())
                for s in range(steps) if s != at)
    halved = tr.scales[at + 1] == tr.scales[at] / 2  # the scale step at + 1 ran with
    everyone = comm.builtin.allgather_object((tr.skipped, halved, unchanged, moved))
    what = f"{label(cfg)}: an inf in one gradient of world rank {rank} at step {at}"
    return [
        row(f"{what}: every rank skipped step {at}, and only it",
            0.0 if all(sk == [at] for sk, *_ in everyone) else 1.0, 0.0),
        row(f"{what}: every rank halved its loss scale",
            0.0 if all(h for _, h, *_ in everyone) else 1.0, 0.0),
        row(f"{what}: every rank's weights unchanged by step {at}, changed by the others",
            0.0 if all(u and m for *_, u, m in everyone) else 1.0, 0.0),
    ]


def poisoned_step(tr, step):
    """``tr.step(step)`` with an inf written into this rank's first gradient right after the dp
    reduction (a gradient no other rank adds into from then on)."""
    sync = tr.sync_dp

    def sync_then_poison():
        sync()
        g = tr.grads()[0]
        g[(0,) * len(g.shape)] = float("inf")

    tr.sync_dp = sync_then_poison
    try:
        return tr.step(step)
    finally:
        del tr.sync_dp  # the class's method again


def check_resume(comm, directory, saved, resumed, steps=4, at=2):
    """Train ``saved`` (a config dict with a 16-bit ``precision``) for ``steps`` steps,
    checkpointing after ``at``; resume on the same grid (the losses and fp16's loss scales must
    continue bitwise) and on each of ``resumed`` (other grids: the same precision's tolerance u).
    The wrong way that must differ: master weights taken from the 16-bit copy."""
    from ..train.checkpoint import resume
    from ..train.trainer import train

    cfg = make_config(**dict(saved, steps=steps))
    sub = first_ranks(comm, ranks_of(cfg), "saved")
    full = scales = None
    if sub is not None:
        tr, full, _ = train(sub, cfg, save=directory, save_every=at)
        scales = tr.scales
    full, scales = comm.builtin.bcast_object((full, scales), 0)
    wait_politely(comm)
    rows, same = [], tolerances(cfg)[0]
    for i, kw in enumerate([saved] + list(resumed)):
        other = make_config(**dict(kw, model=saved.get("model"), steps=steps))
        sub = first_ranks(comm, ranks_of(other), f"resumed{i}")
        if sub is not None:
            what = f"{label(cfg)} saved at step {at}, resumed on {label(other)}"
            tr, start = resume(sub, other, f"{directory}/step{at:06d}")
            _, losses, _ = train(sub, other, trainer=tr, start=start)
            rows.append(row(f"{what}: losses of steps {at}..{steps - 1}" + (" (bitwise)" if i == 0 else ""),
                            rel_error(np.array(losses), np.array(full[at:])), 0.0 if i == 0 else same))
            if tr.scaler is not None:
                rows.append(row(f"{what}: the loss scales continue ({tr.scales})",
                                0.0 if tr.scales == scales[at:] else 1.0, 0.0))
            if i == 0:  # the wrong way, once
                tr, start = resume(sub, other, f"{directory}/step{at:06d}")
                for e in tr.engines:
                    for mod, pname, lo, hi, master in e.master_pieces():
                        master[...] = flat_as(mod.params[pname], master)[lo:hi]
                _, losses, _ = train(sub, other, trainer=tr, start=start)
                err = rel_error(np.array(losses), np.array(full[at:]))
                rows.append(row(f"{what}: wrong way, master weights from the 16-bit copy, differs",
                                0.0 if err > 0 else 1.0, 0.0))
                if tr.scaler is not None:
                    tr, start = resume(sub, other, f"{directory}/step{at:06d}")
                    tr.scaler.scale, tr.scaler.good = other.initial_scale, 0  # the state not restored
                    train(sub, other, trainer=tr, start=start)
                    rows.append(row(f"{what}: wrong way, the loss scale from --initial-scale, runs other scales",
                                    0.0 if tr.scales != scales[at:] else 1.0, 0.0))
        wait_politely(comm)
    return rows


def flat_as(param, like):
    """``param`` flattened, in ``like``'s dtype."""
    from ..xp import namespace

    xp = namespace(param)
    return xp.astype(xp.reshape(param, (-1,)), like.dtype)


def check_fp16_events(comm, config, directory, resumed=()):
    """fp16's loss scale on one job: an overflow on one rank (``check_overflow``), the same with
    the flag not all-reduced (rows named "overflow_seen_locally: ...", which must fail), and a
    checkpoint resumed on its grid and on ``resumed`` (``check_resume``)."""
    rows = check_overflow(comm, config)
    rows += [dict(r, what=f"overflow_seen_locally: {r['what']}")
             for r in check_overflow(comm, config, mutant="overflow_seen_locally")]
    return rows + check_resume(comm, directory, config, resumed)
