"""The lessons of the course: what each one runs, and where its lab, notebook and figures are.

The tour, ``minipar lessons`` and ``minipar figures`` read this list; a lesson joins the course
by adding one entry.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    key: str  # "01"
    name: str  # "collectives"
    title: str
    driver: str  # "module:function" run on ranks by the tour; returns check rows
    figures_module: str  # module with make(outdir, quick=False) -> [paths]
    lab: str
    notebook: str
    figures: tuple[str, ...]


LESSONS = [
    Lesson("01", "collectives", "Collectives from send/recv: broadcast, reduce, all-gather, reduce-scatter, all-reduce",
           "minipar.lessons.collectives:tour", "minipar.figures.collectives",
           "labs/01_collectives", "notebooks/01_collectives.ipynb",
           ("collectives_busbw.png", "collectives_ring_steps.png")),
]


def lesson(key_or_name: str) -> Lesson:
    for ls in LESSONS:
        if key_or_name in (ls.key, ls.name, ls.key.lstrip("0")):
            return ls
    raise ValueError(f"no lesson {key_or_name!r}; choose one of "
                     f"{', '.join(f'{ls.key} ({ls.name})' for ls in LESSONS)}")
