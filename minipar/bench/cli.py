"""Entry points of ``minipar bench``: run in-job under mpiexec, or launch mpiexec first."""
from __future__ import annotations

import json
import os
import sys


def in_mpi_job() -> bool:
    """True when this process was started by mpiexec (so it is one rank of a job)."""
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MINIPAR_IN_JOB"))


def relaunch(n: int, argv: list[str]) -> int:
    """Re-run this same command on n ranks: mpiexec -n N python -m mpi4py -m minipar ARGV."""
    from ..launcher import mpiexec, rank_env, run_streaming

    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "minipar", *argv]
    print("launching:", " ".join(cmd[:3] + ["python"] + cmd[4:]), flush=True)
    code, _ = run_streaming(cmd, limit=3600, env=rank_env({**os.environ, "MINIPAR_IN_JOB": "1"}))
    return code


def strip_n(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "-n":
            skip = True
            continue
        if a.startswith("-n") and a[2:].isdigit():
            continue
        out.append(a)
    return out


def collectives(args) -> int:
    if args.n and args.n > 1 and not in_mpi_job():
        return relaunch(args.n, strip_n(sys.argv[1:]))
    import minipar

    from . import collectives as B

    comm = minipar.init(args.backend)
    algs = tuple(args.algorithms) if args.algorithms else B.ALGS
    if comm.rank == 0:
        print(f"all-reduce benchmark on {comm.size} ranks ({args.backend}); float32; "
              f"busbw = algbw * 2(p-1)/p; model = alpha-beta-gamma fit from a ping-pong")
        print(B.header(algs), flush=True)
    result = B.run(comm, args.sizes, algs, args.budget)
    if comm.rank == 0:
        print(f"fit: alpha = {result['alpha'] * 1e6:.2f} us, beta = {result['beta'] * 1e9:.4f} ns/B "
              f"(1/beta = {1 / result['beta'] / 1e9 if result['beta'] else float('inf'):.2f} GB/s), "
              f"gamma = {result['gamma'] * 1e9:.4f} ns/B")
        if "builtin" in algs:
            for alg in algs:
                if alg != "builtin":
                    r = B.ratios(result["records"], alg)
                    if r:
                        print(f"busbw {alg}/builtin at >= 16 MiB: " + ", ".join(f"{b >> 20} MiB: {v:.2f}x" for b, v in sorted(r.items())))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result["records"], f, indent=1)
            print(f"wrote {args.json}")
        if args.plot:
            from ..figures.collectives import plot_busbw

            os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
            print(f"wrote {plot_busbw(result, args.plot)}")
    return 0
