"""Lab 05 (3D parallelism): the tasks and their checks.

Each check runs on every rank as ``check(comm, fn)`` with the learner's function and returns a
list of failure messages saying where the result differs or which rule was broken.

* 5.1 (pure, one process): the groups of every rank of many grids, up to 2 x 4 x 3, against
  ``arange(n).reshape(dp, pp, tp)``; typical mistakes get their own message (the DP group built
  along another axis, TP partners that are not neighbours, a tied-embedding group on every stage
  or where there is none).
* 5.2: the cross-entropy over a vocabulary split across the ranks. Every rank is handed the
  whole-shaped logits with the other ranks' columns NaN (poisoned) and watched, so using them, or
  computing on the whole array and slicing afterwards, shows; the traffic must be exactly one
  ring all-reduce of the N row maxima and one of the 2N [sum of exps, label logit]: the logits
  never travel. The large-logit cases (exp overflows above ~709 in float64, ~88 in float32) and
  per-rank maxima that differ catch a softmax without the all-reduced max.
* 5.3: the tied embedding's gradient summed over the first and last pipeline stage: the sum on
  both ends (a + b == b + a bitwise, so the two copies take identical steps), the typical
  mistakes named (the own share only, the mean); exactly one gradient's bytes sent, to the other
  end only; the stages in between send nothing.
* 5.5 (``minipar.labs.lab05_dropout``): dropout that does not depend on the grid. Every rank draws the keep mask of the elements
  it holds (global batch rows, positions, columns of a (B, T, D) site); the pieces of every split
  (columns over tp, rows over dp, zigzag positions over cp, two at once) must be the slices of the
  mask the same function draws for everything in one process, and that mask must be the same on
  every rank (a seed taken from the rank fails here). Nothing may travel. The typical mistake of
  Megatron's RNG tracker with one seed inside a TP region, drawing by the local index, is named.
* 5.6 (``minipar.labs.lab05_norm``): the global gradient norm that ``--clip`` clips by, on every grid of 2 and 4 ranks. Each
  rank is handed only its own pieces of a tiny GPT's gradients (its stage's parameters, its TP
  shard, its ZeRO shard over dp; the other dp ranks' elements NaN) and must return the norm of
  one process, float64, to 1e-12. The typical mistakes are named by the value they give: the
  rank's own pieces only, parameters whole on every TP rank counted tp times, the tied embedding
  counted on both ends, the sum over the pipeline missing, the one over dp missing.
* 5.4 (``minipar.labs.lab05_step``): one training step of minipar's GPT on real grids (2 and 4
  ranks: every axis, every pair of axes, every schedule) with the learner's step around lesson
  03's pipeline: afterwards every gradient must equal the one-process gradient of the global batch
  (float64, 1e-12: only the order of the sums differs), the DP traffic over ``grid.dp`` must be
  one step's average (a DP sync per micro-batch sends m times more, with the same numbers), and
  nothing else may be sent besides the pipeline's messages and the tied sum.

``comm.builtin`` is refused inside every call; the checks' own references use it outside. Every
message must be the learner's own (sent by their code, through minipar.collectives at most), not
made by minipar's vocab-parallel loss or trainer called from the exercise.
"""
from __future__ import annotations


import numpy as np

from ..nn.functional import cross_entropy
from ..xp import chunk_bounds, to_numpy
from .checks import (COLLECTIVES, attempt, chunk_counts, compare, draw, expect_traffic, graded, no_builtin, poisoned,
                     ring_traffic, sent_by_learner, stop, used_only_own, watched)
from .grader import Task
from .lab05_dropout import DROPOUT_HINTS
from .lab05_norm import NORM_HINTS
from .lab05_step import STEP_HINTS

TITLE = "3D parallelism: the grid's groups, vocab-parallel cross-entropy, the tied weight, DP after the flush"
HERE = "minipar.labs.lab05"
INSTEAD = "minipar.collectives (all_reduce, ...: rings on send/recv) or comm.sendrecv"

TASKS = [
    Task("5.1", "the grid's groups", "grid_groups", f"{HERE}:check_grid_groups", sizes=(1,)),
    Task("5.2", "vocab-parallel cross-entropy", "vocab_parallel_cross_entropy", f"{HERE}:check_cross_entropy",
         sizes=(2, 4)),
    Task("5.3", "tied-weight gradient sync", "sync_tied", f"{HERE}:check_sync_tied", sizes=(2, 4)),
    Task("5.4", "DP after the pipeline flush", "train_step", f"{HERE}_step:check_train_step", sizes=(2, 4),
         budget=20),  # 1.4 s on 4 ranks
    Task("5.5", "grid-independent dropout", "dropout_mask", f"{HERE}_dropout:check_dropout", sizes=(2, 4)),
    Task("5.6", "the global gradient norm", "global_grad_norm", f"{HERE}_norm:check_grad_norm", sizes=(2, 4)),
]

# Hints, stage by stage (`minipar check 05 --hint 5.2`): a nudge naming the idea and what to read,
# the shape of the computation, then near-pseudocode. The answer: `minipar lab solution 05 --task 5.2`.
HINTS = {
    "5.1": (
        """Lay the world out as ranks = numpy.arange(dp * pp * tp).reshape(dp, pp, tp): a group along
        an axis is the line of that array through your rank. np.argwhere(ranks == rank)[0] is your
        (d, p, t). The lesson: notebooks/05_3d_parallelism.ipynb and minipar/grid.py.""",
        """tp: ranks[d, p, :]; pp: ranks[d, :, t]; dp: ranks[:, p, t] (as lists of ints, .tolist()).
        emb: [ranks[d, 0, t], ranks[d, -1, t]] when pp > 1 and p is 0 or pp - 1, else None.""",
        """
        ranks = np.arange(dp * pp * tp).reshape(dp, pp, tp); d, p, t = np.argwhere(ranks == rank)[0]
        emb = [int(ranks[d, 0, t]), int(ranks[d, -1, t])] if pp > 1 and p in (0, pp - 1) else None
        return {"tp": ranks[d, p, :].tolist(), "pp": ranks[d, :, t].tolist(), "dp": ranks[:, p, t].tolist(), "emb": emb}
        """,
    ),
    "5.2": (
        """A softmax over a split vocabulary: each rank sums exp over its own columns, and the partial
        sums add up only if every rank subtracted the same shift, the row's global max. So
        all_reduce(comm, row maxima, op="max") first, then one all_reduce (sum) of your partial sums
        together with the label's logit (0 on the ranks that do not own the label). Compute with
        xp = minipar.xp.namespace(logits): NumPy's or torch's functions, by the array-API names.""",
        """lo, hi = chunk_bounds(V, p)[rank]; z = logits[..., lo:hi]; m = all_reduce(comm, xp.max(z,
        axis=-1), op="max"); e = xp.exp(z - m[..., None]); onehot = your columns of onehot(labels):
        labels[..., None] == xp.arange(lo, hi), as z's dtype (xp.astype); label_z = xp.sum((z -
        m[..., None]) * onehot, axis=-1) (0 where the label is not yours). s, label_z = all_reduce(comm,
        xp.stack([xp.sum(e, axis=-1), label_z])). loss = mean(log s - label_z); your dlogits = (e /
        s[..., None] - onehot) / N.""",
        """
        xp = namespace(logits); n = math.prod(labels.shape)
        onehot = xp.astype(labels[..., None] == xp.arange(lo, hi, device=device(z)), z.dtype)
        label_z = xp.sum((z - m[..., None]) * onehot, axis=-1)
        s, label_z = all_reduce(comm, xp.stack([xp.sum(e, axis=-1), label_z]))
        return xp.sum(xp.log(s) - label_z) / n, (e / s[..., None] - onehot) / n
        """,
    ),
    "5.3": (
        """The first and the last stage (pp ranks 0 and pp.size - 1) each hold a gradient of the
        tied weight, and both need the sum: one exchange between the two, with pp.sendrecv (or an
        all_reduce over a group of the two, made with pp.split(color, key)).""",
        """With pp.size == 1, or on a middle stage (grad is None), return grad as it is. On an end:
        the other end is the opposite rank; theirs = pp.sendrecv(grad, other, empty(grad.shape,
        like=grad), other) (empty from minipar.xp: grad's kind, dtype and device); return grad +
        theirs (a + b == b + a bitwise: both ends agree).""",
        """
        if pp.size == 1 or grad is None:
            return grad
        other = pp.size - 1 if pp.rank == 0 else 0
        return grad + pp.sendrecv(grad, other, empty(grad.shape, like=grad), other)
        """,
    ),
    **STEP_HINTS,
    **DROPOUT_HINTS,
    **NORM_HINTS,
}


# ---------------------------------------------------------------- 5.1: the grid's groups

AXES = ("dp", "pp", "tp")
GRIDS = [(1, 1, 1), (2, 1, 2), (1, 2, 1), (1, 1, 2), (2, 1, 1), (1, 3, 1), (2, 2, 2), (1, 4, 2), (4, 2, 1), (2, 1, 4),
         (3, 2, 2), (2, 3, 2), (1, 8, 1), (2, 4, 3)]


def layout(dp, pp, tp):
    """World rank at (d, p, t): arange(n).reshape(dp, pp, tp), TP partners neighbours."""
    return np.arange(dp * pp * tp).reshape(dp, pp, tp)


def groups_of(ranks, rank):
    """{axis: world ranks of rank's group along it, by their coordinate; "emb": [first, last]
    stage of its (dp, tp) when it is one of them and pp > 1, else None} for a layout ``ranks``."""
    d, p, t = (int(i) for i in np.argwhere(ranks == rank)[0])
    pp = ranks.shape[1]
    out = {"dp": ranks[:, p, t], "pp": ranks[d, :, t], "tp": ranks[d, p, :]}
    out = {k: [int(w) for w in v] for k, v in out.items()}
    out["emb"] = [int(ranks[d, 0, t]), int(ranks[d, pp - 1, t])] if pp > 1 and p in (0, pp - 1) else None
    return out


def _as_list(v):
    if v is None:
        return None
    try:
        return [int(w) for w in v]
    except (TypeError, ValueError):
        return v


def group_hint(grid, rank, axis, got, want):
    """Why ``got`` is not rank's ``axis`` group: the typical mistakes, by what got equals."""
    dp, pp, tp = grid
    ranks = layout(dp, pp, tp)
    mine = groups_of(ranks, rank)
    others = {"dp": "(pp, tp)", "pp": "(dp, tp)", "tp": "(dp, pp)"}
    if axis == "emb":
        p = int(np.argwhere(ranks == rank)[0][1])
        if want is None and pp == 1:
            return "with pp = 1 the embedding and the head are on the same stage and share one array: no group (None)"
        if want is None:
            return (f"rank {rank} is stage {p}, between the first and the last: it holds no copy of the tied "
                    f"embedding (None)")
        if got == mine["pp"]:
            return "that is its whole pp group: only the first and the last stage hold the tied weight"
        return "the first and the last stage of its (dp, tp): [rank at pp = 0, rank at pp = pp - 1]"
    what = {"dp": "the replicas of its shard", "pp": "the stages of its pipeline", "tp": "the shards of its layers"}
    same = [f"its {o} group ({what[o]})" for o in AXES if o != axis and got == mine[o]]
    if got == list(range(dp * pp * tp)):
        same.append("every rank of the grid")
    if same:
        return (f"that is {' and '.join(same)}" + (": built along the wrong axis" if same[0].startswith("its") else "")
                + f"; the {axis} group holds only the ranks that share rank {rank}'s {others[axis]} coordinates")
    if isinstance(got, list) and sorted(got) == want:
        return f"the right ranks in the wrong order: list them by their {axis} coordinate (their rank in the group)"
    flipped = np.arange(dp * pp * tp).reshape(tp, pp, dp).transpose(2, 1, 0)  # dp partners neighbours
    if got == groups_of(flipped, rank)[axis]:
        return ("that is the layout with DP partners as neighbours; minipar puts TP partners next to each other "
                "(they exchange the most bytes, inside a node): rank = (d * pp + p) * tp + t")
    return f"the ranks that share rank {rank}'s {others[axis]} coordinates, ordered by their {axis} coordinate"


def check_grid_groups(comm, fn):
    for grid in GRIDS:
        dp, pp, tp = grid
        ranks = layout(dp, pp, tp)
        for rank in range(dp * pp * tp):
            call = f"grid_groups(dp={dp}, pp={pp}, tp={tp}, rank={rank})"
            got = fn(dp, pp, tp, rank)
            if not isinstance(got, dict):
                return [f"{call} returned {type(got).__name__}; expected a dict with the keys 'dp', 'pp', 'tp', 'emb'"]
            want = groups_of(ranks, rank)
            d, p, t = (int(i) for i in np.argwhere(ranks == rank)[0])
            for axis in ("tp", "pp", "dp", "emb"):
                if axis not in got:
                    return [f"{call} has no '{axis}' entry (expected {want[axis]})"]
                g = _as_list(got[axis])
                if g != want[axis]:
                    return [f"{call}['{axis}'] = {g}, expected {want[axis]}: rank {rank} sits at (dp={d}, pp={p}, "
                            f"tp={t}) of arange({dp * pp * tp}).reshape(dp, pp, tp); "
                            f"{group_hint(grid, rank, axis, g, want[axis])}"]
    return []


# ---------------------------------------------------------------- 5.2: vocab-parallel cross-entropy

B, T, V = 2, 6, 24  # N = 12 tokens (divisible by 1 .. 4: the ring chunks are equal); V/p columns each


def owners(p):
    """(V,) the rank holding each column."""
    return np.concatenate([np.full(b - a, k) for k, (a, b) in enumerate(chunk_bounds(V, p))])


def ce_cases(p):
    """(label, logits (B, T, V), labels, dtype, tolerance), smallest first. In the large cases
    every rank's columns sit at another height, so the rows' maxima differ from rank to rank."""
    block = owners(p)
    labels = np.random.default_rng(7).integers(0, V, (B, T))
    z = draw(B, T, V, seed=5)
    return [("random logits, float64", z, labels, "float64", 1e-12),
            ("logits around 800 + 40 x (the owner's rank), float64 (exp overflows above ~709)",
             800 + 40 * block + z, labels, "float64", 1e-12),
            ("float32 logits around 100 + 10 x (the owner's rank) (exp overflows above ~88 in float32), vs the "
             "float64 reference: 1e-5, a few float32 roundings of the 24-term sums",
             100 + 10 * block + z, labels, "float32", 1e-5)]


def local_max_loss(logits, labels, p):
    """The loss a softmax gets when every rank shifts by its own max: partial sums of exps in
    different units (what the check names when it sees it)."""
    cols = chunk_bounds(V, p)
    s = sum(np.exp(logits[..., a:b] - logits[..., a:b].max(-1, keepdims=True)).sum(-1) for a, b in cols)
    owner_max = np.take_along_axis(np.stack([logits[..., a:b].max(-1) for a, b in cols], -1),
                                   owners(p)[labels][..., None], -1)[..., 0]
    label_logit = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return float(np.mean(np.log(s) - (label_logit - owner_max)))


def loss_hint(comm, got, want, logits, labels, case):
    """A message for a wrong loss, naming the mistake when it is a typical one."""
    r, p = comm.rank, comm.size
    head = f"rank {r}: the loss is {got}, expected {want:.12g} ({case})"
    if np.isinf(got) or (np.isnan(got) and logits.max() > 80):
        return [f"{head}: exp overflowed (above ~709 in float64, ~88 in float32): subtract the row's max, the "
                f"same max on every rank (all-reduced over the group), before exp"]
    if p > 1 and np.isclose(got, local_max_loss(logits.astype(np.float64), labels, p), rtol=1e-9, atol=0):
        return [f"{head}: every rank shifted by its own max, so the partial sums of exp(z - m_r) are in different "
                f"units and do not add up: all-reduce the max first (op=\"max\"), then shift by it everywhere"]
    return [head]


def ce_traffic(comm):
    """(bytes, messages) of a ring all-reduce of the N maxima and one of the 2N partial sums."""
    N = B * T
    a, b = (ring_traffic(chunk_counts(n, comm.size), comm.rank, 8) for n in (N, 2 * N))
    return a[0] + b[0], a[1] + b[1]


def check_cross_entropy(comm, fn):
    p, r = comm.size, comm.rank
    lo, hi = chunk_bounds(V, p)[r]
    owns = f"columns {lo}:{hi} of the logits (chunk_bounds(V, p)[rank])"
    for case, logits, labels, dtype, tol in ce_cases(p):
        logits = logits.astype(dtype)
        want_loss, want_d = cross_entropy(logits.astype(np.float64), labels)
        handed = watched(comm.asarray(poisoned(logits, (..., slice(lo, hi)))))
        g = graded(comm, lambda: fn(comm, handed, comm.asarray(labels.copy())))
        label = f"{case}; logits ({B}, {T}, {V}) on {p} rank{'s' if p > 1 else ''}"
        fails = no_builtin(comm, g, "vocab_parallel_cross_entropy", INSTEAD)
        if not fails and not (isinstance(g.out, tuple) and len(g.out) == 2):
            fails = [f"rank {r}: vocab_parallel_cross_entropy must return (loss, dlogits), got {type(g.out).__name__}"]
        if not fails:
            loss, dlogits = g.out
            loss = float(to_numpy(loss)) if loss is not None else float("nan")
            if not np.isclose(loss, want_loss, rtol=tol, atol=tol):
                fails = (compare(comm, np.float64(loss), np.float64(want_loss), "the loss", label, owns=owns)
                         if np.isnan(loss) and logits.max() < 80  # no overflow here: NaN comes from the poison
                         else loss_hint(comm, loss, float(want_loss), logits, labels, label))
        if not fails:
            d = to_numpy(dlogits) if dlogits is not None else None
            want = want_d[..., lo:hi]
            if d is not None and d.shape == want_d.shape and p > 1:
                fails = [f"rank {r}: dlogits has shape {d.shape}, the whole vocabulary: return the gradient of your "
                         f"{hi - lo} columns only, {want.shape} ({label})"]
            elif d is not None and d.shape == want.shape and np.allclose(d, want * B * T, rtol=1e-6, atol=1e-9):
                fails = [f"rank {r}: dlogits is {B * T} times too large: the loss is the mean over the N = {B * T} "
                         f"tokens, so dlogits = (softmax - onehot) / N ({label})"]
            else:
                fails = compare(comm, d, want, "dlogits (your columns)", label, tol=tol, owns=owns)
        if not fails and dtype == "float64":  # float32 may be exchanged in either precision
            nbytes, _ = ce_traffic(comm)
            fails = expect_traffic(comm, g, f"a ring all-reduce of the N = {B * T} row maxima, then one of the 2N "
                                            f"[sum of exps, label logit] ({case})", nbytes,
                                   hint="3N numbers per rank travel, the logits never do; the max comes first "
                                        "(op=\"max\"), the sums after")
        fails = fails or used_only_own(comm, {"logits": (handed, B * T * (hi - lo), owns)},
                                       "vocab_parallel_cross_entropy")
        fails = fails or sent_by_learner(comm, g, fn, "vocab_parallel_cross_entropy", INSTEAD, COLLECTIVES)
        if stop(comm, fails):
            return fails
    return []


# ---------------------------------------------------------------- 5.3: the tied weight's gradient

TIED_SHAPES = [(12, 8), (5, 3)]  # wte's shard (V/t, C), and an odd one


def check_sync_tied(comm, fn):
    p, r = comm.size, comm.rank
    end = r in (0, p - 1)
    for shape in TIED_SHAPES:
        first, last = draw(*shape, seed=11), draw(*shape, seed=12)  # the two stages' shares
        mine = (first if r == 0 else last).copy() if end else None
        want = first + last if p > 1 else first
        g = graded(comm, lambda: fn(comm, None if mine is None else comm.asarray(mine.copy())))
        case = f"shape {shape}, pipeline of {p} stage{'s' if p > 1 else ''}"
        fails = no_builtin(comm, g, "sync_tied", INSTEAD)
        got = g.out
        if not fails and end:  # (what the stages in between return is not used)
            gn = to_numpy(got) if got is not None else None
            if p > 1 and gn is not None and gn.shape == shape and np.array_equal(gn, mine):
                fails = [f"rank {r} returned its own stage's gradient only ({case}): the tied weight is used twice, "
                         f"by the embedding on stage 0 and by the head on stage {p - 1}; its gradient is the sum of "
                         f"both: exchange with the other end and add"]
            elif p > 1 and gn is not None and gn.shape == shape and np.allclose(gn, want / 2, rtol=1e-12, atol=0):
                fails = [f"rank {r}: the result is half the sum ({case}): a weight used twice gets the sum of the two "
                         f"gradients, not their mean"]
            else:
                fails = compare(comm, got, want, "the tied gradient (first + last stage's)", case)
        if not fails:
            other = {0: p - 1, p - 1: 0}.get(r)
            fails = expect_traffic(comm, g, f"the sum of the tied gradient over the first and the last stage, "
                                            f"{shape} doubles ({case})", int(np.prod(shape)) * 8 if end and p > 1 else 0,
                                   to=[other] if end and p > 1 else [],
                                   hint="one gradient's bytes, to the other end only: the stages in between hold no "
                                        "copy and take no part")
        fails = fails or sent_by_learner(comm, g, fn, "sync_tied", INSTEAD, COLLECTIVES)
        if stop(comm, fails):
            return fails
    return []


# ---------------------------------------------------------------- the exercise's demo

def demo(comm, grid_groups, vocab_parallel_cross_entropy, sync_tied, train_step, dropout_mask=None,
         global_grad_norm=None):
    """What ``mpiexec -n P python -m mpi4py labs/05_3d/exercise.py`` (or ``torchrun --standalone
    --nproc-per-node P ...``) shows: each task run once on these ranks with the learner's
    function, on the backend's arrays, against minipar's answer; "not implemented yet" where it
    still raises."""
    p, r = comm.size, comm.rank
    grid = {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 2, 2)}.get(p)
    if r == 0:
        shape = grid or (p, 1, 1)
        print(f"== 5.1 your grid_groups for dp x pp x tp = {shape} (expected from arange({p}).reshape(dp, pp, tp)):")
        for w in range(p):
            got, why = attempt(lambda: grid_groups(*shape, w))
            ok = "" if why else ("  ok" if {k: _as_list(v) for k, v in got.items()} == groups_of(layout(*shape), w)
                                 else f"  expected {groups_of(layout(*shape), w)}")
            print(f"   rank {w}: {why or got}{ok}", flush=True)
    case, logits, labels, dtype, _ = ce_cases(p)[1]
    lo, hi = chunk_bounds(V, p)[r]
    out, why = attempt(lambda: vocab_parallel_cross_entropy(comm, comm.asarray(poisoned(logits, (..., slice(lo, hi)))),
                                                            comm.asarray(labels)))
    if r == 0:
        want = float(cross_entropy(logits, labels)[0])
        print(f"\n== 5.2 {case}, {p} ranks: your loss {why or float(to_numpy(out[0]))}, one process {want}", flush=True)
    tied = comm.asarray(draw(12, 8, seed=11 + (r == p - 1))) if r in (0, p - 1) else None
    out, why = attempt(lambda: sync_tied(comm, tied))
    got = comm.builtin.allgather_object(why or (float(np.sum(to_numpy(out))) if r in (0, p - 1) else None))
    if r == 0:
        want = float(np.sum(draw(12, 8, seed=11) + (draw(12, 8, seed=12) if p > 1 else 0)))
        print(f"== 5.3 the tied gradient's sum (its elements added up) on stage 0: {got[0]}, on stage {p - 1}: "
              f"{got[p - 1]}; expected {want} on both", flush=True)
    if grid is not None:
        from .lab05_step import Step

        st = Step(comm, *grid, "1f1b", 2)
        _, why = attempt(lambda: train_step(st.tr.grid, st.pipeline, list(st.grads), st.tied))
        err = max(float(np.max(np.abs(to_numpy(g) - w))) for _, _, g, w, _ in st.named) if not why else None
        errs = comm.builtin.allgather_object(err)
        if r == 0:
            print(f"\n== 5.4 a step of {st.label} with your train_step: "
                  + (why or f"largest gradient difference from one process on any rank {max(errs):.2g}"), flush=True)
    if dropout_mask is not None:
        from .lab05_dropout import DB, DD, DT, KEYS

        full, why = attempt(lambda: dropout_mask(comm, KEYS[0], np.arange(DB), np.arange(DT), (0, DD), (DT, DD), 0.5))
        lo, hi = chunk_bounds(DD, p)[r]
        mine, why = (None, why) if why else attempt(lambda: dropout_mask(comm, KEYS[0], np.arange(DB), np.arange(DT),
                                                                         (lo, hi), (DT, DD), 0.5))
        same = why or bool(np.array_equal(to_numpy(mine), to_numpy(full)[..., lo:hi]))
        same = comm.builtin.allgather_object(same)
        if r == 0:
            print(f"== 5.5 each rank's columns of a dropout mask (tp = {p}) = those columns of its one-process mask: "
                  f"{same}", flush=True)
    if global_grad_norm is not None and grid is not None:
        from ..grid import Grid
        from .lab05_norm import norm_pieces

        g3 = Grid(comm, *grid)
        pieces, full = norm_pieces(*grid, g3.coords, 0)
        got, why = attempt(lambda: global_grad_norm(g3, [(n, comm.asarray(g), s, c) for n, g, s, c in pieces]))
        got = comm.builtin.allgather_object(why or float(to_numpy(got)))
        if r == 0:
            want = float(np.sqrt(sum(float(np.sum(g * g)) for g in full.values())))
            print(f"== 5.6 the global gradient norm on dp x pp x tp = {grid}, ZeRO shards over dp, on each rank: "
                  f"{got}; one process: {want!r}", flush=True)
    if grid is not None and r == 0:
        print("now grade it: minipar check 05", flush=True)
