"""The emulated cluster: nodes as network namespaces (root), jobs started across them with
mpiexec's host list and torchrun, and the uplink counters against the collectives' formulas.

Every test makes its own cluster (a unique id in every name) and removes it in a finalizer;
without the right to make namespaces they are skipped with the reason ``refusal()`` gives.
"""
import json
import pathlib
import shlex
import os
import subprocess
import sys

import pytest

from minipar.cluster import launch as L
from minipar.cluster import nodes as N
from minipar.cluster import traffic as T
from minipar.errors import UsageError
from minipar.launcher import rank_env, run_streaming

from .conftest import has_torch

WHY = N.refusal()
needs_namespaces = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def leftovers(state):
    """Whatever of the cluster still exists: namespaces, hosts folders, files, processes."""
    left = N.existing(state)
    left += [f"/etc/netns/{n['ns']}" for n in state["nodes"] if os.path.exists(f"/etc/netns/{n['ns']}")]
    left += [f for f in (state["script"], N.path(state)) if os.path.exists(f)]
    return left


@pytest.fixture(scope="module")
def cluster():
    state = N.up(2, 2, "1gbit")
    yield state
    N.down(state)
    assert not leftovers(state)


def test_rates_and_the_refusal_without_root(monkeypatch, capsys):
    from minipar.cli import main

    assert N.parse_rate("100mbit") == 10**8 and N.parse_rate("1gbit") == 10**9 and N.parse_rate("2.5gbit") == 25 * 10**8
    for bad in ("fast", "1tbit", "100", "10kbit", "-1gbit"):
        with pytest.raises(UsageError, match="1mbit ... 100gbit"):
            N.parse_rate(bad)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(N, "_sh", lambda *a, **k: pytest.fail(f"ran {a} after deciding it could not"))
    assert "need root" in N.refusal() and "--link" in N.refusal()
    with pytest.raises(UsageError, match=r"cannot build a cluster here: .* `minipar --link ethernet"):
        N.up(2, 1, "1gbit")
    for verb in (["up"], ["status"], ["run", "--", "hostname"], ["traffic"], ["down"], ["bench"]):
        assert main(["cluster", *verb]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "need root" in err and "--link" in err, (verb, err)


@needs_namespaces
@pytest.mark.timeout(60)
def test_an_interrupted_up_and_a_crashed_job_leave_nothing(monkeypatch):
    made = []
    monkeypatch.setattr(N, "new_state", lambda *a, new=N.new_state: made.append(new(*a)) or made[-1])
    shape = N._shape
    calls = []

    def interrupted(ns, dev, bits):
        calls.append(ns)
        if len(calls) == 3:  # node 1's uplink: node 0 is built, node 1 half
            raise KeyboardInterrupt
        shape(ns, dev, bits)

    monkeypatch.setattr(N, "_shape", interrupted)
    with pytest.raises(KeyboardInterrupt):
        N.up(2, 1, "1gbit")
    assert len(calls) == 3 and not leftovers(made[0])
    monkeypatch.setattr(N, "_shape", shape)

    state = N.up(1, 1, "1gbit")  # a process left running in a node (a crashed launcher's rank) ...
    try:
        orphan = subprocess.Popen(N.in_node(state, 0, ["sleep", "300"]), start_new_session=True)
        assert N.existing(state) == N.namespaces(state)
    finally:
        removed = N.down(state)
    assert orphan.wait(timeout=10) != 0 and "1 processes" in removed  # ... is ended by down
    assert not leftovers(state)


@needs_namespaces
@pytest.mark.timeout(60)
def test_nodes_are_hosts_with_shaped_uplinks(cluster):
    for i, node in enumerate(cluster["nodes"]):
        probe = "import socket; print(socket.gethostname(), socket.gethostbyname('node0'), socket.gethostbyname('node1'))"
        out = subprocess.run(N.in_node(cluster, i, [sys.executable, "-c", probe]), capture_output=True, text=True, check=True)
        assert out.stdout.split() == [node["host"], cluster["nodes"][0]["ip"], cluster["nodes"][1]["ip"]]
    assert all("tbf" in q and "rate 1Gbit" in q for q in N.qdiscs(cluster).values())
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() not in ("node0", "node1")


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["one_node", "ucx_shared_memory"])
def test_bytes_through_shared_memory_fail_the_check(cluster, how):
    """Two ways the 'inter-node' bytes avoid the link: all four ranks on node 0, and MPICH's UCX left
    to its defaults (it sees one kernel and uses shared memory between the two hosts)."""
    n = 1 << 18
    if how == "one_node":
        res = L.launch_on(cluster, "minipar.cluster.traffic:measure", per_node=4, on=[0], n=n, ranks_per_node=2).results
    else:
        res = L.launch_on(cluster, "minipar.cluster.traffic:measure", env={"UCX_TLS": "all", "UCX_NET_DEVICES": "all"},
                          n=n, ranks_per_node=2).results
        assert [r["shared_memory_group"] for r in res] == [2, 2, 2, 2]  # MPICH still believes in two hosts
    payload = T.crossing_bytes("ring", n, 4, 2, 2)
    verdicts = [T.verdict(d, payload[0]) for d in T.per_node(res, "ring").values()]
    assert verdicts and not any(ok for ok, _ in verdicts), verdicts
    assert all("did not cross" in line for _, line in verdicts)


@needs_namespaces
@pytest.mark.timeout(120)
def test_the_cli_brings_a_cluster_up_runs_across_it_and_takes_it_down(capsys):
    from minipar.cli import main

    assert main(["cluster", "up", "--nodes", "2", "--ranks-per-node", "1", "--inter-rate", "100mbit"]) == 0
    cid = capsys.readouterr().out.split()[1].rstrip(":")
    state = N.find(cid)
    try:
        assert main(["cluster", "run", "--cluster", cid, "--", "hostname"]) == 0  # mpiexec -hosts node0:1,node1:1
        assert sorted(capsys.readouterr().out.split()) == ["node0", "node1"]
        assert main(["cluster", "run", "--cluster", cid, "--engine", "torch", "--dry-run", "--", "x.py"]) == 0
        dry = capsys.readouterr().out
        assert dry.count("torch.distributed.run --nnodes 2 --nproc-per-node 1") == 2, dry
        assert "GLOO_SOCKET_IFNAME=eth0" in dry and f"--rdzv-endpoint node0:{L.RDZV_PORT}" in dry
        assert main(["cluster", "status", "--cluster", cid]) == 0 and "rate 100Mbit" in capsys.readouterr().out
    finally:
        assert main(["cluster", "down", "--cluster", cid]) == 0
    assert cid in capsys.readouterr().out and not leftovers(state)
    assert main(["cluster", "status", "--cluster", cid]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no cluster '{cid}'" in err


# under torchrun: one measured ring all-reduce, the bytes on each node's uplink (the lesson itself
# runs under torchrun elsewhere; here it would double the test's time)
TORCH_PROBE = """
import json, minipar
from minipar.cluster.traffic import measure
comm = minipar.init("torch")
res = comm.builtin.gather_object(measure(comm, n=1 << 16, algorithms=("ring",), ranks_per_node=1), 0)
if comm.rank == 0:
    print("RESULT", json.dumps(res), flush=True)
minipar.comm.finalize()
"""


# --------------------------------------------------------------------------- docs/multinode.md's lines, run


def doc_block(tag):
    """The code block under ``<!-- tested: TAG -->`` in docs/multinode.md, as lines."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "multinode.md").read_text()
    after = text.split(f"<!-- tested: {tag} -->", 1)[1]
    return after.split("```", 2)[1].split("\n")[1:]


# lesson 01 under mpiexec, after a measured ring and hierarchical all-reduce: the bytes on each uplink
MPI_PROBE = """
import json, sys, minipar
from minipar.cluster.traffic import measure
from minipar.lessons.collectives import main
comm = minipar.init("mpi")
res = comm.builtin.gather_object(measure(comm, n=1 << 18, algorithms=("ring", "hierarchical"), ranks_per_node=2), 0)
if comm.rank == 0:
    print("RESULT", json.dumps(res), flush=True)
sys.exit(main(sys.argv[1:]))
"""


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_the_docs_mpiexec_line_runs_lesson_01_on_separate_hosts_over_the_uplinks(cluster, tmp_path):
    """The page's mpiexec line with its host file: ranks on two hosts as MPICH sees them, lesson 01
    passing, and before it a ring and a hierarchical all-reduce (1 MiB of float32) whose bytes on
    each uplink are the formula's, to MPI's few bytes."""
    from minipar.launcher import mpiexec, run_streaming

    hosts = tmp_path / "hosts"
    hosts.write_text("node0:2\nnode1:2\n")  # the host file of the page
    (line,) = [ln for ln in doc_block("mpi") if ln.startswith("mpiexec")]
    argv = shlex.split(line)
    argv[argv.index("hosts")] = str(hosts)
    argv[argv.index("python")] = sys.executable
    module = argv.index("-m", argv.index("mpi4py"))
    assert argv[module + 1] == "minipar.lessons.collectives"
    probe = tmp_path / "probe.py"
    probe.write_text(MPI_PROBE)
    argv[module:module + 2] = [str(probe)]  # the lesson, after the measured all-reduces
    # the one addition of the emulation: hydra's "ssh" enters a namespace
    argv[:1] = [mpiexec(), "-launcher", "ssh", "-launcher-exec", cluster["script"]]
    code, out = run_streaming(N.in_node(cluster, 0, argv), 100, echo=False, env=L.job_env(cluster, "mpi"))
    assert code == 0 and "4 ranks (mpi):" in out, out
    (res,) = [json.loads(ln.split("RESULT ", 1)[1]) for ln in out.splitlines() if "RESULT " in ln]
    assert [r["host"] for r in res] == ["node0", "node0", "node1", "node1"]
    assert [r["shared_memory_group"] for r in res] == [2, 2, 2, 2]  # MPICH sees two hosts of two ranks
    n = 1 << 18
    for alg in ("ring", "hierarchical"):
        payload = T.crossing_bytes(alg, n, 4, 2, 2)
        for host, d in T.per_node(res, alg).items():
            ok, why = T.verdict(d, payload[int(host[4:])])
            assert ok, (alg, host, why)
        assert max(r["algorithms"][alg]["rel_error"] for r in res) < 1e-5  # float32 vs MPI's own sum
    # the check also refuses too many bytes: the ring's counters against the hierarchical's payload
    ok, why = T.verdict(T.per_node(res, "ring")["node0"], T.crossing_bytes("hierarchical", n, 4, 2, 2)[0])
    assert not ok and "besides the payload" in why


@needs_namespaces
@pytest.mark.torch
@pytest.mark.skipif(not has_torch(), reason="needs torch")
@pytest.mark.timeout(180)
def test_the_docs_slurm_torchrun_line_runs_across_the_nodes_over_the_uplinks(cluster, tmp_path):
    """The page's torchrun line on both nodes (c10d rendezvous on node 0, gloo on eth0), its
    script a ring all-reduce whose bytes must be on the uplinks."""
    lines = doc_block("torch")
    env = dict(kv.split("=", 1) for ln in lines if ln.startswith("export ") for kv in ln.split()[1:])
    assert env["GLOO_SOCKET_IFNAME"] == cluster["ifname"]
    (line,) = [ln for ln in lines if ln.startswith("srun torchrun")]
    values = {"$SLURM_NNODES": "2", "$head": "node0", "$SLURM_JOB_ID": cluster["id"]}  # what Slurm fills in
    argv = [values.get(a.split(":")[0], a.split(":")[0]) + (":" + a.split(":")[1] if ":" in a else "")
            for a in shlex.split(line)[2:]]
    argv[argv.index("--nproc-per-node") + 1] = "1"  # one rank per node: the suite's time
    module = argv.index("-m")
    assert argv[module + 1] == "minipar.lessons.collectives"
    probe = tmp_path / "probe.py"
    probe.write_text(TORCH_PROBE)
    argv[module:module + 4] = [str(probe)]  # the script in place of the lesson (and its --backend torch)
    cmds = [N.in_node(cluster, i, [sys.executable, "-m", "torch.distributed.run", *argv]) for i in range(2)]
    code, out = run_streaming(cmds, 150, echo=False, env={**rank_env(), **env}, labels=["[node0] ", "[node1] "])
    assert code == 0, out
    (res,) = [json.loads(ln.split("RESULT ", 1)[1]) for ln in out.splitlines() if "RESULT " in ln]
    assert sorted(r["host"] for r in res) == ["node0", "node1"]
    payload = T.crossing_bytes("ring", 1 << 16, 4, 2, 1)
    for host, d in T.per_node(res, "ring").items():
        ok, why = T.verdict(d, payload[int(host[4:])])
        assert ok, (host, why)


@pytest.mark.timeout(60)
def test_one_runner_for_several_commands_the_first_failure_ends_the_others(tmp_path):
    """``run_streaming`` with a list of commands (torchrun on each node): each line labelled, the
    first failure's exit code, and the command still running ended at once, not waited for; the
    time limit ends them all. (No namespaces needed: plain shells.)"""
    import time

    pidfile = tmp_path / "pid"
    slow = ["sh", "-c", f"echo $$ > {pidfile}; echo up; exec sleep 60"]
    t0 = time.monotonic()
    code, out = run_streaming([slow, ["sh", "-c", "sleep 1; echo failing; exit 3"]], 30, echo=False,
                              labels=["[a] ", "[b] "])
    assert code == 3 and time.monotonic() - t0 < 15, (code, out)  # not the 60 s of the other
    assert "[a] up\n" in out and "[b] failing\n" in out, out
    pid = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    t0 = time.monotonic()
    code, out = run_streaming([["sleep", "60"], ["sleep", "60"]], 1, echo=False)
    assert code == 124 and time.monotonic() - t0 < 15 and "hard time limit" in out
    assert run_streaming([["true"], ["true"]], 10, echo=False)[0] == 0


# --------------------------------------------------------------------------- placements, predicted


def test_the_planner_predicts_each_placement_from_the_clusters_hardware_file(tmp_path):
    """The hardware file the placement command writes is one `minipar plan --hardware-file` reads;
    from it the planner puts each comparison's placement across the slow link behind the other
    one, and the node's ranks share its uplink (pure: no cluster)."""
    from minipar.bench import cluster as B
    from minipar.cli import main
    from minipar.cli.cluster import PLACEMENT_MODEL
    from minipar.plan.hardware import hardware_file
    from minipar.records import write_json
    from minipar.train.model import GPTConfig
    from minipar.train.trainer import TrainConfig

    path = str(tmp_path / "cluster.json")
    write_json(path, B.cluster_hardware("100mbit", 2, (2e-5, 1 / 3e9), 1e-4))
    hw = hardware_file(path)
    assert (hw.gpus_per_node, hw.inter.bandwidth, hw.inter.alpha) == (2, 100e6 / 8 / 2, 1e-4)
    cfg = TrainConfig(GPTConfig(**PLACEMENT_MODEL), batch=16)
    pred = {}
    for c, (grid, (inside, across)) in B.COMPARISONS.items():
        for p in (inside, across):
            run = B.placement_config(cfg, grid, p)
            pred[p.name] = B.predicted(run, p.per_node, hw, B.tp_across(run, p.per_node), cores=2)
        # links swapped for TP across (else "tp across" = "tp inside"); the one-node DDP on the fast link
        assert pred[across.name].step_time_s > 1.1 * pred[inside.name].step_time_s, (c, pred)
    # DP across with 2 ranks a node (each half the gradients) and DDP with 1 rank a node: the same
    # bytes through one uplink, the same time (an uplink per rank would halve the first)
    dp2, ddp = pred["tp inside, dp across"].parts["dp_comm"], pred["ddp across the link"].parts["dp_comm"]
    assert abs(dp2 / ddp - 1) < 0.05, (dp2, ddp)
    shape = ["--layers", "2", "--hidden", "128", "--heads", "4", "--seq", "32", "--vocab", "96"]
    assert main(["plan", "--hardware-file", path, "--gpus", "4", "--gpus-per-node", "2", "--tp", "2", "--dp", "2",
                 "--global-batch", "16", *shape]) == 0


@needs_namespaces
@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_ddp_across_the_link_and_on_one_node_measured_and_predicted(tmp_path):
    """`minipar cluster placement --compare ddp` on a 1 Gbit/s cluster of its own, one round of 2
    steps of a tiny GPT: the bytes between nodes read from the trace equal the formula's (all of
    DDP's across the link, none on one node), and the planner's DP time across, from the hardware
    file it wrote, is those bytes at the link's rate."""
    from minipar.bench import cluster as B
    from minipar.lessons.train import make_config

    path = str(tmp_path / "cluster.json")
    recs = B.placements("1gbit", make_config(steps=2), ("ddp",), rounds=1, hardware_file=path)
    file = json.loads(pathlib.Path(path).read_text())
    one, across = recs
    assert across["inter_bytes"] == across["inter_bytes_formula"] > 0 and across["intra_bytes"] == 0, across
    assert one["inter_bytes"] == one["inter_bytes_formula"] == 0 and one["intra_bytes"] == across["inter_bytes"], one
    assert across["steps_timed"] == one["steps_timed"] == 1 and one["predicted_s"] > 0
    # the planner's DP time across is the ring over the 2 nodes of the gradient the trace counted:
    # 2 alpha + n / rate, each rank's uplink its own (the file's per-GPU share is for 2 ranks a node)
    n, bw, alpha = across["inter_bytes"] / 2, 2 * file["inter"]["bandwidth"], file["inter"]["latency"]
    assert bw == 1e9 / 8
    assert abs(across["predicted_parts"]["dp_comm"] - (2 * alpha + n / bw)) <= 1e-3 * n / bw, (across, file)


def test_segments_sent_again_are_counted_once_each_and_nothing_else_is_excused(tmp_path):
    """The counters' check takes MSS bytes per retransmitted segment off (TCP's RetransSegs), and
    only those: the 10 Gbit/s rep that resent 45 segments passes with its count, fails without
    it, and a count cannot hide bytes that went through shared memory."""
    payload, packets = 12_582_912, 500
    resent = {"tx_bytes": payload + T.HEADERS * packets + 45 * T.MSS + 1388, "tx_packets": packets}
    assert not T.verdict(resent, payload)[0]
    ok, line = T.verdict(dict(resent, retrans_segs=45), payload)
    assert ok and "45 segments sent again" in line, line
    assert not T.verdict(dict(resent, retrans_segs=46), payload)[0]  # a segment more than was resent: short of the payload
    shared = {"tx_bytes": 20_000, "tx_packets": 100, "retrans_segs": 3}
    assert not T.verdict(shared, payload)[0]
    snmp = tmp_path / "snmp"
    snmp.write_text("Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 2774 0\nUdp: InDatagrams\nUdp: 5\n")
    assert T.retransmitted_segments(str(snmp)) == 2774
