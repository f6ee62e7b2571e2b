"""Lesson 7 on real ranks: the planner's formulas checked, and a link you can feel.

    from minipar import launch
    out = launch(4, "minipar.lessons.planning:tour")               # check rows, every rank
    minipar run -n 4 planning                                      # the same from the shell
    minipar bench links                                            # DDP and TP under emulated links,
                                                                   # measured vs the planner's prediction
                                                                   # (minipar.bench.links)

The checks: the planner reproduces the ZeRO paper's memory table cell for cell and Korthikanti
et al.'s activation formulas; an emulated link (``minipar.comm.link``) really delays the
messages: the rank sleeps at least the link's alpha + n beta for what it sent (counted from the
trace), and the data still arrives intact (a delay, not a replacement). ``check_memory``: the
planner's bytes per rank equal what lesson 05's trainer counts on its ranks, to the byte.

``feel_ddp`` and ``feel_tp`` are the measured halves of two lessons about links in the
Hugging Face guide "Efficient Training on Multiple GPUs" (docs/sources.md):
DDP with and without NVLink, and tensor parallelism losing across a slow link. ``feel`` runs
them under each link and sets the planner's prediction beside each measurement.
"""
from __future__ import annotations

import os
import time
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from .. import nn
from ..collectives import all_gather, all_reduce, reduce_scatter
from ..comm.link import ENV, LINKS, QUANTUM, SLOWDOWN_ENV
from ..xp import chunk_bounds, to_numpy
from .common import rel_error

# ZeRO (Rajbhandari et al. 2020), Table 1: GB per device, model states only; columns
# P_os, P_os+g, P_os+g+p for 7.5B, 128B, 1T parameters; rows DP = 1, 4, 16, 64, 256, 1024.
ZERO_TABLE = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88),
            256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128), 64: (536, 284, 32),
            256: (518, 263, 8), 1024: (513, 257, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000), 64: (4187, 2218, 250),
           256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}


def as_printed(gb: float) -> float:
    """How the ZeRO table prints a value: whole GB (truncated) from 100 GB up; below, 3 significant
    figures with at most 2 decimals, rounded half up (41.25 -> 41.3, 1.875 -> 1.88, 0.469 -> 0.47)."""
    if gb >= 100:
        return float(int(gb))
    places = min(2, 2 - int(np.floor(np.log10(gb))))
    return float(Decimal(repr(gb)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def zero_table_rows() -> list[tuple]:
    """(psi, dp, stage, planner's GB as printed, the paper's) for all 54 cells, through the
    planner's model-state function."""
    from ..plan.config import Problem
    from ..plan.hardware import preset
    from ..plan.memory import states
    from ..plan.models import model

    prob = Problem(model("gpt3-175b"), 1, 1, preset("a100-80gb"), 1)  # mixed-precision Adam: 2 + 2 + 12
    out = []
    for psi, rows in ZERO_TABLE.items():
        for dp, cells in rows.items():
            for stage, want in zip((1, 2, 3), cells):
                s = states(prob, np.array([psi]), np.array([dp]), np.array([stage]), np.array([0.0]), extras=False)
                got = float(s["params_bytes"][0] + s["grads_bytes"][0] + s["optimizer_bytes"][0]) / 1e9
                out.append((psi, dp, stage, as_printed(got), want))
    return out


# --------------------------------------------------------------------------- a link you can feel


def link_probe(comm, sizes=(4096, 65536, 262144), reps=3, ring_bytes=1 << 20, seed=0):
    """Messages between rank pairs (sendrecv) and a ring all-reduce, traced. Returns per rank:
    the traced point-to-point events (kind, seconds, bytes), the emulated link's accounting
    (owed, paid) or None, and whether every message arrived intact."""
    comm.tracer.clear()
    comm.tracer.enabled = True
    peer = comm.rank ^ 1 if (comm.rank ^ 1) < comm.size else comm.rank
    intact = True
    for n in sizes:
        x = comm.asarray(np.random.default_rng([seed, comm.rank, n]).standard_normal(n // 8))
        want = np.random.default_rng([seed, peer, n]).standard_normal(n // 8)
        buf = comm.empty(x.shape, "float64")
        for _ in range(reps):
            comm.sendrecv(x, peer, buf, peer)
            intact &= bool(np.array_equal(to_numpy(buf), want))
    v = comm.asarray(np.random.default_rng([seed, comm.rank]).standard_normal(ring_bytes // 8))
    total = all_reduce(comm, v, "ring")
    want = sum(np.random.default_rng([seed, r]).standard_normal(ring_bytes // 8) for r in range(comm.size))
    intact &= bool(np.max(np.abs(to_numpy(total) - want)) <= 1e-12 * np.max(np.abs(want)))
    comm.tracer.enabled = False
    events = [(e.kind, e.t_end - e.t_start, e.bytes) for e in comm.tracer.events
              if e.kind in ("send", "recv", "sendrecv", "isend", "irecv")]
    d = getattr(comm, "link_delay", None)
    return events, (None if d is None else (d.owed, d.paid)), intact


def link_shortfall(events, lk) -> tuple[float, float]:
    """(how much less time the traced messages took than the link's alpha + n beta for each,
    that sum): the emulation owes at most QUANTUM."""
    need = sum(lk.time(n) for _, _, n in events)
    return max(0.0, need - sum(d for _, d, _ in events)), need


def emulated(comm, name: str, slowdown: float = 1.0):
    """A copy of ``comm`` (via split) whose messages pay link ``name``: the hook reads the
    environment when a communicator is made. Collective."""
    old = os.environ.get(ENV), os.environ.get(SLOWDOWN_ENV)
    os.environ[ENV], os.environ[SLOWDOWN_ENV] = name, str(slowdown)
    try:
        return comm.split(0, comm.rank, name=f"{comm.name}+{name}")
    finally:
        for key, val in zip((ENV, SLOWDOWN_ENV), old):
            if val is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = val


def _block_stack(layers, hidden, heads, seed=0):
    rng = np.random.default_rng(seed)
    return nn.Sequential(*[nn.Block(hidden, heads, rng) for _ in range(layers)])


def feel_runs(comm, links=("none", "nvlink", "pcie", "ethernet"), slowdown=200.0, steps=5, ddp=None, tp=None,
              pairs=None):
    """The Hugging Face guide's two link lessons, measured in ONE job on 2 ranks, every link on its own copy of
    the communicator (``emulated``), the variants taking turns step by step so that the load of a
    shared machine hits them alike. Seconds per step, best of ``steps`` (slowest rank):

    - ``ddp``: DDP training step (one bucket, the all-reduce after the backward) on a stack of
      transformer blocks, one sequence per rank;
    - ``tp2``: forward + backward of such a stack, tensor-parallel over the 2 ranks (Megatron:
      2 all-reduces forward, 2 backward per block);
    - ``tp1``: the dense stack on rank 0 alone (rank 1 waits): no communication at all.

    ``pairs``: only these (run, link) pairs, e.g. (("ddp", "nvlink"), ("tp2", "ethernet")).
    """
    from ..data_parallel import DDP
    from ..tensor_parallel import ParallelBlock

    ddp, tp = ddp or FEEL["ddp"], tp or FEEL["tp"]
    comms = {lk: (comm.split(0, comm.rank) if lk == "none" else emulated(comm, lk, slowdown)) for lk in links}
    rng = np.random.default_rng([1, comm.rank])
    x = comm.asarray(rng.standard_normal((1, ddp["seq"], ddp["hidden"])))
    y = comm.asarray(rng.standard_normal((1, ddp["seq"], ddp["hidden"])))
    ddps = {lk: DDP(c, _block_stack(ddp["layers"], ddp["hidden"], ddp["heads"]).to(x)) for lk, c in comms.items()}
    xt = comm.asarray(np.random.default_rng(2).standard_normal((1, tp["seq"], tp["hidden"])))
    dense = _block_stack(tp["layers"], tp["hidden"], tp["heads"]).to(xt)
    tps = {lk: nn.Sequential(*[ParallelBlock(c, b) for b in dense.children().values()]).to(xt)
           for lk, c in comms.items()}

    def fwd_bwd(model):
        out, ctx = model.forward(xt)
        model.backward(xt, ctx)

    runs = {("tp1", "none"): (lambda: fwd_bwd(dense) if comm.rank == 0 else None)}
    for lk in links:
        runs["ddp", lk] = (lambda d=ddps[lk]: d.train_step(x, y))
        runs["tp2", lk] = (lambda m=tps[lk]: fwd_bwd(m))
    if pairs is not None:
        keep = {tuple(p) for p in pairs}
        runs = {k: fn for k, fn in runs.items() if k in keep}
    best = {k: float("inf") for k in runs}
    for step in range(steps + 1):  # the first round warms up
        for key, fn in runs.items():
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            t = comm.builtin.all_reduce(comm.asarray(np.array([time.perf_counter() - t0])), "max")[0].item()
            if step:
                best[key] = min(best[key], t)
    return best


FEEL = dict(ddp=dict(layers=2, hidden=256, heads=4, seq=8), tp=dict(layers=2, hidden=256, heads=4, seq=128))


def predicted(what: str, hw, spec: dict | None = None) -> float:
    """The planner's step time for a ``feel_runs`` run on hardware ``hw`` (this machine + a link)."""
    from ..plan import Config, ModelSpec, Problem, predict

    spec = spec or FEEL["ddp" if what == "ddp" else "tp"]
    m = ModelSpec(spec["layers"], spec["hidden"], spec["heads"], spec["seq"], 0, name=what, dropout=False,
                  positions="alibi")
    if what == "ddp":
        return predict(Problem(m, 2, 2, hw, 2, overlap_dp=False), Config(dp=2)).step_time_s
    n = 1 if what == "tp1" else 2
    p = predict(Problem(m, n, 2, hw, 1), Config(tp=n))
    return p.step_time_s - p.parts["optimizer"]  # forward + backward only


def feel(links=("none", "nvlink", "pcie", "ethernet"), slowdown=200.0, steps=5, hw=None, pairs=None):
    """Measure ``feel_runs`` on 2 real ranks and predict every run: rows {what, link, measured_s, predicted_s}."""
    from ..launcher import launch
    from ..plan.hardware import this_machine

    hw = hw or this_machine("float64")
    known = {("tp1", "none")} | {(w, lk) for w in ("ddp", "tp2") for lk in links}
    unknown = [p for p in pairs or () if tuple(p) not in known]
    if unknown:
        raise ValueError(f"pairs={unknown}: each pair is (run, link) with run ddp or tp2 and a link of {links}, "
                         f"or ('tp1', 'none')")
    best = launch(2, "minipar.lessons.planning:feel_runs", quiet=True, links=tuple(links), slowdown=slowdown,
                  steps=steps, pairs=pairs).results[0]
    rows = []
    for (what, lk), t in best.items():
        hw_l = hw if lk == "none" else hw.with_links(emulated=lk, slowdown=slowdown)
        rows.append(dict(what=what, link=lk, measured_s=t, predicted_s=predicted(what, hw_l)))
    return rows


def feel_summary(rows) -> list[str]:
    """The effects the Hugging Face guide talks about, measured and predicted: what each link adds to a DDP step,
    and TP=2's speed-up over TP=1 on each link (below 1: TP loses)."""
    get = {(r["what"], r["link"]): r for r in rows}
    out = []
    for lk in [r["link"] for r in rows if r["what"] == "ddp" and r["link"] != "none"]:
        m = get["ddp", lk]["measured_s"] - get["ddp", "none"]["measured_s"]
        p = get["ddp", lk]["predicted_s"] - get["ddp", "none"]["predicted_s"]
        out.append(f"DDP step, {lk} adds: measured {m * 1e3:+.1f} ms, predicted {p * 1e3:+.1f} ms")
    t1 = get.get(("tp1", "none"))
    for lk in [r["link"] for r in rows if r["what"] == "tp2"]:
        if t1:
            m = t1["measured_s"] / get["tp2", lk]["measured_s"]
            p = t1["predicted_s"] / get["tp2", lk]["predicted_s"]
            out.append(f"TP=2 over TP=1 on {lk}: measured {m:.2f}x, predicted {p:.2f}x"
                       + ("  (TP loses)" if m < 1 else ""))
    return out


# --------------------------------------------------------------------------- two levels: nodes and a network


def two_level_all_reduce(intra, inter, x):
    """Data parallelism's all-reduce on a two-level network, as the planner times it
    (``plan.timing.dp_collective``): a reduce-scatter among the k ranks of a node (``intra``), an
    all-reduce of each 1/k shard among the ranks holding the same shard, one per node (``inter``),
    an all-gather inside the node. Only N/k bytes per rank cross the network, in 2 (nodes - 1)
    steps; a flat ring sends 2 (n-1)/n N over it in 2 (n - 1) steps."""
    counts = [b - a for a, b in chunk_bounds(x.shape[0], intra.size)]
    shard = reduce_scatter(intra, x)                # (N/k,) my node's sum of my chunk
    shard = all_reduce(inter, shard, "ring")        # (N/k,) summed over the nodes
    return all_gather(intra, shard, counts=counts)  # (N,) on every rank


def two_level_runs(comm, per_node=2, nbytes=1 << 23, intra_link="nvlink", inter_link="ethernet", slowdown=20.0,
                   steps=3, seed=0):
    """These ranks as nodes of ``per_node`` ranks: messages inside a node pay ``intra_link``, between
    nodes ``inter_link`` (both ``slowdown`` times slower, ``emulated``). Seconds per all-reduce of
    ``nbytes`` (float64), best of ``steps`` (slowest rank), two ways: ``two-level``
    (:func:`two_level_all_reduce`) and ``flat ring`` (minipar's ring over every rank: each of its
    steps waits for the messages that cross the network, so here every message pays the inter-node
    link). ``error``: the largest relative error of both against the engine's own all-reduce
    (float64, only the order of the sums differs: <= 1e-12)."""
    if comm.size % per_node:
        raise ValueError(f"per_node={per_node} must divide the {comm.size} ranks")
    node, local = divmod(comm.rank, per_node)
    intra = emulated(comm.split(node, comm.rank), intra_link, slowdown)
    inter = emulated(comm.split(local, comm.rank), inter_link, slowdown)
    flat = emulated(comm, inter_link, slowdown)
    x = comm.asarray(np.random.default_rng([seed, comm.rank]).standard_normal(nbytes // 8))
    want = comm.builtin.all_reduce(x, "sum")
    runs = {"two-level": lambda: two_level_all_reduce(intra, inter, x), "flat ring": lambda: all_reduce(flat, x, "ring")}
    best, error = {k: float("inf") for k in runs}, 0.0
    for step in range(steps + 1):  # the first round warms up
        for key, fn in runs.items():
            comm.barrier()
            t0 = time.perf_counter()
            out = fn()
            t = comm.builtin.all_reduce(comm.asarray(np.array([time.perf_counter() - t0])), "max")[0].item()
            error = max(error, rel_error(out, want))
            if step:
                best[key] = min(best[key], t)
    return dict(best, error=error)


def hierarchical_time(nbytes, n, per_node, intra, inter) -> float:
    """The planner's time for data parallelism's all-reduce of ``nbytes`` over ``n`` ranks, ``per_node``
    of them per node (n <= per_node, or a multiple of it), links given as (alpha s, beta s/byte):
    ``plan.timing.dp_collective`` on a configuration with only data parallelism."""
    from dataclasses import replace

    from ..comm.link import Link
    from ..plan import Config, Configs, ModelSpec, Problem, preset
    from ..plan.timing import dp_collective

    if n > per_node and n % per_node:
        raise ValueError(f"n={n} ranks must fit one node of per_node={per_node} or fill whole nodes")
    hw = replace(preset("a100-80gb"), intra=Link("intra", intra[0], 1 / intra[1]),
                 inter=Link("inter", inter[0], 1 / inter[1]), link_fraction=1.0)
    prob = Problem(ModelSpec(1, 8, 1, 8, 0), n, per_node, hw, n)
    return float(dp_collective(prob, Configs.of([Config(dp=n)]), nbytes, "all_reduce")[0])


def two_level_predicted(n, per_node=2, nbytes=1 << 23, intra_link="nvlink", inter_link="ethernet", slowdown=20.0,
                        hw=None) -> dict:
    """The planner's seconds for ``two_level_runs``: this machine's measured link plus each emulated one
    (``Link.plus``); ``intra``/``inter``: those links as (alpha, beta), the flat ring on ``inter``."""
    from .. import costmodel as cm
    from ..plan.hardware import this_machine

    hw = hw or this_machine("float64")
    intra = hw.intra.plus(LINKS[intra_link].scaled(slowdown))
    inter = hw.inter.plus(LINKS[inter_link].scaled(slowdown))
    a_b = {"intra": (intra.alpha, intra.beta()), "inter": (inter.alpha, inter.beta())}
    return {"two-level": hierarchical_time(nbytes, n, per_node, a_b["intra"], a_b["inter"]),
            "flat ring": cm.allreduce_time("ring", nbytes, n, *a_b["inter"]), **a_b}


# --------------------------------------------------------------------------- the tour


def check_memory(comm, configs) -> list[dict]:
    """Rows: for each configuration (TrainConfig fields; the model ``SMALL``-sized unless given)
    one training step on the first dp*pp*tp ranks, the counted memory of every rank against the
    planner's (``plan.predict.predict_run``), byte for byte. The same on every rank."""
    from ..plan.hardware import this_machine
    from ..plan.predict import memory_errors, predict_run
    from ..train.trainer import Trainer
    from .train import first_ranks, label, make_config, row, wait_politely

    hw = this_machine("float64")
    rows = []
    for i, kw in enumerate(configs):
        cfg = make_config(**dict(kw, steps=1))
        sub = first_ranks(comm, cfg.ranks, f"mem{i}")
        errors = None
        if sub is not None:
            tr = Trainer(sub, cfg)
            tr.step(0)
            measured = [(list(c), m) for c, m in sub.builtin.allgather_object((tr.grid.coords, tr.memory()))]
            errors = memory_errors(cfg, predict_run(cfg, hw), measured)
        errors = comm.builtin.bcast_object(errors, 0)
        for what, err in errors.items():
            rows.append(row(f"{label(cfg)}: planner's {what} bytes = the trainer's count", abs(err), 0.0))
        wait_politely(comm)
    return rows


def tour(comm, slowdown=20.0):
    """Check rows (see the module docstring), the same on every rank."""
    from ..plan.config import Problem
    from ..plan.hardware import preset
    from ..plan.memory import layer_activations
    from ..plan.models import model

    rows = []
    cells = zero_table_rows()
    bad = [c for c in cells if c[3] != c[4]]
    rows.append({"what": f"plan: ZeRO paper Table 1, {len(cells)} cells as printed", "error": float(len(bad)),
                 "tolerance": 0.0, "ok": not bad})
    m = model("gpt3-175b")
    prob = Problem(m, 8, 8, preset("a100-80gb"), 1)
    s, b, h, a = m.seq, 1, m.hidden, m.heads
    for t, sp, want in ((1, False, s * b * h * (34 + 5 * a * s / h)), (8, False, s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))),
                        (8, True, s * b * h / 8 * (34 + 5 * a * s / h))):
        got = float(layer_activations(prob, b, t, 1, sp)[0])
        rows.append({"what": f"plan: Korthikanti activations per layer, tp={t}{' sp' if sp else ''}",
                     "error": abs(got - want) / want, "tolerance": 1e-12, "ok": abs(got - want) <= 1e-12 * want})
    lk = LINKS["ethernet"].scaled(slowdown)
    sub = emulated(comm, "ethernet", slowdown)
    events, _, intact = link_probe(sub, ring_bytes=1 << 18)
    gap, need = link_shortfall(events, lk)
    rows.append({"what": f"link: ethernet x{slowdown:g}: traced message time >= sum of alpha + n beta",
                 "error": gap / need, "tolerance": QUANTUM / need, "ok": gap <= QUANTUM})
    rows.append({"what": "link: the data still arrives intact under emulation", "error": 0.0 if intact else 1.0,
                 "tolerance": 0.0, "ok": intact})
    return rows
