"""Lesson 1 on real ranks: every collective against the engine's own, and a ring walkthrough.

    from minipar import launch
    out = launch(4, "minipar.lessons.collectives:verify")
    out = launch(4, "minipar.lessons.collectives:ring_walkthrough", n=8)

Numerics: inputs are fresh random draws seeded per (seed, rank). float64 results must match
the builtin to 1e-12 relative (only the summation order differs: at most p terms, error ~p*eps);
float32 to 1e-5 relative (float32 eps is 6e-8, times p terms); int64 exactly.
"""
from __future__ import annotations

import numpy as np

from .. import collectives as C
from ..xp import chunk_bounds, to_numpy
from .common import format_rows, rel_error  # noqa: F401  (format_rows: re-exported)

TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "int64": 0.0}
DEFAULT_LENGTHS = (1, 2, 3, 7, 8, 13, 64, 1000)


def draw(comm, n, dtype, seed=0, rank=None):
    """Rank ``rank``'s (default: mine) random input of length n: same draw on every backend."""
    rng = np.random.default_rng([seed, comm.rank if rank is None else rank, n])
    a = rng.integers(-50, 50, size=n) if dtype == "int64" else rng.standard_normal(n)
    return comm.asarray(a.astype(dtype))


def verify(comm, lengths=DEFAULT_LENGTHS, dtypes=("float64", "float32", "int64"), seed=0):
    """Run every from-scratch collective against ``comm.builtin``; one record per case.

    Returns [{"collective", "dtype", "n", "error", "tolerance", "ok"}, ...] (same on every rank
    for the all-* collectives; broadcast/reduce roots vary with n).
    """
    out = []

    def record(name, dtype, n, got, want):
        err = rel_error(got, want) if got is not None else float("inf")
        tol = TOLERANCE[dtype]
        out.append({"collective": name, "dtype": dtype, "n": n, "error": err, "tolerance": tol,
                    "ok": bool(err <= tol), "rank": comm.rank})

    b = comm.builtin
    nodes = C.node_groups(comm, 2 if comm.size % 2 == 0 else 1)  # "nodes" of 2 ranks (of 1 for odd counts)
    for dtype in dtypes:
        for n in lengths:
            x = draw(comm, n, dtype, seed)
            want = b.all_reduce(x)
            for alg in C.ALGORITHMS:
                record(f"all_reduce:{alg}", dtype, n, C.all_reduce(comm, x, alg), want)
            record("all_reduce:hierarchical", dtype, n, C.hierarchical_all_reduce(*nodes, x), want)
            record("reduce_scatter", dtype, n, C.reduce_scatter(comm, x), b.reduce_scatter(x))
            bounds = chunk_bounds(n, comm.size)
            lo, hi = bounds[comm.rank]
            record("all_gather", dtype, n, C.all_gather(comm, x[lo:hi], [q - p for p, q in bounds]),
                   b.all_gather(x[lo:hi]))
            root = n % comm.size  # vary the root with n
            buf = x if comm.rank == root else comm.empty(n, dtype)
            record("broadcast", dtype, n, C.broadcast(comm, buf, root), draw(comm, n, dtype, seed, rank=root))
            red, ref = C.reduce(comm, x, root), b.reduce(x, root)
            if comm.rank == root:
                record("reduce", dtype, n, red, ref)
            elif red is not None:  # only the root gets a result
                out.append({"collective": "reduce", "dtype": dtype, "n": n, "error": float("inf"),
                            "tolerance": 0.0, "ok": False, "rank": comm.rank})
            uneven = [(n + q) % 3 for q in range(comm.size)]  # rows per rank: 0, 1 or 2, some empty
            starts = [sum(uneven[:q]) for q in range(comm.size + 1)]
            mine = draw(comm, uneven[comm.rank], dtype, seed + 4)  # rank q's uneven[q] elements
            everyone = C.all_gather(comm, mine, uneven)  # (the reference: the ring checked above)
            got = C.gather(comm, mine, np.int64(root), uneven)  # a NumPy integer is a rank too
            if comm.rank == root:
                record("gather", dtype, n, got, everyone)
            elif got is not None:
                out.append({"collective": "gather", "dtype": dtype, "n": n, "error": float("inf"),
                            "tolerance": 0.0, "ok": False, "rank": comm.rank})
            whole = draw(comm, starts[-1], dtype, seed + 3, rank=root)
            sent = whole if comm.rank == root else comm.empty(starts[-1], dtype)
            lo, hi = starts[comm.rank], starts[comm.rank + 1]
            record("scatter", dtype, n, C.scatter(comm, sent, root, uneven), whole[lo:hi])
            record("reduce_scatter:counts", dtype, n, C.reduce_scatter(comm, everyone, counts=uneven),
                   b.all_reduce(everyone)[lo:hi])
            y = draw(comm, comm.size * n, dtype, seed + 1)
            record("all_to_all", dtype, n, C.all_to_all(comm, y), b.all_to_all(y))
            counts = [int(c) for c in np.random.default_rng([seed, comm.rank, n]).integers(0, n + 1, comm.size)]
            z = draw(comm, sum(counts), dtype, seed + 2)  # uneven, different on every rank
            got, rc = C.all_to_all_v(comm, z, counts)
            want, want_rc = b.all_to_all_v(z, counts)
            record("all_to_all_v", dtype, n, got if rc == want_rc else None, want)
    return out


def ring_walkthrough(comm, n=8, seed=0):
    """Ring all-reduce on a tiny vector, recording every rank's buffer after every step.

    Returns {"input": x, "steps": [(phase, step, sent_chunk, received_chunk, buf), ...],
    "result", "error"} for this rank; buffers as NumPy copies. The loop is the library's own
    ``ring_steps``, only observed.
    """
    x = comm.asarray(np.round(np.random.default_rng([seed, comm.rank]).uniform(0, 9, n)))
    buf = x.copy() if hasattr(x, "copy") else x.clone()
    steps = []
    observe = lambda phase, s, sent, got, b: steps.append((phase, s, sent, got, to_numpy(b).copy()))  # noqa: E731
    bounds = chunk_bounds(n, comm.size)
    C.drain(C.ring_steps(comm, buf, bounds, observe=observe))
    return {"input": to_numpy(x).copy(), "bounds": bounds, "steps": steps,
            "result": to_numpy(buf).copy(), "error": rel_error(buf, comm.builtin.all_reduce(x))}


def summarize(results):
    """Per-collective rows {"what", "error", "tolerance", "ok", "cases"} over all ranks' records."""
    rows = {}
    for rec in (r for rank in results for r in rank):
        key = (rec["collective"], rec["dtype"])
        row = rows.setdefault(key, {"what": f"{rec['collective']} ({rec['dtype']})", "error": 0.0,
                                    "tolerance": rec["tolerance"], "ok": True, "cases": 0})
        row["error"] = max(row["error"], rec["error"])
        row["ok"] &= rec["ok"]
        row["cases"] += 1
    return list(rows.values())


def tour(comm):
    """The tour's check of lesson 1: one row per collective.

    The error shown is float64's (tolerance 1e-12); the row is ok only if float32 (1e-5) and
    int64 (exact) passed too, for every length.
    """
    recs = verify(comm, lengths=(1, 3, 8, 13, 1000))
    rows = []
    for name in dict.fromkeys(r["collective"] for r in recs):
        mine = [r for r in recs if r["collective"] == name]
        rows.append({"what": f"{name} (n=1..1000; f64, also f32, i64)",
                     "error": max(r["error"] for r in mine if r["dtype"] == "float64"),
                     "tolerance": TOLERANCE["float64"], "ok": all(r["ok"] for r in mine)})
    return rows


def format_walkthrough(walk) -> str:
    """Every rank's buffer after every step of ``ring_walkthrough`` (one block per step)."""
    lines = ["input:"] + [f"  rank {r}: {w['input']}" for r, w in enumerate(walk)]
    for i, (phase, s, sent, got, _) in enumerate(walk[0]["steps"]):
        lines.append(f"{phase} step {s + 1}: each rank r sends chunk (r{'-' if phase == 'all-gather' else '-1-'}{s}) "
                     f"and receives the chunk on its left")
        for r, w in enumerate(walk):
            ph, _, sent_r, got_r, buf = w["steps"][i]
            lines.append(f"  rank {r}: {buf}   (sent chunk {sent_r}, received chunk {got_r})")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Check every collective under whatever launched this process:

        mpiexec -n 4 python -m mpi4py -m minipar.lessons.collectives
        torchrun --standalone --nproc-per-node 4 -m minipar.lessons.collectives --backend torch
    """
    import argparse

    import minipar

    ap = argparse.ArgumentParser(prog="python -m minipar.lessons.collectives")
    ap.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    ap.add_argument("--raise-on", type=int, help="this rank raises (to see a failing job end)")
    args = ap.parse_args(argv)
    comm = minipar.init(args.backend)
    if args.raise_on == comm.rank:
        raise RuntimeError(f"planted failure on rank {comm.rank}")
    rows = summarize(comm.builtin.allgather_object(verify(comm, lengths=(1, 7, 64))))
    if comm.rank == 0:
        print(f"{comm.size} ranks ({args.backend}):")
        print(format_rows(rows), flush=True)
    ok = all(r["ok"] for r in rows)
    minipar.comm.finalize()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
