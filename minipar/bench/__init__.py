"""Benchmarks: ours vs the engine's own, ratios taken in one run (see docs/benchmarks.md)."""
