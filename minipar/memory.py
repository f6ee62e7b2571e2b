"""Memory per rank of data-parallel training: the ZeRO formulas, and a ledger that measures.

    minipar memory --params 7.5e9 --dp 64 --stage 3          # the ZeRO paper's example: 1.9 GB
    minipar memory --params 1e9 --dp 1 --stage 0 --precision fp32 --json out.json

Training keeps, per parameter (Psi parameters, N data-parallel ranks):

    weights   2 bytes (float16 working copy)           \
    gradients 2 bytes                                   } mixed-precision Adam: 2 + 2 + K
    optimizer K = 12 bytes (fp32 master, m, v)          /

Storing a model keeps only the weights (4 bytes per parameter in fp32): 1B parameters are 4 GB
on disk but 16 GB to train with Adam, before a single activation. ZeRO removes the redundancy of
data parallelism, where every rank holds all of it:

    stage 0 (DDP)  (2 + 2 + K) Psi
    stage 1        2 Psi + 2 Psi + K Psi / N          optimizer state sharded
    stage 2        2 Psi + (2 + K) Psi / N            + gradients sharded
    stage 3        (2 + 2 + K) Psi / N                + parameters sharded

Activations are not in these numbers: they grow with batch and sequence length, not with N.
``zero_with_pipeline``: the same stages beside a pipeline of m micro-batches, with the DP traffic
each one costs per step.

``Ledger`` measures the same three quantities on real ranks (and what is offloaded: ``host``
bytes in CPU memory, ``file`` bytes in memory-mapped files on disk): the bytes of the arrays a rank
actually holds (weakly referenced, so an array kept alive by accident is counted), peak over
the step. ``zero_bytes(..., pad=, gathered=, unit_grad=)`` adds the terms a real run has on top
of the formula: padding, and the layer(s) gathered or whose full gradient is alive at the peak.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from .errors import UsageError

GB = 1e9
CATEGORIES = ("params", "grads", "optimizer")

# (working param bytes, gradient bytes, optimizer bytes K) per parameter
BYTES = {
    ("adam", "mixed"): (2, 2, 12),  # fp16 weights + fp16 grads; fp32 master, m, v
    ("adam", "fp32"): (4, 4, 8),  # fp32 weights + grads; m, v
    ("sgd", "mixed"): (2, 2, 8),  # SGD with momentum: fp32 master + momentum
    ("sgd", "fp32"): (4, 4, 4),  # momentum
}

# Megatron-LM's convention (its "Distributed Optimizer" guide): the optimizer keeps an fp32 main
# copy of 16-bit weights, and of 16-bit gradients too (the ZeRO paper's K = 12 does not count that
# one); with fp32 gradients (Megatron's default for bf16) the gradient buffer is itself the main
# gradient. Its "distributed optimizer" shards the optimizer's part over the d data-parallel ranks:
# ZeRO-1 with these bytes.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# FP8 training (NVIDIA Transformer Engine, Megatron's --fp8-format) casts to fp8 inside the matmuls
# only: the weights are kept in bf16 with their fp32 main copy, so fp8 changes the matmul rate, not
# the bytes per parameter.
STORED_AS = {"fp8": "bf16"}
# the weights' dtypes the planner prices (the precisions a run computes in: ``mixed_precision.PRECISIONS``)
WEIGHT_DTYPES = (*DTYPE_BYTES, *STORED_AS)


@dataclass(frozen=True)
class Precision:
    """The dtypes of weights and gradients, and the bytes per parameter they cost with Adam.

        Precision("bf16").bytes        # (2, 4, 12): bf16 weights, fp32 main grads, fp32 master + m + v = 18
        Precision("bf16", "bf16").bytes  # (2, 2, 16): + an fp32 copy of the gradients = 20
        Precision("fp32").bytes        # (4, 4, 8): no master copy = 16
        Precision("fp8").bytes         # (2, 4, 12): as bf16; only the matmuls run in fp8
    """

    params: str = "bf16"
    grads: str = "fp32"

    def __post_init__(self):
        if self.params not in WEIGHT_DTYPES:
            raise UsageError(f"params dtype {self.params!r}: choose one of {', '.join(WEIGHT_DTYPES)}")
        if self.grads not in DTYPE_BYTES:
            raise UsageError(f"grads dtype {self.grads!r}: choose one of {', '.join(DTYPE_BYTES)}")
        if self.grads != "fp32" and self.grads != self.stored:
            raise UsageError(f"gradients in {self.grads} with {self.params} weights: they are kept in the "
                             f"weights' dtype or in fp32")

    @property
    def stored(self) -> str:
        """The dtype the weights are kept in (fp8: bf16)."""
        return STORED_AS.get(self.params, self.params)

    @property
    def bytes(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer K) bytes per parameter, zero_bytes' arguments."""
        bp, bg = DTYPE_BYTES[self.stored], DTYPE_BYTES[self.grads]
        master = 4 if bp < 4 else 0  # fp32 main weights beside 16-bit ones
        main_grad = 4 if bg < 4 else 0  # fp32 main gradients beside 16-bit ones
        return bp, bg, master + main_grad + 8  # + Adam's m and v in fp32


def precision_table() -> list[str]:
    """Markdown rows: bytes per parameter per precision, without and with the distributed
    optimizer (``zero_bytes`` at stage 0 and 1 with d ranks), as docs/planner.md prints them."""
    rows = ["| weights | gradients | bytes per parameter | distributed optimizer |", "|---|---|---|---|"]
    bp, bg, k = BYTES[("adam", "mixed")]
    rows.append(f"| 16-bit (default: the ZeRO paper's K) | 16-bit | {bp} + {bg} + {k} = {bp + bg + k} | {bp + bg} + {k}/d |")
    for params, grads in (("fp16", "fp16"), ("bf16", "bf16"), ("fp16", "fp32"), ("bf16", "fp32"), ("fp8", "fp32"),
                          ("fp32", "fp32")):
        bp, bg, k = Precision(params, grads).bytes
        rows.append(f"| {params} | {grads} | {bp} + {bg} + {k} = {bp + bg + k} | {bp + bg} + {k}/d |")
    return rows


def zero_bytes(psi, n, stage, bytes_param=2, bytes_grad=2, k=12, offload=False,
               pad=0, gathered=0, unit_grad=0) -> dict:
    """Bytes per rank of params, grads and optimizer state for ZeRO ``stage`` (0 = plain DDP).

    psi parameters, n ranks. Extras (in elements, 0 for the paper's formula): ``pad`` padding
    elements added to make every layer divisible by n (held like parameters), ``gathered``
    elements of full layers gathered on top of the stage-3 shards, ``unit_grad`` elements of the
    full gradient of the layer being reduced on top of the stage-2/3 gradient shards.
    ``offload``: the optimizer state lives on the host (True or "cpu": reported as ``host_bytes``)
    or in a file ("nvme" or an ``NVMe`` store: ``file_bytes``).
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage={stage!r}: choose 0 (DDP), 1, 2 or 3")
    p = psi + pad
    params = bytes_param * (p if stage < 3 else p / n + gathered)
    grads = bytes_grad * (p if stage < 2 else p / n + unit_grad)
    opt = k * (p if stage == 0 else p / n)
    out = {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": 0 if offload else opt}
    out["total_bytes"] = sum(out.values())
    if offload:
        from .mixed_precision import where

        out["file_bytes" if where(offload) == "file" else "host_bytes"] = opt
    return out


def zero_with_pipeline(psi, dp, pp, tp, m, bytes_param=2, bytes_grad=2, k=12):
    """Bytes per rank of model state and of DP traffic per step, for ZeRO stages 0-3 combined with
    a pipeline of m micro-batches: why ZeRO-2 and 3 are rarely combined with a pipeline, in numbers.

    A rank holds psi / (pp tp) parameters. Its gradients are complete only after the last
    micro-batch's backward (the flush), and they are averaged over dp ranks:

        stage 0, 1  one all-reduce (ZeRO-1: reduce-scatter + all-gather): 2 (dp-1)/dp of the gradients
        stage 2     keeping only a shard of the gradients means reduce-scattering each micro-batch's
                    contribution as it is produced: m reduce-scatters + the parameters' all-gather,
                    (m + 1) (dp-1)/dp, in m small pieces on the pipeline's critical path (holding
                    the full gradient until the flush instead saves nothing)
        stage 3     the weights are gathered for every micro-batch's forward and again for its
                    backward, and its gradient reduce-scattered: 3 m (dp-1)/dp
    """
    share = psi / (pp * tp)
    unit = (dp - 1) / dp * share * bytes_grad
    traffic = {0: 2 * unit, 1: 2 * unit, 2: (m + 1) * unit, 3: 3 * m * unit}
    return [dict(stage=s, memory=zero_bytes(share, dp, s, bytes_param, bytes_grad, k)["total_bytes"],
                 dp_traffic=traffic[s], collectives_per_step={0: 1, 1: 2, 2: m + 1, 3: 3 * m}[s])
            for s in range(4)]


# ------------------------------------------------------------------------------- measuring


class Ledger:
    """The bytes of the arrays a rank holds, by category, sampled when the engine says so.

    ``track(category, array)`` remembers an array that owns its memory (a buffer, a shard, not a
    view of one) through a weak reference; ``sample()`` sums the arrays still alive. An array
    freed by the engine but kept alive elsewhere (say, by an activation context) still counts:
    that is real memory. ``track(..., name=, label=)`` also names it as a buffer of the rank
    (``minipar.trace.Buffers``, the ledger's ``buffers``): counted by kind, and in the trace.
    """

    def __init__(self, buffers=None):
        self.buffers = buffers  # a minipar.trace.Buffers (comm.tracer.buffers), or None
        self.refs = {c: {} for c in CATEGORIES + ("host", "file")}
        self.peak = {c: 0 for c in self.refs}
        self.peak_total = 0
        self.samples = 0

    def track(self, category, *arrays, name=None, label=""):
        for a in arrays:
            self.refs[category][id(a)] = (weakref.ref(a), _nbytes(a))
            if name and self.buffers is not None:
                self.buffers.hold(name, a, label)

    def now(self) -> dict:
        """Bytes per category held right now (dead references are dropped)."""
        out = {}
        for c, refs in self.refs.items():
            for key in [k for k, (r, _) in refs.items() if r() is None]:
                del refs[key]
            out[c] = sum(nb for _, nb in refs.values())
        return out

    def sample(self):
        cur = self.now()
        self.samples += 1
        for c, b in cur.items():
            self.peak[c] = max(self.peak[c], b)
        self.peak_total = max(self.peak_total, sum(cur[c] for c in CATEGORIES))

    def reset_peak(self):
        self.peak = {c: 0 for c in self.refs}
        self.peak_total = 0

    def report(self) -> dict:
        """Peak bytes per category over the samples since ``reset_peak`` (zero_bytes' keys)."""
        out = {f"{c}_bytes": self.peak[c] for c in CATEGORIES}
        out["total_bytes"] = self.peak_total
        out["host_bytes"] = self.peak["host"]
        out["file_bytes"] = self.peak["file"]  # memory-mapped files (NVMe offload)
        return out


def _nbytes(a):
    from .xp import nbytes

    return nbytes(a)


# ------------------------------------------------------------------------------- the calculator


def calculate(params, dp, stage, optimizer="adam", precision="mixed", offload=False) -> dict:
    bp, bg, k = BYTES[(optimizer, precision)]
    return zero_bytes(params, dp, stage, bp, bg, k, offload)
