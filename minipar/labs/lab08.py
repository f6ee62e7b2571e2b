"""Lab 08 (automatic parallelization): the tasks and their checks.

8.1, 8.4 and 8.5 are pure functions, checked in one process on many cases, smallest first,
with a hint for each typical mistake: 8.1 the collective a move on one mesh axis needs and its
alpha-beta-gamma time (against ``transitions.step_time``: every pair of placements, shapes that
divide and not, 2 to 4 ranks); 8.4 an operator's layout for every choice of every operator of a
transformer block and an MLP under a vocabulary head (against ``graph.layout``); 8.5 one Markov
chain step (its check is in ``lab08_mcmc``).

8.2 and 8.3 run on real ranks (3 and 4; the 2-D mesh is 2 x 2), pair after pair of placements,
every rank handed its own piece only of a tensor drawn the same everywhere (a Partial piece an
addend with noise that cancels over the ranks, not "the value on rank 0"): the result against
gather-then-slice (bitwise for moves, 1e-12 where addends are summed: float64, only the order of
the sums differs), the bytes each rank sent (the trace) against the formula of every step,
exactly (gathering the whole tensor to slice it sends more where a cheaper collective exists,
and is told so), ``comm.builtin`` refused, and every message the learner's own (sent by their
code, through minipar.collectives at most), not made by minipar's own ``redistribute``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..autoparallel import (Mesh, P, R, Shard, assemble, build, layout, local_block, redistribution_steps, step_bytes,
                           step_time)
from ..autoparallel.graph import choices
from ..autoparallel.transitions import step_kind
from ..lessons.auto_parallel import _noise
from ..xp import to_numpy
from .checks import COLLECTIVES, compare, graded, no_builtin, ran, sent, sent_by_learner, stop
from .grader import Task

TITLE = "automatic parallelization: redistributions and their cost, operator layouts, one MCMC step"
HERE = "minipar.labs.lab08"
INSTEAD = "minipar.collectives (all_gather, reduce_scatter, all_reduce, all_to_all_v: rings on send/recv)"

TASKS = [
    Task("8.1", "a move's collective and cost", "transition_cost", f"{HERE}:check_transition_cost", sizes=(1,)),
    Task("8.2", "redistribute, 1-D mesh", "redistribute", f"{HERE}:check_redistribute", sizes=(3, 4),
         budget=40),  # 3 s on 4 ranks
    Task("8.3", "redistribute, 2-D mesh", "redistribute_2d", f"{HERE}:check_redistribute_2d", sizes=(4,),
         budget=40),
    Task("8.4", "an operator's layout", "op_layout", f"{HERE}:check_op_layout", sizes=(1,)),
    Task("8.5", "one MCMC step", "mcmc_step", "minipar.labs.lab08_mcmc:check_mcmc_step", sizes=(1,)),
]

# Hints, stage by stage (`minipar check 08 --hint 8.2`): a nudge naming the idea and what to read,
# the shape of the computation, then near-pseudocode. The answer: `minipar lab solution 08 --task 8.2`.
HINTS = {
    "8.1": (
        """The kind follows from the types of src and dst alone (the docstring's table): Shard -> Replicate
        all_gather, Partial -> Replicate all_reduce, Partial -> Shard reduce_scatter, Shard -> Shard
        all_to_all, the rest local. Then c, the bytes of the largest piece one message carries; the
        README's table gives each operation's time from it.""",
        """n = prod(shape). all_reduce: c = ceil(n / m) * itemsize. all_gather or reduce_scatter along
        d: c = ceil(shape[d] / m) * (n // shape[d]) * itemsize. all_to_all from d to e:
        c = ceil(shape[d] / m) * ceil(shape[e] / m) * (n // shape[d] // shape[e]) * itemsize, plus
        (m-1)(alpha + 8 beta) for the counts when shape[d] or shape[e] does not divide by m.""",
        """
        if src == dst: return None, 0.0
        all_gather:     (m-1) * (alpha + c * beta)
        reduce_scatter: (m-1) * (alpha + c * (beta + gamma))
        all_reduce:     2*(m-1)*alpha + 2*(m-1)*c*beta + (m-1)*c*gamma
        all_to_all:     (m-1) * (alpha + c * beta) + the counts swap;   local moves: 0.0
        """,
    ),
    "8.2": (
        """One branch per (type of src, type of dst), each at most one collective of
        minipar.collectives (all_gather, all_reduce, reduce_scatter, all_to_all_v). They work along
        axis 0: move the split dim to the front (xp.moveaxis, xp = minipar.xp.namespace(x)) and back
        afterwards. Take every extent from shape: x.shape is only your piece.""",
        """S(d) -> R: moveaxis(all_gather(comm, moveaxis(x, d, 0), counts=chunk sizes of shape[d]), 0, d).
        P -> R: all_reduce(comm, x). P -> S(d): moveaxis(reduce_scatter(comm, moveaxis(x, d, 0)), 0, d).
        R -> S(d): x[(slice(None),) * d + (slice(a, b),)] with (a, b) = chunk_bounds(shape[d], m)[r].
        R -> P: x on rank 0, zeros(x.shape, like=x) elsewhere. S(d) -> P: zeros with shape[d] along d,
        your piece at a:b.""",
        """
        S(d) -> S(e): cut x along e by chunk_bounds(x.shape[e], m), flatten each piece (xp.reshape(piece,
        (-1,))), xp.concat them; rows, counts = all_to_all_v(comm, flat, [piece sizes], or None when every
        piece is the same size). Piece j (counts[j] elements) = rank j's rows of d (chunk_bounds(shape[d],
        m)[j]) x your chunk of e: xp.reshape each piece and xp.concat them along d.
        """,
    ),
    "8.3": (
        """A 2-D move is a sequence of 1-D moves, one mesh axis at a time, in the order plan(src, dst)
        gives (minipar.autoparallel.placement): each step is your redistribute on
        mesh.axis_comms[step.axis].""",
        """The shape a step's axis sees is not the global shape but the block the other axes leave:
        take step.before, set its own axis to Replicate(), and block(shape, that, mesh.shape,
        mesh.coords) gives (start, stop) per dim; the extents are stop - start.""",
        """
        for step in plan(src, dst):
            seen = list(step.before); seen[step.axis] = Replicate()
            sub = tuple(b - a for a, b in block(shape, seen, mesh.shape, mesh.coords))
            x = redistribute(mesh.axis_comms[step.axis], x, step.src, step.dst, sub)
        return x
        """,
    ),
    "8.4": (
        """One rule per tensor. Has the split dim: Shard(its position among the tensor's dims). An
        input without it: Replicate() (needed whole). The output without it: Partial() (summed over
        the split dim). A parameter without it: Partial() when the output is Partial (a bias added
        after the sum, as in a row split), else Replicate().""",
        """The special cases first. "-": everything Replicate(). "@k": inputs and parameters Replicate(),
        the output Partial() (only rank k computes; the others hold zeros). Attention split along "T":
        a query needs every key and value before it, so the input is Replicate() and the output
        Shard along T.""",
        """
        y = Shard(out.index(choice)) if choice in out else Partial()
        if kind == "attention" and choice == "T": return [Replicate()], {}, y
        xs = [Shard(d.index(choice)) if choice in d else Replicate() for d in ins]
        ps = {p: Shard(d.index(choice)) if choice in d else (Partial() if y == Partial() else Replicate())
              for p, d in params.items()}
        return xs, ps, y
        """,
    ),
    "8.5": (
        """Metropolis, as in FlexFlow: propose a neighbour by changing one operator's choice, simulate
        it, always accept it if not slower, accept a slower one with probability exp(-beta f). The
        order of the random draws matters: the grader replays the same generator.""",
        """ops = [op for op, cs in space.items() if len(cs) > 1]; op = ops[rng.integers(len(ops))];
        others = the choices of op other than strategy[op]; candidate = dict(strategy) with op set to
        others[rng.integers(len(others))]; c = simulate(candidate).""",
        """
        f = (c - cost) / cost
        if c <= cost or rng.random() < math.exp(-beta * f):   # u is drawn only when slower
            return candidate, c, True
        return strategy, cost, False
        """,
    ),
}

WHAT = {"all_gather": "an all-gather: every rank needs every piece",
        "all_reduce": "an all-reduce: sum the addends, everyone keeps the sum",
        "reduce_scatter": "a reduce-scatter: sum the addends, each rank keeps its piece",
        "all_to_all": "an all-to-all: cut my piece along the new dim, swap",
        "slice": "local, keep my piece", "to_partial": "local, rank 0 keeps x and the others hold zeros",
        "shard_to_partial": "local, my piece inside zeros", None: "src == dst, nothing to do"}


# ---------------------------------------------------------------- 8.1: which collective, and its cost

COST_CASES = [((8, 12), 2, 8, 7e-6, 2e-9, 5e-10), ((8, 12), 4, 8, 7e-6, 2e-9, 5e-10),
              ((5, 7), 4, 8, 3e-5, 1e-10, 4e-11), ((6, 4, 3), 3, 4, 1e-6, 5e-10, 1e-10),
              ((7, 9, 2), 3, 8, 2e-5, 3e-9, 6e-10)]


def _formula(kind, m, c, a, b, g, swap, steps=None):
    """The alpha-beta-gamma time of one move (c: bytes of the largest piece in one message)."""
    s = m - 1 if steps is None else steps
    return {"all_gather": s * (a + c * b), "reduce_scatter": s * (a + c * (b + g)),
            "all_reduce": 2 * s * a + 2 * s * c * b + s * c * g,
            "all_to_all": s * (a + c * b) + (s * (a + 8 * b) if swap else 0.0)}.get(kind, 0.0)


def _piece(kind, src, dst, shape, m, item):
    """(c: bytes of the largest piece a rank sends in one message, the average piece, the whole
    tensor's bytes, do the pieces differ?)."""
    n, up = math.prod(shape), lambda k: -(-k // m)  # noqa: E731
    if kind == "all_reduce":
        return up(n) * item, n / m * item, n * item, n % m != 0
    if kind == "all_to_all":
        d, e = src.dim, dst.dim
        rest = n // (shape[d] * shape[e])
        return (up(shape[d]) * up(shape[e]) * rest * item, n / m / m * item, n * item,
                bool(shape[d] % m or shape[e] % m))
    d = (src if kind == "all_gather" else dst).dim
    return up(shape[d]) * (n // shape[d]) * item, n / m * item, n * item, shape[d] % m != 0


def _cost_hint(kind, src, dst, shape, m, item, a, b, g, got):
    c, avg, whole, uneven = _piece(kind, src, dst, shape, m, item)
    same = lambda t: math.isclose(got, t, rel_tol=1e-9, abs_tol=1e-15)  # noqa: E731
    if kind not in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        return "; a local move sends nothing: it costs 0 here" if got else ""
    hints = [("a reduce-scatter's cost: a ring all-reduce is a reduce-scatter and then an all-gather, 2(m-1) steps",
              kind == "all_reduce" and same(_formula("reduce_scatter", m, c, a, b, g, False))),
             ("m steps: a ring of m ranks needs m-1 (each rank starts with its own piece)",
              same(_formula(kind, m, c, a, b, g, uneven, steps=m))),
             (f"c = the whole tensor ({whole} bytes): each step sends one piece, c = the largest piece ({c} bytes)",
              same(_formula(kind, m, whole, a, b, g, uneven))),
             (f"c = the average piece ({avg:g} bytes): the pieces differ, and every step waits for the largest "
              f"one, c = {c} bytes", uneven and same(_formula(kind, m, avg, a, b, g, uneven))),
             (f"c in elements: c is in bytes ({c // item} elements x itemsize {item})",
              same(_formula(kind, m, c // item, a, b, g, uneven))),
             ("no gamma: a reduction also adds c bytes per step (gamma per byte)",
              kind in ("all_reduce", "reduce_scatter") and same(_formula(kind, m, c, a, b, 0.0, uneven))),
             ("gamma on a move that adds nothing up: only all-reduce and reduce-scatter pay gamma",
              kind in ("all_gather", "all_to_all") and same(_formula(kind, m, c, a, b, g, uneven) + (m - 1) * c * g)),
             ("no counts swap: the pieces differ, so all_to_all_v first sends every other rank one int64 count, "
              "(m-1)(alpha + 8 beta)", kind == "all_to_all" and uneven and same(_formula(kind, m, c, a, b, g, False))),
             ("a counts swap although every piece has the same size: all_to_all_v swaps counts only when they "
              "differ", kind == "all_to_all" and not uneven and same(_formula(kind, m, c, a, b, g, True)))]
    return next((f"; you computed {h}" for h, hit in hints if hit), f" (c = {c} bytes)")


def check_transition_cost(comm, fn):
    for shape, m, item, a, b, g in COST_CASES:
        for src, dst in itertools.product([Shard(d) for d in range(len(shape))] + [R, P], repeat=2):
            call = (f"transition_cost({src!r}, {dst!r}, shape={shape}, m={m}, itemsize={item}, alpha={a:g}, "
                    f"beta={b:g}, gamma={g:g})")
            got = fn(src, dst, shape, m, item, a, b, g)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                return [f"{call} returned {got!r}; expected (kind, seconds)"]
            kind, want_kind = got[0], step_kind(src, dst)
            if kind != want_kind:
                return [f"{call}: the move is {want_kind!r} ({WHAT[want_kind]}), not {kind!r}"]
            steps = redistribution_steps((src,), (dst,))
            want = sum(step_time(s, shape, (m,), (0,), item, a, b, g) for s in steps)
            try:
                secs = float(got[1])
            except (TypeError, ValueError):
                return [f"{call} returned {got[1]!r} seconds, expected a number"]
            if not math.isclose(secs, want, rel_tol=1e-9, abs_tol=1e-15):
                return [f"{call} = {secs:.6g} s, expected {want:.6g} s for {want_kind or 'no move (src == dst)'}"
                        + _cost_hint(want_kind, src, dst, shape, m, item, a, b, g, secs)]
    return []


# ---------------------------------------------------------------- 8.2, 8.3: redistribute on real ranks

def _traffic(comm, g, src, dst, shape, mesh_shape, coords, case):
    """This rank's bytes sent during the call against the formula of every step, exactly."""
    steps = redistribution_steps(src, dst)
    want = sum(step_bytes(s, shape, mesh_shape, coords, 8) for s in steps)
    got, _, _ = sent(comm, g.events)
    if got == want:
        return []
    r, how = comm.rank, " then ".join(s.kind for s in steps) or "nothing"
    seen = f" (the trace shows {ran(g.events)})"
    if got == 0:
        return [f"rank {r} sent 0 bytes through comm in {case}; {how} sends exactly {want}: did you use a builtin "
                f"collective (mpi4py's own, torch.distributed) instead of {INSTEAD}?"]
    if want == 0:
        return [f"rank {r} sent {got} bytes in {case}; {how + ' is ' if steps else ''}"
                f"{WHAT[steps[0].kind if steps else None]}: nothing to send{seen}"]
    if [s.kind for s in steps] == ["all_to_all"] and got - want == (mesh_shape[steps[0].axis] - 1) * 8:
        return [f"rank {r} sent {got} bytes in {case}, {got - want} more than the all-to-all: the counts swap of "
                f"all_to_all_v, needed only when the pieces differ; with pieces of one size pass send_counts=None"]
    more = (": gathering the whole tensor and slicing it sends more; a cheaper collective exists"
            if got > want else "")
    return [f"rank {r} sent {got} bytes in {case}; {how} sends exactly {want}{seen}{more}"]


def _fmt(placements):
    return repr(placements[0]) if len(placements) == 1 else "(" + ", ".join(map(repr, placements)) + ")"


def _check_pairs(comm, fn, name, mesh, pairs, shape, call, seed=0):
    """``call(x, src, dst)`` (the learner's ``fn`` named ``name``) for each (src, dst) pair in turn,
    every rank handed its own piece of one random tensor; the failures of the first failing pair
    (all ranks stop there together)."""
    full, where = np.random.default_rng([seed, *shape]).standard_normal(shape), f"mesh {'x'.join(map(str, mesh.shape))}"
    for a, (src, dst) in enumerate(pairs):
        x = _noise(mesh, src, local_block(full, src, mesh.shape, mesh.coords), (seed, a))
        g = graded(comm, lambda: call(comm.asarray(x), src, dst))
        out = None if g.out is None else to_numpy(g.out)
        everyone = comm.builtin.allgather_object(out)  # the reference's gather: outside the graded call
        case, tol = f"{_fmt(src)} -> {_fmt(dst)}, shape {shape} on {where}", 1e-12 if P in src else 0.0
        want = local_block(full, dst, mesh.shape, mesh.coords)
        fails = no_builtin(comm, g, name, INSTEAD)
        if not fails and P in dst:  # addends are not unique: my piece's shape, then the sum over the ranks
            fits = [y is not None and y.shape == local_block(full, dst, mesh.shape, mesh.coords_of(r)).shape
                    for r, y in enumerate(everyone)]
            fails = (compare(comm, out, want, "my addend", case) if not fits[comm.rank] else [] if not all(fits)
                     else compare(comm, assemble(everyone, dst, shape, mesh.shape), full,
                                  "the sum of the ranks' addends (a Partial result)", case, tol))
        elif not fails:
            fails = compare(comm, out, want, "my piece", case, tol)
        fails = (fails or _traffic(comm, g, src, dst, shape, mesh.shape, mesh.coords, case)
                 or sent_by_learner(comm, g, fn, name, INSTEAD, COLLECTIVES))
        if stop(comm, fails):
            return fails
    return []


def check_redistribute(comm, fn):
    """Every pair of S(0), S(1), R, P on the 1-D mesh of all ranks; a shape that divides, one that does not."""
    mesh, p = Mesh((comm.size,), comm), comm.size
    pairs = [((s,), (d,)) for s, d in itertools.product([Shard(0), Shard(1), R, P], repeat=2)]
    for shape in [(2 * p, p, 3), (p + 1, 2 * p - 1, 2)]:  # the third dim is carried along
        fails = _check_pairs(comm, fn, "redistribute", mesh, pairs, shape,
                             lambda x, s, d: fn(comm, x, s[0], d[0], shape))
        if fails:
            return fails
    return []


def check_redistribute_2d(comm, fn, n_pairs=96):
    """``n_pairs`` of the 256 pairs of placements on a 2 x 2 mesh (a seeded draw, in order), shape (3, 5)."""
    mesh = Mesh((2, comm.size // 2), comm)
    combos = list(itertools.product([Shard(0), Shard(1), R, P], repeat=2))
    pairs = list(itertools.product(combos, repeat=2))
    pairs = [pairs[i] for i in sorted(np.random.default_rng(8).choice(len(pairs), n_pairs, replace=False))]
    return _check_pairs(comm, fn, "redistribute_2d", mesh, pairs, (3, 5), lambda x, s, d: fn(mesh, x, s, d, (3, 5)))


# ---------------------------------------------------------------- 8.4: an operator's layout

def graphs():
    """The graphs whose every operator 8.4 checks: a transformer block, an MLP under a vocabulary head."""
    return [build("block", B=4, T=6, C=8, n_heads=4, H=16).graph, build("vocab", B=4, T=6, C=8, H=12, V=20).graph]


def describe_op(graph, op):
    """(dims of each input, {parameter: dims}, dims of the output): what the learner is given."""
    ins = [graph.tensors[t].dims for t in op.inputs]
    out = graph.tensors[op.output].dims
    if op.kind == "linear":
        params = {op.params_named("w"): ins[0][2:] + out[2:], op.params_named("b"): out[2:]}
    else:
        params = {p: (ins[0][-1],) for p in op.params}  # LayerNorm's gamma and beta: (C,)
    return ins, params, out


def dim_of(graph, op, choice):
    """A choice as the dim it splits: linear's "out" / "in" become its output / input feature dim."""
    if op.kind == "linear" and choice in ("out", "in"):
        return (graph.tensors[op.output].dims[2 + op.attrs["out_axis"]] if choice == "out"
                else graph.tensors[op.inputs[0]].dims[2 + op.attrs["in_axis"]])
    return choice


def _layout_hint(op, d, what, want):
    """Why ``what`` must be ``want`` when ``op`` is split along ``d``."""
    if d == "-":
        return "replicated: every rank computes all of it from all of its inputs"
    if d.startswith("@"):
        return (f"only rank {d[1:]} computes; the others hold zeros, and the sum over the ranks is the output"
                if what == "the output" else f"rank {d[1:]} computes it alone, from whole inputs")
    if want == P and what == "the output":
        return f"it has no dim {d}: {d} is summed over, so each rank holds an addend"
    if want == P:
        return ("the output is Partial (every rank's addend is summed): a replicated bias would be added on every "
                "rank and counted m times; it must be Partial too (added once, as in a row split)")
    if op.kind == "attention" and d == "T":
        return ("splitting the queries: a query at position t attends to the keys and values of every position up "
                "to t, so every rank needs all of qkv")
    if isinstance(want, Shard):
        return f"it has {d} at position {want.dim}"
    if what.startswith("parameter"):
        return f"it has no dim {d}: every rank uses all of it (the output is not Partial, so it is not either)"
    return f"it has no dim {d}: every rank needs all of it"


def check_op_layout(comm, fn):
    for graph in graphs():
        for op in graph.ops:
            ins, params, out = describe_op(graph, op)
            for c in choices(op, (4,)):
                if c in ("@1", "@3"):
                    continue
                d, lay = dim_of(graph, op, c), layout(op, (c,))
                call = f"op_layout({op.kind!r}, {d!r}, ins={ins}, params={params}, out={out})"
                got = fn(op.kind, d, [tuple(i) for i in ins], dict(params), tuple(out))
                if not (isinstance(got, (tuple, list)) and len(got) == 3):
                    return [f"{call} returned {got!r}; expected (input placements, {{param: placement}}, output)"]
                g_ins, g_params, g_out = list(got[0]), got[1], got[2]
                if len(g_ins) != len(ins) or not isinstance(g_params, dict):
                    return [f"{call} returned {got!r}; expected a list of {len(ins)} input placements, a dict "
                            f"{{param: placement}} and the output's placement"]
                want = [(f"input {k} {tuple(ins[k])}", lay.ins[k][0], g_ins[k]) for k in range(len(ins))]
                want += [(f"parameter {p} {params[p]}", lay.params[p][0], g_params.get(p)) for p in op.params]
                want.append(("the output", lay.out[0], g_out))
                for what, w, g in want:
                    if g != w:
                        return [f"{graph.name} {op.name} split along {d!r} ({call}): {what} must be {w!r}, you "
                                f"returned {g!r}: {_layout_hint(op, d, what, w)}"]
    return []
