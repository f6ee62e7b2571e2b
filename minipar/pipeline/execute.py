"""Run a pipeline Schedule on real ranks: the model is split into stages, activations and
gradients travel point to point, and the trace gives the measured bubble.

    from minipar.pipeline import one_f_one_b
    from minipar.pipeline.execute import build_stages, run_schedule, dense_step
    s = one_f_one_b(p=comm.size, m=4)
    stages = build_stages(s.total_stages, layers=8, width=16, rng=np.random.default_rng(0))
    mine = {k: stages[k] for k in range(s.total_stages) if s.stage_to_rank[k] == comm.rank}
    out = run_schedule(comm, s, mine, microbatches, targets)   # grads accumulate in mine[k]
    out["loss"]    # on the rank of the last stage: the full-batch loss; None elsewhere
    costs = measured_costs(merge(comm), s)      # traced run -> Costs; simulate(s, costs) replays it

    minipar run -n 4 pipeline --schedule 1f1b --microbatches 8 --json out.json   # the same, measured

Messages. The activation going *into* stage s for micro-batch i travels with tag
``2 * (s * m + i)``; the gradient coming *back into* stage s (from stage s+1) with tag
``2 * (s * m + i) + 1``. Every message of one step therefore has its own tag: nothing can be
matched with the wrong micro-batch or stage, whatever order the schedule runs them in.

Why isend, and blocking recv. ``comm.send`` is synchronous (it returns once the receiver has
started receiving), so a blocking send from rank r to rank q waits until q reaches the
action that receives it. In 1F1B, rank r may send F's output to q while q is itself blocked
sending a gradient back to r: both wait, a deadlock, although the schedule is valid. So every
send here is an ``isend``; its request (and the array, which must not change until then) is
kept until it completes: after every action the finished ones are dropped, and what is left is
waited for at the end of the step. A receive happens exactly where the action needs
the data (``recv`` at the start of F / B / I): that wait is a real data dependency of the
schedule, and since :func:`~minipar.pipeline.validate` proved the schedule deadlock-free with
dependencies only (lockstep), and sends never block, the execution cannot deadlock either.
(Pre-posting every irecv would overlap receiving with compute but needs the buffers up front;
we keep the simple form.) Stages on the same rank (possible when p = 1) hand over in memory.

Buffers (``minipar.trace.buffer``, counted per rank while tracing or counting): "pipeline.recv
act" (an activation received for F, kept by the stage's ctx until its B, or W), "pipeline.recv
grad" (an output gradient received for B, or kept from I to W) and "pipeline.send" (the array
handed to ``isend``, alive until the send completes). :func:`buffers_in_flight` says how many
of each a rank holds at worst, from the schedule alone.

Loss scaling. The full batch is m equal micro-batches and the loss is the mean over the full
batch, i.e. (1/m) * sum of the per-micro-batch means, so each micro-batch's output gradient is
scaled by ``scale = 1/m`` (default) and the gradients summed over micro-batches equal the
dense full-batch gradients (up to rounding order).
"""
from __future__ import annotations

import numpy as np

from ..nn import GeLU, Linear, Sequential, mse_loss
from ..nn.functional import kept
from ..trace import buffer
from ..xp import chunk_bounds, contiguous
from .schedules import Action, Schedule, inflight_profile, lockstep, validate
from .simulate import Costs, Event as SimEvent, SimResult

__all__ = ["build_stages", "run_schedule", "dense_step", "reference_step", "measured_bubble", "act_tag", "grad_tag",
           "peer_and_tag", "action_events", "measured_costs", "measured_durations", "trace_timeline",
           "buffers_in_flight"]


def act_tag(stage: int, microbatch: int, m: int) -> int:
    """Tag of the activation going into ``stage`` for ``microbatch``."""
    return 2 * (stage * m + microbatch)


def grad_tag(stage: int, microbatch: int, m: int) -> int:
    """Tag of the output gradient coming back into ``stage`` (sent by stage + 1)."""
    return 2 * (stage * m + microbatch) + 1


def peer_and_tag(action: Action, schedule: Schedule):
    """Who ``action`` receives from and sends to: ``(recv, send)``, each ``(rank, tag)`` or None.

    F of stage s receives the activation from stage s-1's rank and sends its output to stage
    s+1's rank; B (or I) receives the output gradient from stage s+1's rank and sends the input
    gradient to stage s-1's rank. The first stage reads its input from the data, the last
    computes its gradient from the loss, and W talks to nobody. Tags: :func:`act_tag`,
    :func:`grad_tag`. This is the convention :func:`run_schedule` follows (lab 03 task 3.4).
    """
    s, kind, i = action
    S, m, owner = schedule.total_stages, schedule.microbatches, schedule.stage_to_rank
    if kind == "F":
        return ((owner[s - 1], act_tag(s, i, m)) if s > 0 else None,
                (owner[s + 1], act_tag(s + 1, i, m)) if s < S - 1 else None)
    if kind in "BI":
        return ((owner[s + 1], grad_tag(s, i, m)) if s < S - 1 else None,
                (owner[s - 1], grad_tag(s - 1, i, m)) if s > 0 else None)
    return None, None


def build_stages(n_stages: int, layers: int, width: int, rng) -> list[Sequential]:
    """``layers`` layers (Linear(width, width) + GeLU each, the last one without GeLU), split
    into ``n_stages`` contiguous Sequential stages by :func:`~minipar.xp.chunk_bounds`.

    Every rank builds all of them from the same seeded ``rng`` and keeps the ones it owns.
    """
    all_layers = []
    for i in range(layers):
        lin = Linear(width, width, rng)
        all_layers.append(Sequential(lin, GeLU()) if i < layers - 1 else Sequential(lin))
    return [Sequential(*all_layers[lo:hi]) for lo, hi in chunk_bounds(layers, n_stages)]


def run_schedule(comm, schedule: Schedule, stages, microbatches, targets, loss=mse_loss,
                 scale=None, shape_of=None, dtype=None, pairing=peer_and_tag, check: bool = True,
                 after_action=None, before_action=None) -> dict:
    """Execute this rank's action list of ``schedule`` over ``comm`` (one training step).

    stages: {global stage id: module} for the stages this rank owns (stage_to_rank[s] == rank).
    microbatches / targets: lists of m arrays (inputs are read on stage 0's rank, targets on
    the last stage's rank; other ranks may pass the same lists). loss(pred, target) ->
    (loss, dpred), a mean over the micro-batch. scale: factor on each micro-batch's output
    gradient and loss (default 1/m: the loss is the mean over the full batch). shape_of(stage,
    i): the shape of the activation entering ``stage`` for micro-batch i (default: the shape of
    microbatches[i], i.e. every stage keeps the width); the gradient coming back into stage s has
    the shape of the activation entering stage s+1. dtype: of the activations and gradients
    (default: that of the micro-batches). pairing(action, schedule) -> (recv, send), each a
    (rank, tag) or None: who each message comes from and goes to (default :func:`peer_and_tag`;
    lab 03 grades a learner's by running it here). check: validate the schedule first (a schedule
    that passed is not checked again while unchanged: the trainer's later steps pay one comparison
    here). Gradients accumulate into the modules.
    after_action(action, held): called after every action with ``held`` = {"ctx": the forward
    contexts, "dy": the output gradients kept for W}, what this rank holds for its backwards
    (the trainer counts activation memory there). before_action(action): called before each
    action's compute (the trainer points dropout at the action's micro-batch there, so that a
    forward recomputed inside B draws the masks its F drew).

    Stages can be any modules with forward -> (y, ctx), backward / backward_input /
    backward_weight: a stack of Linear layers, or a GPT stage whose first stage reads token ids
    (``microbatches`` may be int arrays: stage 0 reads them, nobody receives them) and whose last
    stage's ``loss`` is a closure over its tensor-parallel group.

    Returns {"loss": full-batch loss (float) on the last stage's rank else None, "actions": n}.
    Each action's compute (and its non-blocking sends) runs inside ``comm.region(str(action))``:
    compute events named "1F3" etc.; the blocking receive before it is outside, so waiting for
    a neighbour shows up as idle time in :func:`measured_bubble`.
    """
    if check:
        validate(schedule)
    if comm.size != schedule.ranks:
        raise ValueError(f"schedule {schedule.name} is for p={schedule.ranks} ranks, comm has {comm.size}")
    m, S, owner, me = schedule.microbatches, schedule.total_stages, schedule.stage_to_rank, comm.rank
    if len(microbatches) != m or len(targets) != m:
        raise ValueError(f"need m={m} micro-batches and targets, got {len(microbatches)} and {len(targets)}")
    for s in stages:
        if owner[s] != me:
            raise ValueError(f"stage {s} lives on rank {owner[s]}, not on rank {me}")
    scale = 1.0 / m if scale is None else scale
    if shape_of is None:
        def shape_of(stage, i):
            return tuple(microbatches[i].shape)
    dtype = dtype or str(microbatches[0].dtype).replace("torch.", "")

    ctxs, dys = {}, {}            # (stage, mb) -> forward ctx / output gradient (kept for W)
    local = {}                    # messages between stages on the same rank
    pending = []                  # isend requests not yet complete (each keeps its send buffer)
    total = None

    def send(x, peer, a):
        rank, tag = peer
        if rank == me:
            local[tag] = x
        else:  # a layer's output may be a strided view
            pending.append(comm.isend(buffer(comm, "pipeline.send", contiguous(x), str(a)), rank, tag))

    def recv(peer, shape, kind, a):
        rank, tag = peer
        if rank == me:
            return local.pop(tag)
        return comm.recv(buffer(comm, kind, comm.empty(shape, dtype), str(a)), rank, tag)

    for a in schedule.actions[me]:
        s, kind, i = a
        mod = stages[s]
        src, dst = pairing(a, schedule)
        # receive first, outside the compute region: waiting is idle time, not compute
        if kind == "F":
            x = microbatches[i] if s == 0 else recv(src, shape_of(s, i), "pipeline.recv act", a)
        elif kind in "BI":
            dy = dys.pop((s, i)) if s == S - 1 else recv(src, shape_of(s + 1, i), "pipeline.recv grad", a)
        if before_action is not None:
            before_action(a)
        with comm.region(str(a)):
            if kind == "F":
                y, ctxs[(s, i)] = mod.forward(x)
                if s == S - 1:
                    li, dpred = loss(y, targets[i])
                    li = float(li) * scale
                    total = li if total is None else total + li
                    dys[(s, i)] = kept(dpred * scale, dpred)  # (NumPy bfloat16 * a float is float32)
                else:
                    send(y, dst, a)
            elif kind in "BI":
                ctx = ctxs[(s, i)]
                if kind == "B":
                    dx = mod.backward(dy, ctx)
                    del ctxs[(s, i)]
                else:
                    dx = mod.backward_input(dy, ctx)
                    dys[(s, i)] = dy          # W needs it (and the ctx) later
                if s > 0:
                    send(dx, dst, a)
            elif kind == "W":
                mod.backward_weight(dys.pop((s, i)), ctxs.pop((s, i)))
            else:
                raise ValueError(f"unknown action kind in {a}")
        x = y = dy = dx = ctx = None  # what the action used lives on only in ctxs, dys and pending
        pending = [req for req in pending if not req.test()]  # a finished send frees its buffer
        if after_action is not None:
            after_action(a, {"ctx": ctxs, "dy": dys})
    for req in pending:
        req.wait()
    if local or ctxs or dys:
        raise RuntimeError(f"rank {me}: left over after the step: messages {sorted(local)}, "
                           f"contexts {sorted(ctxs)}, gradients {sorted(dys)}")
    return {"loss": total if owner[S - 1] == me else None, "actions": len(schedule.actions[me])}


def dense_step(stages, x, target, loss=mse_loss) -> float:
    """The dense reference: all ``stages`` in order on one process over the full batch ``x``;
    loss, then backward through every stage (gradients accumulate in the modules). Returns the loss."""
    ctxs = []
    for mod in stages:
        x, ctx = mod.forward(x)
        ctxs.append(ctx)
    value, dy = loss(x, target)
    for mod, ctx in zip(reversed(stages), reversed(ctxs)):
        dy = mod.backward(dy, ctx)
    return float(value)


reference_step = dense_step  # its name before the dense reference had one name (lab 03 imports it)


def buffers_in_flight(schedule: Schedule, rank: int, pairing=peer_and_tag) -> dict:
    """The most messages (a micro-batch's activation or gradient each) of each kind of buffer
    that :func:`run_schedule` holds at once on ``rank``, from the schedule alone:

    "pipeline.recv act"   activations received for an F and kept by the stage's ctx (its first
                          layer saves its input, as a Linear does) until its B, or its W: exact,
                          the in-flight count of the stages that receive;
    "pipeline.recv grad"  output gradients received for a B (gone after it), or for an I and kept
                          until its W: exact;
    "pipeline.send"       send buffers: an upper bound. A send is dropped at the first action
                          boundary where it has completed; the rank *knows* it has once the
                          receiver's action has started, and it learns that only from a message
                          that left the receiver later (straight back, or through other ranks).
                          That knowledge is traced here through the schedule (vector clocks); a
                          send may complete sooner, so fewer may be held.

    Counts are taken where the executor allocates each buffer (the peak of that kind)."""
    ops = schedule.actions
    where, hist = {}, []  # (sender, tag) -> (receiver, position of its action); rank's knowledge per action
    for q, acts in enumerate(ops):
        for k, a in enumerate(acts):
            src = pairing(a, schedule)[0]
            if src is not None and src[0] != q:
                where[(src[0], src[1])] = (q, k)
    steps, _ = lockstep(schedule)
    know = [[-1] * schedule.ranks for _ in ops]  # know[r][q]: q's last action r knows has started
    carried = {}  # (sender, tag) -> what the sender knew when it sent
    for _, r, k in sorted((t, r, k) for r, row in enumerate(steps) for k, t in enumerate(row)):
        src, dst = pairing(ops[r][k], schedule)
        if src is not None and src[0] != r:
            know[r] = [max(u, v) for u, v in zip(know[r], carried[src])]
        know[r][r] = k
        if dst is not None and dst[0] != r:
            carried[(r, dst[1])] = list(know[r])
        if r == rank:
            hist.append(list(know[r]))
    sends = []  # (position of the sending action, position of the action after which it is dropped)
    act, grad, peak = set(), set(), {"pipeline.recv act": 0, "pipeline.recv grad": 0, "pipeline.send": 0}
    for k, a in enumerate(ops[rank]):
        s, kind, i = a
        src, dst = pairing(a, schedule)
        if src is not None and src[0] != rank:
            held = act if kind == "F" else grad
            held.add((s, i))
            name = "pipeline.recv act" if kind == "F" else "pipeline.recv grad"
            peak[name] = max(peak[name], len(held))
        if dst is not None and dst[0] != rank:
            q, kr = where[(rank, dst[1])]
            sends.append((k, next((j for j in range(k, len(hist)) if hist[j][q] >= kr), len(hist))))
            peak["pipeline.send"] = max(peak["pipeline.send"], sum(1 for k1, k2 in sends if k1 <= k <= k2))
        if kind in "BW":
            act.discard((s, i))
            grad.discard((s, i))
    return peak


def measured_bubble(events, p: int) -> float:
    """idle / (p * makespan) from a merged trace, counting only compute events named like an
    action ("1F3"): makespan from the first action's start to the last one's end on any rank.

    Raises ValueError when the trace holds no such events (the run was not traced): there is
    no bubble to measure then, and 0.0 would read as a perfect pipeline."""
    busy, t0, t1 = [0.0] * p, None, None
    for e in events:
        if e.kind != "compute":
            continue
        try:
            Action.parse(e.name)
        except ValueError:
            continue
        busy[e.rank] += e.t_end - e.t_start
        t0 = e.t_start if t0 is None else min(t0, e.t_start)
        t1 = e.t_end if t1 is None else max(t1, e.t_end)
    if t0 is None or t1 <= t0:
        raise ValueError(f"measured_bubble: no timed compute events named like an action (1F3) among "
                         f"{len(events)} trace events; trace the run (launch(..., trace=True), or "
                         f"comm.tracer.enabled = True) and pass the merged events")
    span = t1 - t0
    return (p * span - sum(busy)) / (p * span)


# ---------------------------------------------------------------- from a trace back to the model


def action_events(events) -> list[tuple[Action, object]]:
    """The compute events named like an action ("1F3"), as (Action, trace event) pairs."""
    out = []
    for e in events:
        if e.kind == "compute":
            try:
                out.append((Action.parse(e.name), e))
            except ValueError:
                pass
    return out


def measured_costs(events, schedule: Schedule) -> Costs:
    """The :class:`Costs` (seconds) that make :func:`simulate` replay this run: the mean
    duration of each action kind (times v: simulate divides a rank's cost among its v chunks)
    and ``p2p``, the median delay from the end of an action to the start of the action on
    another rank that needs its output, counted only where that rank was idle, waiting for it
    (its previous action had ended before): send + receive + waking up the receiver."""
    acts = action_events(events)
    done = {a: e for a, e in acts}
    mean = {}
    for kind in "FBIW":
        ds = [e.t_end - e.t_start for a, e in acts if a.kind == kind]
        if ds:
            mean[kind] = schedule.chunks * sum(ds) / len(ds)
    prev_end, gaps = {}, []
    for a, e in sorted(acts, key=lambda ae: ae[1].t_start):
        if a.kind == "F" and a.stage > 0:
            froms = [(a.stage - 1, "F", a.microbatch)]
        elif a.kind in "BI" and a.stage < schedule.total_stages - 1:
            froms = [(a.stage + 1, k, a.microbatch) for k in "BI"]
        else:
            froms = []
        for dep in froms:
            src = done.get(Action(*dep))
            if src is not None and src.rank != e.rank and prev_end.get(e.rank, -1e300) <= src.t_end:
                gaps.append(e.t_start - src.t_end)
        prev_end[e.rank] = e.t_end
    p2p = float(np.median(gaps)) if gaps else 0.0
    if "B" in mean:
        return Costs(F=mean["F"], B=mean["B"], p2p=max(p2p, 0.0))
    return Costs(F=mean["F"], I=mean["I"], W=mean["W"], p2p=max(p2p, 0.0))


def measured_durations(events) -> dict:
    """{Action: seconds} of every action in a traced run (for ``simulate(..., durations=)``)."""
    return {a: e.t_end - e.t_start for a, e in action_events(events)}


def trace_timeline(events, schedule: Schedule, unit: float = 1e-3) -> SimResult:
    """A measured run as a :class:`SimResult` (times in ``unit`` seconds from the first
    action's start), so the plots that draw simulations draw real runs too."""
    acts = action_events(events)
    t0 = min(e.t_start for _, e in acts)
    evs = sorted((SimEvent(e.rank, a, (e.t_start - t0) / unit, (e.t_end - t0) / unit) for a, e in acts),
                 key=lambda e: (e.rank, e.start))
    p = schedule.ranks
    makespan = max(e.end for e in evs)
    busy = [sum(e.end - e.start for e in evs if e.rank == r) for r in range(p)]
    idle = [makespan - b for b in busy]
    peak = [max(inflight_profile(ops), default=0) for ops in schedule.actions]
    return SimResult(schedule, Costs(), evs, makespan, busy, sum(idle) / (p * makespan), peak, idle)
