"""The same lesson under the engines' own launchers, mpiexec and torchrun; and ``minipar.launch``
unaffected by the environment of an outer torch job."""
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from minipar import launch
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


FAKE_GPU = """
import torch
torch.cuda.is_available = lambda: True  # one (pretend) GPU for three ranks: gloo, not NCCL
torch.cuda.device_count = lambda: 1
torch.cuda.set_device = lambda device: None
"""


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_raising_ranks_end_a_torchrun_job(tmp_path):
    """Under torchrun: rank 1's UsageError is one line, rank 2's bug its traceback once, and the
    job ends at once; rank 0 alone says why it chose gloo over NCCL (three ranks, one GPU)."""
    if not has_torch() or not torchrun():
        pytest.skip("torch / torchrun not installed")
    from .test_faults import SCRIPT, check_script_output

    script = tmp_path / "script.py"
    script.write_text(FAKE_GPU + SCRIPT.format(init="'torch', device='cuda'"))
    t0 = time.monotonic()
    out = subprocess.run([torchrun(), "--standalone", "--nproc-per-node", "3", str(script)], capture_output=True,
                         text=True, timeout=160, env={**rank_env(), "MINIPAR_WATCHDOG": "60", "TMPDIR": str(tmp_path)})
    text = out.stdout + out.stderr
    assert out.returncode != 0
    check_script_output(text)
    assert text.count("minipar: device='cuda' with 3 ranks on 1 GPU on this host: NCCL needs a GPU per rank") == 1
    assert time.monotonic() - t0 < 60  # torchrun's agent stops the others; nobody waits for the watchdog


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_an_inherited_rendezvous_does_not_reach_the_ranks(monkeypatch):
    """MASTER_PORT (and RANK, WORLD_SIZE) inherited from an outer torchrun or a shell profile, the
    port already taken by another job: each launched job picks a free port of its own."""
    if not has_torch():
        pytest.skip("torch not installed")
    with socket.socket() as other_job:
        other_job.bind(("127.0.0.1", 0))
        other_job.listen()
        for var, value in (("MASTER_PORT", other_job.getsockname()[1]), ("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
            monkeypatch.setenv(var, str(value))
        out = launch(2, "minipar.lessons.collectives:verify", backend="torch", quiet=True, lengths=(1, 7))
    assert len(out.results) == 2 and all(r["ok"] for rows in out.results for r in rows)
