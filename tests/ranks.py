"""Rank-side helpers for the tests (launched with minipar.launch as ``tests.ranks:NAME``)."""
import numpy as np

from minipar import collectives as C
from minipar.lessons.collectives import draw, rel_error, verify
from minipar.trace import bytes_sent, count
from minipar.xp import to_numpy


def broken_ring(comm):
    """verify() must notice a ring whose all-gather stops one step early (a planted bug in the
    one ring every ring collective runs)."""
    good = C.ring_steps

    def one_step_short(comm, buf, bounds=None, tag=C.TAG + 2, phases=("reduce-scatter", "all-gather"),
                       op="sum", observe=None, name=None):
        if "reduce-scatter" in phases:
            yield from good(comm, buf, bounds, tag, ("reduce-scatter",), op)
        if "all-gather" in phases:
            p, r = comm.size, comm.rank
            bounds = bounds or C.xp.chunk_bounds(buf.shape[0], p)
            for s in range(p - 2):  # BUG: p - 1 steps are needed
                sa, sb = bounds[(r - s) % p]
                ra, rb = bounds[(r - s - 1) % p]
                comm.sendrecv(buf[sa:sb], (r + 1) % p, buf[ra:rb], (r - 1) % p, tag)
                yield

    C.ring_steps = one_step_short
    try:
        return verify(comm, lengths=(8, 12), dtypes=("float64",))
    finally:
        C.ring_steps = good


def split_collectives(comm):
    """Collectives on sub-communicators (rows of a 2 x p/2 grid) vs the builtin on the same."""
    sub = comm.split(comm.rank % 2, key=comm.rank)
    errs = []
    for n in (1, 5, 16):
        x = draw(comm, n, "float64")
        want = sub.builtin.all_reduce(x)
        for alg in C.ALGORITHMS:
            errs.append(rel_error(C.all_reduce(sub, x, alg), want))
    return {"sub_size": sub.size, "world_ranks": sub.world_ranks, "max_error": max(errs)}


def traced_ring(comm, n=1200):
    """One traced ring all-reduce: what the trace says each rank sent."""
    comm.tracer.enabled = True
    comm.tracer.clear()
    x = draw(comm, n, "float64")
    C.all_reduce(comm, x, "ring")
    ev = comm.tracer.events
    return {"isend": count(ev, kind="isend"), "irecv": count(ev, kind="irecv"), "bytes": bytes_sent(ev, comm.world_rank(comm.rank)),
            "collective": count(ev, kind="collective", name="all_reduce:ring")}


def untraced(comm):
    x = draw(comm, 64, "float64")
    C.all_reduce(comm, x, "ring")
    with comm.region("compute"):
        np.dot(np.ones(3), np.ones(3))
    return len(comm.tracer.events)


def grid_groups(comm, dp, pp, tp):
    """Who is in each of my grid's sub-communicators, and a sum over each axis."""
    from minipar.grid import Grid

    g = Grid(comm, dp, pp, tp)
    x = comm.asarray(np.array([float(comm.rank)]))
    return {"coords": g.coords, "tp": g.tp.world_ranks, "pp": g.pp.world_ranks, "dp": g.dp.world_ranks,
            "tp_sum": float(C.all_reduce(g.tp, x)[0]), "dp_sum": float(C.all_reduce(g.dp, x)[0])}


def test_then_wait(comm):
    """irecv.test() is False before the matching send is posted, True (buffer filled) after."""
    x = comm.asarray(np.arange(3.0) + comm.rank)
    buf = comm.asarray(np.zeros(3))
    if comm.rank == 1:
        req = comm.irecv(buf, 0, tag=3)
        early = req.test()
        comm.barrier()  # rank 0 posts its send only after this
        import time

        t0 = time.monotonic()
        while not req.test() and time.monotonic() - t0 < 10:
            time.sleep(0.001)
        return {"early": early, "late": req.test(), "buf": [float(v) for v in buf], "again": req.wait() is buf}
    comm.barrier()
    if comm.rank == 0:
        req = comm.isend(x, 1, tag=3)
        req.wait()
        return {"sent": req.test()}
    return {}


def uneven_all_gather(comm):
    """all_gather of (rows, 3) pieces where some ranks hold zero rows, vs the builtin."""
    counts = [(2 * r) % 3 for r in range(comm.size)]  # 0, 2, 1, 0, ...: zero-row pieces included
    x = comm.asarray(np.random.default_rng([5, comm.rank]).standard_normal((counts[comm.rank], 3)))
    got = C.all_gather(comm, x, counts)
    return bool((to_numpy(got) == to_numpy(comm.builtin.all_gather(x))).all())


def live_tensor_bytes():
    """{storage address: bytes} of every torch tensor alive in this process, each storage once."""
    import gc

    import torch

    gc.collect()
    return {o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()
            for o in gc.get_objects() if isinstance(o, torch.Tensor)}


def live_vs_ledger(comm, stage, mixed=False):
    """(bytes the engine left alive after two steps, its ledger's params + grads + optimizer, the
    bytes of one parameter element): what the real memory holds against what minipar counts."""
    from minipar.data_parallel import local_batch
    from minipar.lessons.fixtures import make_data, uniform_model
    from minipar.xp import itemsize
    from minipar.zero import ZeRO

    x, y = make_data(comm, 1, 8, 34, 34)
    before = live_tensor_bytes()
    engine = ZeRO(comm, uniform_model(4, 34, 0).to(x), stage, precision="fp16" if mixed else None)
    for _ in range(2):
        engine.train_step(local_batch(comm, x), local_batch(comm, y))
    new = sum(n for p, n in live_tensor_bytes().items() if p not in before)
    led = engine.measured_memory()
    return new, sum(led[f"{k}_bytes"] for k in ("params", "grads", "optimizer")), itemsize(x)


def split_in_world_order_only(comm):
    """The torch backend where ``new_group`` cannot keep the caller's order (torch < 2.13): a
    split whose key follows the world's order works, a reversed one is refused in one line."""
    from minipar.comm import torch_backend
    from minipar.errors import UsageError

    torch_backend._KEEPS_ORDER = False
    same = comm.split(0, key=comm.rank, name="same")
    try:
        comm.split(0, key=-comm.rank, name="reversed")
        refused = ""
    except UsageError as err:
        refused = str(err)
    return same.rank == comm.rank, refused


def split_some_then_grid(comm):
    """Only the two end ranks form a group (the others pass color None), then every rank builds a
    grid's groups: on torch, each rank's count of groups must stay in step, or the next group's
    rendezvous never completes (the watchdog would report a rank stuck in new_group). Returns
    the sum over each axis of the ranks, all-reduced on the new groups."""
    from minipar.collectives import all_reduce
    from minipar.grid import Grid

    ends = comm.split(0 if comm.rank in (0, comm.size - 1) else None, key=comm.rank, name="ends")
    with comm.watchdog.within("the grid's groups", 20):  # a rank stuck in new_group ends the job
        grid = Grid(comm, 1, 2, comm.size // 2)
    x = comm.asarray([float(comm.rank)])
    return (None if ends is None else float(all_reduce(ends, x)[0]),
            float(all_reduce(grid.pp, x)[0]), float(all_reduce(grid.tp, x)[0]))


def step_peak(comm, recompute):
    """(the bytes NumPy allocates at the peak of one training step, over what was held before it;
    the trainer's ledger of activations held between pipeline actions). tracemalloc sees every
    NumPy array's memory, the in-action temporaries included, which the ledger does not sample."""
    import tracemalloc

    from minipar.train.config import DEFAULT_MODEL, TrainConfig
    from minipar.train.model import GPTConfig
    from minipar.train.trainer import Trainer

    model = GPTConfig(vocab=DEFAULT_MODEL["vocab"], d_model=64, n_heads=4, n_layers=4, seq_len=64)
    tr = Trainer(comm, TrainConfig(model, recompute=recompute, steps=2, batch=8, data="sorting"))
    tr.step(0)  # Adam's state and the gradient buffers exist from here on
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tr.step(1)
        return tracemalloc.get_traced_memory()[1] - base, tr.memory()["activations"]
    finally:
        tracemalloc.stop()



def hierarchical(comm, per_node=(1, 2, 3), lengths=(1, 3, 16, 37), mutant=None):
    """For each ranks-per-node count: the hierarchical all-reduce (or a planted bug, ``mutant``)
    against the builtin, and the bytes this rank sent to ranks on other nodes (from the trace)
    against the exact message list. {R: {max_error, cross, want_cross, intra, inter}}."""
    from minipar.cluster.traffic import messages

    out = {}
    for R in per_node:
        intra, inter = C.node_groups(comm, R)
        impl = C.hierarchical_all_reduce
        if mutant == "wrong_peers":  # across nodes, local rank l meets local rank l+1 of the next node
            inter = comm.split((comm.rank % R - comm.rank // R) % R, key=comm.rank)
        elif mutant == "full_buffer":
            impl = hierarchical_full_buffer
        comm.tracer.enabled = True
        errs, cross, want_cross = [], 0, 0
        for n in lengths:
            for shape in ((n,), (n, 2)):
                x = comm.asarray(np.random.default_rng([7, comm.rank, n]).standard_normal(shape))
                comm.tracer.clear()
                got = impl(intra, inter, x)
                cross += sum(e.bytes for e in comm.tracer.events if e.kind == "isend" and e.peer // R != comm.rank // R)
                size = int(np.prod(shape))
                want_cross += 8 * sum(e for s, d, e in messages("hierarchical", size, comm.size // R, R)
                                      if s == comm.rank and s // R != d // R)
                errs.append(rel_error(got, comm.builtin.all_reduce(x)))
                assert tuple(got.shape) == shape
        comm.tracer.enabled = False
        out[R] = {"max_error": max(errs), "cross": cross, "want_cross": want_cross,
                  "intra": intra.world_ranks, "inter": inter.world_ranks}
    return out


def hierarchical_full_buffer(intra, inter, x, op="sum"):
    """Planted bug: the step across nodes all-reduces the whole buffer, not my shard (right sums,
    R times the bytes on the slow link)."""
    buf = C.xp.copy(x)
    flat = C.xp.flat(buf)
    bounds = C.xp.chunk_bounds(flat.shape[0], intra.size)
    C.drain(C.ring_steps(intra, flat, bounds, C.TAG + 13, ("reduce-scatter",), op))
    C.drain(C.ring_steps(inter, flat, None, C.TAG + 14, op=op))
    C.drain(C.ring_steps(intra, flat, bounds, C.TAG + 15, ("all-gather",)))
    return buf


def hierarchical_and_mutants(comm):
    """One job for the hierarchical all-reduce's tests: itself on nodes of 1, 2 and 3 ranks, and
    each planted bug on nodes of 2 (even lengths: the wrong peers hold shards of the same size)."""
    return {"ok": hierarchical(comm, (1, 2, 3)),
            **{m: hierarchical(comm, (2,), (8, 16), mutant=m)[2] for m in ("full_buffer", "wrong_peers")}}


PLACEMENTS = {"tp inside": dict(dp=2, tp=2, order="tp-cp-pp-dp"), "tp across": dict(dp=2, tp=2, order="dp-tp-cp-pp"),
              "pp across": dict(pp=2, tp=2, order="tp-cp-pp-dp")}


def placement_bytes(comm):
    """One traced training step per placement of the grid on 2 nodes of 2 ranks: the bytes this
    rank sent inside and between nodes (read from each event's link), and the formula's:
    ``accounting.comm_bytes`` per group, counted between nodes where the group spans nodes
    (``bench.cluster.formula_link_bytes``, which the cluster's placement benchmark reports too)."""
    from minipar.bench.cluster import formula_link_bytes
    from minipar.lessons.train import make_config
    from minipar.trace import link_bytes
    from minipar.train.trainer import Trainer

    out = {}
    for name, kw in PLACEMENTS.items():
        cfg = make_config(steps=1, ranks_per_node=2, **kw)
        tr = Trainer(comm, cfg)
        comm.tracer.clear()
        comm.tracer.enabled = True
        tr.step(0)
        comm.tracer.enabled = False
        want = formula_link_bytes(tr)
        out[name] = dict(link_bytes(comm.tracer.events, comm.rank), want_inter=want["inter"], want_intra=want["intra"])
        comm.tracer.clear()
        comm.tracer.ranks_per_node = None
    return out
