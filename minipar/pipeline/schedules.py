"""Pipeline schedules as plain data: one list of actions per rank.

    >>> s = one_f_one_b(p=2, m=3)
    >>> [[str(a) for a in rank] for rank in s.actions]
    [['0F0', '0F1', '0B0', '0F2', '0B1', '0B2'], ['1F0', '1B0', '1F1', '1B1', '1F2', '1B2']]
    >>> validate(s)              # raises ScheduleError, with a time x rank grid, when broken
    >>> print(format_grid(s))    # the same grid, for reading: one column per time step
    1f1b: p=2 m=3 v=1
    step       0   1   2   3   4   5   6   7
    rank 0   0F0 0F1   . 0B0 0F2 0B1   . 0B2
    rank 1     . 1F0 1B0 1F1 1B1 1F2 1B2   .

An action ``Action(stage, kind, microbatch)`` prints as ``1F3``: stage 1, forward, micro-batch 3.
Kinds: F forward, B full backward, I backward w.r.t. the stage *inputs* (what the previous
stage waits for), W backward w.r.t. the *weights* (nobody waits for it). B = I + W.

Words: ``p`` ranks (the field ``ranks``), ``m`` micro-batches, ``v`` chunks (model pieces) per
rank, so ``p * v`` global stages (``total_stages``).  Stage ``s`` lives on rank ``s % p``
(chunks round robin: rank r holds stages r, r+p, r+2p, ...).

"In flight" on a rank = activations held there: (stage, micro-batch) pairs whose F is done
and whose backward is not finished, i.e. B not done, or, when B is split, W not done
(W still needs the stage's saved inputs).  Every generator documents its bound in
``Schedule.inflight_limit``, and :func:`validate` enforces it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

KINDS = ("F", "B", "I", "W")
_ACTION_RE = re.compile(r"^\s*(\d+)([FBIW])(\d+)\s*$")


class Action(NamedTuple):
    stage: int        # global stage id, 0 .. p*v - 1
    kind: str         # "F", "B", "I" or "W"
    microbatch: int

    def __str__(self):
        return f"{self.stage}{self.kind}{self.microbatch}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> "Action":
        """``Action.parse("1F3") == Action(1, "F", 3)``."""
        match = _ACTION_RE.match(text)
        if not match:
            raise ValueError(f"not an action: {text!r} (expected e.g. '1F3': stage, F/B/I/W, micro-batch)")
        return cls(int(match[1]), match[2], int(match[3]))


class ScheduleError(ValueError):
    """A schedule broke a rule. The message holds the grid with the offending step marked."""


@dataclass
class Schedule:
    name: str
    ranks: int                        # p: pipeline ranks
    microbatches: int                 # m
    chunks: int                       # v: model chunks per rank
    actions: list[list[Action]]       # actions[rank] = what that rank runs, in order
    stage_to_rank: tuple[int, ...] = ()   # default: stage s on rank s % p
    inflight_limit: tuple[int, ...] = ()  # per rank; default: no bound
    passed: tuple | None = field(default=None, init=False, repr=False, compare=False)  # see validate()

    def __post_init__(self):
        self.actions = [[a if isinstance(a, Action) else Action.parse(a) for a in rank]
                        for rank in self.actions]
        if not self.stage_to_rank:
            self.stage_to_rank = tuple(s % self.ranks for s in range(self.total_stages))
        if not self.inflight_limit:
            self.inflight_limit = (self.total_stages * self.microbatches,) * self.ranks

    @property
    def total_stages(self) -> int:
        return self.ranks * self.chunks

    @property
    def stages(self) -> int:
        """The number of stages, p * v (``total_stages``): stage ids run 0 .. stages - 1."""
        return self.total_stages

    def contents(self) -> tuple:
        """Everything :func:`validate` reads, as one value: equal contents, equal verdict."""
        return (self.ranks, self.microbatches, self.chunks, tuple(map(tuple, self.actions)),
                tuple(self.stage_to_rank), tuple(self.inflight_limit))

    def as_strings(self) -> list[list[str]]:
        return [[str(a) for a in rank] for rank in self.actions]


def _check(**values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# ---------------------------------------------------------------- generators (pure functions)

def naive(p: int) -> Schedule:
    """One batch (m=1) through p ranks, forward then backward: one rank busy at a time.
    In flight: 1 per rank."""
    _check(p=p)
    actions = [[Action(r, "F", 0), Action(r, "B", 0)] for r in range(p)]
    return Schedule("naive", p, 1, 1, actions, inflight_limit=(1,) * p)


def gpipe(p: int, m: int) -> Schedule:
    """Fill-drain: every rank runs all m forwards, then all m backwards.

    Backwards run in order 0..m-1 (first in, first out), as torch's ScheduleGPipe does; the
    reverse order gives the same timeline with unit costs. In flight: m on every rank.
    """
    _check(p=p, m=m)
    actions = [[Action(r, "F", i) for i in range(m)] + [Action(r, "B", i) for i in range(m)]
               for r in range(p)]
    return Schedule("gpipe", p, m, 1, actions, inflight_limit=(m,) * p)


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush / Megatron): rank r warms up with min(p-1-r, m) forwards, then
    alternates one forward, one backward, then cools down with the remaining backwards.
    In flight on rank r: min(p - r, m), so rank 0 holds p micro-batches instead of m."""
    _check(p=p, m=m)
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action(r, "F", i) for i in range(warmup)]
        for i in range(m - warmup):                        # steady state: F then B
            ops += [Action(r, "F", warmup + i), Action(r, "B", i)]
        ops += [Action(r, "B", i) for i in range(m - warmup, m)]   # cool-down
        actions.append(ops)
    limit = tuple(min(p - r, m) for r in range(p))
    return Schedule("1f1b", p, m, 1, actions, inflight_limit=limit)


def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B: each rank holds v chunks (stages r, r+p, ...).

    Micro-batches go through the chunks in groups of p: forward k (k = 0 .. v*m-1) on rank r
    is chunk (k // p) % v of micro-batch (k // (p*v)) * p + k % p; backwards walk the chunks
    in reverse. Warm-up on rank r: (v-1)*p + 2*(p-1-r) forwards (capped at v*m), then 1F1B.
    Like Megatron, needs m % p == 0. In flight on rank r (in chunk-activations, each 1/v of
    a rank's layers): min(warm-up + 1, v*m).
    """
    _check(p=p, m=m, v=v)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs microbatches m divisible by stages p "
                         f"(as in Megatron), got m={m}, p={p}")
    total = v * m

    def microbatch(k):
        return (k // (p * v)) * p + k % p

    actions, limit = [], []
    for r in range(p):
        def fwd(k):
            return Action(((k // p) % v) * p + r, "F", microbatch(k))

        def bwd(k):
            return Action((v - 1 - (k // p) % v) * p + r, "B", microbatch(k))

        warmup = min((v - 1) * p + 2 * (p - 1 - r), total)
        ops = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            ops += [fwd(warmup + k), bwd(k)]
        ops += [bwd(k) for k in range(total - warmup, total)]
        actions.append(ops)
        limit.append(min(warmup + 1, total))
    return Schedule("interleaved", p, m, v, actions, inflight_limit=tuple(limit))


def zero_bubble_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023): 1F1B with B split into I and W, the W's moved late.

    Same warm-up as 1F1B; then each step runs F and I. Rank r holds back its first r W's
    (it would otherwise idle at the end, waiting for I's to travel up to rank 0) and then
    runs one W after each I, oldest first; the held-back W's fill the cool-down bubble.
    In flight (F done, W not): min(p, m) on every rank -- 1F1B's peak (its rank 0).
    """
    _check(p=p, m=m)
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action(r, "F", i) for i in range(warmup)]
        next_w = 0
        for i in range(m):                                 # i-th backward input
            if i < m - warmup:
                ops.append(Action(r, "F", warmup + i))
            ops.append(Action(r, "I", i))
            if i >= r:                                     # the first r W's wait for the end
                ops.append(Action(r, "W", next_w))
                next_w += 1
        ops += [Action(r, "W", j) for j in range(next_w, m)]
        actions.append(ops)
    return Schedule("zb-h1", p, m, 1, actions, inflight_limit=(min(p, m),) * p)


SCHEDULES = {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b,
             "interleaved": interleaved_1f1b, "zb-h1": zero_bubble_h1}


def make_schedule(name: str, p: int, m: int = 1, v: int = 1) -> Schedule:
    """Build a schedule by its CLI name (``naive`` ignores m, only ``interleaved`` uses v)."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    if name == "naive":
        return naive(p)
    if name == "interleaved":
        return interleaved_1f1b(p, m, v)
    return SCHEDULES[name](p, m)


# ---------------------------------------------------------------- dependencies and validation

def dependencies(action: Action, total_stages: int) -> list[tuple[Action, str]]:
    """What must be done before ``action`` may start, each with the rule it comes from."""
    s, kind, mb = action
    if kind == "F":
        return [(Action(s - 1, "F", mb), "F of stage s-1 before F of stage s")] if s > 0 else []
    if kind == "W":
        return [(Action(s, "I", mb), "W after I of the same stage and micro-batch")]
    deps = [(Action(s, "F", mb), "B/I after F of the same stage and micro-batch")]
    if s + 1 < total_stages:   # the gradient comes from stage s+1, by its B or its I
        deps.append(((s + 1, "BI", mb), "B/I of stage s after B/I of stage s+1"))
    return deps


def _dep_str(dep) -> str:
    return f"{dep[0]}B{dep[2]}/{dep[0]}I{dep[2]}" if dep[1] == "BI" else str(dep)


def _is_done(dep, done) -> bool:
    if dep[1] == "BI":
        return (dep[0], "B", dep[2]) in done or (dep[0], "I", dep[2]) in done
    return dep in done


def lockstep(schedule: Schedule):
    """Run the schedule in unit time steps: each rank starts its next action once all its
    dependencies finished in an earlier step. Returns ``(steps, blocked)``: ``steps[rank][i]``
    is the time step of the rank's i-th action, and ``blocked`` the (rank, index) of each
    rank's stuck action when nothing can run any more (a deadlock), else ``[]``."""
    S = schedule.total_stages
    pos = [0] * schedule.ranks
    steps = [[None] * len(ops) for ops in schedule.actions]
    done, t = set(), 0
    while True:
        ready = [r for r, ops in enumerate(schedule.actions) if pos[r] < len(ops)
                 and all(_is_done(d, done) for d, _ in dependencies(ops[pos[r]], S))]
        if not ready:
            break
        for r in ready:
            steps[r][pos[r]] = t
            pos[r] += 1
        done.update(schedule.actions[r][pos[r] - 1] for r in ready)
        t += 1
    blocked = [(r, pos[r]) for r, ops in enumerate(schedule.actions) if pos[r] < len(ops)]
    return steps, blocked


def inflight_profile(ops: list[Action]) -> list[int]:
    """Activations held on one rank after each of its actions (see the module docstring)."""
    held, out = set(), []
    for a in ops:
        if a.kind == "F":
            held.add((a.stage, a.microbatch))
        elif a.kind in "BW":
            held.discard((a.stage, a.microbatch))
        out.append(len(held))
    return out


def format_grid(schedule: Schedule, marks=(), width: int = 132) -> str:
    """Time x rank grid (columns = time steps of :func:`lockstep`, every action one step
    whatever its cost; rows = ranks); ``marks`` are (rank, index) cells shown as ``>1F3<``. Actions that can never run (deadlock) are appended after the
    last step in program order. Wide grids wrap into blocks of at most ``width`` characters."""
    steps, blocked = lockstep(schedule)
    marks = set(marks)
    n_steps = 1 + max([t for row in steps for t in row if t is not None], default=-1)
    start = n_steps
    for r, i in blocked:                        # lay out what never ran, after the end
        for k in range(i, len(steps[r])):
            steps[r][k] = start + k - i
    n_cols = 1 + max([t for row in steps for t in row], default=-1)
    cells = [["."] * n_cols for _ in range(schedule.ranks)]
    for r, row in enumerate(steps):
        for i, t in enumerate(row):
            a = str(schedule.actions[r][i])
            cells[r][t] = f">{a}<" if (r, i) in marks else a
    w = max([len(c) for row in cells for c in row] + [len(str(n_cols - 1))]) + 1
    label = f"rank {schedule.ranks - 1}"
    per_block = max(1, (width - len(label) - 2) // w)
    head = f"{schedule.name}: p={schedule.ranks} m={schedule.microbatches} v={schedule.chunks}"
    lines = [head + (f"  (steps {n_steps}..: can never run, shown in program order)" if blocked else "")]
    for c0 in range(0, max(n_cols, 1), per_block):
        cols = range(c0, min(c0 + per_block, n_cols))
        lines.append(f"{'step':<{len(label)}}  " + "".join(f"{c:>{w}}" for c in cols))
        for r in range(schedule.ranks):
            lines.append(f"{'rank ' + str(r):<{len(label)}}  " + "".join(f"{cells[r][c]:>{w}}" for c in cols))
    return "\n".join(lines)


def _fail(schedule, marks, rule):
    raise ScheduleError(f"{format_grid(schedule, marks)}\nrule broken: {rule}")


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless the schedule is complete, owned, deadlock-free and
    within its in-flight bound. The message is the grid with the offending step marked.

    A schedule that passed remembers what it held then (``schedule.passed``): validating it again
    unchanged, as the executor does every training step, is one comparison."""
    checked = schedule.contents()
    if schedule.passed == checked:
        return
    p, m, S = schedule.ranks, schedule.microbatches, schedule.total_stages
    if len(schedule.actions) != p:
        raise ScheduleError(f"{schedule.name}: {len(schedule.actions)} action lists for p={p} ranks")
    seen = {}
    for r, ops in enumerate(schedule.actions):
        for i, a in enumerate(ops):
            if not (0 <= a.stage < S and 0 <= a.microbatch < m and a.kind in KINDS):
                _fail(schedule, [(r, i)], f"{a}: stage must be in 0..{S - 1}, micro-batch in 0..{m - 1}")
            if schedule.stage_to_rank[a.stage] != r:
                _fail(schedule, [(r, i)], f"{a} runs on rank {r}, but stage {a.stage} "
                                          f"lives on rank {schedule.stage_to_rank[a.stage]}")
            if a in seen:
                _fail(schedule, [seen[a], (r, i)], f"{a} appears twice")
            seen[a] = (r, i)
    for s in range(S):
        for mb in range(m):
            has = {k for k in KINDS if Action(s, k, mb) in seen}
            where = [seen[Action(s, k, mb)] for k in sorted(has)]
            if "F" not in has:
                _fail(schedule, where, f"{s}F{mb} is missing: every (stage, micro-batch) needs one F")
            if has - {"F"} not in ({"B"}, {"I", "W"}):
                _fail(schedule, where, f"stage {s} micro-batch {mb} has backward kinds "
                                       f"{sorted(has - {'F'})}: need one B, or one I and one W")
    steps, blocked = lockstep(schedule)
    if blocked:   # find the cycle of ranks waiting on each other; the others wait on it
        done = {a for ops, st in zip(schedule.actions, steps) for a, t in zip(ops, st) if t is not None}
        wait, waits_on = {}, {}
        for r, i in blocked:
            a = schedule.actions[r][i]
            missing = [(d, rule) for d, rule in dependencies(a, S) if not _is_done(d, done)]
            wait[r] = f"rank {r} waits at {a} for {_dep_str(missing[0][0])} ({missing[0][1]})"
            waits_on[r] = schedule.stage_to_rank[missing[0][0][0]]
        path, r = [], blocked[0][0]
        while r not in path:
            path.append(r)
            r = waits_on[r]
        cycle = path[path.index(r):]
        _fail(schedule, [(q, i) for q, i in blocked if q in cycle],
              "deadlock: " + "; ".join(wait[q] for q in cycle))
    for r, ops in enumerate(schedule.actions):
        for i, held in enumerate(inflight_profile(ops)):
            if held > schedule.inflight_limit[r]:
                _fail(schedule, [(r, i)], f"rank {r} holds {held} activations in flight after "
                                          f"{ops[i]}, above this schedule's bound "
                                          f"{schedule.inflight_limit[r]}")
    schedule.passed = checked
