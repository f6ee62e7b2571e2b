"""Every rank keeps freed memory in its heap (``minipar.comm.malloc``): a step's temporaries reuse
the pages of the last step's instead of a fresh mmap that faults in again. Checked on launched
ranks (``minipar.init`` sets it before it picks the backend: torch ranks run the same line; a
torch rank's start costs ~25 s here, so it is not launched for this), and against a plain Python process, where the same probe must show the
temporary in a mmap of its own (the check can fail)."""
import subprocess
import sys

import pytest

from minipar import launch
from minipar.comm.malloc import probe


def plain_process():
    code = "from minipar.comm.malloc import probe; print(probe())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return eval(out.stdout)  # a dict literal of ints


@pytest.mark.skipif(not probe(), reason="glibc >= 2.33 only (mallopt, mallinfo2)")
def test_without_the_setting_a_temporary_gets_its_own_mmap():
    got = plain_process()
    assert got["mmapped"] >= 8 * 2**20 and got["faults"] > 0  # the next one faults fresh pages in again


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.skipif(not probe(), reason="glibc >= 2.33 only (mallopt, mallinfo2)")
def test_a_launched_rank_reuses_its_freed_pages():
    out = launch(2, "minipar.comm.malloc:probe_rank", quiet=True, job_timeout=110)
    assert out.results == [{"mmapped": 0, "faults": 0}] * 2
