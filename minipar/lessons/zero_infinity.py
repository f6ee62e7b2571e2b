"""Lesson 4, beyond the GPU's memory (ZeRO-Infinity): optimizer state on the host or in a file,
and a layer too large to gather whole, computed tile by tile.

    from minipar import launch
    out = launch(2, "minipar.lessons.zero_infinity:offload")   # check rows: bitwise, bytes where they live
    out = launch(4, "minipar.lessons.zero_infinity:tiling")    # check rows: equal to the untiled layer, peak
    minipar run -n 2 data_parallel [--offload-dir DIR]         # both, with the rest of lesson 4
    minipar bench offload -n 2                                 # the step time each home costs (minipar.bench.offload)

``offload``: ZeRO-2 with Adam's state (master, m, v) on the host ("cpu") and in a memory-mapped
file ("nvme"). Checked: the two train bitwise alike, in float64 and in mixed precision (the same
NumPy update on the same values); in float64 the file's
optimizer equals the one whose state sits beside the weights (bitwise with NumPy; torch's
kernels may round differently, hence 1e-12); the bytes are where the formula puts them, counted three ways: the engine's ledger, the files on
disk (their size, and their contents read back with ``numpy.fromfile``, equal to the host
optimizer's state), and the RAM the engine holds (``tracemalloc``: the file's state is not in
it); the temporary directory is gone once the store is closed.

``tiling``: a Linear(24, 60) after a small Linear and a GeLU, as 4 tiles under ZeRO-3 without
prefetch. Checked: forward output and every gradient equal the untiled layer's in one process
(1e-12: only dx's summation order differs), the parameters after 3 Adam steps too; the peak of
gathered bytes is one tile's padded size exactly, while ZeRO-3 on the untiled layer gathers the
whole layer (the same measurement, seeing the difference).
"""
from __future__ import annotations

import copy
import gc
import os
import tracemalloc

import numpy as np

from .. import nn
from ..data_parallel import local_batch, train_dense
from ..mixed_precision import NVMe
from ..nn import mse_loss
from ..xp import chunk_bounds, itemsize, to_numpy
from ..zero import ZeRO, tiled_linear
from .fixtures import make_data, max_error, row, train, uniform_model

TOL = 1e-12
RAM_TOL = 0.05  # the engine's Python objects (a few KB) beside the state's bytes


# --------------------------------------------------------------------------- NVMe offload


def offload(comm, units=4, width=256, batch=12, steps=2, seed=0, path=None):
    """Check rows for the optimizer state in memory, on the host and in a file (see the module doc).
    The bytes are counted in float64 (NumPy's float16 matmuls, without BLAS, would take seconds
    at a width where the state dwarfs the engine's Python objects); mixed precision on a small
    model."""
    x, y = make_data(comm, seed + 1, batch, width, width)
    store = NVMe(path)
    tracemalloc.start()
    engines, ram, got = {}, {}, {}
    for name, off in (("warm-up", "cpu"), ("cpu", "cpu"), ("nvme", store)):  # the first pays one-time allocations
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        engines[name] = e = ZeRO(comm, uniform_model(units, width, seed).to(x), 2, offload=off)
        got[name] = train(e, x, y, steps)
        gc.collect()
        ram[name] = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    cpu, nv = engines["cpu"], engines["nvme"]
    rows = [row("NVMe offload == CPU offload (bitwise, float64: the same NumPy update)", max_error(got["nvme"], got["cpu"]), 0.0)]
    xs, ys = make_data(comm, seed + 2, batch, 34, 34)
    side = NVMe()
    small = {name: train(ZeRO(comm, uniform_model(seed=seed).to(xs), 2, precision="fp16" if mixed else None, offload=off),
                       xs, ys, steps)
             for name, mixed, off in (("ram", False, False), ("nvme", False, side), ("cpu mixed", True, "cpu"),
                                      ("nvme mixed", True, side))}
    side.close()
    rows.append(row("NVMe offload == CPU offload (bitwise, mixed float16/fp32)", max_error(small["nvme mixed"], small["cpu mixed"]), 0.0))
    rows.append(row(f"NVMe offload == ZeRO-2 with the state beside the weights (float64, {TOL:.0e}: the backend's "
                    "kernels vs NumPy's)", max_error(small["nvme"], small["ram"]), TOL))
    state = nv.predicted_memory()["file_bytes"]
    led = nv.measured_memory()
    for where, want in (("optimizer", 0), ("host", 0), ("file", state)):
        got_b = led[f"{where}_bytes"]
        rows.append(row(f"NVMe offload: {where} bytes (ledger) == {'K Psi/N' if want else '0'} (exact)",
                        abs(got_b - want) / state, 0.0))
    rows.append(row("CPU offload: host bytes (ledger) == K Psi/N (exact)",
                    abs(cpu.measured_memory()["host_bytes"] - cpu.predicted_memory()["host_bytes"]) / state, 0.0))
    rows.append(row("NVMe offload: bytes of the files on disk == K Psi/N (exact)", abs(store.bytes_on_disk() - state) / state, 0.0))
    disk = 0.0
    for u in nv.units:
        f, c = nv.opts[u].file, cpu.opts[u]
        back = np.fromfile(f.filename, dtype=f.dtype).reshape(f.shape)  # read from the file, not the mapping
        disk = max(disk, max_error({"s": back}, {"s": np.stack([c.master, c.m, c.v])}, relative=False))
    rows.append(row("NVMe offload: the files hold the optimizer's state (read back == CPU offload's, bitwise)", disk, 0.0))
    rows.append(row(f"NVMe offload: RAM held (tracemalloc) is the CPU-offloaded engine's minus the state ({RAM_TOL:.0%})",
                    abs((ram["cpu"] - ram["nvme"]) - state) / state, RAM_TOL))
    where = store.path
    store.close()
    rows.append(row("NVMe offload: its files are removed when the store closes", float(any(os.path.exists(f) for f in store.files)
                                                                                      or (store.own and os.path.exists(where))), 0.0))
    return rows


# --------------------------------------------------------------------------- Memory-Centric Tiling


def tiling_models(seed=0, d_in=24, d_out=60, tiles=4):
    """(untiled, tiled): Linear(5, d_in), GeLU, Linear(d_in, d_out) with every weight and bias
    drawn; the tiled one holds the same numbers, its last Linear as ``tiles`` column blocks."""
    rng = np.random.default_rng(seed)
    dense = nn.Sequential(nn.Linear(5, d_in, rng), nn.GeLU(), nn.Linear(d_in, d_out, rng))
    for _, p in dense.named_parameters():
        p[...] = rng.standard_normal(p.shape) / np.sqrt(d_in)
    first = copy.deepcopy(dense[0])
    return dense, nn.Sequential(first, nn.GeLU(), *tiled_linear(d_in, d_out, tiles, dense=dense[2]))


def unit_gradients(engine):
    """{id(module): {name: full gradient}} of every unit, its shards gathered (``comm.builtin``:
    this is the check's reference, not the technique)."""
    comm, out = engine.comm, {}
    for u in engine.units:
        full = np.asarray(to_numpy(comm.builtin.all_gather(engine.grad_shard(u))))
        for mod, name, shape, a, b in engine.flats[u].slots:
            out.setdefault(id(mod), {})[name] = full[a:b].reshape(shape)
    return out


def tiling(comm, seed=0, d_in=24, d_out=60, tiles=4, batch=12, steps=3, lr=1e-2):
    """Check rows for Memory-Centric Tiling (see the module doc)."""
    x, y = make_data(comm, seed + 1, batch, 5, d_out)
    xl, yl = local_batch(comm, x), local_batch(comm, y)
    dense, tiled = tiling_models(seed, d_in, d_out, tiles)
    dense, tiled = dense.to(x), tiled.to(x)
    ref = copy.deepcopy(dense)
    pred_d, ctx_d = ref.forward(x)
    ref.backward(mse_loss(pred_d, y)[1], ctx_d)
    engine = ZeRO(comm, tiled, 3, lr=lr, prefetch=False)
    pred, ctxs = engine.forward(xl)
    a, b = chunk_bounds(batch, comm.size)[comm.rank]
    rows = [row(f"tiling: forward == untiled Linear, {tiles} tiles ({TOL:.0e})", max_error({"y": pred}, {"y": pred_d[a:b]}), TOL)]
    engine.backward(mse_loss(pred, yl)[1], ctxs)  # my rows' mean loss; the engine averages over ranks
    grads = unit_gradients(engine)
    want = {id(tiled[0]): ref[0].grads}
    for t, (lo, hi) in zip(_tiles(tiled), chunk_bounds(d_out, tiles)):  # the columns tiled_linear gave it
        want[id(t.lin)] = {n: g[..., lo:hi] for n, g in ref[2].grads.items()}
    err = max(max_error(grads[k], want[k]) for k in want)
    rows.append(row(f"tiling: every gradient == untiled ({TOL:.0e})", err, TOL))

    engine = ZeRO(comm, tiling_models(seed, d_in, d_out, tiles)[1].to(x), 3, lr=lr, prefetch=False)
    got = train(engine, x, y, steps)
    untiled = tiling_models(seed, d_in, d_out, tiles)[0].to(x)
    train_dense(untiled, x, y, steps, lr)
    full_w = np.concatenate([got[f"{i}.lin.w"] for i in range(3, 3 + tiles)], axis=1)
    full_b = np.concatenate([got[f"{i}.lin.b"] for i in range(3, 3 + tiles)])
    mine = {"0.w": got["0.w"], "0.b": got["0.b"], "2.w": full_w, "2.b": full_b}
    rows.append(row(f"tiling: parameters after {steps} Adam steps == one process, untiled ({TOL:.0e})",
                    max_error(mine, {n: to_numpy(p) for n, p in untiled.named_parameters()}), TOL))

    size = itemsize(x)
    tile = max(engine.flats[u].n_pad for u in engine.units) * size
    rows.append(row("tiling: peak gathered bytes == one tile (exact)", abs(engine.peak_gathered() - tile) / tile, 0.0))
    whole = ZeRO(comm, tiling_models(seed, d_in, d_out, tiles)[0].to(x), 3, lr=lr, prefetch=False)
    train(whole, x, y, 1)
    layer = whole.flats["2"].n_pad * size
    rows.append(row("untiled ZeRO-3: peak gathered bytes == the whole layer (exact)", abs(whole.peak_gathered() - layer) / layer, 0.0))
    return rows


def _tiles(model):
    return [m for m in model.children().values() if hasattr(m, "lin")]


def tour(comm, path=None):
    return offload(comm, path=path) + tiling(comm)
