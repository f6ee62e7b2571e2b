"""``minipar figures``: regenerate every lesson's figures from real runs and the models."""
from __future__ import annotations

import importlib
import time

from ..course import LESSONS, lesson


def main(args) -> int:
    lessons = [lesson(args.only)] if args.only else LESSONS
    for ls in (ls for ls in lessons if ls.figures_modules):
        t0 = time.perf_counter()
        print(f"{ls.key} {ls.name}: drawing figures ...", flush=True)
        for module in ls.figures_modules:
            for path in importlib.import_module(module).make(args.out, quick=args.quick):
                print(f"  wrote {path}", flush=True)
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0
