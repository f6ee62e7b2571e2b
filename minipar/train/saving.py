"""Writing a checkpoint: one writer per folder, a checksum per shard, nothing half-done visible.

    with owning("ckpt/"):                  # world rank 0, for the whole run (``train`` does it)
        save(trainer, "ckpt/", step=100)   # collective: every rank writes its own shards

What a checkpoint holds, and how it is read back onto any grid: ``checkpoint.py``. This module
sits below the trainer, whose loop saves; ``checkpoint`` (its ``resume`` builds a Trainer) sits
above both.

One writer per folder: ``ckpt/.lock``, locked with ``fcntl.flock`` by world rank 0 for the whole
run, names its holder (``pid 4242 on host: minipar train ...``, the command that launched the
job). A second writer fails at once with a ``UsageError`` naming it. The kernel drops the lock
when its holder dies, however it dies: a stale lock file locks nothing. Holding the lock, the
writer tidies what a killed save left (nobody else can be writing it): its ``.tmp-step*``
folder, and a step it had set aside (``.old-step*``, put back if its replacement never came).

A checksum per shard: each rank hashes the bytes of its file as it writes them (sha256); the
index lists every file with its hash and size, and the loader compares them before reading.

Atomic, in an order a kill at any moment survives:

1. every rank writes its file into ``.tmp-stepNNNNNN/`` and fsyncs it; rank 0 writes the index
   last, fsyncs it and the folder;
2. a step that exists already (a second run into the same folder) is renamed aside to
   ``.old-stepNNNNNN``;
3. ``.tmp-stepNNNNNN`` is renamed to ``stepNNNNNN``: the checkpoint exists, complete, from here on;
4. ``latest`` is replaced: the name written to ``.latest.tmp``, fsynced, renamed over it (a rename
   is atomic);
5. the set-aside copy is removed.

Killed before 3, ``latest`` still names the previous complete step; killed between 2 and 3 or
between 3 and 4, it names a step that is not there or not the newest: the reader then takes the
newest complete step (``checkpoint.read_index``), the set-aside copy included.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil

import numpy as np

from ..errors import UsageError
from ..xp import to_numpy
from .model import dense_name, is_expert

FORMAT = "minipar-checkpoint/2"  # /1: the same without checksums
LOCK = ".lock"

_held = {}  # real path of a folder this process owns -> [its open lock file, how many blocks hold it]


def holder() -> str:
    """Who writes: the job's launching command (``MINIPAR_JOB``, set by ``minipar.launch``), or
    this process."""
    from ..launcher import this_process

    return os.environ.get("MINIPAR_JOB") or this_process()


@contextlib.contextmanager
def owning(directory):
    """Hold ``directory``'s lock for the block (creating the folder): the one writer. Re-entrant
    within a process; a second writer raises ``UsageError`` at once, naming the holder."""
    import fcntl

    key = os.path.realpath(directory)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    os.makedirs(directory, exist_ok=True)
    f = open(os.path.join(directory, LOCK), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        who = f.read().strip() or "another process"
        f.close()
        raise UsageError(f"checkpoint folder {directory} is in use by {who}; wait for it to end, "
                         f"or save somewhere else") from None
    f.seek(0)
    f.truncate()
    f.write(holder() + "\n")
    f.flush()
    _held[key] = [f, 1]
    try:
        tidy(directory)
        yield
    finally:
        del _held[key]
        f.close()  # the lock goes with the file


def tidy(directory):
    """Remove what a killed save left in ``directory`` (call it holding the lock)."""
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if entry.startswith(".tmp-step"):
            shutil.rmtree(path, ignore_errors=True)
        elif entry.startswith(".old-step"):
            final = os.path.join(directory, entry[len(".old-"):])
            if os.path.exists(final):
                shutil.rmtree(path, ignore_errors=True)
            else:  # killed before the new copy came in: this is the only one
                os.rename(path, final)


def layout(module, name):
    """(axis, blocks) of the TP cut of ``module.params[name]``, or None if every rank holds it whole."""
    from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from ..tensor_parallel.vocab import VocabParallelEmbedding, VocabParallelHead

    if isinstance(module, ColumnParallelLinear):
        return (-1, module.blocks)
    if isinstance(module, RowParallelLinear):
        return (0, 1) if name == "w" else None
    if isinstance(module, (VocabParallelEmbedding, VocabParallelHead)):
        return (0, 1)
    return None


def named_modules(stage, prefix=""):
    yield prefix, stage
    for name, child in stage.children().items():
        yield from named_modules(child, f"{prefix}{name}.")


def save(trainer, directory, step: int, crash_before_commit=False):
    """Collective over the trainer's world: write the checkpoint of the state before ``step``."""
    comm = trainer.comm
    with owning(directory) if comm.rank == 0 else contextlib.nullcontext():
        with trainer.gathered():  # ZeRO-3: dp rank 0 writes the weights whole, every rank its Adam ranges
            return _save(trainer, directory, step, crash_before_commit)


def _save(trainer, directory, step, crash_before_commit):
    from safetensors.numpy import save as serialize

    comm, cfg = trainer.comm, trainer.cfg
    d, p, c, t = trainer.place.coord  # my full coordinate (dp, pp, cp, tp), from the run's plan
    first = d == 0 and c == 0  # replicas of the same shards: one writes them
    name = f"step{step:06d}"
    tmp = os.path.join(directory, f".tmp-{name}")
    if comm.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a save that failed earlier in this run
        os.makedirs(tmp)
    comm.builtin.barrier()
    where = {}  # id(module) -> qualified prefix in its stage
    for st in trainer.stages.values():
        where.update({id(m): pre for pre, m in named_modules(st)})
    arrays, pieces = {}, []
    fname = f"rank{comm.rank:05d}.safetensors"
    skip_copy = cfg.pp > 1  # the last stage's wte is a copy of the first stage's

    def add(kind, qual, mod, pname, a, rng):
        dn = dense_name(qual)
        if skip_copy and qual == "head.wte":
            return
        key = f"{kind}/{dn}" + (f"@{rng[0]}" if rng else "")
        a = to_numpy(a)
        if a.dtype.kind == "V":  # bfloat16 (ml_dtypes): safetensors' NumPy side has none; float32 holds it exactly
            a = a.astype(np.float32)
        arrays[key] = np.ascontiguousarray(a)
        pieces.append({"tensor": dn, "kind": kind, "file": fname, "key": key, "tp": [t, cfg.tp],
                       "cut": layout(mod, pname), "shard_shape": list(mod.params[pname].shape),
                       "range": list(rng) if rng else None})

    for st in trainer.stages.values():
        for pre, mod in named_modules(st):
            for pname, a in mod.params.items():
                if first or is_expert(pre):
                    add("param", pre + pname, mod, pname, a, None)
    for e in trainer.engines:
        mine = trainer.plan.zero >= 1 or e.model is trainer.experts  # ZeRO's ranges, or my experts
        for mod, pname, lo, hi, m, v in e.optimizer_pieces():
            if first or mine:
                qual = where[id(mod)] + pname
                add("m", qual, mod, pname, m, (lo, hi))
                add("v", qual, mod, pname, v, (lo, hi))
        for mod, pname, lo, hi, master in e.master_pieces():  # mixed precision: the float32 weights Adam updates
            if first or mine:
                add("master", where[id(mod)] + pname, mod, pname, master, (lo, hi))
    data = serialize(arrays)
    write_synced(os.path.join(tmp, fname), data)
    digest = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    everyone = comm.builtin.gather_object((pieces, fname, digest), 0)
    if comm.rank == 0:
        tensors, files = {}, {}
        for ps, f, digest in everyone:
            files[f] = digest
            for pc in ps:
                tensors.setdefault(pc["tensor"], []).append(pc)
        index = {"format": FORMAT, "step": step, "adam_steps": trainer.engines[0].steps,
                 "model": cfg.model.as_dict(), "grid": {"dp": cfg.dp, "pp": cfg.pp, "cp": cfg.cp, "tp": cfg.tp},
                 "train": {k: getattr(cfg, k) for k in ("lr", "seed", "data", "data_seed", "batch", "precision",
                                                        "clip", "loss_scale", "initial_scale", "growth_interval")}
                 | {"clip_norm_type": str(cfg.clip_norm_type)},  # "2.0" or "inf": JSON has no infinity
                 "loss_scale": trainer.scaler.state() if trainer.scaler else None,
                 "files": files, "tensors": tensors}
        write_synced(os.path.join(tmp, "index.json"), json.dumps(index, indent=1).encode())
        sync_folder(tmp)
        if crash_before_commit:
            raise RuntimeError("crash during save (planted)")
        commit(directory, name)
    comm.builtin.barrier()
    return os.path.join(directory, name)


def commit(directory, name):
    """Steps 2-5 of the module's docstring: ``.tmp-NAME`` becomes ``NAME``, and ``latest`` names it."""
    final, aside = os.path.join(directory, name), os.path.join(directory, f".old-{name}")
    if os.path.exists(final):
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    os.rename(os.path.join(directory, f".tmp-{name}"), final)  # the checkpoint exists, complete, from here on
    sync_folder(directory)
    pointer = os.path.join(directory, ".latest.tmp")
    write_synced(pointer, (name + "\n").encode())
    os.replace(pointer, os.path.join(directory, "latest"))
    sync_folder(directory)
    shutil.rmtree(aside, ignore_errors=True)


def write_synced(path, data: bytes):
    """Write ``data`` to ``path`` and wait until it is on the disk (a rename after it is then safe)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sync_folder(path):
    """fsync a folder: the names created or renamed in it are on the disk too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
