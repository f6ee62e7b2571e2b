"""Lesson drivers: the multi-rank functions that the tour, the notebooks and the tests launch.

Each lesson module holds small functions ``f(comm, **kwargs)`` that run one lesson on real
ranks and check it against its reference on the spot. They contain no algorithm of their own:
the algorithms live in the library modules (``minipar.collectives`` ...).
"""
