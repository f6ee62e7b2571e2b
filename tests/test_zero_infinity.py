"""ZeRO-Infinity's two techniques in lesson 4: NVMe offload and Memory-Centric Tiling.

Their passing runs are part of the lesson's tour (``tests/test_data_parallel.py`` runs it on 1-4
ranks, both backends). Here: one 2-rank job runs them right, in a directory the user names, and
then wrong three ways, each of which its own check must catch.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.lessons.data_parallel import summarize
from minipar.mixed_precision import NVMe


def failing(rows):
    return {r["what"] for r in summarize(rows) if not r["ok"]}


def nvme_in_ram():
    """NVMe offload that makes its file but keeps the state it updates in RAM."""
    from minipar.mixed_precision import FlatAdam

    good = FlatAdam.__init__

    def init(self, *a, **kw):
        good(self, *a, **kw)
        if self.file is not None:
            self.master, self.m, self.v = (np.array(r) for r in self.file)  # BUG: copies in RAM

    FlatAdam.__init__ = init
    return lambda: setattr(FlatAdam, "__init__", good)


def tiles_at_once():
    """ZeRO-3 that gathers every later unit as soon as the first one computes."""
    from minipar.zero import ZeRO3

    good = ZeRO3.before_forward

    def before_forward(self, name):
        good(self, name)
        if name in self.flats:
            for u in self.units[self.index[name] + 1:]:
                self.start_gather(u)  # BUG: all tiles in flight together

    ZeRO3.before_forward = before_forward
    return lambda: setattr(ZeRO3, "before_forward", good)


def files_left():
    """A store that never removes its files."""
    from minipar import mixed_precision

    good = mixed_precision._remove
    mixed_precision._remove = lambda files, directory: None  # BUG
    return lambda: setattr(mixed_precision, "_remove", good)


def right_then_wrong(comm, path):
    from minipar.lessons import zero_infinity as zi

    out = {"right": zi.offload(comm, path=path) + zi.tiling(comm), "left": sorted(os.listdir(path))}
    for bug, run in ((nvme_in_ram, lambda: zi.offload(comm)), (tiles_at_once, lambda: zi.tiling(comm)),
                     (files_left, lambda: zi.offload(comm, path=path))):
        undo = bug()
        try:
            out[bug.__name__] = run()
        finally:
            undo()
    return out


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_offload_and_tiling_right_and_three_ways_wrong(tmp_path):
    res = launch(2, "tests.test_zero_infinity:right_then_wrong", quiet=True, path=str(tmp_path)).results
    right = summarize([r["right"] for r in res])
    assert len(right) == 16 and all(r["ok"] for r in right), [r for r in right if not r["ok"]]
    assert res[0]["left"] == []  # the user's directory stays, our files in it are gone
    assert failing([r["nvme_in_ram"] for r in res]) == {
        "NVMe offload: the files hold the optimizer's state (read back == CPU offload's, bitwise)",
        "NVMe offload: RAM held (tracemalloc) is the CPU-offloaded engine's minus the state (5%)"}
    assert "tiling: peak gathered bytes == one tile (exact)" in failing([r["tiles_at_once"] for r in res])
    assert not any(w.startswith("tiling: ") and "peak" not in w for w in failing([r["tiles_at_once"] for r in res]))
    assert failing([r["files_left"] for r in res]) == {"NVMe offload: its files are removed when the store closes"}


def test_nvme_store_in_a_temporary_directory_is_removed_with_it():
    store = NVMe()
    a = store.array(3, 5, "float32")
    a[...] = np.arange(15, dtype="float32").reshape(3, 5)
    a.flush()
    assert store.bytes_on_disk() == 60 and np.array_equal(np.fromfile(store.files[0], "float32"), np.arange(15))
    path = store.path
    del a
    store.close()
    assert not os.path.exists(path)


def test_offload_dir_must_be_a_directory(tmp_path, capsys):
    from minipar.cli import main

    with pytest.raises(UsageError, match="--offload-dir"):
        NVMe(str(tmp_path / "missing"))
    for argv in (["run", "-n", "2", "data_parallel", "--offload-dir", str(tmp_path / "missing")],
                 ["bench", "offload", "--offload-dir", str(tmp_path / "missing")]):
        assert main(argv) == 2
        err = capsys.readouterr()
        assert "--offload-dir" in err.out + err.err and "Traceback" not in err.out + err.err
