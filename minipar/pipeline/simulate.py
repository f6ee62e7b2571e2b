"""Run a schedule on a clock: when does each action start and end, and how much is idle?

    >>> from minipar.pipeline import gpipe, simulate, theory_bubble_fraction
    >>> sim = simulate(gpipe(p=4, m=8), {"F": 1, "B": 2})
    >>> sim.bubble_fraction, theory_bubble_fraction("gpipe", 4, 8)
    (Fraction(3, 11), Fraction(3, 11))

Each rank runs its action list in order. An action starts when its rank is free and its
dependencies are done: the previous stage's F of the same micro-batch (for F), the next
stage's B or I of the same micro-batch (for B/I), the stage's own I (for W). A dependency
produced on another rank arrives ``p2p`` time units after it ends.

Costs are per micro-batch for one rank's share of the model (a stage of a p-stage split);
with v chunks per rank each chunk action costs ``cost / v``, so every schedule of the same
(p, m) does the same total work.  Integer or Fraction costs give exact Fraction results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from .schedules import Action, Schedule, ScheduleError, dependencies, inflight_profile, validate

__all__ = ["Costs", "Event", "SimResult", "simulate", "theory_bubble_fraction"]


def _exact(x):
    """int / Fraction -> Fraction (exact arithmetic), anything else -> float."""
    return Fraction(x) if isinstance(x, (int, Fraction)) else float(x)


@dataclass
class Costs:
    """Time of one action. B = I + W; given only B, I = W = B/2; given I and W, B = I + W."""
    F: object = 1
    B: object = None
    I: object = None
    W: object = None
    p2p: object = 0

    def __post_init__(self):
        F, B, I, W = (None if x is None else _exact(x) for x in (self.F, self.B, self.I, self.W))
        if B is None:
            B = I + W if I is not None and W is not None else _exact(2)
        if I is None and W is None:
            I = W = B / 2
        elif I is None:
            I = B - W
        elif W is None:
            W = B - I
        self.F, self.B, self.I, self.W, self.p2p = F, B, I, W, _exact(self.p2p)

    @classmethod
    def coerce(cls, costs) -> "Costs":
        if costs is None:
            return cls()
        if isinstance(costs, Costs):
            return costs
        return cls(**costs)


class Event(NamedTuple):
    rank: int
    action: Action
    start: object
    end: object


@dataclass
class SimResult:
    schedule: Schedule
    costs: Costs
    events: list[Event]            # in start order per rank
    makespan: object
    busy: list                     # per rank: time spent computing
    bubble_fraction: object        # idle rank-time / (p * makespan)
    peak_inflight: list[int]       # per rank: max activations held (F done, B / W not yet)
    idle: list = field(default_factory=list)

    def rank_events(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]


def simulate(schedule: Schedule, costs=None, check: bool = True, durations=None) -> SimResult:
    """Time every action of ``schedule`` (validated first unless ``check=False``).

    ``durations`` ({Action: time}) overrides the per-kind cost of the actions it names: with
    every action's duration measured on real ranks, the simulation *replays* that run, and
    what remains between replay and measurement is time the model does not know about.
    """
    if check:
        validate(schedule)
    c = Costs.coerce(costs)
    v = schedule.chunks
    duration = {k: getattr(c, k) / v for k in "FBIW"}
    S, owner = schedule.total_stages, schedule.stage_to_rank
    end: dict[Action, object] = {}
    free = [_exact(0)] * schedule.ranks
    pos = [0] * schedule.ranks
    events = []

    def arrival(dep, rank):
        """When the result of ``dep`` is available on ``rank`` (None: not computed yet)."""
        s, kind, mb = dep
        kinds = "BI" if kind == "BI" else kind
        t = next((end[(s, k, mb)] for k in kinds if (s, k, mb) in end), None)
        return None if t is None else t + (c.p2p if owner[s] != rank else 0)

    progress = True
    while progress:               # sweep the ranks until nothing more can be placed
        progress = False
        for r, ops in enumerate(schedule.actions):
            while pos[r] < len(ops):
                a = ops[pos[r]]
                ready = [arrival(d, r) for d, _ in dependencies(a, S)]
                if any(t is None for t in ready):
                    break
                start = max([free[r], *ready])
                free[r] = end[a] = start + (durations[a] if durations and a in durations else duration[a.kind])
                events.append(Event(r, a, start, end[a]))
                pos[r] += 1
                progress = True
    if any(pos[r] < len(ops) for r, ops in enumerate(schedule.actions)):
        raise ScheduleError(f"{schedule.name}: deadlock in simulation; run validate() for the grid")

    p = schedule.ranks
    events.sort(key=lambda e: (e.rank, e.start))
    makespan = max(free)
    busy = [_exact(0)] * p  # one pass over the events (a pass per rank is slow for long schedules)
    for e in events:
        busy[e.rank] += e.end - e.start
    idle = [makespan - b for b in busy]
    bubble = sum(idle) / (p * makespan) if makespan else _exact(0)
    peak = [max(inflight_profile(ops), default=0) for ops in schedule.actions]
    return SimResult(schedule, c, events, makespan, busy, bubble, peak, idle)


def theory_bubble_fraction(name: str, p: int, m: int = 1, v: int = 1) -> Fraction:
    """The textbook bubble fraction (idle rank-time / total rank-time).

    - naive: (p-1)/p -- one rank busy at a time.
    - gpipe, 1f1b: (p-1)/(m+p-1). Each rank is busy m(F+B) and idle (p-1)(F+B): the time for
      the first forward to reach it plus the last backward to come back (any F, B; the tests
      use F=1, B=2).
    - interleaved: (p-1)/(v*m+p-1). The idle part shrinks to (p-1)(F+B)/v because the fill and
      drain now move chunks of 1/v of the work (Narayanan et al. 2021).
    - zb-h1: (p-1)/(3m+p-1) for F = I = W = 1. Qi et al. 2023 (sec. 3.1) give ZB-H1's idle time
      per rank as (p-1)(T_F + T_I - T_W) = p-1, against busy m(T_F + T_I + T_W) = 3m: the W's
      fill the cool-down, about a third of 1F1B's (p-1)(T_F + T_I + T_W). Holds for m >= p;
      with fewer micro-batches there are too few W's to fill it (simulate to see).
    """
    p, m, v = Fraction(p), Fraction(m), Fraction(v)
    formulas = {
        "naive": lambda: (p - 1) / p,
        "gpipe": lambda: (p - 1) / (m + p - 1),
        "1f1b": lambda: (p - 1) / (m + p - 1),
        "interleaved": lambda: (p - 1) / (v * m + p - 1),
        "zb-h1": lambda: (p - 1) / (3 * m + p - 1),
    }
    if name not in formulas:
        raise ValueError(f"no theory for schedule {name!r}; known: {', '.join(formulas)}")
    return formulas[name]()
