"""Starting a job on the cluster with the engines' own multi-node launchers.

MPI (MPICH's hydra), started on node 0 as a user would start it on a login node::

    mpiexec -hosts node0:2,node1:2 -launcher ssh -launcher-exec <cluster>.ssh CMD

Hydra starts one proxy per host through the launcher; ours enters that node's namespaces where
ssh would log in (``nodes._write_script``). MPICH then puts ranks of one host on shared memory
and ranks of different hosts on its network module. Its default network module here, UCX, finds
that two "hosts" share one kernel and would move their bytes through shared memory anyway
(measured: 16 kB crossed eth0 for an 8 MB all-reduce), so the job is told to use TCP on eth0 only
(``UCX_TLS=tcp,self``, ``UCX_NET_DEVICES=eth0``), as a real two-machine job would; and to send
large messages in pieces of 256 kB, not 8 kB (``UCX_TCP_TX_SEG_SIZE``, ``UCX_TCP_RX_SEG_SIZE``).

torch: on every node i, at once::

    GLOO_SOCKET_IFNAME=eth0 torchrun --nnodes N --nproc-per-node R --rdzv-backend c10d \\
        --rdzv-endpoint node0:29500 --rdzv-id <cluster id> CMD

torchrun's ``--node-rank`` is for ``--rdzv-backend static`` only (under c10d it warns that it
ignores it): the c10d rendezvous numbers the nodes in the order they arrive, and the ranks of one
node are always consecutive. Each node's namespace has its own ports, so 29500 is free on node 0.
"""
from __future__ import annotations

import sys

from ..errors import UsageError
from . import nodes as N

RDZV_PORT = 29500
# MPICH's UCX network module would reach the other "node" through shared memory (same kernel);
# and UCX's TCP moves a large message in 8 kB pieces, one pass of its progress loop each: on 2 busy
# cores that, not the link, held a 2 x 2 ring at 0.4-0.65 of a 1 Gbit/s uplink (0.76 at 100 Mbit/s);
# pieces of 256 kB reach 0.7-0.85 (0.93), 64-512 kB alike, 1 MB worse (docs/cluster.md)
MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": N.IFNAME, "UCX_TCP_TX_SEG_SIZE": "256k", "UCX_TCP_RX_SEG_SIZE": "256k"}


def hosts_arg(state: dict, ranks_per_node: int | None = None, on: list[int] | None = None) -> str:
    """``node0:2,node1:2``: hydra's host list, ``ranks_per_node`` ranks on each node of ``on`` (default all)."""
    r = ranks_per_node or state["ranks_per_node"]
    on = range(len(state["nodes"])) if on is None else on
    return ",".join(f"{state['nodes'][i]['host']}:{r}" for i in on)


def mpiexec_command(state: dict, argv: list[str], ranks_per_node: int | None = None, on=None) -> list[str]:
    """The whole command, run from the host: mpiexec on node 0, its proxies on every node."""
    from ..launcher import mpiexec

    mpi = [mpiexec(), "-hosts", hosts_arg(state, ranks_per_node, on), "-launcher", "ssh",
           "-launcher-exec", state["script"], *argv]
    return N.in_node(state, 0, mpi)


def torchrun_commands(state: dict, argv: list[str], ranks_per_node: int | None = None) -> list[list[str]]:
    """One command per node: torchrun in the node's namespace, rendezvous at node 0."""
    r, n = ranks_per_node or state["ranks_per_node"], len(state["nodes"])
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", str(r),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{state['nodes'][0]['host']}:{RDZV_PORT}",
           "--rdzv-id", state["id"]]
    return [N.in_node(state, i, [*run, *argv]) for i in range(n)]


def engine_env(state: dict, engine: str) -> dict:
    """What a job on the cluster adds to the ranks' usual environment: the engine's interface."""
    return dict(MPI_ENV) if engine == "mpi" else {"GLOO_SOCKET_IFNAME": state["ifname"]}


def job_env(state: dict, engine: str) -> dict:
    """The environment of a job on the cluster: the ranks' usual one (launcher.rank_env) and :func:`engine_env`."""
    from ..launcher import rank_env

    return {**rank_env(), **engine_env(state, engine)}


def run(state: dict, engine: str, argv: list[str], limit: float = 600, echo: bool = True,
        ranks_per_node: int | None = None):
    """Run ``argv`` on every node with the engine's launcher; (exit code, output). Whatever way
    it ends (a rank failing, the time limit, Ctrl-C, SIGTERM), nothing of it outlives the call."""
    if engine not in ("mpi", "torch"):
        raise UsageError(f"engine {engine!r}: choose mpi or torch")
    if not argv:
        raise UsageError("nothing to run: give the command after --, e.g. `minipar cluster run -- python x.py`")
    if not N.existing(state):
        raise UsageError(f"cluster {state['id']} is gone (its namespaces do not exist): `minipar cluster down` "
                         "removes its state, `minipar cluster up` makes a new one")
    from ..launcher import run_streaming

    env = job_env(state, engine)
    try:
        if engine == "mpi":
            return run_streaming(mpiexec_command(state, argv, ranks_per_node), limit, echo=echo, env=env)
        cmds = torchrun_commands(state, argv, ranks_per_node)
        return run_streaming(cmds, limit, echo=echo, env=env, labels=[f"[node{i}] " for i in range(len(cmds))])
    finally:
        N.end_processes(state)  # a rank that outlived its launcher (a crash) ends here


def launch_on(state: dict, target, /, *, per_node: int | None = None, on: list[int] | None = None,
              env: dict | None = None, **kwargs):
    """:func:`minipar.launch` on the cluster: ``target(comm, **kwargs)`` on ``per_node`` ranks
    (default: the cluster's ranks per node) of each node of ``on`` (default: every node), started
    by :func:`mpiexec_command` (MPI backend), with ``env`` (default ``MPI_ENV``). Returns the LaunchResult.

    A job that fails while a node of it is lost (its namespace deleted, its uplink down) raises
    the LaunchError with the lost node and its ranks named first in its line: hydra ends a job whose
    proxy died at once, with a line of its own that names neither."""
    from ..launcher import LaunchError, launch

    r = per_node or state["ranks_per_node"]
    hosts = list(range(len(state["nodes"]))) if on is None else list(on)
    kwargs.setdefault("quiet", True)
    try:
        return launch(r * len(hosts), target, via=lambda n, ranks: mpiexec_command(state, ranks, r, hosts),
                      env=MPI_ENV if env is None else env, **kwargs)
    except LaunchError as err:
        gone = N.lost(state)
        said = [f"{state['nodes'][i]['host']} ({why}; ranks {', '.join(str(j * r + k) for k in range(r))})"
                for j, i in enumerate(hosts) if (why := gone.get(i))]
        if said:
            err.line = f"lost {', '.join(said)}: {err.line}"
        raise
    finally:
        N.end_processes(state)
