"""Lesson 6, part 2, on real ranks: a mixture of experts, its experts sharded over the ranks.

    from minipar import launch
    out = launch(4, "minipar.lessons.experts:verify")                          # float64, MPI
    out = launch(3, "minipar.lessons.experts:verify", backend="torch")         # the same on gloo
    out = launch(4, "minipar.lessons.experts:train", ep=2, steps=20)           # EP x DP training

Every check builds the dense ``MoE`` from a seeded rng (the same on every rank) with one token
group per rank (``groups=p``: the same capacity and the same drops as the ranks), runs it on all
the tokens, and compares each rank's ``ExpertParallelMoE`` on its own tokens with the matching
rows: output, aux loss, the input gradient, the router gradient (averaged over the ranks, as
data parallelism does) and every local expert's gradient (the sum the all-to-all brought, / p).
The model's loss is the mean of the ranks' losses, so the dense run gets dy / p.

Numerics: float64 to 1e-12 relative: the same terms summed in another order (the experts see
the rows in the same order, the router's gradient is a sum over ranks). float32 to 1e-5 (sums
of <= 32 products, measured ~1e-7); routing decisions are made on the float32 probabilities,
which on these draws pick the same experts as float64 (a near-tie could flip one: the check
would say so).
"""
from __future__ import annotations

import copy

import numpy as np

from ..collectives import all_reduce
from ..errors import UsageError
from ..experts import ExpertParallelMoE, MoE
from ..nn import Linear, functional as F
from ..optim import sgd_step
from ..trace import bytes_sent
from ..xp import namespace, size, to_numpy
from .common import TOLERANCE, Checks, expect_error, rel_error, traced

N, C, H = 12, 6, 10  # tokens per rank, model width, expert hidden width


def make_moe(rng, E, p, k, capacity_factor=1.0, aux_weight=0.1, aux_groups=1, d_model=C):
    """A dense MoE with every parameter a fresh draw (nn starts biases at 0), one group per rank."""
    moe = MoE(d_model, H, E, rng, k=k, capacity_factor=capacity_factor, aux_weight=aux_weight,
              groups=p, aux_groups=aux_groups)
    for _, a in moe.named_parameters():
        a += 0.3 * rng.standard_normal(a.shape)
    return moe


def total(comm, counts):
    """Per-expert counts summed over the ranks (an int list, the same on every rank)."""
    return [int(round(c)) for c in to_numpy(all_reduce(comm, comm.asarray(np.asarray(counts, dtype=np.float64))))]


def check_moe(ch, E, k, rng):
    """One EP forward + backward against the dense MoE; returns the traced events and ctx."""
    comm, p = ch.comm, ch.comm.size
    dense = make_moe(rng, E, p, k)
    x, dy = rng.standard_normal((p * N, C)), rng.standard_normal((p * N, C))
    ep = ExpertParallelMoE(comm, dense).to(comm.asarray(np.zeros(1, ch.dtype)))
    y, dctx = dense.forward(x)
    dx = dense.backward(dy / p, dctx)
    mine = slice(comm.rank * N, (comm.rank + 1) * N)
    A = lambda a: comm.asarray(a[mine].astype(ch.dtype))  # noqa: E731
    (yr, ctx), fwd = traced(comm, ep.forward, A(x))
    dxr, bwd = traced(comm, ep.backward, A(dy), ctx)
    want = dict(dense.named_grads())
    errs = [rel_error(yr, y[mine]), abs(ctx["aux"] - dctx["aux"]) / dctx["aux"], rel_error(to_numpy(dxr) / p, dx[mine])]
    for name, g in ep.named_grads():
        g = all_reduce(comm, g) if name.startswith("router") else g
        errs.append(rel_error(to_numpy(g) / p, want[name]))
    what = f"E={E} experts on {p} ranks, top-{k}"
    ch.flag(f"{what}: output, aux loss, dx, router and {len(ep.experts())} local experts' grads", max(errs),
            TOLERANCE[ch.dtype])
    held, want_held = ep.num_params(), dense.router.num_params() + E // p * dense.expert0.num_params()
    ch.flag(f"{what}: each rank holds the router and {E // p} of {E} experts ({want_held} parameters)",
            abs(held - want_held))
    r, dr = ctx["routing"], dctx["routing"]
    kept, routed = total(comm, r.counts), total(comm, r.routed)
    ch.flag(f"{what}: tokens per expert {kept}, {sum(routed) - sum(kept)} of {sum(routed)} choices dropped = dense",
            abs(np.array(kept) - dr.counts).sum() + abs(np.array(routed) - dr.routed).sum())
    return ep, ctx, fwd, bwd


def verify(comm, dtypes=("float64",), seed=0):
    """Every check on this world size, per dtype (float32 rows are named "float32: ...")."""
    return [{**r, "what": ("" if dtype == "float64" else f"{dtype}: ") + r["what"]}
            for dtype in dtypes for r in verify_dtype(comm, dtype, seed)]


def verify_dtype(comm, dtype="float64", seed=0):
    p, ch = comm.size, Checks(comm, dtype)
    rng = np.random.default_rng([seed, 8])
    runs = {}
    for E in sorted({p, 2 * p}):
        for k in (1, 2) if E > 1 else (1,):
            runs[E, k] = check_moe(ch, E, k, rng)

    # traffic: the all-to-alls' bytes (sendrecv in the trace) against the counts they moved
    ep, ctx, fwd, bwd = runs[2 * p, 2 if p > 1 else 1]
    dispatched = "send_counts" in ctx["experts"]  # what the layer says it dispatched
    want = ep.traffic(ctx, np.dtype(dtype).itemsize) if dispatched else {"forward": -1, "backward": -1}
    for phase, ev in (("forward", fwd), ("backward", bwd)):
        got = bytes_sent([e for e in ev if e.kind == "sendrecv"], comm.world_rank(comm.rank))
        ch.flag(f"all-to-all bytes sent in the {phase} = rows x C x itemsize + counts"
                + ("" if dispatched else " (no dispatch recorded)"), abs(got - want[phase]))

    # refused with one clear line
    if p > 1:
        expect_error(ch, f"E={p + 1} experts on {p} ranks", lambda: ExpertParallelMoE(comm, make_moe(rng, p + 1, p, 1)),
                     f"n_experts={p + 1}", f"ep={p}")
    expect_error(ch, "top-3 of 2 experts", lambda: MoE(C, H, 2, rng, k=3), "k=3")
    if dtype == "float64":  # experts sharded over groups of p/2 ranks, replicated twice (p odd: one group)
        ep_size = p // 2 if p % 2 == 0 else p
        out = train(comm, ep=ep_size, steps=2, seed=seed)
        ch.flag(f"EP x DP training, dp={p} ep={ep_size}: losses, tokens per expert and parameters of 2 SGD "
                "steps = one process", out["error"], TOLERANCE[dtype])
    return ch.rows


# --------------------------------------------------------------------------- EP x DP training


def train(comm, ep=None, steps=3, seed=0, E=None, k=2, lr=0.2, aux_weight=0.1, n_tokens=N, d_in=4):
    """x -> Linear (dense, replicated) -> h; y = h + MoE(h); loss = mse(y, target) + aux.

    The world is the data-parallel group (dp = p ranks, each with its own tokens); the experts
    are sharded over groups of ``ep`` consecutive ranks and replicated across the dp/ep groups.
    Gradients: the dense ones (Linear, router) all-reduced over the world, an expert's over its
    replicas (its own group's sum came through the all-to-all), all divided by dp. Each step is
    compared with the same model trained in one process on all the tokens (groups = dp,
    aux_groups = dp/ep). Returns losses and tokens per expert per step, and the max error.
    """
    p = comm.size
    ep = ep or p
    if p % ep:
        raise UsageError(f"ep={ep} must divide the number of ranks ({p})")
    E = E or 2 * ep
    rng = np.random.default_rng([seed, 9])
    inp = Linear(d_in, C, rng)
    dense = make_moe(rng, E, p, k, capacity_factor=1.25, aux_weight=aux_weight, aux_groups=p // ep)
    group, replicas = comm.split(comm.rank // ep, key=comm.rank), comm.split(comm.rank % ep, key=comm.rank)
    like = comm.asarray(np.zeros(1))
    ours_inp, ours_moe = copy.deepcopy(inp).to(like), ExpertParallelMoE(group, dense).to(like)
    mine, errs, log = slice(comm.rank * n_tokens, (comm.rank + 1) * n_tokens), [], []
    for _ in range(steps):
        x, t = rng.standard_normal((p * n_tokens, d_in)), rng.standard_normal((p * n_tokens, C))
        loss_d, stats_d = _step(inp, dense, x, t, lr)  # one process, every token
        loss, stats = _step(ours_inp, ours_moe, comm.asarray(x[mine]), comm.asarray(t[mine]), lr,
                            lambda g: sync(comm, replicas, g, p))
        summed = to_numpy(all_reduce(comm, comm.asarray(np.concatenate([[loss], *stats]).astype(np.float64))))
        loss, (kept, routed) = summed[0] / p, (summed[a:a + E].round().astype(int).tolist() for a in (1, E + 1))
        errs += [abs(loss - loss_d) / abs(loss_d), float(np.abs(np.array(kept) - stats_d[0]).sum()),
                 float(np.abs(np.array(routed) - stats_d[1]).sum())]
        log.append({"loss": loss, "kept": kept, "routed": routed})
    want = dict(dense.named_parameters()) | {f"inp.{n}": a for n, a in inp.params.items()}
    got = dict(ours_moe.named_parameters()) | {f"inp.{n}": a for n, a in ours_inp.params.items()}
    errs += [rel_error(a, want[name]) for name, a in got.items()]
    return {"error": max(errs), "steps": log, "capacity": dense.group_capacity(n_tokens), "E": E, "k": k, "dp": p}


def sync(comm, replicas, grads, p):
    """Data-parallel averaging: dense grads over the world, expert grads over their replicas
    (each replica's already holds its ep group's sum), all divided by dp = p."""
    dense = {k: g for k, g in grads.items() if not k.startswith("expert")}
    return average(comm, dense, p) | average(replicas, {k: g for k, g in grads.items() if k not in dense}, p)


def _step(inp, moe, x, t, lr, sync=None):
    """Forward, backward, ``sync`` of the gradients ({name: grad} -> {name: grad}), an SGD step.
    Returns (this rank's loss, (kept, routed) per expert)."""
    h, ci = inp.forward(x)
    m, cm = moe.forward(h)
    loss, dy = F.mse_loss(h + m, t)
    dh = dy + moe.backward(dy, cm)
    inp.backward(dh, ci)
    grads = {"inp." + n: g for n, g in inp.named_grads()} | dict(moe.named_grads())
    grads = sync(grads) if sync else grads
    params = {"inp." + n: a for n, a in inp.named_parameters()} | dict(moe.named_parameters())
    for name, param in params.items():
        sgd_step(param, grads[name], lr)
    inp.zero_grad()
    moe.zero_grad()
    return float(loss) + cm["aux"], (cm["routing"].counts, cm["routing"].routed)


def average(comm, grads, n):
    """{name: grad} summed over ``comm`` in one all-reduce of the packed arrays, divided by n."""
    xp, names = namespace(*grads.values()), list(grads)
    flat = all_reduce(comm, xp.concat([xp.reshape(grads[k], (-1,)) for k in names])) / n
    sizes = np.cumsum([0] + [size(grads[k]) for k in names])
    return {k: xp.reshape(flat[a:b], grads[k].shape) for k, a, b in zip(names, sizes, sizes[1:])}


def tour(comm, seed=0):
    """The lesson's checks in float64."""
    return verify(comm, ("float64",), seed)


# --------------------------------------------------------------------------- for the figures


def dispatch_matrix(comm, E=None, k=2, seed=3, n_tokens=32):
    """Rows this rank sends to each expert (before and after dropping) in one forward."""
    E = E or 2 * comm.size
    rng = np.random.default_rng(seed)
    dense = make_moe(rng, E, comm.size, k, capacity_factor=1.0)
    x = rng.standard_normal((comm.size * n_tokens, C))[comm.rank * n_tokens:(comm.rank + 1) * n_tokens]
    x = comm.asarray(x)
    _, ctx = ExpertParallelMoE(comm, dense).to(x).forward(x)
    r = ctx["routing"]
    return {"kept": r.counts.tolist(), "routed": r.routed.tolist(), "capacity": dense.group_capacity(n_tokens)}
