"""The lab grader's memory count (minipar.labs.memory): the bytes of the arrays a call allocated
and still holds at its peak, the same on NumPy (tracemalloc's NumPy domain) and on torch (a
dispatch mode over the storages), and the arrays alive at that peak, named with the learner's
line that made them.

* in one process: the peak counts arrays only, exactly, and again the same on a second run; a
  name read to describe the peak does not keep the array alive afterwards (Python < 3.13 keeps
  a frame's f_locals dict, and a profiler refills it);
* graded: a ZeRO-3 that keeps the previous layer's weights while the next all-gather runs fails
  task 4.5 on both backends, naming ``w`` and the learner's line, with the same bytes.
"""
import pathlib
import re
import subprocess
import sys
import weakref

import numpy as np
import pytest

from minipar.labs.memory import Memory

ROOT = pathlib.Path(__file__).resolve().parent.parent


def kinds():
    """The array makers to run the in-process tests on: NumPy, and torch where it is installed."""
    out = [pytest.param("numpy", id="numpy")]
    try:
        import torch  # noqa: F401

        out.append(pytest.param("torch", id="torch"))
    except ImportError:
        pass
    return out


def maker(kind):
    if kind == "numpy":
        return lambda n: np.ones(n)
    import torch

    return lambda n: torch.ones(n, dtype=torch.float64)


def two_at_once(new):
    """8000 bytes, then 16000 at once, then 8000 again; returns the last array (counted, alive)."""
    a = new(1000)
    b = new(1000)
    del a
    c = new(1000)
    del b
    return c


def measured(kind, fn, *args):
    m = Memory()
    m.torch = kind == "torch"
    with m:
        out = fn(*args)
    return m, out


@pytest.mark.parametrize("kind", kinds())
def test_the_peak_counts_array_bytes_only_and_again_the_same(kind):
    new = maker(kind)
    first, _ = measured(kind, two_at_once, new)
    second, _ = measured(kind, two_at_once, new)
    assert first.peak == second.peak == 16000
    assert [h.nbytes for h in first.at_peak] == [8000, 8000]
    assert all("test_lab_memory.py" in h.made for h in first.at_peak), first.at_peak


def keeps_the_previous(new, probe):
    """A loop that rebinds ``w``: the previous array must die at the rebinding, names read or not."""
    refs = []
    for _ in range(3):
        w = new(1000)
        probe(refs)
        refs.append(weakref.ref(w))
    return refs


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "under a profiler"])
@pytest.mark.parametrize("kind", kinds())
def test_reading_names_at_the_peak_keeps_nothing_alive(kind, profiled):
    seen = []

    def probe(refs):
        seen.append([r() is not None for r in refs])

    before = sys.getprofile()
    if profiled:  # the lab grader watches calls with sys.setprofile (checks.Answers)
        sys.setprofile(lambda frame, event, arg: None)
    try:
        m, _ = measured(kind, keeps_the_previous, maker(kind), probe)
    finally:
        sys.setprofile(before)
    assert seen == [[], [False], [False, False]]
    assert m.peak == 16000  # the new w and the previous one, for the moment of the rebinding
    assert any("held by w of keeps_the_previous" in str(h) for h in m.at_peak), m.at_peak


PLANTED = '''"""ZeRO-3 that keeps the previous layer's weights while the next all-gather runs."""
import math

from minipar.collectives import all_gather


def zero3_forward(comm, shards, shapes, x, layer):
    y = x
    for i, (shard, shape) in enumerate(zip(shards, shapes)):
        w = all_gather(comm, shard)[:math.prod(shape)].reshape(shape)
        y = layer(i, w, y)  # (no del w: the previous layer's weights live on into the next all_gather)
    return y
'''


def report(text, task):
    """The report line of ``task`` in a ``minipar check`` output."""
    return next(line for line in text.splitlines() if line.strip().startswith(task + " "))


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_zero3_keeping_the_previous_layer_names_it_on_both_backends(tmp_path):
    planted = tmp_path / "keeps_the_previous_layer.py"
    planted.write_text(PLANTED)
    line = PLANTED.splitlines().index(next(ln for ln in PLANTED.splitlines() if "w = all_gather" in ln)) + 1
    messages = {}
    pytest.importorskip("torch")
    for backend in ("mpi", "torch"):
        out = subprocess.run([sys.executable, "-m", "minipar", "check", "04", "--file", str(planted), "--task", "4.5",
                              "--backend", backend], cwd=ROOT, capture_output=True, text=True, timeout=240)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        got = report(text, "4.5")
        assert "FAIL" in got and "held 66560 bytes at once inside zero3_forward" in got, got
        assert "at most 40952" in got, got
        assert "held by w of zero3_forward, made in minipar/collectives.py" in got, got
        assert f"called at {planted}:{line}: w = all_gather(comm, shard)[:math.prod(shape)].reshape(shape)" in got, got
        assert "2 gathered layers were alive at once (w of zero3_forward, out of all_gather)" in got, got
        messages[backend] = re.sub(r"\s+", " ", got)
    assert len(set(messages.values())) == 1, messages  # the same bytes, arrays and lines on both
