"""Lesson drivers: the multi-rank functions that the tour, the notebooks and the tests launch.

Each lesson module holds small functions ``f(comm, **kwargs)`` that run one lesson on real
ranks and check it against its reference on the spot, and each one is named in its lesson's
``drivers`` in ``minipar.course``. They contain no algorithm of their own: the algorithms live
in the library modules (``minipar.collectives`` ...). ``common`` is the check harness every
driver shares, ``fixtures`` the models and data that lesson 04's drivers share, ``torch_fixtures``
lesson 09's (torch modules). What a figure runs and draws lives in ``minipar.figures``, what a
benchmark times in ``minipar.bench``.
"""
