"""What the lesson-04 drivers share (``data_parallel``, ``zero_infinity``, ``buffers``): the
seeded models and batch every engine trains on, training an engine a few steps, comparing two
parameter sets, a check row, and one traced step.

Odd layer sizes on purpose: ``make_model``'s layers (``DIMS``) hold 42, 48 and 21 weights and
``uniform_model``'s 1190, so no layer divides by 2, 3 or 4 ranks and padding is always exercised.
"""
from __future__ import annotations

import time

import numpy as np

from .. import nn
from ..data_parallel import local_batch
from ..xp import to_numpy

DIMS = (5, 7, 6, 3)  # units of 42, 48 and 21 weights


def make_model(seed=0, dims=DIMS):
    """Linear, GeLU, Linear, ... with biases drawn too (nn starts them at zero)."""
    rng = np.random.default_rng(seed)
    layers = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        layers += [nn.Linear(a, b, rng)] + ([nn.GeLU()] if i < len(dims) - 2 else [])
    model = nn.Sequential(*layers)
    for _, p in model.named_parameters():
        p[...] = rng.standard_normal(p.shape) / np.sqrt(dims[0])
    return model


def make_data(comm, seed=1, batch=12, d_in=DIMS[0], d_out=DIMS[-1]):
    """The whole batch (x, y), the same draw on every rank, as the comm's arrays."""
    rng = np.random.default_rng(seed)
    return comm.asarray(rng.standard_normal((batch, d_in))), comm.asarray(rng.standard_normal((batch, d_out)))


def max_error(got: dict, want: dict, relative=True) -> float:
    """max over parameters of max |got - want| (/ max |want|): 0.0 means bitwise equal."""
    errs = []
    for n, w in want.items():
        g, w = to_numpy(got[n]).astype(np.float64), to_numpy(w).astype(np.float64)  # from any device
        errs.append(np.max(np.abs(g - w)) / (np.max(np.abs(w)) if relative else 1.0))
    return float(max(errs))


def row(what, error, tol):
    return {"what": what, "error": float(error), "tolerance": tol, "ok": bool(error <= tol)}


def train(engine, x, y, steps):
    comm = engine.comm
    for _ in range(steps):
        engine.train_step(local_batch(comm, x), local_batch(comm, y))
    return engine.params_numpy()


def uniform_model(units=4, width=34, seed=0):
    """``units`` equal Linear(width, width) layers. 34 x 35 = 1190 weights per layer: neither 3
    nor 4 divides it, so the memory and traffic checks include padding (1 or 2 per layer)."""
    rng = np.random.default_rng(seed)
    return nn.Sequential(*[nn.Linear(width, width, rng) for _ in range(units)])


def traced(comm, step):
    """(this rank's events, seconds) of one traced call of ``step()``, after one untraced call."""
    step()
    comm.builtin.barrier()
    comm.tracer.clear()
    comm.tracer.enabled = True
    t0 = time.perf_counter()
    with comm.region("step"):
        step()
    dt = time.perf_counter() - t0
    comm.tracer.enabled = False
    return list(comm.tracer.events), dt


def stepper(engine, x, y):
    xl, yl = local_batch(engine.comm, x), local_batch(engine.comm, y)
    return lambda: engine.train_step(xl, yl)
