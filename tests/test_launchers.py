"""The same lesson under the engines' own launchers: mpiexec and torchrun."""
import os
import shutil
import subprocess
import sys
import time

import pytest

from minipar.launcher import mpiexec, rank_env

from .conftest import has_torch


def torchrun():
    found = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return found if os.path.exists(found) else shutil.which("torchrun")


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_collectives_under_mpiexec():
    out = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", "minipar.lessons.collectives"],
                         capture_output=True, text=True, timeout=100, env=rank_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 ranks (mpi):" in out.stdout and "FAIL" not in out.stdout and "all_reduce:ring" in out.stdout


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_collectives_under_torchrun():
    if not has_torch() or not torchrun():
        pytest.skip("torch / torchrun not installed")
    out = subprocess.run([torchrun(), "--standalone", "--nproc-per-node", "3", "-m", "minipar.lessons.collectives",
                          "--backend", "torch"], capture_output=True, text=True, timeout=160, env=rank_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 ranks (torch):" in out.stdout and "FAIL" not in out.stdout and "all_reduce:rabenseifner" in out.stdout


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_a_raising_rank_ends_a_torchrun_job():
    if not has_torch() or not torchrun():
        pytest.skip("torch / torchrun not installed")
    t0 = time.monotonic()
    out = subprocess.run([torchrun(), "--standalone", "--nproc-per-node", "3", "-m", "minipar.lessons.collectives",
                          "--backend", "torch", "--raise-on", "1"], capture_output=True, text=True, timeout=160,
                         env={**rank_env(), "MINIPAR_WATCHDOG": "60"})
    assert out.returncode != 0
    assert "RuntimeError: planted failure on rank 1" in out.stdout + out.stderr
    assert time.monotonic() - t0 < 60  # torchrun's agent stops the others; nobody waits for the watchdog
