"""Lesson 5 on real ranks: a small GPT on DP x PP x CP x TP grids (experts over DP), checked
against one process.

    from minipar import launch
    out = launch(8, "minipar.lessons.train:tour")                          # the tour's checks
    out = launch(8, "minipar.lessons.train:check_grids", configs=[...])    # any list of grids

Each configuration runs on the first dp*pp*tp ranks of the job (a sub-communicator made for
it; the other ranks wait without spinning), trains ``steps`` steps and is compared with the
dense GPT trained in one process on the same batches (computed on every rank, it is tiny):

    losses         every step's loss, float64, relative error <= 1e-12 (only the order of the
                   sums differs: TP all-reduces, micro-batch accumulation, DP averaging)
    parameters     every rank's shards after the last step vs the same slices of the reference
    replicas       bitwise equal within each DP (x CP) group (the same averaged gradient, elementwise
                   Adam); with experts, the weights both ranks hold
    tied copies    the first stage's wte shard bitwise equal to the last stage's copy
    experts        tokens per expert (kept and routed, every layer, every step) equal to one
                   process's exactly, and E/dp experts per layer on every rank
    clipping       (``clip``) every step's global gradient norm equal to one process's, 1e-12: each
                   parameter counted once; and the first step's norm above ``clip`` (it clipped)
    dropout        (``dropout``) nothing more to compare: every rank draws one process's masks for
                   what it holds (``minipar.nn.dropout``), so the checks above hold with it on

ZeRO's checks on these grids (ZeRO-0 ... 3 against each other, the ledger and the dp bytes against
the formulas) are ``minipar.lessons.train_zero``'s; mixed precision's ``minipar.lessons.train_precision``'s.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from ..tensor_parallel.layers import local_shards
from ..xp import to_numpy
from .common import rel_error

TOL = 1e-12
# the checks' models: 8 layers split over 1, 2, 4 or 8 stages; 6 layers over 3 (3 and 6 ranks)
SMALL = dict(vocab=32, d_model=16, n_heads=8, n_layers=8, seq_len=8)
ODD = dict(vocab=24, d_model=12, n_heads=6, n_layers=6, seq_len=6)
# context and expert parallelism: 4 layers (2 over pp = 2 interleaved), 4 experts of width 64
SHORT = dict(SMALL, n_layers=4)
MOE = dict(SHORT, n_experts=4, top_k=2)
# the checks' run: a few steps of a small batch (``TrainConfig``'s defaults are ``minipar train``'s run)
CHECKS = dict(steps=5, batch=16, lr=1e-3)


def row(what, error, tol):
    return {"what": what, "error": float(error), "tolerance": tol, "ok": bool(error <= tol)}


def make_config(model=None, **kw):
    """A ``TrainConfig`` of the checks: the ``model`` (a dict of GPTConfig fields, default SMALL),
    ``CHECKS``' steps, batch and lr unless given, and any other field in ``kw``."""
    from ..train.model import GPTConfig
    from ..train.trainer import TrainConfig

    return TrainConfig(GPTConfig(**(model or SMALL)), **dict(CHECKS, **kw))


def label(cfg) -> str:
    M = cfg.model
    extra = [cfg.schedule + f" m={cfg.microbatches}"] if cfg.pp > 1 or cfg.microbatches > 1 else []
    extra += ["SP"] if cfg.sequence_parallel else []
    extra += [f"recompute {cfg.recompute}"] if cfg.recompute != "none" else []
    extra += [f"ZeRO-{cfg.zero}" + (" reshard" if cfg.reshard else "")] if cfg.zero else []
    extra += [cfg.dtype] if cfg.dtype != "float64" else []
    extra += ["Ulysses"] if cfg.cp > 1 and cfg.cp_attention == "ulysses" else []
    extra += [f"E={M.n_experts} top-{M.top_k} f={M.capacity_factor}"] if M.n_experts else []
    extra += [f"clip {cfg.clip}" + (" inf-norm" if cfg.clip_norm_type != 2.0 else "")] if cfg.clip is not None else []
    extra += [f"dropout {cfg.dropout}"] if cfg.dropout else []
    cp = f" cp{cfg.cp}" if cfg.cp > 1 else ""
    return f"dp{cfg.dp} pp{cfg.pp}{cp} tp{cfg.tp}" + (f" ({', '.join(extra)})" if extra else "")


def ranks_of(cfg) -> int:
    return cfg.dp * cfg.pp * cfg.cp * cfg.tp


def first_ranks(comm, n, name):
    """The sub-communicator of world ranks 0 .. n-1 (None on the others)."""
    return comm.split(0 if comm.rank < n else None, key=comm.rank, name=name)


def wait_politely(comm):
    """A barrier for ranks with nothing to do: sleep between tests instead of spinning, so the
    working ranks keep the cores (MPI's blocking calls busy-poll)."""
    if comm.rank == 0:
        for r in range(1, comm.size):
            comm.send(comm.asarray(np.zeros(1)), r, 77)
        return
    req, t0 = comm.irecv(comm.empty((1,)), 0, 77), time.perf_counter()
    while not req.test():
        if time.perf_counter() - t0 > 1.0:  # gloo: test() sees a receive only once waited for,
            req.wait()  # and its blocking wait does not spin
            break
        time.sleep(0.005)


def digest(a) -> str:
    return hashlib.sha1(np.ascontiguousarray(to_numpy(a)).tobytes()).hexdigest()


def grid_rows(sub, cfg, tr, losses, ref_losses, ref_params, tol=TOL, param_tol=TOL, ref_experts=None, ref_norms=None):
    """The checks of one trained configuration, on every rank of ``sub``: losses, parameters,
    replicas, tied copies; with experts also the tokens per expert of every step; with clipping
    the gradient norm of every step."""
    what = label(cfg)
    rows = [row(f"{what}: losses of {len(losses)} steps", rel_error(np.array(losses), np.array(ref_losses)), tol)]
    if cfg.clip is not None:
        err = rel_error(np.array(tr.grad_norms), np.array(ref_norms)) if len(tr.grad_norms) == len(ref_norms) else 1.0
        rows.append(row(f"{what}: gradient norm of every step = one process's (each parameter once)", err, tol))
        rows.append(row(f"{what}: the first step clipped (its norm {tr.grad_norms[0]:.3g} > clip {cfg.clip})",
                        0.0 if tr.grad_norms[0] > cfg.clip else 1.0, 0.0))
    full = dict(ref_params, **{"head.wte": ref_params["embed.wte"]})
    err = 0.0
    with tr.gathered():  # ZeRO-3: the weights exist whole only while gathered
        for st in tr.stages.values():
            want = local_shards(st, full)
            for n, p in st.named_parameters():
                err = max(err, rel_error(p, want[n]))
    rows.append(row(f"{what}: parameters after the last step", err, param_tol))
    mine = tr.local_params()
    place = tr.grid.coords + (tr.grid.cp_rank,)  # (d, p, t, c)
    everyone = sub.builtin.allgather_object((place, {n: digest(a) for n, a in mine.items()}))
    d, p, t, c = place
    # the dp x cp replicas hold the same weights (experts: the ones both hold)
    same = all(h == digest(mine[n]) for (_, p2, t2, _), hs in everyone if (p2, t2) == (p, t)
               for n, h in hs.items() if n in mine)
    rows.append(row(f"{what}: replicas bitwise equal within each DP" + (" x CP" if cfg.cp > 1 else "") + " group",
                    0.0 if same else 1.0, 0.0))
    if cfg.pp > 1:
        firsts = {(d2, t2, c2): hs["embed.wte"] for (d2, p2, t2, c2), hs in everyone if "embed.wte" in hs}
        lasts = {(d2, t2, c2): hs["head.wte"] for (d2, p2, t2, c2), hs in everyone if "head.wte" in hs}
        rows.append(row(f"{what}: tied embedding bitwise equal on the first and last stage",
                        0.0 if firsts == lasts and firsts else 1.0, 0.0))
    if cfg.model.n_experts:
        wrong = sum(abs(np.array(got[k][kind]) - want[k][kind]).sum() for got, want in zip(tr.history, ref_experts)
                    for k in want for kind in ("kept", "routed")) if len(tr.history) == len(ref_experts) else 1
        rows.append(row(f"{what}: tokens per expert (kept, routed) of every step = one process", float(wrong), 0.0))
        held = {n.split(".expert")[1].split(".")[0] for n in mine if ".expert" in n}
        rows.append(row(f"{what}: each rank holds E/dp = {cfg.model.n_experts // cfg.dp} experts per layer",
                        abs(len(held) - cfg.model.n_experts // cfg.dp), 0))
    return rows


def check_grids(comm, configs, steps=5, mutant=None):
    """Train every configuration (dicts of TrainConfig fields, ``model`` a dict of GPTConfig
    fields) on the first dp*pp*tp ranks and compare it with one process. Returns check rows.

    float32 configurations are compared with the float64 reference: losses at 1e-5 (float32
    rounding, 6e-8, grown by the few hundred terms of each sum); parameters at 1e-4, because
    Adam divides each gradient by its own running RMS, so an element whose gradient is near
    float32's noise level moves by up to lr = 1e-3 in a direction the rounding decides (a few
    such elements in 5 steps give ~3e-5 relative to the largest weight)."""
    from ..train.mutants import planted
    from ..train.reference import train_dense
    from ..train.trainer import train

    refs, rows = {}, []
    for i, kw in enumerate(configs):
        cfg = make_config(**dict(kw, steps=steps))
        key = (cfg.model, cfg.batch, cfg.lr, cfg.seed, cfg.data_seed, steps, cfg.clip, cfg.clip_norm_type, cfg.dropout)
        if cfg.model.n_experts:  # the routing groups follow the grid (train_dense)
            key += (cfg.dp, cfg.microbatches)
        if key not in refs:
            record, norms = [], []
            refs[key] = train_dense(cfg.with_(precision="fp64"), record=record, norms=norms) + (record, norms)
        sub = first_ranks(comm, ranks_of(cfg), f"cfg{i}")
        if sub is not None:
            with planted(mutant):
                tr, losses, _ = train(sub, cfg)
            f64 = cfg.dtype == "float64"
            ref_losses, ref_params, ref_experts, ref_norms = refs[key]
            rows += grid_rows(sub, cfg, tr, losses, ref_losses, ref_params, tol=TOL if f64 else 1e-5,
                              param_tol=TOL if f64 else 1e-4, ref_experts=ref_experts, ref_norms=ref_norms)
        wait_politely(comm)
    return rows


def check_mutants(comm, cases):
    """[(mutant, "grids" | "accounting", config[, steps])]: the rows of each run, named "mutant: ..."."""
    rows = []
    for mutant, check, kw, *steps in cases:
        run = check_grids if check == "grids" else check_accounting
        more = {"steps": steps[0]} if steps and check == "grids" else {}
        rows += [dict(r, what=f"{mutant}: {r['what']}") for r in run(comm, [kw], mutant=mutant, **more)]
    return rows


def dp_units(tr):
    """(padded sizes, pipeline stages) of the flat buffers the trainer's DP engines reduce over
    dp x cp (the experts' engine, a group of one, sends nothing); stages None without ZeRO."""
    engines = [e for e in tr.engines if e.model is not tr.experts]
    sizes = [f.n_pad for e in engines for f, _, _ in e.optimizer_parts()]
    stages = [tr.unit_stage[u] for e in engines for u in getattr(e, "flats", {})]  # each unit's pipeline stage
    return sizes, stages or None


def traced_step(sub, cfg, mutant=None):
    """One traced step of ``cfg`` on ``sub``: (measured, predicted) dicts of this rank's
    activation peak ("activations") and bytes sent per group ("tp", "pp", "dp", "emb", "cp")."""
    from ..train import accounting as acc
    from ..train.mutants import planted
    from ..train.trainer import Trainer

    with planted(mutant):
        tr = Trainer(sub, cfg)
        sub.tracer.clear()
        sub.tracer.enabled = True
        tr.step(0)
        sub.tracer.enabled = False
    got = dict(acc.measured_comm(sub.tracer.events, sub.world_rank(sub.rank)), activations=tr.peak_activations)
    want = dict(acc.comm_bytes(cfg, tr.grid.coords, *dp_units(tr)), activations=acc.activation_peak(cfg, tr.grid.coords))
    sub.tracer.clear()
    return got, want


def check_accounting(comm, configs, mutant=None, precisions=None):
    """Activation peak and bytes sent per group in one traced step, against the formulas of
    ``minipar.train.accounting``, to the byte, on every rank of every configuration: in its own
    ``precision``, or in each of ``precisions`` ("fp64", "fp32", "bf16", "fp16"; 16 bits: 2 bytes
    an element, float32 for the cross-entropy's all-reduces and main_grad's dp and emb sums)."""
    if precisions:
        configs = [dict(kw, precision=p) for kw in configs for p in precisions]
    rows = []
    for i, kw in enumerate(configs):
        cfg = make_config(**dict(kw, steps=1))
        sub = first_ranks(comm, ranks_of(cfg), f"acc{i}")
        if sub is not None:
            got, want = traced_step(sub, cfg, mutant)
            what = label(cfg)
            rows.append(row(f"{what}: activation bytes at the peak = formula", abs(got["activations"] - want["activations"]), 0))
            for fam in ("tp", "pp", "dp", "emb") + (("cp",) if cfg.cp > 1 else ()):
                rows.append(row(f"{what}: {fam} bytes per step = formula", abs(got[fam] - want[fam]), 0))
        wait_politely(comm)
    return rows


def cp_table(comm, cps=(1, 2, 4), tp=1, attention="ring", microbatches=1):
    """The documented model (docs/train.md) on dp1 pp1 cp tp for each cp: rank 0's activation
    peak and bytes per step over cp, tp and dp, measured and predicted, from one traced step."""
    from ..train.config import DEFAULT_MODEL

    out = []
    for cp in cps:
        cfg = make_config(model=DEFAULT_MODEL, cp=cp, tp=tp, cp_attention=attention, batch=32,
                          microbatches=microbatches, steps=1)
        sub = first_ranks(comm, ranks_of(cfg), f"cp{cp}")
        if sub is not None:
            got, want = traced_step(sub, cfg)
            if sub.rank == 0:
                out.append({"grid": label(cfg), "measured": got, "formula": want})
        wait_politely(comm)
    return out


def check_checkpoints(comm, directory, saved, resumed, steps=6, at=3):
    """Train ``saved`` (a config dict) for ``steps`` steps, checkpointing after ``at``; resume
    that checkpoint on each of ``resumed`` (other grids, other world sizes) and compare their
    losses from step ``at`` on with the uninterrupted run's (1e-12). Wrong ways that must
    differ: resuming with a fresh optimizer, and resuming at step 0 of the data."""
    from ..train.checkpoint import resume
    from ..train.trainer import train

    cfg = make_config(**dict(saved, steps=steps))
    sub = first_ranks(comm, ranks_of(cfg), "saved")
    full = None
    if sub is not None:
        _, full, _ = train(sub, cfg, save=directory, save_every=at)
    full = comm.builtin.bcast_object(full, 0)
    wait_politely(comm)
    rows = []
    for i, kw in enumerate(resumed):
        other = make_config(**dict(kw, model=saved.get("model"), steps=steps))
        sub = first_ranks(comm, ranks_of(other), f"resumed{i}")
        if sub is not None:
            what = f"saved on {label(cfg)}, resumed on {label(other)} ({sub.size} ranks)"
            tr, start = resume(sub, other, f"{directory}/step{at:06d}")
            _, losses, _ = train(sub, other, trainer=tr, start=start)
            rows.append(row(f"{what}: losses of steps {at}..{steps - 1}", rel_error(np.array(losses), np.array(full[at:])), TOL))
            if i == 0:  # the wrong ways, once
                tr, start = resume(sub, other, f"{directory}/step{at:06d}")
                for e in tr.engines:
                    for *_, m, v in e.optimizer_pieces():
                        m[...] = 0
                        v[...] = 0
                    e.steps = 0
                _, losses, _ = train(sub, other, trainer=tr, start=start)
                err = rel_error(np.array(losses), np.array(full[at:]))
                rows.append(row(f"{what}: wrong way, a fresh optimizer, differs", 0.0 if err > 1e-6 else 1.0, 0.0))
                tr, start = resume(sub, other, f"{directory}/step{at:06d}")
                _, losses, _ = train(sub, other.with_(steps=steps - at), trainer=tr, start=0)
                err = rel_error(np.array(losses), np.array(full[at:]))
                rows.append(row(f"{what}: wrong way, the data from step 0, differs", 0.0 if err > 1e-6 else 1.0, 0.0))
        wait_politely(comm)
    return rows


def check_checkpoint_cases(comm, directory, cases):
    """[(saved, [resumed, ...])]: :func:`check_checkpoints` for each, in its own subdirectory."""
    rows = []
    for i, (saved, resumed) in enumerate(cases):
        rows += check_checkpoints(comm, f"{directory}/case{i}", saved, resumed)
    return rows


def save_then_crash(comm, directory):
    """Train 2 steps saving after each; the second save dies after writing its shards and index
    but before its rename (the job aborts): the first checkpoint must stay the loadable one."""
    from ..train.saving import save
    from ..train.trainer import train

    cfg = make_config(steps=1)
    tr, _, _ = train(comm, cfg, save=directory, save_every=1)
    tr.step(1)
    save(tr, directory, 2, crash_before_commit=True)


def check_generation(comm, directory, n_new=6, tps=(1, 2, 4), model=None, batch=2, mutant=None):
    """Train 3 steps on one rank and checkpoint; decode greedily from it at each TP size with a
    KV cache. Tokens must be identical at every TP size and equal decoding without the cache.
    Returns rows, and (on rank 0) the seconds per token of each TP size."""
    from ..train.generate import generate, load_model
    from ..train.trainer import train

    cfg = make_config(model=model, steps=3)
    sub = first_ranks(comm, 1, "gen-train")
    if sub is not None:
        train(sub, cfg, save=directory)
    wait_politely(comm)
    prompt = np.random.default_rng(5).integers(0, cfg.model.vocab, (batch, 3))
    rows, outs, times = [], {}, {}
    for tp in tps:
        sub = first_ranks(comm, tp, f"gen-tp{tp}")
        if sub is not None:
            from ..train.mutants import planted

            model, _ = load_model(sub, directory)
            with planted(mutant):
                ids, per_token = generate(sub, model, prompt, n_new)
            outs[tp], times[tp] = ids.tolist(), per_token
            if tp == max(tps):
                plain, _ = generate(sub, model, prompt, n_new, use_cache=False)
                rows.append(row(f"generation at TP={tp}: KV cache = no cache", float(np.any(plain != ids)), 0.0))
        wait_politely(comm)
    if comm.rank == 0:
        same = all(outs[tp] == outs[tps[0]] for tp in tps)
        rows.append(row(f"greedy tokens identical at TP = {', '.join(map(str, tps))}", 0.0 if same else 1.0, 0.0))
        rows.append({"what": "seconds per token", "times": times, "error": 0.0, "tolerance": 0.0, "ok": True})
    return rows


def tour(comm):
    """The tour's checks on whatever ranks it gets: a pipelined, tensor-parallel grid (with 4 or
    more ranks: dp1 pp2 tp2, zb-h1, sequence parallel) trained 5 steps against one process, and
    its activation peak and traffic against the formulas; a planted bug caught."""
    if comm.size >= 4:
        grid = dict(dp=2 if comm.size >= 8 else 1, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True)
    elif comm.size >= 2:
        grid = dict(dp=1, pp=2, tp=1, schedule="1f1b", microbatches=2, recompute="selective")
    else:
        grid = dict(microbatches=2, recompute="full")
    rows = check_grids(comm, [grid]) + check_accounting(comm, [grid])
    if comm.size >= 2:
        caught = check_grids(comm, [dict(dp=1, pp=2, tp=1, microbatches=2)], mutant="tied_not_summed")
        bad = [r for r in caught if "tied embedding" in r["what"]]  # on the ranks that ran it
        if comm.rank == 0:
            rows.append(row("planted bug (tied gradient not summed) caught by the tied-copies check",
                            0.0 if bad and not any(r["ok"] for r in bad) else 1.0, 0.0))
    return rows
