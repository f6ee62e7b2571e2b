"""Nothing hangs: a raising rank ends the job, a deadlock is reported by the watchdog."""
import time

import pytest

from minipar import launch
from minipar.launcher import LaunchError

from .conftest import has_torch


def failing(target, n, **kw):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(n, f"minipar.lessons.faults:{target}", quiet=True, **kw)
    return info.value, time.monotonic() - t0


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_a_raising_rank_ends_the_job(backend):
    if backend == "torch" and not has_torch():
        pytest.skip("torch not installed")
    err, took = failing("raise_on", 4, backend=backend, watchdog=60, rank=2)
    assert err.returncode != 0
    assert err.output.count("RuntimeError: planted failure on rank 2") == 1  # traceback printed once
    assert took < 30, f"job took {took:.1f} s to end after a rank raised"  # not the 60 s watchdog


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_send_without_recv_is_reported():
    err, took = failing("send_without_recv", 2, watchdog=2)
    out = err.output
    assert "minipar watchdog" in out
    assert "rank 0: blocked in send to rank 1 tag 7 (32 bytes)" in out
    assert "rank 1: finished its work" in out or "rank 1: no report" in out
    assert took < 30


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_head_to_head_deadlock_lists_every_rank():
    err, _ = failing("head_to_head", 3, watchdog=2)
    for r in range(3):
        assert f"rank {r}: blocked in send to rank {(r + 1) % 3} tag 0 (32 bytes)" in err.output


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_recv_without_send_on_torch():
    if not has_torch():
        pytest.skip("torch not installed")
    err, _ = failing("recv_without_send", 2, backend="torch", watchdog=3)
    assert "rank 1: blocked in recv from rank 0 tag 5 (32 bytes)" in err.output


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_wrong_receive_buffer_is_a_clear_error():
    err, _ = failing("wrong_buffer", 2, watchdog=10)
    assert "is larger than buf (24 bytes, shape (3,), float64)" in err.output
