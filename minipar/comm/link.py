"""A link you can feel: every message also pays a slower interconnect's alpha + n * beta.

    MINIPAR_LINK=pcie minipar run -n 2 data_parallel          # or: minipar --link pcie run ...
    MINIPAR_LINK=ethernet MINIPAR_LINK_SLOWDOWN=100 ...          # that link, 100x slower still

The message still travels for real (shared memory, MPI or gloo); on top of that, the rank waits
as long as the named link would take to carry it: ``alpha + n / bandwidth`` for n bytes
(``LINKS``: NVLink, PCIe, InfiniBand, Ethernet). A delay of real messages, never a replacement.

- ``send``/``recv``/``sendrecv`` (blocking): the delay follows the real transfer, on both ends
  (a sendrecv pays for the larger of its two messages: the link is full duplex);
- ``isend``/``irecv``: the link time runs from the post; what the rank computed before calling
  ``wait`` hides part of it (DDP's overlap still overlaps), the rest is paid after the real
  transfer completes. A request waited on at once pays it all, as a blocking call does.

Sleeping is coarse (a 3 us sleep takes ~60 us on Linux), so delays are paid in quanta: what a
message owes is added to the rank's debt, the rank sleeps once the debt reaches ``QUANTUM``, and
oversleeping is credited. Over many messages the total delay is the sum of their alpha + n beta,
to within one quantum; a single short message may pass early. The engines' own collectives
(``comm.builtin``, the references) are not delayed.

``install(comm)`` is the one hook in ``Comm.__init__``: with no MINIPAR_LINK it does nothing.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .. import xp

ENV, SLOWDOWN_ENV = "MINIPAR_LINK", "MINIPAR_LINK_SLOWDOWN"
QUANTUM = 5e-4  # seconds of owed delay before a rank sleeps


@dataclass(frozen=True)
class Link:
    """A message of n bytes costs ``alpha + n / (bandwidth * fraction)`` seconds."""

    name: str
    alpha: float  # seconds per message
    bandwidth: float  # bytes/s per direction, nominal
    source: str = ""

    def beta(self, fraction: float = 1.0) -> float:
        """Seconds per byte at ``fraction`` of the nominal bandwidth."""
        return 1.0 / (self.bandwidth * fraction)

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.bandwidth

    def scaled(self, slowdown: float) -> "Link":
        """The link ``slowdown`` times slower (alpha and beta both stretched)."""
        return Link(self.name, self.alpha * slowdown, self.bandwidth / slowdown, self.source)

    def plus(self, other: "Link") -> "Link":
        """This link with ``other``'s delay added to every message (what emulation does)."""
        beta = 1.0 / self.bandwidth + 1.0 / other.bandwidth
        return Link(f"{self.name}+{other.name}", self.alpha + other.alpha, 1.0 / beta, self.source)


# Alphas are orders of magnitude: they matter only for messages below ~100 KB.
LINKS = {
    "nvlink": Link("nvlink", 3e-6, 300e9,
                   "NVLink 3 (A100): 12 links x 25 GB/s per direction = 300 GB/s (NVIDIA A100 data sheet); "
                   "alpha: a 32 KiB all-reduce over 8 GPUs takes ~40 us = 14 ring steps of ~3 us "
                   "(stas00/ml-engineering, network/benchmarks/results/all-reduce-8xH200.md)"),
    "nvlink4": Link("nvlink4", 3e-6, 450e9,
                    "NVLink 4 (H100 SXM): 18 links x 25 GB/s per direction = 450 GB/s (NVIDIA H100 data sheet); "
                    "alpha as for NVLink 3"),
    "pcie": Link("pcie", 5e-6, 32e9,
                 "PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction (PCI-SIG); "
                 "what GPUs without NVLink use (NCCL_P2P_DISABLE=1 in the Hugging Face guide's DDP benchmark)"),
    "infiniband": Link("infiniband", 5e-6, 25e9,
                       "HDR InfiniBand, 200 Gb/s = 25 GB/s per port; a DGX A100 has one port per GPU "
                       "(NVIDIA DGX A100 user guide; Narayanan et al. 2021, sec. 5)"),
    "infiniband-ndr": Link("infiniband-ndr", 5e-6, 50e9,
                           "NDR InfiniBand, 400 Gb/s = 50 GB/s per port, one per GPU in a DGX H100"),
    "ethernet": Link("ethernet", 50e-6, 1.25e9,
                     "10 Gigabit Ethernet = 1.25 GB/s; alpha ~50 us for a TCP message between hosts"),
}


def from_env(environ=None) -> Link | None:
    """The emulated link MINIPAR_LINK names (stretched by MINIPAR_LINK_SLOWDOWN), or None."""
    env = os.environ if environ is None else environ
    name = env.get(ENV, "").strip()
    if not name or name == "none":
        return None
    if name not in LINKS:
        raise ValueError(f"{ENV}={name!r}: choose one of {', '.join(LINKS)} (or unset it)")
    try:
        slowdown = float(env.get(SLOWDOWN_ENV, "1") or 1)
    except ValueError:
        raise ValueError(f"{SLOWDOWN_ENV}={env.get(SLOWDOWN_ENV)!r} must be a number > 0") from None
    if slowdown <= 0:
        raise ValueError(f"{SLOWDOWN_ENV}={slowdown!r} must be a number > 0")
    return LINKS[name].scaled(slowdown)


class Delay:
    """One rank's owed link time, paid in sleeps of at least QUANTUM."""

    def __init__(self, link: Link):
        self.link, self.debt, self.paid, self.owed = link, 0.0, 0.0, 0.0

    def charge(self, seconds: float):
        self.debt += seconds
        self.owed += seconds
        if self.debt >= QUANTUM:
            t0 = time.perf_counter()
            time.sleep(self.debt)
            slept = time.perf_counter() - t0
            self.paid += slept
            self.debt -= slept  # oversleeping is credited to the next messages

    def message(self, nbytes: float):
        self.charge(self.link.time(nbytes))

    def after(self, hidden: float, nbytes: float):
        """A non-blocking message: owe its link time minus the ``hidden`` seconds the rank spent
        between posting it and waiting for it."""
        self.charge(max(0.0, self.link.time(nbytes) - hidden))


def install(comm) -> None:
    """Wrap ``comm``'s point-to-point primitives so each message also pays the emulated link."""
    lk = from_env()
    if lk is None:
        return
    d = comm.link_delay = Delay(lk)
    send, recv, sendrecv, isend, irecv = comm._send, comm._recv, comm._sendrecv, comm._isend, comm._irecv

    def _send(x, dst, tag):
        send(x, dst, tag)
        d.message(xp.nbytes(x))

    def _recv(buf, src, tag):
        out = recv(buf, src, tag)
        d.message(xp.nbytes(buf))
        return out

    def _sendrecv(x, dst, buf, src, sendtag, recvtag):
        out = sendrecv(x, dst, buf, src, sendtag, recvtag)
        d.message(max(xp.nbytes(x), xp.nbytes(buf)))
        return out

    def nonblocking(start):
        def post(arr, peer, tag):
            t0, n = time.perf_counter(), xp.nbytes(arr)
            wait, test = start(arr, peer, tag)

            def wait_delayed():
                hidden = time.perf_counter() - t0
                out = wait()
                d.after(hidden, n)
                return out

            def test_delayed():  # done once the real transfer is and the link time has passed since the post
                return bool(test()) and time.perf_counter() >= t0 + lk.time(n)

            return wait_delayed, test_delayed
        return post

    comm._send, comm._recv, comm._sendrecv = _send, _recv, _sendrecv
    comm._isend, comm._irecv = nonblocking(isend), nonblocking(irecv)
