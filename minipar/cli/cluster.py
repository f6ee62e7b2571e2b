"""``minipar cluster``: N nodes on this machine (network namespaces, root needed), and jobs
started on them with the engines' own multi-node launchers (part of lesson 01).

    minipar cluster up --nodes 2 --ranks-per-node 2 --inter-rate 1gbit
    minipar cluster status
    minipar cluster run -- python -m mpi4py my_script.py             # mpiexec -hosts node0:2,node1:2 ...
    minipar cluster run --engine torch -- my_script.py               # torchrun --nnodes 2 ... on each node
    minipar cluster traffic                                           # uplink bytes vs the ring's formula
    minipar cluster bench --rates 100mbit 1gbit --json bench.json    # flat vs hierarchical vs MPI's own
    minipar cluster placement --rates 100mbit 1gbit                  # lesson 05's trainer: placements, measured
                                                                     # and predicted (minipar plan)
    minipar cluster down

The technique is ``minipar.cluster``; the benchmark ``minipar.bench.cluster``.
"""
from __future__ import annotations

import argparse
import os
import shlex

from ..cluster import nodes as N
from ..errors import UsageError
from ..records import write_json
from .common import bounded, output_path, positive, progress, size_at_most, with_example


def rate(text: str) -> str:
    try:
        N.parse_rate(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


# the vector is held several times by each of the ranks, all on this machine
SIZE = size_at_most(1 << 30, "1 GiB: every rank holds the vector a few times, and all ranks are on this machine")


def refuse_without_namespaces(args):
    """Every cluster verb, before anything: one line where namespaces cannot be made here."""
    why = N.refusal()
    if why:
        raise UsageError(why)


def add_verbs(verbs):
    c = verbs.top.add_parser("cluster", help="nodes as network namespaces on this machine, and jobs across them",
                             description=__doc__.split("\n\n")[0], **with_example("minipar cluster up --nodes 2"))
    sub = c.add_subparsers(dest="cluster_verb", metavar="VERB", required=True)
    verbs_here = []

    u = sub.add_parser("up", help="bring up N nodes joined by a shaped switch",
                       **with_example("minipar cluster up --nodes 2 --ranks-per-node 2 --inter-rate 1gbit"))
    u.add_argument("--nodes", type=bounded(200, "addresses 10.x.0.1 ... 10.x.0.200"), default=2)
    u.add_argument("--ranks-per-node", type=bounded(64, "ranks of one node share this machine's cores"), default=2)
    u.add_argument("--inter-rate", type=rate, default="1gbit", help="each node's uplink, both ways (tc: 100mbit, 1gbit)")
    u.add_argument("--intra-rate", type=rate, help="also shape each node's loopback (torch's intra-node traffic; "
                                                   "MPI's goes through shared memory, which no rate shapes)")
    u.set_defaults(func=cmd_up)

    for name, help, func in (("status", "the cluster's nodes, links and byte counters", cmd_status),
                             ("down", "remove the cluster: its processes, namespaces, links and files", cmd_down)):
        p = sub.add_parser(name, help=help, **with_example(f"minipar cluster {name}"))
        p.add_argument("--cluster", metavar="ID", help="which cluster (default: the only one)")
        p.set_defaults(func=func)
        verbs_here.append(p)

    r = sub.add_parser("run", help="run a command on every node with mpiexec or torchrun",
                       **with_example("minipar cluster run -- python -m mpi4py script.py\n"
                                      "  minipar cluster run --engine torch -- script.py --its-options"))
    r.add_argument("--cluster", metavar="ID", help="which cluster (default: the only one)")
    r.add_argument("--engine", choices=("mpi", "torch"), default="mpi",
                   help="mpi: mpiexec -hosts node0:R,... from node 0; torch: torchrun --nnodes N on every node")
    r.add_argument("--ranks-per-node", type=bounded(64, "ranks of one node share this machine's cores"),
                   help="default: the cluster's")
    r.add_argument("--timeout", type=positive, default=600, help="seconds before the job is stopped (default 600)")
    r.add_argument("--dry-run", action="store_true", help="print the command lines, start nothing")
    r.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command (torch: the script and its options)")
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("traffic", help="one all-reduce across the nodes: each uplink's bytes vs the formula",
                       **with_example("minipar cluster traffic --size 4M --algorithm hierarchical"))
    t.add_argument("--cluster", metavar="ID", help="which cluster (default: the only one)")
    t.add_argument("--size", type=SIZE, default=4 << 20, help="bytes of float32 to all-reduce (default 4M)")
    t.add_argument("--algorithm", choices=("ring", "hierarchical"), default="ring")
    t.add_argument("--json", type=output_path, help="write each node's counters and verdict here")
    t.set_defaults(func=cmd_traffic)

    b = sub.add_parser("bench", help="flat ring vs hierarchical vs MPI's all-reduce at each rate (own clusters)",
                       **with_example("minipar cluster bench --rates 100mbit 1gbit --json bench.json"))
    b.add_argument("--rates", type=rate, nargs="+", default=["100mbit", "1gbit"])
    b.add_argument("--nodes", type=bounded(16, "ranks share this machine's cores"), default=2)
    b.add_argument("--ranks-per-node", type=bounded(16, "ranks share this machine's cores"), default=2)
    b.add_argument("--size", type=SIZE, default=8 << 20, help="bytes of float32 to all-reduce (default 8M)")
    b.add_argument("--reps", type=bounded(100, "each repetition at 100mbit takes a second per 8 MB"), default=3)
    b.add_argument("--json", type=output_path, help="write one record per (rate, algorithm) here")
    b.set_defaults(func=cmd_bench)
    pl = sub.add_parser("placement", help="lesson 05's trainer on 2 nodes: TP inside vs across, PP across vs TP "
                                          "across, DDP across the link vs on one node; measured and predicted (own clusters)",
                        **with_example("minipar cluster placement --rates 100mbit 1gbit --json placement.json "
                                       "--hardware-file cluster.json"))
    pl.add_argument("--rates", type=rate, nargs="+", default=["100mbit"])
    pl.add_argument("--compare", nargs="+", choices=("tp", "pp", "ddp"), default=["tp", "pp", "ddp"],
                    help="tp: dp2 x tp2, TP inside vs across; pp: pp2 x tp2, PP across vs TP across; ddp: dp2 across "
                         "the link vs on one node (default all)")
    pl.add_argument("--steps", type=bounded(100, "steps of each run"), default=4,
                    help="steps per run; the first is not timed (default 4)")
    pl.add_argument("--rounds", type=bounded(20, "interleaved rounds"), default=2,
                    help="runs of each placement, interleaved (default 2)")
    pl.add_argument("--json", type=output_path, help="write one record per (rate, placement) here")
    pl.add_argument("--hardware-file", type=output_path, help="write the cluster's description for `minipar plan "
                    "--hardware-file` here (with several rates, one file each: NAME-RATE.json)")
    pl.set_defaults(func=cmd_placement)
    for p in (u, r, t, b, pl, *verbs_here):
        p.set_defaults(validate=refuse_without_namespaces)


def _elements(nbytes: int) -> int:
    if nbytes < 4:
        raise UsageError(f"--size {nbytes}: at least 4 bytes (one float32)")
    return nbytes // 4


def cmd_up(args):
    s = N.up(args.nodes, args.ranks_per_node, args.inter_rate, args.intra_rate,
             progress=lambda it: progress(it, desc="nodes", unit="node"))
    print(f"cluster {s['id']}: {len(s['nodes'])} nodes x {s['ranks_per_node']} ranks, uplinks {args.inter_rate}"
          + (f", loopback {args.intra_rate}" if args.intra_rate else ""))
    for n in s["nodes"]:
        print(f"  {n['host']:<7} {n['ip']:<14} namespace {n['ns']}")
    print(f"state: {N.path(s)} (minipar cluster down removes it all)")
    return 0


def cmd_status(args):
    s = N.find(args.cluster)
    alive = N.existing(s)
    print(f"cluster {s['id']}: {len(s['nodes'])} nodes x {s['ranks_per_node']} ranks; state {N.path(s)}")
    if len(alive) < len(N.namespaces(s)):
        print(f"  incomplete: {len(alive)} of {len(N.namespaces(s))} namespaces exist; `minipar cluster down` removes the rest")
        return 1
    shaping = N.qdiscs(s)
    for n, c in zip(s["nodes"], N.counters(s)):
        print(f"  {n['host']:<7} {n['ip']:<14} {n['ns']}  tx {c['tx_bytes']} B rx {c['rx_bytes']} B  [{shaping[n['host']]}]")
    return 0


def cmd_down(args):
    s = N.find(args.cluster)
    print(f"cluster {s['id']} removed: {', '.join(N.down(s)) or 'nothing was left'}")
    return 0


def cmd_run(args):
    from ..cluster import launch as L
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    s = N.find(args.cluster)
    if args.dry_run:
        env = L.engine_env(s, args.engine)
        cmds = ([L.mpiexec_command(s, command or ["CMD"], args.ranks_per_node)] if args.engine == "mpi"
                else L.torchrun_commands(s, command or ["CMD"], args.ranks_per_node))
        for c in cmds:
            print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(c))
        return 0
    code, _ = L.run(s, args.engine, command, limit=args.timeout, ranks_per_node=args.ranks_per_node)
    if code:
        print(f"minipar cluster run: the job ended with exit code {code}")
    return code


def cmd_traffic(args):
    from ..cluster import launch as L
    from ..cluster import traffic as T

    s = N.find(args.cluster)
    n, R, nodes = _elements(args.size), s["ranks_per_node"], len(s["nodes"])
    print(f"{args.algorithm} all-reduce of {4 * n} B on {nodes} nodes x {R} ranks (mpiexec across the nodes) ...")
    res = L.launch_on(s, "minipar.cluster.traffic:measure", n=n, algorithms=(args.algorithm,), ranks_per_node=R).results
    hosts = [r["host"] for r in sorted(res, key=lambda r: r["rank"])]
    shm = {r["host"]: r["shared_memory_group"] for r in res}
    print(f"ranks' hosts: {' '.join(hosts)}; MPI's shared-memory group per host: {shm}")
    payload = T.crossing_bytes(args.algorithm, n, 4, nodes, R)
    rows, ok = [], True
    for host, d in sorted(T.per_node(res, args.algorithm).items()):
        good, line = T.verdict(d, payload[int(host[4:])])
        ok &= good
        print(f"  {host}: {'ok  ' if good else 'FAIL'} {line}")
        rows.append({"host": host, "ok": good, "payload": payload[int(host[4:])], **d})
    if args.json:
        write_json(args.json, rows)
    return 0 if ok else 1


def cmd_bench(args):
    from ..bench import cluster as B
    print(f"all-reduce of {args.size} B float32 on {args.nodes} nodes x {args.ranks_per_node} ranks, "
          f"median of {args.reps}; a cluster of its own per rate")
    records = B.run(args.rates, _elements(args.size), args.nodes, args.ranks_per_node, args.reps,
                    progress=lambda it: progress(it, desc="rates", unit="rate"))
    print(B.table(records))
    if args.json:
        write_json(args.json, records)
    return 0


PLACEMENT_MODEL = dict(vocab=96, d_model=128, n_heads=4, n_layers=2, seq_len=32)  # ~0.4 M parameters, float64


def hardware_path(path: str | None, rate: str, rates: list) -> str | None:
    """Where the hardware file of ``rate`` goes: ``path``, or with several rates ``stem-RATE.ext``."""
    if not path or len(rates) == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}-{rate}{ext or '.json'}"


def cmd_placement(args):
    from ..bench import cluster as B
    from ..train.model import GPTConfig
    from ..train.trainer import TrainConfig

    cfg = TrainConfig(GPTConfig(**PLACEMENT_MODEL), steps=args.steps, batch=16, lr=1e-3)  # the placements' own run
    print(f"{', '.join(args.compare)} on 2 nodes, GPT {PLACEMENT_MODEL}, batch 16, {args.steps} steps x "
          f"{args.rounds} rounds per placement; a cluster of its own per rate")
    records = []
    for r in args.rates:
        records += B.placements(r, cfg, args.compare, args.rounds, hardware_path(args.hardware_file, r, args.rates),
                                progress=lambda it: progress(it, desc=f"{r} rounds", unit="round"))
    print(B.placement_table(records))
    if args.json:
        write_json(args.json, records)
    return 0
