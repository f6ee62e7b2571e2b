"""Pipeline parallelism: schedules are data; generate, validate, simulate and plot them apart.

    from minipar.pipeline import one_f_one_b, validate, simulate, format_grid
    s = one_f_one_b(p=4, m=8)          # Schedule: s.actions[rank] = [0F0, 0F1, ...]
    validate(s)                        # ScheduleError with a time x rank grid if broken
    print(format_grid(s))
    sim = simulate(s, {"F": 1, "B": 2})
    sim.bubble_fraction                # Fraction(3, 11) == theory_bubble_fraction("1f1b", 4, 8)

    minipar schedule 1f1b --stages 4 --microbatches 8       # the same from the shell

Drawing them (timelines, bubble curves, memory): :mod:`minipar.figures.pipeline`.
"""
from .schedules import (KINDS, SCHEDULES, Action, Schedule, ScheduleError, dependencies,
                        format_grid, gpipe, inflight_profile, interleaved_1f1b, lockstep,
                        make_schedule, naive, one_f_one_b, validate, zero_bubble_h1)
from .simulate import Costs, Event, SimResult, simulate, theory_bubble_fraction

__all__ = ["KINDS", "SCHEDULES", "Action", "Schedule", "ScheduleError", "dependencies",
           "format_grid", "gpipe", "inflight_profile", "interleaved_1f1b", "lockstep",
           "make_schedule", "naive", "one_f_one_b", "validate", "zero_bubble_h1",
           "Costs", "Event", "SimResult", "simulate", "theory_bubble_fraction"]
