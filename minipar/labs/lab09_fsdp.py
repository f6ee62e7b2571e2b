"""Lab 09, task 9.2: one FSDP unit, graded against one process, by bytes and by memory.

Two units run one after the other, each a residual MLP (``layer``) whose 229 weights lie flat
in one buffer, padded to a multiple of p (229 divides by neither 2 nor 3) and cut into one
shard per rank. The grader hands each rank its shards only. Two cases: float64 throughout,
and float32 shards (the master copy) computing in bfloat16.

* memory: every tensor made during the forward is followed (a ``TorchDispatchMode`` sees each
  op's new storage, a weak reference says when it is freed); when the forward has returned, none
  as large as a unit's gathered weights may be alive: the full weights exist only while their
  unit computes, and again in its backward;
* traffic: the forward sends one ring all-gather per unit in the compute dtype; the backward one
  all-gather (compute dtype) and one reduce-scatter of the gradient (the shards' dtype) per unit;
* values: the output, the input's gradient and every shard's gradient, against one process
  (float64: 1e-12); in bfloat16, against the same casts on this rank's rows with the ranks'
  gradients averaged in float32 by the engine's own all-reduce (1e-5: the order of the float32
  sums; a gradient reduced in bfloat16 is off by about 4e-3), and the output and input gradient
  to 1e-2 (bfloat16).
"""
from __future__ import annotations

import functools
import sys
import weakref

from ..comm.watchdog import user_line
from ..xp import chunk_bounds
from .checks import compare, expect_traffic, ranks, stop
from .lab09_rules import run_learner

C, H = 8, 13  # the unit's features and hidden features: n = 2 C H + H + C = 229 weights
N = 2 * C * H + H + C
ROWS = 12  # the whole batch: 6 or 4 rows per rank


def layer(w, x):
    """One unit: x + gelu(x W1 + b1) W2 + b2, its weights laid out flat in w (N elements): W1 (C, H),
    b1 (H), W2 (H, C), b2 (C). x: (rows, C)."""
    import torch

    W1, b1 = w[:C * H].view(C, H), w[C * H:C * H + H]
    W2, b2 = w[C * H + H:2 * C * H + H].view(H, C), w[2 * C * H + H:]
    return x + torch.nn.functional.gelu(x @ W1 + b1) @ W2 + b2


@functools.cache
def _watch_class():
    """A ``TorchDispatchMode`` that follows every new storage of at least ``least`` bytes made while
    it is on: (bytes, dtype and shape, where it was made, a weak reference to the storage).
    Made on first use: importing this module imports no torch."""
    from torch.utils._pytree import tree_leaves
    from torch.utils._python_dispatch import TorchDispatchMode

    import torch

    class Made(TorchDispatchMode):
        def __init__(self, least):
            super().__init__()
            self.least, self.made = least, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            had = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.least:
                    s = t.untyped_storage()
                    if id(s) not in had:
                        what = f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}"
                        self.made.append((s.nbytes(), what, user_line(sys._getframe(1)), weakref.ref(s)))
            return out

        def alive(self):
            return [(n, what, where) for n, what, where, ref in self.made if ref() is not None]

    return Made


def draw(shape, seed, dtype):
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def dense(weights, x, R, compute, master, rows=None):
    """One process: both units on ``x`` (every row, or ``rows``) with full weights, the loss the
    mean over those rows of (output . R): (output, {"x": dx, 0: dW0, 1: dW1})."""
    import torch

    ws = [w.detach().clone().requires_grad_() for w in weights]
    xs = (x if rows is None else x[rows]).detach().clone().requires_grad_()
    out = layer(ws[1].to(compute), layer(ws[0].to(compute), xs.to(compute)))
    loss = (out.to(master) * (R if rows is None else R[rows])).sum(-1).mean()
    dx, dw0, dw1 = torch.autograd.grad(loss, (xs, *ws))
    return out.detach(), {"x": dx, 0: dw0, 1: dw1}


def check_fsdp_unit(comm, fn):
    import torch

    p, r = comm.size, comm.rank
    for master, compute in ((torch.float64, None), (torch.float32, torch.bfloat16)):
        cd = compute or master
        case = f"{ranks(p)}, shards {str(master)[6:]}" + (f", computing in {str(compute)[6:]}" if compute else "")
        S = -(-N // p)
        weights = [draw(N, 10 + u, master) for u in range(2)]
        shards = []
        for w in weights:
            padded = torch.zeros(p * S, dtype=master)
            padded[:N] = w
            shards.append(padded[r * S:(r + 1) * S].clone().requires_grad_())
        X, R = draw((ROWS, C), 20, master), draw((ROWS, C), 21, master)
        a, b = chunk_bounds(ROWS, p)[r]
        x = X[a:b].clone().requires_grad_()
        full_bytes = p * S * cd.itemsize
        watch = _watch_class()(full_bytes)

        def forward():
            with watch:
                return fn(comm, shards[1], fn(comm, shards[0], x, layer, N, compute), layer, N, compute)

        fwd, fails = run_learner(comm, fn, "fsdp_unit", forward)
        alive = watch.alive() if fwd is not None else []
        out = fwd.out if fwd is not None else None

        def backward():
            (out.to(master) * R[a:b]).sum(-1).mean().backward()

        bwd, more = (None, []) if fails else run_learner(comm, fn, "fsdp_unit", backward)
        fails = fails or more
        _, mine = dense(weights, X, R, cd, master, slice(a, b))  # this rank's rows: its own gradients
        want, whole = dense(weights, X, R, cd, master)
        averaged = [comm.builtin.all_reduce(mine[u].to(master)) / p for u in (0, 1)]  # every rank, before any verdict
        fails = fails or unit_failures(comm, fwd, bwd, alive, shards, x, out, want[a:b], mine, whole, averaged,
                                       S, master, cd, case)
        if stop(comm, fails):
            return fails
    return []


def unit_failures(comm, fwd, bwd, alive, shards, x, out, want, mine, whole, averaged, S, master, cd, case):
    """Memory, the output, the traffic of the forward and of the backward, then the gradients."""
    p, r = comm.size, comm.rank
    if alive:
        n, what, where = alive[0]
        return [f"rank {r}: {n} bytes ({what}, made at {where}) are still alive after the units' forward returned, "
                f"as large as a unit's gathered weights ({p * S} x {cd.itemsize} bytes; {case}): FSDP frees a "
                f"unit's full weights when its forward ends and gathers them again in its backward (save the "
                f"shard and the input with ctx.save_for_backward, never the gathered weights)"]
    loose = cd != master
    fails = compare(comm, _f64(out), _f64(want), "the output of the two units", case, tol=1e-2 if loose else 1e-12)
    if fails:
        return fails
    c, m = cd.itemsize, master.itemsize
    fails = expect_traffic(comm, fwd, f"the forward of 2 units: an all-gather of the shards ({S} elements each) per "
                                      f"unit in {str(cd)[6:]} ({case})", 2 * (p - 1) * S * c, 2 * (p - 1),
                           hint="gather each unit's shards once, in the compute dtype (cast the shard first)")
    fails = fails or expect_traffic(
        comm, bwd, f"the backward of 2 units: per unit an all-gather of the shards in {str(cd)[6:]} and a "
                   f"reduce-scatter of the gradient in {str(master)[6:]} ({case})", 2 * (p - 1) * S * (c + m),
        4 * (p - 1), hint="the weights were freed after the forward: gather them again for the backward; and reduce "
                          "the gradient in the shards' dtype (the master copy's), never in the compute dtype")
    if fails:
        return fails
    fails = compare(comm, _f64(x.grad), _f64(mine["x"]), "the gradient of the input x", case,
                    tol=1e-2 if loose else 1e-12)
    lo, hi = min(r * S, N), min((r + 1) * S, N)  # my piece of the N weights; the rest of my shard is padding
    for u, shard in enumerate(shards):
        got = shard.grad
        if not fails and got is not None and got.shape == (S,) and hi - lo < S:
            if got[hi - lo:].abs().max() > 0:
                return [f"rank {r}: the gradient of unit {u}'s shard is not zero on the padding (elements "
                        f"{hi - lo} to {S - 1} of the shard; {case}): pad the full gradient with zeros"]
            got = got[:hi - lo]
        want_piece = (averaged if loose else whole)[u][lo:hi]
        fails = fails or compare(comm, _f64(got), _f64(want_piece), f"the gradient of unit {u}'s shard", case + (
            "; against this rank's rows in bfloat16, averaged over the ranks in float32" if loose else "; one process"),
            tol=1e-5 if loose else 1e-12, offset=r * S)
    return fails


def _f64(t):
    """``t`` as float64 (a bfloat16 tensor compares through float64), None stays None."""
    return None if t is None else t.detach().double()
