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
from ..memory import WEIGHT_DTYPES
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
    peaks: dict = field(default_factory=dict)  # dense matmul FLOP/s per dtype ("bf16", "fp8", ...); {}: peak_flops for all
    ops: dict = field(default_factory=dict)  # this machine: the model's own operations timed on k ranks (machine.measure_ops)

    def matmul_peak(self, dtype: str | None) -> float:
        """Dense FLOP/s of the matmuls in ``dtype`` (None: ``peak_flops``, the 16-bit rate MFU is
        counted against). A dtype the hardware has no rate for is refused."""
        if dtype is None or not self.peaks:
            return self.peak_flops
        if dtype not in self.peaks:
            raise UsageError(f"--precision {dtype}: {self.name} has no {dtype} matmul rate "
                             f"(it has {', '.join(self.peaks)})")
        return self.peaks[dtype]

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


# Dense (no 2:4 sparsity) tensor-core FLOP/s per dtype; "fp32" is TF32 on tensor cores, what
# fp32 training uses once torch.backends.cuda.matmul.allow_tf32 is on (plain FP32: 19.5 / 67 TFLOP/s).
_A100 = dict(peak_flops=312e12, gpus_per_node=8, intra=LINKS["nvlink"], inter=LINKS["infiniband"],
             host=LINKS["pcie"], host_bandwidth=409.6e9 / 8,
             peaks={"bf16": 312e12, "fp16": 312e12, "fp32": 156e12})
_A100_SOURCES = {
    "peak_flops": "312 TFLOP/s dense BF16/FP16 tensor core, 156 TF32, no FP8 (NVIDIA A100 data sheet)",
    "memory_bytes": "HBM capacity as nvidia-smi reports it (40960 / 81920 MiB)",
    "hbm_bandwidth": "1555 GB/s (40GB) / 2039 GB/s (80GB) (NVIDIA A100 data sheet)",
    "host_bandwidth": "DGX A100: 2 EPYC 7742 x 8 channels DDR4-3200 = 409.6 GB/s per node, / 8 GPUs",
    "matmul_fraction": "Korthikanti et al. 2022 Table 4 (see MATMUL_FRACTION)",
    "link_fraction": "ring all-reduce bus bandwidth / NVLink spec (see LINK_FRACTION)",
}
_HOPPER = dict(peak_flops=989e12, gpus_per_node=8, intra=LINKS["nvlink4"], inter=LINKS["infiniband-ndr"],
               host=Link("pcie5", 5e-6, 64e9, "PCIe 5.0 x16: 32 GT/s x 16 lanes = 64 GB/s per direction (PCI-SIG)"),
               host_bandwidth=2 * 307.2e9 / 8, peaks={"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 494.5e12})
_HOPPER_SOURCES = {
    "peak_flops": "989 TFLOP/s dense BF16/FP16, 1979 FP8, 494.5 TF32 (NVIDIA H100 SXM data sheet: 1979 / 3958 / "
                  "989 'with sparsity', halved; the H200 data sheet lists the same figures)",
    "intra": "NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction (H100 / H200 SXM data sheets)",
    "inter": "one ConnectX-7 NDR 400 Gb/s port per GPU (DGX H100 / DGX H200 data sheets)",
    "host_bandwidth": "DGX H100: 2 Xeon 8480C x 8 channels DDR5-4800 = 614 GB/s per node, / 8 GPUs",
    "matmul_fraction": "no published per-layer Hopper timing found: A100's share assumed",
    "link_fraction": "measured on NVLink 4 (see LINK_FRACTION)"}
# DGX B200 data sheet: 8 GPUs, "72 PFLOPS training" (FP8, with sparsity) = 4.5 PFLOP/s dense FP8 per GPU
# = 2.25 PFLOP/s dense BF16; 1440 GB HBM3e and 64 TB/s in all = 180 GB and 8 TB/s per GPU; NVLink 5
# "14.4 TB/s aggregate" = 1.8 TB/s per GPU bidirectional = 900 GB/s per direction; 8 ConnectX-7 400 Gb/s.
_NVLINK5 = Link("nvlink5", 3e-6, 900e9, "NVLink 5 (B200): 1.8 TB/s bidirectional per GPU (NVIDIA DGX B200 data sheet); "
                "alpha as for NVLink 3")

PRESETS = {
    "a100-40gb": Hardware("a100-40gb", memory_bytes=40 * GiB, hbm_bandwidth=1555e9, sources=_A100_SOURCES, **_A100),
    "a100-80gb": Hardware("a100-80gb", memory_bytes=80 * GiB, hbm_bandwidth=2039e9, sources=_A100_SOURCES, **_A100),
    "h100-80gb": Hardware(
        "h100-80gb", memory_bytes=80 * GiB, hbm_bandwidth=3350e9, **_HOPPER,
        sources={**_HOPPER_SOURCES, "memory_bytes": "80 GB HBM3 (81559 MiB per nvidia-smi; we count 80 GiB)",
                 "hbm_bandwidth": "3.35 TB/s (H100 SXM data sheet)"}),
    "h200": Hardware(
        "h200", memory_bytes=141e9, hbm_bandwidth=4.8e12, **_HOPPER,
        sources={**_HOPPER_SOURCES, "memory_bytes": "141 GB HBM3e (NVIDIA H200 data sheet)",
                 "hbm_bandwidth": "4.8 TB/s (NVIDIA H200 data sheet)"}),
    "b200": Hardware(
        "b200", peak_flops=2.25e15, memory_bytes=180e9, hbm_bandwidth=8e12, gpus_per_node=8, intra=_NVLINK5,
        inter=LINKS["infiniband-ndr"], host=_HOPPER["host"], host_bandwidth=2 * 307.2e9 / 8,
        peaks={"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "fp32": 1.125e15},
        sources={"peak_flops": "DGX B200 data sheet: 72 PFLOP/s FP8 training with sparsity over 8 GPUs = 4.5 dense "
                               "FP8, 2.25 dense BF16/FP16 per GPU; TF32 half of BF16 as on every tensor-core generation",
                 "memory_bytes": "1440 GB HBM3e / 8 GPUs (DGX B200 data sheet)",
                 "hbm_bandwidth": "64 TB/s / 8 GPUs (DGX B200 data sheet)",
                 "intra": "NVLink 5: 14.4 TB/s aggregate / 8 GPUs = 1.8 TB/s bidirectional (DGX B200 data sheet)",
                 "inter": "8 ConnectX-7 400 Gb/s, one per GPU (DGX B200 data sheet)",
                 "host_bandwidth": "2 Xeon Platinum 8570 x 8 channels DDR5-4800, / 8 GPUs",
                 "matmul_fraction": "no published per-layer Blackwell timing found: A100's share assumed",
                 "link_fraction": "measured on NVLink 4 (see LINK_FRACTION)"}),
}


def this_machine(dtype: str = "float64", path: str | None = None, record: dict | None = None) -> Hardware:
    """The preset `minipar bench machine` measured (``machine.load``, or ``record``: such a record
    already in hand, a recorded run's own): one "node" of ``cores`` cores whose ranks talk through
    shared memory. No calibration constants: rates and alpha/beta are measured, and with more ranks
    than cores (``oversubscribed``) alpha/beta measured with that many."""
    m = load(path) if record is None else record
    path = m.get("path", "the record in hand")
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
        busy=busy, dtype_bytes=size, mixed_precision=False, ops=m.get("ops", {}) if dtype == "float64" else {},
        sources={"measured": f"{path} ({m.get('when', '?')}; {m.get('command', 'minipar bench machine')})"})


# --------------------------------------------------------------------------- --hardware-file

FILE_FIELDS = {  # field: (what it is, required)
    "name": ("a label", False),
    "peak_flops": ('dense matmul FLOP/s per GPU by dtype, e.g. {"bf16": 989e12, "fp8": 1979e12}', True),
    "memory_bytes": ("HBM bytes per GPU", True),
    "hbm_bandwidth": ("HBM bytes/s per GPU", True),
    "gpus_per_node": ("GPUs per node", True),
    "intra": ('{"bandwidth": bytes/s per direction, "latency": seconds}: the link inside a node', True),
    "inter": ('{"bandwidth": ..., "latency": ...}: the link between nodes, per GPU', True),
    "host": ('{"bandwidth": ..., "latency": ...}: GPU <-> host (offload; default PCIe 5)', False),
    "host_bandwidth": ("host memory bytes/s per GPU (CPU Adam under offload; default 77 GB/s)", False),
    "matmul_fraction": (f"share of the peak a large matmul reaches (default {MATMUL_FRACTION})", False),
    "link_fraction": (f"share of a link's bandwidth a ring reaches (default {LINK_FRACTION})", False),
}


def _positive(path, key, v, integer=False):
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not v > 0 or v != v or v == float("inf"):
        raise UsageError(f"{path}: {key} must be a positive {'integer' if integer else 'number'}, got {v!r}")
    return v


def _link(path, key, v) -> Link:
    if not isinstance(v, dict) or set(v) != {"bandwidth", "latency"}:
        raise UsageError(f"{path}: {key} must be a table with bandwidth (bytes/s) and latency (s), got {v!r}")
    lat = v["latency"]
    if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not 0 <= lat < float("inf"):
        raise UsageError(f"{path}: {key}.latency must be a number of seconds >= 0, got {lat!r}")
    return Link(key, float(lat), float(_positive(path, f"{key}.bandwidth", v["bandwidth"])), f"{path}: {key}")


def hardware_from_dict(d: dict, path: str = "hardware file") -> Hardware:
    """A user's cluster (``FILE_FIELDS``), every field checked: one line naming the bad one."""
    if not isinstance(d, dict):
        raise UsageError(f"{path}: expected a table of fields ({', '.join(FILE_FIELDS)})")
    unknown = [k for k in d if k not in FILE_FIELDS]
    if unknown:
        raise UsageError(f"{path}: unknown field {unknown[0]!r}: the fields are {', '.join(FILE_FIELDS)}")
    missing = [k for k, (_, req) in FILE_FIELDS.items() if req and k not in d]
    if missing:
        raise UsageError(f"{path}: missing field {missing[0]!r} ({FILE_FIELDS[missing[0]][0]})")
    peaks = d["peak_flops"]
    if not isinstance(peaks, dict) or not peaks:
        raise UsageError(f"{path}: peak_flops must be a table of dtype = FLOP/s, e.g. bf16 = 989e12, got {peaks!r}")
    for k, v in peaks.items():
        if k not in WEIGHT_DTYPES:
            raise UsageError(f"{path}: peak_flops.{k}: the dtypes are {', '.join(WEIGHT_DTYPES)}")
        _positive(path, f"peak_flops.{k}", v)
    base = peaks.get("bf16", peaks.get("fp16"))
    if base is None:
        raise UsageError(f"{path}: peak_flops needs bf16 or fp16 (the rate MFU is counted against)")
    for k in ("matmul_fraction", "link_fraction"):
        if k in d and not (_positive(path, k, d[k]) <= 1):
            raise UsageError(f"{path}: {k} must be in (0, 1], got {d[k]!r}")
    name = d.get("name", path)
    if not isinstance(name, str):
        raise UsageError(f"{path}: name must be a string, got {name!r}")
    return Hardware(
        name, peak_flops=float(base), memory_bytes=float(_positive(path, "memory_bytes", d["memory_bytes"])),
        hbm_bandwidth=float(_positive(path, "hbm_bandwidth", d["hbm_bandwidth"])),
        gpus_per_node=_positive(path, "gpus_per_node", d["gpus_per_node"], integer=True),
        intra=_link(path, "intra", d["intra"]), inter=_link(path, "inter", d["inter"]),
        host=_link(path, "host", d["host"]) if "host" in d else _HOPPER["host"],
        host_bandwidth=float(_positive(path, "host_bandwidth", d.get("host_bandwidth", _HOPPER["host_bandwidth"]))),
        matmul_fraction=float(d.get("matmul_fraction", MATMUL_FRACTION)),
        link_fraction=float(d.get("link_fraction", LINK_FRACTION)),
        peaks={k: float(v) for k, v in peaks.items()}, sources={"file": path})


def hardware_file(path: str) -> Hardware:
    """``--hardware-file PATH``: JSON, or TOML when the name ends in .toml."""
    import json
    import tomllib
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise UsageError(f"--hardware-file {path}: {err.strerror}") from None
    try:
        d = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        kind = "TOML" if path.endswith(".toml") else "JSON"
        raise UsageError(f"--hardware-file {path}: not valid {kind}: {str(err).splitlines()[0]}") from None
    return hardware_from_dict(d, path)


def preset(name: str, dtype: str = "float64") -> Hardware:
    if name == "this-machine":
        return this_machine(dtype)
    if name not in PRESETS:
        raise UsageError(f"hardware={name!r}: choose one of {', '.join([*PRESETS, 'this-machine'])}")
    return PRESETS[name]


PRESET_NAMES = (*PRESETS, "this-machine")
