"""Lab 05, task 5.4: one training step of minipar's GPT on a real grid, with the learner's step
around lesson 03's pipeline (the rest of the lab's checks: ``minipar.labs.lab05``).

The grader builds minipar's trainer (grid, stages, schedule: ``minipar.train.Trainer``) for each
grid in ``STEP_GRIDS`` (2 and 4 ranks: every axis alone, then every pair of axes, every
schedule), fills the gradients with "the previous step's" values, and hands the learner
``pipeline(after_action=None)``: lesson 03's executor over ``grid.pp``, every micro-batch. After
the learner's ``train_step``:

* traffic: exactly one ring all-reduce per gradient over ``grid.dp`` (or one of them all
  flattened: the sizes divide by dp, the bytes are the same); a DP sync per micro-batch sends m
  (or m + 1) times that with the same numbers, and says so; besides one run of the pipeline and
  the DP average only the tied gradient's sum over the two ends may be sent (one gradient's
  bytes), so an average over the world or the whole pipeline, or a second run of the pipeline,
  shows, with the bytes by communicator;
* values: every gradient equals the one-process gradient of the global batch, sliced to this
  rank's shard (float64, 1e-12: only the order of the sums differs), with the typical mistakes
  named: gradients not zeroed, summed instead of averaged, divided by another count than
  grid.dp.size (every gradient off by the same factor, named before any single gradient), the
  tied gradient not summed (looked at last), an array replaced instead of written into;
* ``comm.builtin`` is refused, and every message besides the pipeline's (the grader's callback)
  must be the learner's own: sent by their code, through minipar.collectives at most.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..nn.functional import cross_entropy
from ..trace import SEND_KINDS
from ..xp import to_numpy
from .checks import COLLECTIVES, chunk_counts, compare, graded, no_builtin, ring_traffic, sent_by_learner, stop

INSTEAD = "minipar.collectives (all_reduce, ...: rings on send/recv) or comm.sendrecv"

# Task 5.4's hints, stage by stage (`minipar check 05 --hint 5.4`; lab05.HINTS holds every task's).
STEP_HINTS = {
    "5.4": (
        """One step's gradients: zero them, run the pipeline once (every micro-batch accumulates into
        grads), add the tied copies (5.3 over grid.pp), then average over the data-parallel group:
        once, after the flush, not per micro-batch.""",
        """Write into the arrays (g[...] = ...): the caller holds them. Every stage calls sync_tied
        (with None in the middle), and the sum goes back into tied[...] where it returns one; the average is all_reduce(grid.dp, g) / grid.dp.size.""",
        """
        for g in grads: g[...] = 0
        pipeline()
        summed = sync_tied(grid.pp, tied)       # on every stage: a pp.split inside needs them all
        if summed is not None: tied[...] = summed
        for g in grads: g[...] = all_reduce(grid.dp, g) / grid.dp.size
        """,
    ),
}

MODEL = dict(vocab=24, d_model=8, n_heads=2, n_layers=4, seq_len=4)  # every gradient's size divides by 2
STEP_GRIDS = {  # (dp, pp, tp, schedule, micro-batches): every schedule, every pair of axes, then all three
    2: [(1, 1, 2, "1f1b", 1), (2, 1, 1, "1f1b", 2), (1, 2, 1, "gpipe", 2)],
    4: [(2, 2, 1, "interleaved", 2), (2, 1, 2, "1f1b", 2), (1, 2, 2, "zb-h1", 2)],
}


class Step:
    """One step of minipar's GPT on a grid, ready for the learner's ``train_step``: the trainer
    (grid, stages, schedule), ``pipeline(after_action=None)`` (lesson 03's executor over grid.pp,
    every micro-batch; the bytes it sends are noted), the gradients with the previous step's
    values still in them, the tied one, and what they must become: the one-process gradients of
    the global batch, sliced to this rank's shards."""

    def __init__(self, comm, dp, pp, tp, schedule, m, batch=8):
        from ..pipeline.execute import run_schedule
        from ..tensor_parallel.layers import local_shards
        from ..train.model import GPT, GPTConfig
        from ..train.trainer import TrainConfig, Trainer, make_data

        cfg = TrainConfig(GPTConfig(**MODEL), dp=dp, pp=pp, tp=tp, schedule=schedule, microbatches=m, batch=batch,
                          steps=1)
        self.cfg = cfg
        self.tr = tr = Trainer(comm, cfg)
        self.label = f"dp{dp} pp{pp} tp{tp} ({schedule}, m={m})"
        xs, ys = tr.microbatches(0)
        self.calls, self.pipeline_bytes = 0, 0

        def pipeline(after_action=None):
            self.calls += 1
            before = len(comm.tracer.events)
            out = run_schedule(tr.grid.pp, tr.schedule, tr.stages, xs, ys, loss=tr.loss, shape_of=tr.activation_shape,
                               dtype=cfg.dtype, after_action=after_action)
            if self.calls == 1:  # one run's messages belong to the step; a second run's do not
                self.pipeline_bytes = sum(e.bytes for e in comm.tracer.events[before:] if e.kind in SEND_KINDS)
            return out["loss"]

        self.pipeline = pipeline
        dense = GPT(cfg.model, cfg.seed)
        ids = make_data(cfg).batch(0, cfg.batch, cfg.model.seq_len)
        logits, ctx = dense.forward(ids[:, :-1])
        _, dlogits = cross_entropy(logits, ids[:, 1:])
        dense.backward(dlogits, ctx)
        full = dict(dense.named_grads())
        full["head.wte"] = full["embed.wte"]
        t = tr.grid.coords[2]
        self.named = []  # (stage, name, gradient array, want, stale)
        for s, st in tr.stages.items():
            want = local_shards(st, full)
            for name, g in st.named_grads():
                stale = np.random.default_rng([zlib.crc32(name.encode()), s, t]).standard_normal(g.shape)
                g[...] = comm.asarray(stale)  # the previous step's gradients: the same on every replica
                self.named.append((s, name, g, want[name], stale))
        self.grads = [g for _, _, g, _, _ in self.named]
        S = tr.schedule.total_stages
        self.tied = (tr.stages[0].embed.grads["wte"] if 0 in tr.stages else
                     tr.stages[S - 1].head.grads["wte"] if S - 1 in tr.stages and pp > 1 else None)

    def dp_traffic(self):
        """Bytes this rank sends averaging the gradients once: a ring all-reduce over grid.dp of each
        gradient (or of all of them flattened into one buffer: the same bytes, sizes divide by dp)."""
        dp = self.tr.grid.dp
        return sum(ring_traffic(chunk_counts(int(np.prod(g.shape)), dp.size), dp.rank, 8)[0] for g in self.grads)

    def tied_traffic(self):
        """Bytes this rank sends summing the tied gradient: one gradient's, on the two ends, pp > 1."""
        return int(np.prod(self.tied.shape)) * 8 if self.tied is not None and self.cfg.pp > 1 else 0


def sent_by_comm(events):
    """{communicator name: bytes} this rank sent."""
    out = {}
    for e in events:
        if e.kind in SEND_KINDS and e.bytes:
            out[e.name] = out.get(e.name, 0) + e.bytes
    return out


def step_traffic(comm, run, st: Step):
    """The DP traffic (over grid.dp only, once) and everything else the learner's step sent."""
    r, grid = comm.rank, st.tr.grid
    by = sent_by_comm(run.events)
    shows = ", ".join(f"{k}: {v}" for k, v in by.items()) or "nothing"
    dp_want, dp_got = st.dp_traffic(), by.get(grid.dp.name, 0)
    if dp_got != dp_want:
        times = dp_got / dp_want if dp_want else 0
        if dp_want and times > 1 and times == int(times):
            return [f"rank {r} sent {dp_got} bytes over grid.dp, {int(times)} times one step's average ({dp_want}) "
                    f"({st.label}): average once per step, after the pipeline flush, not after every micro-batch "
                    f"(averaging is linear, so the numbers come out the same; the traffic does not)"]
        return [f"rank {r} sent {dp_got} bytes over grid.dp ({grid.dp.name}); averaging every gradient once over "
                f"the dp group sends exactly {dp_want} ({st.label}; the trace shows bytes by communicator: {shows})"]
    extra = sum(by.values()) - st.pipeline_bytes - dp_want
    if extra != st.tied_traffic():
        twice = f"; pipeline() ran {st.calls} times: once per step runs every micro-batch" if st.calls > 1 else ""
        return [f"rank {r} sent {extra} bytes besides the pipeline's messages and the DP average over grid.dp; the "
                f"tied gradient's sum over the first and last stage sends exactly {st.tied_traffic()} here "
                f"({st.label}; the trace shows bytes by communicator: {shows}): average over grid.dp only, the ranks "
                f"with the same (pp, tp), and sum the tied gradient over the two ends only{twice}"]
    return []


def step_values(comm, st: Step, handed):
    """The gradients against the one-process gradients of the global batch, with the typical
    mistakes named. ``handed``: the list the learner got, to tell a replaced array. The tied
    embedding's gradient is looked at last: when every gradient is off, the message names what
    is wrong with all of them (a scale: the wrong divisor), not the tied sum."""
    r, dp = comm.rank, st.cfg.dp
    entries = [(s, name, g, want, stale, mine, to_numpy(g)) for (s, name, g, want, stale), mine in zip(st.named, handed)]
    for s, name, g, want, stale, mine, got in entries:
        what = f"stage {s}'s gradient {name} (its tp shard)"
        if mine is not g and not np.allclose(got, want, rtol=1e-10, atol=1e-15):
            return [f"rank {r}: {what} is wrong, and its entry of grads was replaced by a new array: write into the "
                    f"gradients (g[...] = ...), the model reads those ({st.label})"]
        if np.allclose(got, want + stale, rtol=1e-10, atol=1e-12) and not np.allclose(got, want, rtol=1e-10, atol=0):
            return [f"rank {r}: {what} still holds what was in it before the step (the grader left the previous "
                    f"step's gradients there): zero the gradients before the pipeline runs, they accumulate "
                    f"({st.label})"]
        if dp > 1 and np.allclose(got, want * dp, rtol=1e-10, atol=1e-15):
            return [f"rank {r}: {what} is the sum over the {dp} replicas, not the average: divide by dp ({st.label})"]
    tied = [e for e in entries if st.tied is not None and e[2] is st.tied and st.cfg.pp > 1]
    untied = [e for e in entries if not any(e is t for t in tied)]
    scaled = uniform_scale(comm, st, untied)
    if scaled:
        return [scaled]
    for s, name, g, want, stale, mine, got in untied + tied:
        what = f"stage {s}'s gradient {name} (its tp shard)"
        if tied and g is st.tied and not np.allclose(got, want, rtol=1e-10, atol=1e-15):
            return [f"rank {r}: {what}, the tied embedding's, is wrong ({st.label}): stage 0 and stage "
                    f"{st.tr.schedule.total_stages - 1} each hold one use's share; sum it over the two ends "
                    f"(your sync_tied) before averaging"]
        fails = compare(comm, got, want, what, st.label)
        if fails:
            return [fails[0] + "; expected: the gradient of the global batch's mean loss, the pipeline's per-replica "
                               "gradients averaged over grid.dp (the ranks with the same (pp, tp))"]
    return []


def uniform_scale(comm, st: Step, entries):
    """A message when every gradient of ``entries`` is the expected one times the same factor c != 1
    (the sum divided by something other than grid.dp.size), else None."""
    got = np.concatenate([e[6].ravel() for e in entries]) if entries else np.zeros(0)
    want = np.concatenate([e[3].ravel() for e in entries]) if entries else np.zeros(0)
    if not np.any(want != 0) or np.allclose(got, want, rtol=1e-10, atol=1e-15):
        return None
    c = float(np.dot(got, want) / np.dot(want, want))
    if not np.allclose(got, c * want, rtol=1e-9, atol=1e-15) or c <= 0:
        return None
    dp = st.cfg.dp
    by = dp / c  # what the sum over grid.dp was divided by
    said = f"divided by {round(by)}" if abs(by - round(by)) < 1e-9 else f"scaled by {c:.6g}"
    return (f"rank {comm.rank}: every gradient is {c:.6g} times the gradient of the global batch ({st.label}): the sum "
            f"over grid.dp was {said}; the average over the replicas divides it by grid.dp.size = {dp} once (the "
            f"ranks along pp and tp hold other stages and other shards, not copies of these gradients)")


def check_train_step(comm, fn):
    for dp, pp, tp, schedule, m in STEP_GRIDS[comm.size]:
        st = Step(comm, dp, pp, tp, schedule, m)
        grads = list(st.grads)
        run = graded(comm, lambda: fn(st.tr.grid, st.pipeline, grads, st.tied))
        fails = (no_builtin(comm, run, "train_step", INSTEAD) or step_traffic(comm, run, st)
                 or step_values(comm, st, grads) or sent_by_learner(comm, run, fn, "train_step", INSTEAD, COLLECTIVES))
        if stop(comm, fails):
            return fails
    return []


