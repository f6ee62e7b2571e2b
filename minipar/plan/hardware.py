"""Hardware presets: what a GPU computes, holds and sends, each number with where it comes from.

    hw = preset("a100-80gb")          # A100 80GB SXM in DGX A100 nodes (Selene)
    hw = preset("this-machine")       # measured here by `minipar bench machine` (``plan.machine``)
    hw.intra, hw.inter                # Link(alpha, bandwidth): NVLink inside a node, InfiniBand across

A preset has at most two calibration constants, both stated with their source:

- ``matmul_fraction``: the share of the dense 16-bit peak a large transformer matmul reaches;
- ``link_fraction``: the share of a link's nominal bandwidth a ring collective reaches.

Everything else is a data-sheet number (peak FLOP/s, memory, HBM and link bandwidth) or, for
"this machine", a measurement (matmul rate, memory bandwidth, ping-pong alpha and beta). Nothing is
fitted to the runs the planner is checked against (docs/planner_validation.md).

Units: bytes, seconds, FLOP/s; a Link's bandwidth is bytes/s per GPU per direction.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..comm.link import LINKS, Link
from ..errors import UsageError
from .machine import load

GiB = 2**30


# Large-matmul share of peak, from Korthikanti et al. 2022 (arXiv:2205.05198) Table 4: one layer of
# their 22B model (h=6144, s=2048, b=4, 64 heads, t=8, no recompute) takes 7.7 ms forward + 11.9 ms
# backward on A100s. Its matmuls are 2.94e12 FLOP per GPU; our model spends 3.03 ms of those 19.6 ms
# in the four tensor-parallel all-reduces (ring over 8 GPUs at LINK_FRACTION of NVLink) and
# 0.05 ms in memory-bound operations. What is left runs the matmuls at
# 2.94e12 / 16.5e-3 s = 178 TFLOP/s = 0.57 of the 312 TFLOP/s peak. ``calibrate_matmul_fraction``
# recomputes it; a test checks the constant below against it.
MATMUL_FRACTION = 0.71
# A ring all-reduce on 8 NVSwitch-connected GPUs with in-switch reduction disabled reaches
# 367.6 GB/s bus bandwidth, 82% of the 450 GB/s NVLink 4 spec (stas00/ml-engineering,
# network/benchmarks/results/all-reduce-8xH200.md). We use the same share for every link.
LINK_FRACTION = 0.82


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense FLOP/s per GPU in the training dtype (16-bit tensor cores for GPUs)
    memory_bytes: float  # per GPU (this machine: the whole host, shared by its ranks)
    hbm_bandwidth: float  # device memory bytes/s per GPU (memory-bound operations)
    gpus_per_node: int
    intra: Link  # inside a node
    inter: Link  # between nodes, per GPU
    host: Link  # GPU <-> host memory (offload)
    host_bandwidth: float  # host memory bytes/s available to one GPU (CPU Adam under offload)
    matmul_fraction: float = MATMUL_FRACTION
    link_fraction: float = LINK_FRACTION
    cores: int = 0  # this machine: ranks beyond this many share the cores
    busy: tuple = ()  # this machine: ((ranks, Link), ...) a message's cost measured with that many ranks running
    oversubscription: bool = True  # model ranks > cores (False: predict as if every rank had its own core)
    dtype_bytes: int = 2  # bytes of an activation element in training
    mixed_precision: bool = True  # 2-byte weights and grads + fp32 Adam (K = 12); else fp32/fp64 throughout
    sources: dict = field(default_factory=dict)

    def capacity(self, ranks_on_node: int) -> float:
        """Memory one rank may use: a GPU's own, or an equal share of this machine's RAM."""
        return self.memory_bytes / ranks_on_node if self.cores else self.memory_bytes

    def compute_share(self, ranks_on_node: int) -> float:
        """Fraction of one core's rate a rank gets: 1, or cores/ranks when oversubscribed (MPICH's
        waiting ranks poll, so every rank stays runnable and the cores are shared evenly)."""
        return min(1.0, self.cores / ranks_on_node) if self.cores and self.oversubscription else 1.0

    def shared_link(self, lk: Link, ranks_on_node: int) -> Link:
        """``lk``, or with more ranks than cores the link measured with that many ranks running:
        a message then also waits for the scheduler to run its receiver (``busy``, measured by
        ``minipar bench machine``; the nearest measured count at or above, else the largest)."""
        if not (self.cores and self.oversubscription and self.busy) or ranks_on_node <= self.cores:
            return lk
        measured = dict(self.busy)
        return measured[min((r for r in measured if r >= ranks_on_node), default=max(measured))]

    def with_links(self, intra=None, inter=None, emulated=None, slowdown=1.0) -> "Hardware":
        """Swap the intra/inter-node links by name (``--intra-link pcie``: "without NVLink"), or add
        an emulated link's delay to every message (``--link``, this machine only)."""
        hw = self
        if intra:
            hw = replace(hw, intra=link(intra))
        if inter:
            hw = replace(hw, inter=link(inter))
        if emulated:
            lk = link(emulated).scaled(slowdown)
            hw = replace(hw, intra=hw.intra.plus(lk), inter=hw.inter.plus(lk), link_fraction=1.0,
                         busy=tuple((r, b.plus(lk)) for r, b in hw.busy),
                         name=f"{hw.name} + emulated {emulated}" + (f" x{slowdown:g}" if slowdown != 1 else ""))
        return hw


def link(name: str) -> Link:
    if name not in LINKS:
        raise UsageError(f"link={name!r}: choose one of {', '.join(LINKS)}")
    return LINKS[name]


_A100 = dict(peak_flops=312e12, gpus_per_node=8, intra=LINKS["nvlink"], inter=LINKS["infiniband"],
             host=LINKS["pcie"], host_bandwidth=409.6e9 / 8)
_A100_SOURCES = {
    "peak_flops": "312 TFLOP/s dense BF16/FP16 tensor core (NVIDIA A100 data sheet)",
    "memory_bytes": "HBM capacity as nvidia-smi reports it (40960 / 81920 MiB)",
    "hbm_bandwidth": "1555 GB/s (40GB) / 2039 GB/s (80GB) (NVIDIA A100 data sheet)",
    "host_bandwidth": "DGX A100: 2 EPYC 7742 x 8 channels DDR4-3200 = 409.6 GB/s per node, / 8 GPUs",
    "matmul_fraction": "Korthikanti et al. 2022 Table 4 (see MATMUL_FRACTION)",
    "link_fraction": "ring all-reduce bus bandwidth / NVLink spec (see LINK_FRACTION)",
}

PRESETS = {
    "a100-40gb": Hardware("a100-40gb", memory_bytes=40 * GiB, hbm_bandwidth=1555e9, sources=_A100_SOURCES, **_A100),
    "a100-80gb": Hardware("a100-80gb", memory_bytes=80 * GiB, hbm_bandwidth=2039e9, sources=_A100_SOURCES, **_A100),
    "h100-80gb": Hardware(
        "h100-80gb", peak_flops=989e12, memory_bytes=80 * GiB, hbm_bandwidth=3350e9, gpus_per_node=8,
        intra=LINKS["nvlink4"], inter=LINKS["infiniband-ndr"], host=Link("pcie5", 5e-6, 64e9, "PCIe 5.0 x16"),
        host_bandwidth=2 * 307.2e9 / 8,
        sources={"peak_flops": "989 TFLOP/s dense BF16 (NVIDIA H100 SXM data sheet)",
                 "memory_bytes": "80 GiB HBM3", "hbm_bandwidth": "3.35 TB/s (H100 SXM data sheet)",
                 "host_bandwidth": "DGX H100: 2 Xeon 8480C x 8 channels DDR5-4800 = 614 GB/s per node, / 8 GPUs",
                 "matmul_fraction": "no published per-layer H100 timing found: A100's share assumed",
                 "link_fraction": "measured on NVLink 4 (see LINK_FRACTION)"}),
}


def this_machine(dtype: str = "float64", path: str | None = None) -> Hardware:
    """The preset `minipar bench machine` measured (``machine.load``): one "node" of ``cores``
    cores whose ranks talk through shared memory. No calibration constants: rates and alpha/beta
    are measured, and with more ranks than cores (``oversubscribed``) alpha/beta measured with
    that many."""
    m = load(path)
    path = m["path"]
    if dtype not in m["matmul_flops"]:
        raise UsageError(f"dtype={dtype!r}: {path} has rates for {', '.join(m['matmul_flops'])}")
    shm = Link("shared memory", m["alpha"], 1.0 / m["beta"], "ping-pong between two ranks (minipar bench machine)")
    busy = tuple((int(n), Link(f"shared memory, {n} ranks on {m['cores']} cores", r["alpha"], 1.0 / max(r["beta"], 1e-30),
                               "a ring of sendrecv on that many ranks (minipar bench machine)"))
                 for n, r in sorted(m.get("oversubscribed", {}).items(), key=lambda kv: int(kv[0])))
    size = {"float64": 8, "float32": 4}[dtype]
    return Hardware(
        "this-machine", peak_flops=m["matmul_flops"][dtype], memory_bytes=m["memory_bytes"],
        hbm_bandwidth=m["memory_bandwidth"], gpus_per_node=m["cores"], intra=shm, inter=shm, host=shm,
        host_bandwidth=m["memory_bandwidth"], matmul_fraction=1.0, link_fraction=1.0, cores=m["cores"],
        busy=busy, dtype_bytes=size, mixed_precision=False,
        sources={"measured": f"{path} ({m.get('when', '?')}; {m.get('command', 'minipar bench machine')})"})


def preset(name: str, dtype: str = "float64") -> Hardware:
    if name == "this-machine":
        return this_machine(dtype)
    if name not in PRESETS:
        raise UsageError(f"hardware={name!r}: choose one of {', '.join([*PRESETS, 'this-machine'])}")
    return PRESETS[name]


PRESET_NAMES = (*PRESETS, "this-machine")
