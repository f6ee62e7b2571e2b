"""Figures of the pipeline lesson, drawn from the schedules and their simulation.

    minipar figures --only pipeline
"""
from __future__ import annotations

import os

from ..pipeline import plot as P


def make(outdir, quick=False, backend="mpi", device=None):
    os.makedirs(outdir, exist_ok=True)
    return [
        P.plot_schedules(os.path.join(outdir, "pipeline_schedules.png"), p=4, m=8, v=2),
        P.plot_bubble_vs_microbatches(os.path.join(outdir, "bubble_vs_microbatches.png"), p=4),
        P.plot_inflight_memory(os.path.join(outdir, "pipeline_memory.png"), p=4, m=8),
    ]
