"""Which communicator an engine talks through, what it says once, and the bytes its rings send.

Every engine of ``minipar.torch`` takes ``comm=None``. Then it talks through

1. the world communicator of ``minipar.init("torch")``, when the script made one; else
2. a communicator over torch.distributed's default group, which the script initialised itself
   (``dist.init_process_group("gloo")`` under torchrun or ``mp.spawn``), built on first use
   (``minipar.comm.torch_backend.default_group_comm``).

Either way every message goes through minipar's own collectives (``minipar.collectives``): the
communicator's tracer sees each one (``comm.tracer.enabled = True``), with its bytes.

Bytes of a ring (``collectives.ring_steps``) over n elements cut in chunks c_0 ... c_{p-1}:
in the reduce-scatter rank r sends every chunk but its own (n - c_r), in the all-gather every
chunk but its right neighbour's (n - c_{r+1}). Equal chunks: (p-1)/p n each, 2 (p-1)/p n for an
all-reduce.
"""
from __future__ import annotations

import sys

import torch

from ..errors import UsageError
from ..xp import chunk_bounds

_SAID: set = set()  # what has been said once in this process


def communicator(comm=None, like=None, what="this engine"):
    """``comm``, else minipar's torch world, else one over the default process group (on the
    device of tensor ``like``). A UsageError when there is none, or ``comm`` is not a torch one."""
    if comm is not None:
        if getattr(comm, "backend", None) != "torch":
            raise UsageError(f"{what}: comm={comm!r} is not a torch communicator; pass one from "
                             f"minipar.init('torch'), or none (the default process group)")
        return comm
    from ..comm import _WORLD
    from ..comm.torch_backend import default_group_comm

    device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
    world = _WORLD.get(("torch", device.type))
    return world if world is not None else default_group_comm(device)


def say_once(comm, what: str):
    """World size 1 is allowed: say once (rank 0, per engine) that the engine sends nothing."""
    if comm.size == 1 and what not in _SAID:
        _SAID.add(what)
        sys.stderr.write(f"minipar.torch: world size 1: {what} sends nothing (a no-op)\n")


def unique_params(module, trainable=True):
    """The parameters of ``module``, each once (a tied weight is one parameter), in registration
    order; only those that require a gradient unless ``trainable=False``."""
    seen, out = set(), []
    for p in module.parameters():
        if id(p) not in seen and (p.requires_grad or not trainable):
            seen.add(id(p))
            out.append(p)
    return out


def need_params(module, what):
    """The trainable parameters of ``module``; a UsageError naming ``what`` when there are none."""
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{what}: expected a torch.nn.Module, got {type(module).__name__}")
    if not any(True for _ in module.parameters()):
        raise UsageError(f"{what}: the module {type(module).__name__} has no parameters: nothing to train")
    params = unique_params(module)
    if not params:
        raise UsageError(f"{what}: no parameter of {type(module).__name__} requires a gradient: nothing to train")
    return params


def ring_bytes(n: int, p: int, r: int, itemsize: int, phases=("reduce-scatter", "all-gather"), sizes=None) -> int:
    """Bytes rank r sends in minipar's ring over n elements (``sizes``: the chunks, default the
    ``chunk_bounds`` rule). ``phases``: the ones run (an all-reduce runs both)."""
    if p == 1:
        return 0
    sizes = [b - a for a, b in chunk_bounds(n, p)] if sizes is None else list(sizes)
    out = 0
    if "reduce-scatter" in phases:
        out += sum(sizes) - sizes[r]
    if "all-gather" in phases:
        out += sum(sizes) - sizes[(r + 1) % p]
    return out * itemsize


def broadcast_state(comm, module):
    """Every parameter and buffer of ``module`` from rank 0 (one tree broadcast per dtype and
    device, through ``collectives.broadcast``): every replica starts from the same weights."""
    from ..collectives import broadcast

    if comm.size == 1:
        return
    tensors = unique_params(module, trainable=False) + [b for b in module.buffers()]
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for (dtype, device), ts in sorted(groups.items(), key=lambda kv: str(kv[0])):
            flat = torch.cat([t.detach().reshape(-1) for t in ts])  # (sum of numels,)
            broadcast(comm, flat, 0)
            at = 0
            for t in ts:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()
