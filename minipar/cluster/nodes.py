"""N nodes on one Linux box: each a network namespace with its own hostname, joined by a switch.

    sudo minipar cluster up --nodes 2 --ranks-per-node 2 --inter-rate 1gbit

What ``up`` builds (every name carries the cluster's id, e.g. ``mp3f9a``, so two clusters, or a
cluster and a test, never meet)::

    namespace mp3f9as (the switch)        br0, a bridge, with one port p<i> per node
          |  veth pair, shaped by tbf in both directions to --inter-rate
    namespace mp3f9an<i> (node i)         eth0 10.<k>.0.<i+1>/24, lo (optionally shaped to --intra-rate)

A node's hostname lives in a UTS namespace of its own. There is no process holding it: every
command started on a node goes through ``ip netns exec NS unshare --uts sh -c 'hostname node<i>;
exec CMD'``, so the hostname is set for exactly that command and its children. A holder process
per node would be one more thing that could outlive a crash; this way a node is only its network
namespace, and deleting the namespaces deletes everything (the veth pairs and the bridge go with
the namespaces they sit in). ``ip netns exec`` also bind-mounts ``/etc/netns/<ns>/hosts`` over
``/etc/hosts``, which is how ``node0``, ``node1`` ... resolve, and remounts ``/sys`` so that
``/sys/class/net/eth0/statistics`` inside a node are that node's counters.

The state is a small JSON file (``state_dir()/<id>.json``) written *before* anything is created,
so ``down`` can remove what an interrupted or killed ``up`` left. ``down`` ends the processes
still inside the namespaces (``ip netns pids``), then deletes the namespaces and the files.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time

from ..errors import UsageError

IFNAME = "eth0"  # each node's uplink, as on a real machine (GLOO_SOCKET_IFNAME=eth0)
TOOLS = ("ip", "tc", "unshare")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
_UNITS = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_rate(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits/s (tc's spelling: bit, kbit, mbit, gbit; 1 Mbit/s ... 100 Gbit/s)."""
    m = _RATE.match(str(text).strip().lower())
    bits = int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0
    if not 10**6 <= bits <= 10**11:
        raise UsageError(f"rate {text!r}: expected 1mbit ... 100gbit, written as tc writes it (100mbit, 1gbit)")
    return bits


def state_dir() -> str:
    """Where clusters' state files live: $XDG_RUNTIME_DIR/minipar-cluster, else /tmp/minipar-cluster."""
    return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", "minipar-cluster")


def refusal() -> str | None:
    """Why namespaces cannot be made here (one line), or None: decided before anything is created.
    The probe ``unshare --net true`` makes an anonymous namespace that is gone when it exits."""
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        why = f"{', '.join(missing)} not found (iproute2, util-linux)"
    elif os.geteuid() != 0:
        why = "network namespaces need root"
    elif subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True).returncode != 0:
        why = "this machine forbids new network namespaces (a container or sandbox)"
    else:
        return None
    return f"cannot build a cluster here: {why}; emulate a link on one host instead with `minipar --link ethernet ...`"


def _sh(*args, check=True):
    out = subprocess.run(args, capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def _burst(bits: int) -> int:
    """tbf's bucket, bytes: 2 ms at the rate, and at least 64 KiB (one GSO packet of veth's must fit).
    tc-tbf(8)'s rule "burst >= rate / HZ" dates from jiffy timers; tbf now waits on an hrtimer, and
    measured here (HZ = 250, one TCP stream through the 1 Gbit/s link) 1 ms, 2 ms (this rule) and
    4 ms (= rate / HZ) of burst all gave 0.95 of the rate; 16 KiB gave 0.62 (docs/cluster.md)."""
    return max(bits // 8 // 500, 1 << 16)


def _shape(ns: str, dev: str, bits: int):
    _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit",
        "burst", str(_burst(bits)), "latency", "100ms")


def set_rate(state: dict, rate: str) -> dict:
    """Reshape every uplink of a running cluster, both ways, to ``rate`` (tc's spelling), in place
    (``tc qdisc replace``: connections stay up); the state file records it. Returns the state."""
    bits = parse_rate(rate)
    for i, node in enumerate(state["nodes"]):
        _shape(node["ns"], IFNAME, bits)
        _shape(state["switch"], f"p{i}", bits)
    state["inter_rate"] = bits
    _write(state)
    return state


def _no_ipv6(ns: str):
    """No IPv6 in ``ns``: its router solicitations and multicast reports would add bytes to the
    counters that no collective sent."""
    _sh("ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"
        " && echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6")


def new_state(nodes: int, ranks_per_node: int, inter_rate: str, intra_rate: str | None = None) -> dict:
    """The plan of a cluster, before anything exists: names, addresses, rates (validated)."""
    if not 1 <= nodes <= 200:
        raise UsageError(f"--nodes {nodes}: expected 1 ... 200 (addresses 10.x.0.1 ... 10.x.0.200)")
    if not 1 <= ranks_per_node <= 64:
        raise UsageError(f"--ranks-per-node {ranks_per_node}: expected 1 ... 64")
    inter = parse_rate(inter_rate)
    intra = parse_rate(intra_rate) if intra_rate else None
    cid = "mp" + secrets.token_hex(3)  # 8 chars: "mp3f9a1c"; names below stay <= 15 (IFNAMSIZ)
    net = 64 + secrets.randbelow(128)
    return {"id": cid, "switch": f"{cid}s", "ranks_per_node": ranks_per_node, "inter_rate": inter,
            "intra_rate": intra, "created": time.time(), "ifname": IFNAME,
            "script": os.path.join(state_dir(), f"{cid}.ssh"),
            "nodes": [{"host": f"node{i}", "ns": f"{cid}n{i}", "ip": f"10.{net}.0.{i + 1}"} for i in range(nodes)]}


def path(state: dict) -> str:
    return os.path.join(state_dir(), f"{state['id']}.json")


def up(nodes: int, ranks_per_node: int, inter_rate: str, intra_rate: str | None = None, progress=None) -> dict:
    """Build the cluster; return its state (also written to ``path(state)``). Any failure or
    signal on the way removes whatever was built, and re-raises."""
    why = refusal()
    if why:
        raise UsageError(why)
    from ..launcher import ending_on_signals

    state = new_state(nodes, ranks_per_node, inter_rate, intra_rate)
    os.makedirs(state_dir(), mode=0o700, exist_ok=True)
    with ending_on_signals():  # SIGTERM, SIGHUP: as Ctrl-C, through the except below
        try:
            _write(state)  # first: a killed `up` can be taken down from it
            sw = state["switch"]
            _sh("ip", "netns", "add", sw)
            _no_ipv6(sw)
            _sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", sw, "link", "set", "br0", "up")
            hosts = "127.0.0.1 localhost\n" + "".join(f"{n['ip']} {n['host']}\n" for n in state["nodes"])
            for i, node in enumerate(progress(state["nodes"]) if progress else state["nodes"]):
                ns = node["ns"]
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/hosts", "w") as f:
                    f.write(hosts)
                _sh("ip", "netns", "add", ns)
                _no_ipv6(ns)
                _sh("ip", "-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", f"p{i}", "netns", sw)
                _sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0", "up")
                _sh("ip", "-n", ns, "addr", "add", f"{node['ip']}/24", "dev", IFNAME)
                _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _shape(ns, IFNAME, state["inter_rate"])  # node -> switch
                _shape(sw, f"p{i}", state["inter_rate"])  # switch -> node
                if state["intra_rate"]:
                    _shape(ns, "lo", state["intra_rate"])
            _write_script(state)
        except BaseException as err:
            down(state)
            if isinstance(err, RuntimeError):  # a command of iproute2 refused: its message, in one line
                raise UsageError(f"cluster up failed, and what it had built is removed: {err}") from None
            raise
    return state


def _write(state):
    tmp = path(state) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path(state))


def _write_script(state):
    """Hydra's "ssh" for this cluster: it enters the node's namespace instead of logging in.
    Hydra calls it as ``SCRIPT -x HOST COMMAND...`` and, as with ssh, the command is one shell line."""
    cases = "".join(f"  {n['host']}) ns={n['ns']} ;;\n" for n in state["nodes"])
    text = f"""#!/bin/sh
# minipar cluster {state['id']}: mpiexec -launcher ssh -launcher-exec THIS starts hydra's proxy
# on a node by entering the node's namespaces (network: ip netns exec; hostname: unshare --uts).
while [ "${{1#-}}" != "$1" ]; do shift; done  # ssh's options (hydra passes -x)
host=$1; shift
case $host in
{cases}  *) echo "minipar cluster {state['id']}: no node named $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""
    with open(state["script"], "w") as f:
        f.write(text)
    os.chmod(state["script"], 0o755)


def in_node(state: dict, i: int, argv: list[str]) -> list[str]:
    """``argv`` run on node i: in its network namespace, under its hostname."""
    node = state["nodes"][i]
    return ["ip", "netns", "exec", node["ns"], "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
            node["host"], *argv]


def namespaces(state: dict) -> list[str]:
    return [n["ns"] for n in state["nodes"]] + [state["switch"]]


def existing(state: dict) -> list[str]:
    """The cluster's namespaces that exist now."""
    have = {line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line.strip()}
    return [ns for ns in namespaces(state) if ns in have]


def end_processes(state: dict, grace: float = 3.0) -> int:
    """SIGTERM every process inside the cluster's namespaces, SIGKILL what is left after ``grace``
    seconds; returns how many there were."""
    def pids():
        found = set()
        for ns in existing(state):
            found.update(int(p) for p in _sh("ip", "netns", "pids", ns, check=False).split())
        return found - {os.getpid()}

    first = pids()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)
    return len(first)


def lost(state: dict) -> dict:
    """{node index: why} for each node that is gone: its namespace deleted, or its uplink down."""
    have = set(existing(state))
    out = {}
    for i, node in enumerate(state["nodes"]):
        if node["ns"] not in have:
            out[i] = "its namespace is gone"
        elif "state UP" not in _sh("ip", "-n", node["ns"], "link", "show", state["ifname"], check=False):
            out[i] = "its uplink is down"
    return out


def down(state: dict) -> list[str]:
    """Remove the cluster: its processes, namespaces (with their links), hosts files, script and
    state file. Safe to repeat, and on a half-built cluster. Returns what it removed."""
    removed = []
    if existing(state):
        n = end_processes(state)
        if n:
            removed.append(f"{n} processes")
    for ns in existing(state):
        _sh("ip", "netns", "del", ns, check=False)
        removed.append(ns)
    for node in state["nodes"]:
        if os.path.isdir(f"/etc/netns/{node['ns']}"):
            shutil.rmtree(f"/etc/netns/{node['ns']}", ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir("/etc/netns")  # only if empty: it was made for us, or nobody else uses it now
    for f in (state["script"], path(state)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f)
            removed.append(f)
    with contextlib.suppress(OSError):
        os.rmdir(state_dir())  # only if no other cluster is up
    return removed


def clusters() -> list[dict]:
    """Every cluster with a state file here, oldest first."""
    if not os.path.isdir(state_dir()):
        return []
    out = []
    for name in sorted(os.listdir(state_dir())):
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(state_dir(), name)) as f:
                out.append(json.load(f))
    return sorted(out, key=lambda s: s["created"])


def find(cid: str | None = None) -> dict:
    """The cluster ``cid``, or the only one there is; UsageError otherwise."""
    have = clusters()
    if cid:
        for s in have:
            if s["id"] == cid:
                return s
        raise UsageError(f"no cluster {cid!r}" + (f"; there is {', '.join(s['id'] for s in have)}" if have else
                                                  "; start one with `minipar cluster up`"))
    if not have:
        raise UsageError("no cluster is up: start one with `minipar cluster up --nodes 2 --ranks-per-node 2`")
    if len(have) > 1:
        raise UsageError(f"{len(have)} clusters are up ({', '.join(s['id'] for s in have)}): name one with --cluster ID")
    return have[0]


def counters(state: dict) -> list[dict]:
    """Each node's uplink counters now: {host, tx_bytes, rx_bytes, tx_packets, rx_packets}, read
    inside the node's namespace (where /sys/class/net is that node's)."""
    names = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
    out = []
    for node in state["nodes"]:
        text = _sh("ip", "netns", "exec", node["ns"], "cat",
                   *(f"/sys/class/net/{state['ifname']}/statistics/{k}" for k in names))
        out.append({"host": node["host"], **dict(zip(names, map(int, text.split())))})
    return out


def qdiscs(state: dict) -> dict:
    """{node host: tc's line for its uplink}: what shapes it (``status`` shows them)."""
    return {n["host"]: _sh("tc", "-n", n["ns"], "qdisc", "show", "dev", state["ifname"]).strip() for n in state["nodes"]}
