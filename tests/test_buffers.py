"""Buffers, named and counted: the mechanism (minipar.trace.Buffers) on one process, then every
count of lessons 01, 03 and 04 against its formula on 4 real ranks, each also run the wrong way
(a buffer reallocated every step, prefetch that gathers everything, a send buffer never
released, a solution that skips the technique), which must fail."""
from __future__ import annotations

import gc
import json
from types import SimpleNamespace

import numpy as np
import pytest

from minipar import launch
from minipar.lessons import buffers as B
from minipar.lessons.common import merge_rows
from minipar.memory import Ledger
from minipar.pipeline import make_schedule
from minipar.pipeline.execute import buffers_in_flight
from minipar.trace import Tracer, buffer, comm_lanes, to_chrome_trace

# --------------------------------------------------------------------------- one process


def fake_comm(tracing=False):
    return SimpleNamespace(tracer=Tracer(0, tracing))


def test_a_buffer_is_counted_while_alive_and_traced_on_its_lane():
    comm = fake_comm(tracing=True)
    rng = np.random.default_rng(0)
    a = buffer(comm, "ring.recv", rng.standard_normal(5), "bucket 0")  # 40 bytes
    b = buffer(comm, "ring.recv", rng.standard_normal(3))              # 24 bytes
    keep = buffer(comm, "pipeline.send", rng.standard_normal((2, 4)))  # 64 bytes
    bufs = comm.tracer.buffers
    assert bufs.alive() == {"ring.recv": 64, "pipeline.send": 64}
    assert bufs.labels("ring.recv") == {"bucket 0": 40, "": 24}
    assert buffer(comm, "ring.recv", a) is a and bufs.allocations["ring.recv"] == 2  # named twice: one buffer
    del a
    gc.collect()
    assert bufs.alive() == {"ring.recv": 24, "pipeline.send": 64}
    c = buffer(comm, "ring.recv", rng.standard_normal(1))  # 24 + 8 alive: the peak stays 64
    rep = bufs.report()
    assert rep["ring.recv"] == {"peak_bytes": 64, "allocations": 3, "allocated_bytes": 72, "alive_bytes": 32}
    assert bufs.peak_total == 128
    ev = [e for e in comm.tracer.events if e.kind == "buffer"]
    assert [(e.name, e.bytes) for e in ev] == [("ring.recv bucket 0", 40)] and ev[0].t_end >= ev[0].t_start
    events = comm.tracer.events + bufs.open_events()  # what merge() hands on: the live ones end now
    assert sorted((e.name, e.bytes) for e in events) == [("pipeline.send", 64), ("ring.recv", 8),
                                                          ("ring.recv", 24), ("ring.recv bucket 0", 40)]
    assert set(comm_lanes(events).values()) == {"buffers"}
    trace = to_chrome_trace(events)["traceEvents"]
    assert {e["tid"] for e in trace if e["ph"] == "X"} == {2}
    assert {"name": "buffers"} in [e["args"] for e in trace if e["ph"] == "M"]
    del b, c, keep


def test_an_array_kept_alive_elsewhere_still_counts():
    """The wrong way for the free: a reference kept by accident keeps the bytes counted."""
    comm = fake_comm()
    bufs = comm.tracer.buffers
    bufs.enabled = True
    x = buffer(comm, "pipeline.send", np.random.default_rng(1).standard_normal(4))
    kept = [x]
    del x
    gc.collect()
    assert bufs.alive() == {"pipeline.send": 32}
    kept.clear()
    gc.collect()
    assert bufs.alive() == {}


def test_off_by_default_and_the_ledger_names_through_the_same_mechanism():
    comm = fake_comm()
    x = buffer(comm, "ring.recv", np.random.default_rng(2).standard_normal(6))
    assert comm.tracer.buffers.alive() == {} and comm.tracer.events == []  # not counting, not tracing
    comm.tracer.buffers.enabled = True
    ledger = Ledger(comm.tracer.buffers)
    ledger.track("grads", x, name="ddp.bucket grads", label="0")
    ledger.track("params", np.random.default_rng(3).standard_normal(2))  # tracked, not a named buffer
    assert comm.tracer.buffers.labels("ddp.bucket grads") == {"0": 48}
    assert ledger.now()["grads"] == 48


def test_buffers_in_flight_by_hand():
    """GPipe, p = 2, m = 3: the last rank keeps all 3 activations to its backward; every send
    is held to the end, since no message comes back after it that says it arrived.
    1F1B, p = 2, m = 4: one activation at a time on the last rank, and a send is dropped once a
    reply proves it received: at most 2. Counting every send until the end of the step (the
    executor before it released them) would say 4."""
    g = make_schedule("gpipe", 2, 3)
    assert buffers_in_flight(g, 0) == {"pipeline.recv act": 0, "pipeline.recv grad": 1, "pipeline.send": 3}
    assert buffers_in_flight(g, 1) == {"pipeline.recv act": 3, "pipeline.recv grad": 0, "pipeline.send": 3}
    f = make_schedule("1f1b", 2, 4)
    assert buffers_in_flight(f, 0) == {"pipeline.recv act": 0, "pipeline.recv grad": 1, "pipeline.send": 2}
    assert buffers_in_flight(f, 1) == {"pipeline.recv act": 1, "pipeline.recv grad": 0, "pipeline.send": 2}


# --------------------------------------------------------------------------- on real ranks: the wrong ways


def realloc_ring(comm, x):
    """A ring whose receive buffer is allocated afresh in every step."""
    from minipar.collectives import drain, ring_steps
    from minipar.xp import copy

    buf = copy(x)
    drain(ring_steps(comm, buf, reuse=False))
    return buf


def builtin_ring(comm, x):
    """Skips the technique: the engine's own all-reduce, no receive buffer of ours."""
    return comm.builtin.all_reduce(x)


def doubling_ring(comm, x):
    """A whole-vector receive buffer where the ring needs one chunk."""
    from minipar import collectives as C

    return C.all_reduce(comm, x, "recursive_doubling")


def _ddp_mutants():
    from minipar.data_parallel import DDP
    from minipar.xp import zeros

    class ReallocBuckets(DDP):
        """Allocates every bucket's gradient buffer afresh each step."""

        def zero_grad(self):
            for k, (units, flat, P, G, opt) in enumerate(self.buckets):
                G = zeros((flat.n_pad,), like=self.like, dtype=self.dtype)
                flat.bind("grads", G)
                self.ledger.track("grads", G, name="ddp.bucket grads", label=str(k))
                self.buckets[k] = (units, flat, P, G, opt)

    class BuiltinDDP(DDP):
        """Sums the buckets with the engine's all-reduce: no ring, no receive buffer of ours."""

        def sync_grads(self):
            for *_, G, _ in self.buckets:
                G[...] = self.comm.builtin.all_reduce(G)
                G /= self.comm.size

    return {"bucket reallocated every step": ReallocBuckets, "builtin all-reduce": BuiltinDDP}


def _zero_mutants():
    from minipar.data_parallel import DDP
    from minipar.xp import zeros
    from minipar.zero import ZeRO1, ZeRO3

    class OverPadded(ZeRO1):
        """Pads every unit's flat buffer by N more than it needs."""

        def setup_params(self):
            super().setup_params()
            for u, f in self.flats.items():
                big = zeros((f.n_pad + self.comm.size,), like=self.like, dtype=self.dtype)
                big[: f.n_pad] = self.full_params[u]
                self.ledger.track("params", big, name="zero.flat params", label=u)
                self.full_params[u] = big[: f.n_pad]
                f.bind("params", self.full_params[u])

    class GatherAll(ZeRO3):
        """'Prefetch' that starts the gather of every unit at once."""

        def start_gather(self, u):
            for v in ([] if u is None else self.units):
                super().start_gather(v)

    class KeepsGathered(ZeRO3):
        """Frees a unit's gathered weights from the engine, but keeps a reference."""

        kept = []

        def free(self, u):
            self.kept.append(self.full_params[u])
            super().free(u)

    class FreedLate(ZeRO3):
        """Keeps the layer's own ctx (the full weights) until the next layer's forward."""

        def after_forward(self, name, ctx):
            self.late = ctx
            return super().after_forward(name, ctx)

    return {"padding of N more": dict(zero1=OverPadded),
            "gathered weights freed one layer late": dict(zero3=FreedLate),
            "unsharded (DDP as ZeRO-1)": dict(zero1=DDP),
            "prefetch that gathers everything": dict(zero3=GatherAll),
            "gathered weights never freed": dict(zero3=KeepsGathered),
            "full weights on every rank (ZeRO-1 as ZeRO-3)": dict(zero3=lambda comm, model, prefetch: ZeRO1(comm, model))}


def _pipeline_mutant(comm, kind):
    """Runs the pipeline checks with sends never released or received activations kept."""
    real_isend, real_recv, kept = comm.isend, comm.recv, []

    class NeverDone:
        def __init__(self, req):
            self.req = req

        def test(self):
            return False

        def wait(self):
            return self.req.wait()

    def keeping_recv(buf, src, tag=0):
        kept.append(buf)
        return real_recv(buf, src, tag)

    if kind == "send buffer never released":
        comm.isend = lambda x, dst, tag=0: NeverDone(real_isend(x, dst, tag))
    else:
        comm.recv = keeping_recv
    try:
        return B.pipeline_buffers(comm, schedules=("1f1b",))["rows"]
    finally:
        vars(comm).pop("isend", None), vars(comm).pop("recv", None)  # back to the class's methods
        kept.clear()


def _prefetch_mutants():
    from minipar.collectives import drain
    from minipar.zero import ZeRO3

    class BlockingPrefetch(ZeRO3):
        """Gathers the next unit ahead, but waits for it at once: nothing left to overlap."""

        def start_gather(self, u):
            super().start_gather(u)
            if u in self.gathering:
                buf, gen = self.gathering[u]
                drain(gen)

    return {"no prefetch at all": lambda comm, model, prefetch: ZeRO3(comm, model, prefetch=False),
            "prefetch that blocks": BlockingPrefetch}


SMALL_TIMELINE = dict(units=4, width=24, batch=16, steps=1)


def checks_and_planted_bugs(comm):
    """{"good": rows of every check, "bad": {planted bug: its rows}} on this rank."""
    good = B.check(comm) + B.prefetch_rows(B.prefetch_timeline(comm, **SMALL_TIMELINE))
    bad = {f"ring: {k}": B.ring_buffers(comm, lengths=(7, 1000), ring=fn)["rows"]
           for k, fn in (("reallocated every step", realloc_ring), ("builtin all-reduce", builtin_ring),
                         ("whole-vector receive buffer", doubling_ring))}
    bad.update({f"DDP: {k}": B.ddp_buffers(comm, engine=cls)["rows"] for k, cls in _ddp_mutants().items()})
    bad.update({f"ZeRO: {k}": B.zero_buffers(comm, **kw)["rows"] for k, kw in _zero_mutants().items()})
    bad.update({f"pipeline: {k}": _pipeline_mutant(comm, k)
                for k in ("send buffer never released", "received activations kept")})
    bad.update({f"ZeRO-3 timeline: {k}": B.prefetch_rows(B.prefetch_timeline(comm, zero3=cls, **SMALL_TIMELINE))
                for k, cls in _prefetch_mutants().items()})
    return {"good": good, "bad": bad}


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_buffer_counts_on_4_ranks_and_every_planted_bug_fails():
    out = launch(4, "tests.test_buffers:checks_and_planted_bugs", quiet=True).results
    good = merge_rows([r["good"] for r in out])
    failing = [r["what"] for r in good if not r["ok"]]
    assert not failing, failing
    assert len(good) == 24
    for k in out[0]["bad"]:
        rows = merge_rows([r["bad"][k] for r in out])
        assert not all(r["ok"] for r in rows), f"the planted bug '{k}' passed every check"
    json.dumps(good)  # plain numbers: the rows can be stored with the docs
