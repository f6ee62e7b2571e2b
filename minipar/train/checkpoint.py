"""Sharded checkpoints that load onto any other grid.

    save(trainer, "ckpt/", step=100)          # saving.py; collective: every rank writes its own shards
    trainer, start = resume(comm, cfg, "ckpt/")   # any dp x pp x tp, any number of ranks

Layout of ``ckpt/``::

    latest                      the name of the newest complete checkpoint (one line)
    .lock                       the folder's writer: locked while a run saves here, names it
    step000100/index.json       what each global tensor is, its shape, how it was cut, where
                                each piece lives; each file's sha256; the step, Adam's step
                                count, the configs
    step000100/rank00003.safetensors   the pieces world rank 3 wrote

What each rank writes: its tensor-parallel shard of every parameter (DP replica 0 and CP rank
0 only: the other replicas hold the same numbers), and Adam's m and v for the part of each
parameter its optimizer updates (all of it; with ZeRO-1 a range of the flattened shard, every
rank of the dp x cp group its own); in mixed precision (bf16, fp16) also the float32 master
weights of that part, cut the same way ("master"). The index keeps the precision, the clip and its norm type, and
fp16's loss-scale state (the scale, the clean steps since it last changed). Experts are written by the rank that holds them, whatever
its DP coordinate. A piece is described by the TP rank and size it was cut for and its flat
range: nothing in it depends on dp, cp or the expert placement, so any grid can load it.

Writing (``saving.py``, below the trainer, whose loop saves): one writer per folder (a lock), a
checksum per file, and an order of renames that a kill at any moment survives. Reading (here):
``latest``, or the newest complete step when ``latest`` names none (a save killed before it
wrote it); every file checked against its checksum first (``read_index``, which the command line
calls before launching: a damaged file is refused before any rank starts); a piece or a tensor
whose shape is not what the index or the model says is named. Every such problem is a
``UsageError``: one line, naming the folder or the file.

Resharding: a loading rank rebuilds each global tensor from the pieces (undoing the TP cut),
builds the dense GPT from them, and slices its own stages out of it exactly as at the start of
training; m and v go through the same ``shard`` functions. The data position is the step: the
batches are a function of it.

Why safetensors: a flat, documented format of named arrays plus a JSON header, written and read
by NumPy and torch alike without pickle (loading runs no code), and readable lazily, one slice at
a time (``safe_open(...).get_slice``), which is what a loader reading only its own pieces needs.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from ..errors import UsageError
from ..xp import to_numpy
from .model import GPT, GPTConfig, dense_name
from .saving import FORMAT, named_modules

READABLE = ("minipar-checkpoint/1", FORMAT)  # /1: written before the checksums
# what a resumed run takes from its checkpoint: a field of TrainConfig (or of its model), and where
# the index keeps it
FIXED_BY_CHECKPOINT = {"model.d_model": ("model", "d_model"), "model.n_layers": ("model", "n_layers"),
                       "model.n_heads": ("model", "n_heads"), "model.seq_len": ("model", "seq_len"),
                       "model.n_experts": ("model", "n_experts"), "model.top_k": ("model", "top_k"),
                       "batch": ("train", "batch"), "lr": ("train", "lr"), "clip": ("train", "clip")}


def cut(full, axis, blocks, r, p):
    """Rank r's piece of ``full``: chunk r of each of ``blocks`` blocks along ``axis``."""
    parts = np.split(full, blocks, axis=axis)
    return np.concatenate([np.split(b, p, axis=axis)[r] for b in parts], axis=axis)


def uncut(shards, axis, blocks):
    """The global tensor from the p shards ``cut`` made."""
    per = [np.split(s, blocks, axis=axis) for s in shards]  # [rank][block]
    return np.concatenate([np.concatenate([per[r][k] for r in range(len(shards))], axis=axis)
                           for k in range(blocks)], axis=axis)


def read_index(directory):
    """(the checkpoint's directory, its index) for a checkpoint folder (the step its ``latest``
    names, else its newest complete step) or a step's own folder; every file checked against
    its checksum first (:func:`verify`), so a damaged one is refused before any rank starts."""
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: no such checkpoint folder")
    if not os.path.exists(os.path.join(directory, "index.json")):
        directory = newest(directory)
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    if index.get("format") not in READABLE:
        raise UsageError(f"{directory}: not a minipar checkpoint ({index.get('format')!r})")
    verify(directory, index)
    return directory, index


def newest(directory) -> str:
    """The step folder of ``directory`` to load: the one ``latest`` names, or, when that one is
    not there (a save killed before it wrote ``latest``, or while it replaced that step), the
    newest complete one (a committed ``stepNNNNNN``, or the copy a replacing save set aside)."""
    latest = os.path.join(directory, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            named = os.path.join(directory, f.read().strip())
        if os.path.exists(os.path.join(named, "index.json")):
            return named
    steps = sorted((int(m.group(2)), m.group(1) is None, entry) for entry in os.listdir(directory)
                   if (m := re.fullmatch(r"(\.old-)?step(\d+)", entry))
                   and os.path.exists(os.path.join(directory, entry, "index.json")))
    if not steps:
        raise UsageError(f"{directory}: no checkpoint in it (no complete stepNNNNNN folder)")
    return os.path.join(directory, steps[-1][2])


def verify(path, index):
    """Raise UsageError, naming the file, for a file of ``path`` that is not the one the index
    recorded (its size and sha256), or one it does not record at all."""
    if index["format"] != FORMAT:
        return  # written before the checksums
    files = index["files"]
    unlisted = sorted({pc["file"] for pieces in index["tensors"].values() for pc in pieces} - set(files))
    if unlisted:
        raise UsageError(f"{os.path.join(path, unlisted[0])}: holds pieces, but the index records no checksum of it")
    for fname, want in files.items():
        try:
            with open(os.path.join(path, fname), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise UsageError(f"{os.path.join(path, fname)}: missing from the checkpoint") from None
        got = hashlib.sha256(data).hexdigest()
        if len(data) != want["bytes"] or got != want["sha256"]:
            raise UsageError(f"{os.path.join(path, fname)}: damaged: {len(data)} bytes with sha256 {got[:16]}..., "
                             f"the index recorded {want['bytes']} bytes with sha256 {want['sha256'][:16]}...; "
                             f"load another checkpoint")


def load_full(directory):
    """{kind: {dense name: global array}} for kind in param, m, v: every cut undone."""
    from safetensors import safe_open

    path, index = read_index(directory)  # every file checked against its checksum
    handles = {}
    out = {"param": {}, "m": {}, "v": {}, "master": {}}
    for tensor, pieces in index["tensors"].items():
        for kind in out:
            mine = [pc for pc in pieces if pc["kind"] == kind]
            if not mine:
                continue
            p = mine[0]["tp"][1]
            shards = [None] * p
            for r in range(p):
                parts = sorted((pc for pc in mine if pc["tp"][0] == r), key=lambda pc: (pc["range"] or [0])[0])
                shape = parts[0]["shard_shape"]
                flat = np.empty(int(np.prod(shape)))
                covered = 0
                for pc in parts:
                    f = handles.get(pc["file"]) or handles.setdefault(
                        pc["file"], safe_open(os.path.join(path, pc["file"]), "np"))
                    a = f.get_tensor(pc["key"]).reshape(-1)
                    lo, hi = pc["range"] or (0, flat.size)
                    if a.size != hi - lo:
                        raise UsageError(f"{kind} {tensor} (TP shard {r} of {p}) in {os.path.join(path, pc['file'])}: "
                                         f"the file holds {a.size} numbers, the index says {hi - lo}")
                    flat[lo:hi] = a
                    covered += hi - lo
                if covered != flat.size:
                    raise UsageError(f"{path}: {kind} of {tensor} TP shard {r}: {covered} of {flat.size} elements")
                shards[r] = flat.reshape(shape)
            c = mine[0]["cut"]
            out[kind][tensor] = uncut(shards, c[0], c[1]) if c else shards[0]
    return index, out


def dense_model(index, full, seed=0):
    """The dense GPT of the checkpoint's model holding its parameters (mixed precision: the
    float32 master weights, whose rounding is the 16-bit copy); a tensor whose shape is not that
    model's is named."""
    dense = GPT(GPTConfig(**index["model"]), seed)
    weights = full.get("master") or full["param"]
    for n, a in dense.named_parameters():
        if n not in weights:
            raise UsageError(f"{n}: not in the checkpoint, though its model has it")
        if weights[n].shape != a.shape:
            raise UsageError(f"{n}: the checkpoint holds shape {weights[n].shape}, its model {a.shape} "
                             f"(the index's model does not match its tensors)")
        a[...] = weights[n]
    return dense


def resume(comm, cfg, directory):
    """A Trainer for ``cfg`` (any grid) holding the checkpoint's weights and Adam state, and the
    step to continue from. The model and training settings come from the checkpoint; the
    precision is ``cfg``'s (the command line refuses another than the checkpoint's unless it is
    said). Mixed precision: the master weights (from a full-precision checkpoint: its weights)
    and fp16's loss-scale state; so the same precision on any grid continues the run bitwise
    where the grid's sums are in the same order."""
    from ..xp import from_numpy
    from .trainer import Trainer

    index, full = load_full(directory)
    kept = ("lr", "seed", "data", "data_seed", "batch") + (("clip", "clip_norm_type") if cfg.clip is None else ())  # a clip said wins
    train = dict(index["train"], clip_norm_type=float(index["train"].get("clip_norm_type", "2.0")))
    cfg = cfg.with_(model=GPTConfig(**index["model"]), **{k: v for k, v in train.items() if k in kept})
    tr = Trainer(comm, cfg, dense_model(index, full, cfg.seed))
    where = {}
    for st in tr.stages.values():
        where.update({id(m): pre for pre, m in named_modules(st)})
    for e in tr.engines:
        for mod, pname, lo, hi, m, v in e.optimizer_pieces():
            dn = dense_name(where[id(mod)] + pname)
            for kind, dst in (("m", m), ("v", v)):
                whole = full[kind][dn]
                piece = mod.shard(pname, whole) if hasattr(mod, "shard") else whole
                dst[...] = from_numpy(np.ascontiguousarray(to_numpy(piece)).reshape(-1)[lo:hi], like=dst)
        for mod, pname, lo, hi, master in e.master_pieces():
            whole = (full["master"] or full["param"])[dense_name(where[id(mod)] + pname)]
            piece = mod.shard(pname, whole) if hasattr(mod, "shard") else whole
            master[...] = from_numpy(np.ascontiguousarray(to_numpy(piece)).reshape(-1)[lo:hi], like=master)
        e.steps = index["adam_steps"]
    state = index.get("loss_scale")
    if tr.scaler is not None and state:  # (a checkpoint of another precision has none: the scale starts afresh)
        tr.scaler.scale, tr.scaler.good = state["scale"], state["good"]
    return tr, index["step"]


# ----------------------------------------------------------------------------- resuming from the command line


def refuse_contradictions(said: dict, index, directory) -> None:
    """Refuse a setting said with ``--resume`` that says otherwise than the checkpoint: the model and
    its training settings come from the checkpoint, and silently ignoring the setting would train
    something else than asked. ``said``: {field (``FIXED_BY_CHECKPOINT``'s): (flag, value)} of the
    flags given, not left at their defaults; one equal to the checkpoint's is fine."""
    for name, (part, key) in FIXED_BY_CHECKPOINT.items():
        if name not in said:
            continue
        flag, given = said[name]
        saved = index.get(part, {}).get(key)
        if saved is not None and given != saved:
            raise UsageError(f"{flag}={given}: the checkpoint {directory} was trained with {key}={saved}, and a resumed "
                             f"run continues it as it is; drop {flag}, or start a new run without --resume")


def resumed_precision(said, index, directory) -> str:
    """The precision a resumed run trains in: the checkpoint's, or another one said (``said``; None
    when ``--precision`` was not given); never another one by default (fp64 after a bf16 run would
    quietly change every number)."""
    saved = saved_precision(index)
    if said is None and saved != "fp64":
        raise UsageError(f"{directory} was trained with --precision {saved}; say --precision {saved} to continue "
                         f"it, or another --precision to switch (the master weights carry over)")
    return said or saved


def saved_precision(index) -> str:
    """A checkpoint's precision (written before --precision: its dtype's)."""
    from ..mixed_precision import COMPUTE

    train = index.get("train", {})
    return train.get("precision") or {dtype: p for p, dtype in COMPUTE.items()}.get(train.get("dtype"), "fp64")
