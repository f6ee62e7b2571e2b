"""A cluster of N nodes on one Linux box, to launch on as on real machines (root needed).

    sudo minipar cluster up --nodes 2 --ranks-per-node 2 --inter-rate 1gbit
    minipar cluster run --engine torch -- python -m minipar.lessons.collectives --backend torch
    minipar cluster traffic          # the bytes on each node's uplink vs the formula
    minipar cluster down

``nodes``: the namespaces, links, hostnames and the state file. ``launch``: mpiexec and torchrun
command lines for the cluster, and running them. ``traffic``: byte counters, and what a
collective must have sent across nodes. docs/cluster.md measures it; docs/multinode.md takes the
same launches to real machines.
"""
from .launch import mpiexec_command, run, torchrun_commands
from .nodes import counters, down, find, refusal, up

__all__ = ["up", "down", "find", "refusal", "counters", "run", "mpiexec_command", "torchrun_commands"]
