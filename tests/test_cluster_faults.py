"""Faults across nodes, on the emulated cluster: a node's uplink brought down in the middle of
training, a node deleted (its processes killed, its namespace removed), and the run resumed from
its last checkpoint on the node that is left, on another grid.

Lesson 05's trainer, dp = 2 across 2 nodes x 1 rank (1 Gbit/s uplinks), a checkpoint every 2
steps, the watchdog at ``WATCHDOG`` seconds; the fault comes once the first checkpoint is there.
Each test makes its own cluster and removes it; without the right to make namespaces they are
skipped with the reason ``refusal()`` gives.
"""
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from minipar.cluster import launch as L
from minipar.cluster import nodes as N
from minipar.comm import watchdog as W
from minipar.comm.watchdog import GRACE, ORPHANED
from minipar.errors import UsageError
from minipar.launcher import LaunchError
from minipar.lessons.train import make_config

from .test_cluster import leftovers, needs_namespaces

WATCHDOG = 2.0
# after the watchdog: the owner's GRACE for the other reports and its 1 s before MPI_Abort; where
# the owner is the rank cut off, the other rank's ORPHANED wait and its own 1 s; then mpiexec's
# teardown and the launcher's clean-up, on 2 busy cores (5 s)
MARGIN = GRACE + 1 + ORPHANED + 1 + 5
TINY = dict(vocab=16, d_model=8, n_heads=2, n_layers=2, seq_len=8)
CFG = dict(model=TINY, dp=2, steps=400, ranks_per_node=1)  # far more steps than the test waits for


def test_a_rank_the_owners_abort_never_reaches_aborts_the_job_itself(tmp_path, monkeypatch, capfd):
    """The watchdog's report is owned by the first rank to fire; if that rank's host is cut off,
    its printed report and its MPI_Abort never arrive, and the ranks still reachable would wait
    for the job's hard limit. A rank still alive ``ORPHANED`` s after the owner removed the report
    folder says, in one line, what it waits on, and aborts. (In-process: a watchdog whose folder
    another "rank" made and removed; without the rule, nothing ever aborts.)"""
    monkeypatch.setattr(W, "ORPHANED", 0.5)
    aborted = threading.Event()
    folder = str(tmp_path / "report")
    wd = W.Watchdog(0, 2, 60, folder, lambda code: aborted.set())
    wd.state = ("wait(irecv) from rank 1 tag 1002 (64 bytes)", time.monotonic(), threading.get_ident())
    os.mkdir(folder)  # rank 1 fired first: it owns the report ...
    deadline = time.monotonic() + 10
    while not os.path.exists(os.path.join(folder, "rank.0")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(os.path.join(folder, "rank.0"))  # ... rank 0 wrote its part ...
    shutil.rmtree(folder)  # ... and rank 1 printed it (where nobody sees it) and called MPI_Abort, in vain
    assert aborted.wait(10)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "rank 0:" in err and "blocked in wait(irecv) from rank 1" in err, err


def train_rank(comm, cfg, save):
    """On every rank: lesson 05's trainer, a checkpoint every 2 steps into ``save``."""
    from minipar.train.trainer import train

    return train(comm, cfg, save=save, save_every=2)[1]


def resume_rank(comm, cfg, directory):
    """On every rank: the checkpoint in ``directory`` resumed on ``cfg``'s grid, trained to
    ``cfg.steps``; (the step it resumed at, the losses from there)."""
    from minipar.train.checkpoint import resume
    from minipar.train.trainer import train

    tr, start = resume(comm, cfg, directory)
    return start, train(comm, cfg, trainer=tr, start=start)[1]


def fault_mid_training(state, tmp_path, fault):
    """Train across the cluster; once the first checkpoint is written, ``fault(state)``. Returns
    (the LaunchError, seconds from the fault to the job's end, the checkpoint folder)."""
    ckpt = str(tmp_path / "ckpt")
    when = {}

    def later():
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(ckpt, "latest")) and time.monotonic() < deadline:
            time.sleep(0.05)
        when["fault"] = time.monotonic()
        fault(state)

    threading.Thread(target=later, daemon=True).start()
    with pytest.raises(LaunchError) as err:
        L.launch_on(state, "tests.test_cluster_faults:train_rank", watchdog=WATCHDOG, job_timeout=90,
                    cfg=make_config(**CFG), save=ckpt)
    assert "fault" in when, "the job ended before its first checkpoint"
    return err.value, time.monotonic() - when["fault"], ckpt


def cut_uplink(state):
    subprocess.run(["ip", "-n", state["nodes"][1]["ns"], "link", "set", state["ifname"], "down"], check=True)


def delete_node(state):
    ns = state["nodes"][1]["ns"]
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], check=True)


def in_namespaces(state):
    return [p for ns in N.existing(state) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                                  text=True).stdout.split()]


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_cut_uplink_mid_training_ends_the_job_within_the_watchdog_naming_the_lost_peer(tmp_path):
    """Each rank waits on the other: nothing crosses the link, and TCP would retry for minutes.
    The watchdog fires; whichever rank owns the report, rank 0 (on the node that still reaches
    mpiexec) says what it is blocked on (rank 1's message, or a collective), the job's line names
    the lost node and its ranks, and the job ends within the watchdog + MARGIN."""
    state = N.up(2, 1, "1gbit")
    try:
        err, after, _ = fault_mid_training(state, tmp_path, cut_uplink)
        print(f"ended {after:.1f} s after the cut: {err.line}")
        assert after <= WATCHDOG + MARGIN, (after, err.output)
        assert "minipar watchdog" in err.output and "job killed after" not in err.output, err.output
        # rank 0's own line says what it waits on: a message from rank 1, or a collective of both
        assert re.search(r"rank 0\b[^\n]*blocked in (\S+ (from|to) rank 1\b|builtin |barrier )", err.output), err.output
        assert err.line.startswith("lost node1 (its uplink is down; ranks 1)"), err.line
        assert not in_namespaces(state)  # node 1's rank, cut off from hydra, is ended by launch_on
    finally:
        N.down(state)
    assert not leftovers(state)


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_a_deleted_node_ends_the_job_and_the_run_resumes_on_the_node_left_on_another_grid(tmp_path):
    """Node 1's processes killed and its namespace deleted: hydra sees its proxy's connection close
    and ends the job at once (no watchdog needed); the line names the lost node and its ranks. The
    newest complete checkpoint passes its checksums and resumes on node 0's 2 ranks as tp = 2: the
    losses are the dense reference's from that step on (float64: 1e-10)."""
    from minipar.train.checkpoint import read_index
    from minipar.train.reference import train_reference

    state = N.up(2, 1, "1gbit")
    try:
        err, after, ckpt = fault_mid_training(state, tmp_path, delete_node)
        print(f"ended {after:.1f} s after the deletion: {err.line}")
        assert after <= WATCHDOG + MARGIN, (after, err.output)
        assert err.line.startswith("lost node1 (its namespace is gone; ranks 1)"), err.line
        assert not in_namespaces(state)

        step_dir, index = read_index(ckpt)  # the step `latest` names, or the newest complete one; verified
        # the checksums can fail: a copy with one byte changed is refused
        bad = tmp_path / "damaged"
        shutil.copytree(step_dir, bad)
        shard = next(f for f in sorted(os.listdir(bad)) if f.endswith(".safetensors"))
        with open(bad / shard, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
        with pytest.raises(UsageError, match="damaged"):
            read_index(str(bad))

        other = make_config(model=TINY, tp=2, steps=index["step"] + 2, ranks_per_node=2)
        out = L.launch_on(state, "tests.test_cluster_faults:resume_rank", per_node=2, on=[0], cfg=other,
                          directory=step_dir).results
    finally:
        N.down(state)
    assert not leftovers(state)
    start, losses = out[0]
    assert start == index["step"] >= 2
    want, _ = train_reference(make_config(**dict(CFG, steps=start + 2)))
    np.testing.assert_allclose(losses, want[start:], rtol=1e-10)
    # the comparison sees which steps they are: the same losses one step off do not match
    assert not np.allclose(losses, want[start - 1:start + 1], rtol=1e-6)
