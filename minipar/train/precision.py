"""Mixed precision for the trainer: which dtype computes, which one keeps, and the fp16 loss scale.

    pol = policy("bf16")                  # compute "bfloat16", master "float32", mixed True
    pol.scaled                            # False: only fp16 scales its loss
    scaler = LossScaler(2.0**16, growth_interval=2000)   # fp16 only: dynamic loss scaling
    scaler.update(found_inf)              # every rank, with the same world-wide flag

precision  weights and      gradients (main_grad),   master weights,     bytes per parameter
           activations      dp / tied reductions     Adam's m and v      (weights + grads + K)
fp64       float64          float64                  - (the weights)     8 + 8 + 16 = 32
fp32       float32          float32                  - (the weights)     4 + 4 + 8  = 16
bf16       bfloat16         float32                  float32             2 + 4 + 12 = 18
fp16       float16          float32                  float32             2 + 4 + 12 = 18

The 16-bit precisions are Megatron's: the forward and backward run on a 16-bit copy of the
weights; every micro-batch's weight gradient is added into a float32 gradient (Megatron's
``main_grad``); the reductions over dp (and the tied embedding's sum over the first and last
stage) run on those float32 sums; Adam updates float32 master weights, which are rounded into the
16-bit copy after each step. The names, their dtypes and ``Policy`` are ``minipar.mixed_precision``'s
(the engines take the policy); ``minipar.memory.Precision`` is the planner's table of the same
bytes: ``Precision("bf16")`` is 2 + 4 + 12.

Why the gradients accumulate in float32. bfloat16 keeps 8 significant bits (7 stored): next to a
running sum of 1.0 its neighbours are 1 - 2^-8 and 1 + 2^-7, so anything added that is smaller
than half that gap, 2^-8 = 0.0039, rounds away. With many micro-batches, each adds a small part
of the total to a sum that is already large: a running sum at 1.0 plus 64 micro-batch gradients of
0.003 is 1.192 accumulated in float32 and still 1.0 in bfloat16, every one of the 64 rounded away
(``running_sum``). float32's gap at 1.0 is 2^-23: the same 64 terms lose nothing visible.

fp16 has float32's precision problem less (11 bits) but a narrow range: its largest number is
65504 and its smallest normal 2^-14 = 6.1e-5, so small gradients underflow to zero. Dynamic loss
scaling (``LossScaler``, as torch.amp.GradScaler and Megatron's DynamicGradScaler) multiplies the
loss gradient by a scale S (a power of 2, so scaling is exact), which shifts every gradient up
into range; the float32 gradients are divided by S before the clip and the step. When any
gradient of any rank came out inf or nan, every rank skips the step and halves S; after
``growth_interval`` steps in a row without one, S doubles. bfloat16 has float32's exponent
range: it needs no scale.

How the numbers are computed on each backend (``compute_dtype``):

- torch: bfloat16 and float16 are native; a matmul takes 16-bit inputs, accumulates in float32
  inside the kernel, and rounds its output to 16 bits: what a GPU's tensor cores do.
- NumPy: float16 is native (NumPy's own loops, no BLAS: slow, correct). bfloat16 comes from
  ``ml_dtypes``, whose matmul takes bfloat16 inputs and accumulates *and returns* float32, and
  whose arithmetic with a Python float is float32 too. Each kernel of ``minipar.nn.functional``
  therefore widens its bfloat16 inputs to float32 once (``wide``: ml_dtypes' own bfloat16 loops are
  30x to 200x slower) and rounds its outputs to bfloat16 (``kept``), as a fused GPU kernel computes
  in float32 registers and writes 16 bits: every activation kept, every tensor all-reduced over tp
  and every message between stages is bfloat16, at the rounding points of torch's kernels (the bytes
  of ``minipar.train.accounting``, to the byte). Each stage still rounds what it hands on
  (``GPTStage.compute``), a no-op once the kernels keep their dtype.
- The loss: the logits are cast to float32 before the (vocab-parallel) cross-entropy, as
  Megatron does; its gradient, times the loss scale, is cast back to the compute dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..mixed_precision import COMPUTE, MASTER, PRECISIONS, Policy, policy  # noqa: F401 (the vocabulary, re-exported)
from ..xp import namespace

# unit roundoff u = 2^-p of a dtype with p significant bits: the largest relative error of one rounding
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
LOSS_SCALES = ("dynamic", "static")

# the losses' relative error allowed against one process at the same precision, and against float64
SAME = {"fp64": 1e-12, "fp32": 1e-5}
F64 = {"fp64": 1e-12, "fp32": 1e-5}
PARAMS = {"fp64": 1e-12, "fp32": 1e-4}  # train.check_grids' (a few float32 elements flip, see there)


def tolerances(cfg, steps=None, smallest=1.0) -> tuple[float, float, float]:
    """(losses vs one process at the same precision, losses vs float64, parameters vs one process):
    relative errors, max |a - b| / max |b| (docs/train.md derives them).

    Losses in 16 bits, with u the unit roundoff (bf16 2^-8, fp16 2^-11): a grid differs from one
    process at the same precision by where its sums are cut and rounded (at most one rounding
    more per value: u), and one process differs from float64 by the roundings of the weights, the
    activations and the logits (u); so u against one process, 2u against float64.

    Parameters in 16 bits, each tensor relative to its largest weight: Adam moves every element
    by about lr a step whatever its gradient's size (exactly lr on the first step), so an element
    whose gradient is at the rounding's noise level may step the other way on the grid: up to 2 lr
    per step apart, ``steps`` steps taken (default ``cfg.steps``), relative to ``smallest``, the
    smallest largest weight of a tensor; and the 16-bit copies of nearly equal masters may round
    one unit (2u) apart. Hence 2 lr steps / smallest + 2u."""
    p = cfg.precision
    if p in SAME:
        return SAME[p], F64[p], PARAMS[p]
    u = UNIT_ROUNDOFF[p]
    return u, 2 * u, 2 * cfg.lr * (cfg.steps if steps is None else steps) / smallest + 2 * u


def check_scale_flags(precision, given) -> None:
    """Refuse, in one line, loss-scale settings given (``given``: {flag: value}, the flags said on
    the command line) with a precision that scales no loss (``Policy.scaled``: fp16 alone)."""
    pol = policy(precision)
    if given and not pol.scaled:
        raise UsageError(f"{next(iter(given))}: only --precision fp16 scales its loss ({pol.why_unscaled()})")


def check_loss_scale(precision, loss_scale, initial_scale, growth_interval) -> None:
    """Refuse, in one line, an fp16 run whose loss scale cannot move, and a scale that is not one."""
    if loss_scale not in LOSS_SCALES:
        raise UsageError(f"--loss-scale={loss_scale!r}: choose one of {', '.join(LOSS_SCALES)}")
    if precision == "fp16" and loss_scale != "dynamic":
        raise UsageError("--precision fp16 with --loss-scale static: fp16's range (6e-5 ... 65504) needs a "
                         "loss scale that moves; use --loss-scale dynamic (the default)")
    if (isinstance(initial_scale, bool) or not isinstance(initial_scale, (int, float))
            or not 1 <= initial_scale < float("inf") or math.log2(initial_scale) % 1):
        raise UsageError(f"--initial-scale={initial_scale!r}: a power of 2, at least 1 (scaling by it is exact)")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise UsageError(f"--growth-interval={growth_interval!r}: a positive number of steps")


@dataclass
class LossScaler:
    """Dynamic loss scaling, torch.amp.GradScaler's rule: halve ``scale`` on a step with an
    overflow (the step is skipped), double it after ``growth_interval`` clean steps in a row.
    ``good`` counts the clean steps since the last change. The state (scale, good) is two
    numbers, kept in checkpoints."""

    scale: float = 2.0**16
    growth_interval: int = 2000
    backoff: float = 0.5
    growth: float = 2.0
    good: int = 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff
            self.good = 0
            return
        self.good += 1
        if self.good == self.growth_interval:
            self.scale *= self.growth
            self.good = 0

    def state(self) -> dict:
        return {"scale": self.scale, "good": self.good}


def running_sum(values, dtype) -> float:
    """The sum of ``values`` added one by one into an accumulator of ``dtype`` (a name): what
    accumulating micro-batch gradients in that dtype keeps (see the module docstring)."""
    from ..xp import dtype_named

    dt = dtype_named(dtype)
    acc = np.zeros((), dtype=dt)
    for v in values:
        acc = (acc + np.asarray(v, dtype=dt)).astype(dt)
    return float(acc)


def loss_in_master(loss, logits, labels, pol: Policy, scale: float = 1.0):
    """(loss, dlogits) of ``loss(logits, labels)`` computed on the logits cast to the master dtype
    (float32: the softmax of 16-bit logits would lose the small probabilities), the gradient
    times the loss ``scale`` and cast back to the compute dtype for the backward. Outside mixed
    precision: ``loss`` itself."""
    if not pol.mixed:
        return loss(logits, labels)
    from ..xp import dtype_named

    xp = namespace(logits)
    value, d = loss(xp.astype(logits, dtype_named(pol.master, logits)), labels)
    return value, xp.astype(d * scale if scale != 1.0 else d, dtype_named(pol.compute, logits))


def nonfinite(grads) -> bool:
    """Whether any of ``grads`` holds an inf or a nan (an fp16 overflow, scaled)."""
    return any(not bool(namespace(g).all(namespace(g).isfinite(g))) for g in grads)
