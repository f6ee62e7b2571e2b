"""Lab 08: automatic parallelization (FlexFlow): placements, redistributions, layouts, the search.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/08_auto_parallel/exercise.py   # see what your code does
    torchrun --standalone --nproc-per-node 4 minipar-labs/08_auto_parallel/exercise.py   # the same, torch
    minipar check 08                                                  # grade every task
    minipar check 08 --task 8.2                                       # grade one task
    minipar check 08 --backend torch                                  # grade it on torch tensors

A tensor's placement on one axis of a mesh of m ranks is one of (DTensor's vocabulary):

    Shard(d)     split along its dim d: rank j holds chunk j, chunk_bounds(n_d, m)[j]
                 (uneven is fine: 5 rows over 4 ranks are 2, 1, 1, 1)
    Replicate()  every rank holds all of it
    Partial()    every rank holds an addend of the same shape; the tensor is their sum

A rank holds only its own piece (its *local* tensor). Communicate with minipar.collectives;
comm.builtin (the engine's own collectives) is off limits. The grader counts the bytes each
rank sends: exactly what the right collective sends, so gathering everything and slicing
afterwards fails wherever a cheaper collective exists.

One code, two backends: a local piece x is a NumPy array under MPI and a torch tensor under
torch.distributed. Compute through its array namespace, xp = namespace(x) (minipar.xp):
xp.moveaxis, xp.reshape, xp.concat; slice with x[(slice(None),) * d + (slice(a, b),)] (rows a:b
of dim d); zeros(shape, like=x) is a zero array of x's kind, dtype and device.
"""
import math  # noqa: F401  math.prod, math.ceil

import numpy as np

import minipar
from minipar.autoparallel.placement import Partial, Replicate, Shard, block, plan  # noqa: F401
from minipar.collectives import all_gather, all_reduce, all_to_all_v, reduce_scatter  # noqa: F401
from minipar.xp import chunk_bounds  # noqa: F401  chunk_bounds(n, m)[j] = (start, stop) of chunk j
from minipar.xp import namespace, to_numpy, zeros  # noqa: F401  follow their argument's kind and device


def transition_cost(src, dst, shape, m, itemsize, alpha, beta, gamma):
    """The move of a tensor of global ``shape`` from placement ``src`` to ``dst`` on one mesh axis of
    m ranks: which operation it needs, and its time in the alpha-beta-gamma model.

    Return (kind, seconds). kind is one of
        "all_gather"        S(d) -> R        every rank needs every piece
        "all_reduce"        P    -> R        sum the addends, everyone keeps the sum
        "reduce_scatter"    P    -> S(d)     sum the addends, each rank keeps its piece
        "all_to_all"        S(d) -> S(e)     cut my piece along e, piece j to rank j
        "slice"             R    -> S(d)     local
        "to_partial"        R    -> P        local
        "shard_to_partial"  S(d) -> P        local
        None                src == dst
    A message of c bytes costs alpha + c * beta; adding up c bytes costs c * gamma. minipar's
    rings take m-1 steps, each step one message of one piece per rank, and wait for the largest:
        all_gather       (m-1) (alpha + c beta)
        reduce_scatter   (m-1) (alpha + c (beta + gamma))
        all_reduce       2 (m-1) alpha + 2 (m-1) c beta + (m-1) c gamma     (c = ceil(n/m) elements)
        all_to_all       (m-1) (alpha + c beta), + (m-1) (alpha + 8 beta) when the pieces differ in
                         size (all_to_all_v first swaps one int64 count with every other rank)
        local moves      0
    c = bytes of the largest piece a rank sends in one message: along the split dim
    ceil(n_d / m) rows times every other dim (for the all-to-all, ceil(n_d/m) x ceil(n_e/m) x the
    rest; for the all-reduce, the flat tensor of n elements in m chunks), times itemsize.
    """
    # TODO(lab8.1): the kind from the types of src and dst, then c and the formula
    raise NotImplementedError("lab 8.1")


def redistribute(comm, x, src, dst, shape):
    """My local piece ``x`` of a tensor of global ``shape``, placed ``src`` on the 1-D mesh of all
    ranks of ``comm``, moved to placement ``dst``: return my local piece under ``dst``.

    One collective at most (the one transition_cost names), or a local operation:
      S(d) -> R     all_gather(comm, x', counts) concatenates along axis 0: move dim d to the
                    front (xp.moveaxis), pass every rank's count (chunk_bounds(shape[d], m)), move it back
      P -> R        all_reduce(comm, x)
      P -> S(d)     reduce_scatter(comm, x') keeps my chunk of axis 0 of the sum: dim d in front
      S(d) -> S(e)  cut x along e into m chunks, flatten each and concatenate; all_to_all_v(comm,
                    flat, send_counts) returns (what arrived, recv_counts) in rank order: piece j
                    holds rank j's rows of d and my chunk of e; stack them along d. Pass
                    send_counts=None when every piece has the same size (no counts swap)
      R -> S(d)     my chunk along d;  R -> P: rank 0 keeps x, the others zeros;
      S(d) -> P     my piece in place inside zeros of the unsplit extent along d
    Take every extent from ``shape`` (x.shape is only my piece).
    """
    # TODO(lab8.2): one branch per transition
    raise NotImplementedError("lab 8.2")


def redistribute_2d(mesh, x, src, dst, shape):
    """The same on a 2-D mesh: src and dst are tuples of one placement per mesh axis, e.g.
    (Shard(0), Replicate()). mesh.shape = (m0, m1); mesh.coords = my (c0, c1); mesh.axis_comms[i]
    = the ranks that differ from me only in coordinate i (rank j of it has coordinate j).

    Axis 0 splits first and axis 1 splits axis 0's piece again, so changing how axis 0 splits a
    dim changes the piece axis 1 splits: plan(src, dst) lists the one-axis steps in a safe order
    (step.axis, step.src, step.dst, step.before = the placements before the step). Run each step
    with your redistribute on mesh.axis_comms[step.axis], giving it as ``shape`` the tensor that
    axis sees: the block the *other* axes leave, block(shape, placements, mesh.shape, mesh.coords)
    with the step's own axis taken as Replicate() (a list of (start, stop) per dim).
    """
    # TODO(lab8.3): for every step of plan(src, dst), redistribute on its axis
    raise NotImplementedError("lab 8.3")


def op_layout(kind, choice, ins, params, out):
    """An operator split along one dim on one mesh axis: where its tensors must be.

    kind: "linear", "mean", "var", "norm", "gelu", "add", "attention" or "mse"; choice: the dim
    it is split along (a name such as "B", "T", "C", "H", "heads", "V"), or "-" (replicated: every
    rank computes all of it), or "@k" (only rank k computes; FlexFlow's Operator dimension).
    ins: the dim names of each input, e.g. [("B", "T", "C")]; params: {name: dim names}, e.g.
    {"mlp.fc1.w": ("C", "H"), "mlp.fc1.b": ("H",)}; out: the output's dim names.

    Return (one placement per input, {param name: placement}, the output's placement). Think per
    tensor: does it have the dim? Then it is split along it. An input without it is needed whole.
    An output without it was summed over it (so is a parameter added to such an output). Causal
    attention split along T splits its queries: which keys and values does a query need?
    """
    # TODO(lab8.4): Shard(position) / Replicate() / Partial() for every tensor
    raise NotImplementedError("lab 8.4")


def mcmc_step(strategy, cost, space, simulate, rng, beta=30.0):
    """One move of FlexFlow's Markov chain over strategies.

    strategy: {operator: choice} with simulated time ``cost`` (seconds); space: {operator: [its
    valid choices]}; simulate(strategy) -> seconds; rng: a numpy Generator.
    Returns (candidate, c, True) when the move is accepted, else (strategy, cost, False); either way
    ``strategy`` is left as it was (the candidate is a new dict).
    The move (the candidate): one operator, among those with more than one choice, gets one of its
    other choices; both picks uniform. c = simulate(candidate). The Metropolis rule: a candidate
    that is not slower is accepted; one slower by the fraction f = (c - cost) / cost is accepted
    with probability exp(-beta f).
    The random draws, which the grader replays: each pick among n things is rng.integers(n), the
    things in space's order (the operators with more than one choice, then that operator's other
    choices); an acceptance takes one u = rng.random(), accepted if u is below its probability,
    and only a slower candidate draws it.
    """
    # TODO(lab8.5): the move, its time, the rule
    raise NotImplementedError("lab 8.5")


if __name__ == "__main__":
    from minipar.autoparallel import Costs, Simulator, build, hand_written, space
    from minipar.lessons.auto_parallel import FIXED_COSTS  # 10 GFLOP/s per rank, alpha 5 us, 1 GB/s

    comm = minipar.init("auto")  # NumPy over MPI under mpiexec, torch tensors under torchrun
    p, shape = comm.size, (comm.size + 1, 2 * comm.size - 1)  # does not divide over p ranks
    full = np.random.default_rng(0).standard_normal(shape)  # the same tensor on every rank

    def piece(pl):  # my block of full under placement pl (Partial: rank 0 holds it, the others zeros), NumPy
        (a, b), (c, d) = block(shape, (pl,), (p,), (comm.rank,))
        return full[a:b, c:d] * (0.0 if isinstance(pl, Partial) and comm.rank else 1.0)

    for src, dst in [(Shard(0), Replicate()), (Partial(), Shard(1)), (Shard(0), Shard(1)), (Replicate(), Shard(0))]:
        try:
            kind, secs = transition_cost(src, dst, shape, p, 8, 5e-6, 1e-9, 1e-10)
            cost = f"{kind}, predicted {secs * 1e6:.1f} us"
        except NotImplementedError as err:
            cost = f"transition_cost not implemented yet ({err})"
        try:
            got = to_numpy(redistribute(comm, comm.asarray(piece(src)), src, dst, shape))  # in the backend's kind
            right = got.shape == piece(dst).shape and np.allclose(got, piece(dst))
            count = all_reduce(comm, comm.asarray(np.array([float(right)])))  # ranks that got it right
            moved = f"right on {int(to_numpy(count)[0])} of {p} ranks"
        except NotImplementedError as err:
            moved = f"redistribute not implemented yet ({err})"
        if comm.rank == 0:
            print(f"{src} -> {dst} of {shape}: {cost}; {moved}", flush=True)
    if comm.rank == 0:
        try:
            print("fc1 split along H:", op_layout("linear", "H", [("B", "T", "C")], {"w": ("C", "H"), "b": ("H",)},
                                                  ("B", "T", "H")))
            print("fc2 split along H:", op_layout("linear", "H", [("B", "T", "H")], {"w": ("H", "C"), "b": ("C",)},
                                                  ("B", "T", "C")))
        except NotImplementedError as err:
            print("op_layout: not implemented yet", err)
        m = build("vocab", B=8, T=64, C=32, H=32, V=4096)  # a huge vocabulary under a small MLP, on 4 ranks
        sim = Simulator(m.graph, (4,), Costs(**FIXED_COSTS))
        sp, cur = space(m.graph, (4,)), hand_written(m.graph, (4,))["data parallel"]
        cost = start = sim.run(cur).time
        best, rng = (cost, cur), np.random.default_rng(0)
        try:
            for _ in range(2000):
                cur, cost, _ = mcmc_step(cur, cost, sp, lambda s: sim.run(s).time, rng, 30.0)
                best = min(best, (cost, cur), key=lambda b: b[0])
            print(f"2000 of your MCMC steps from data parallel ({start * 1e3:.2f} ms simulated): the best seen "
                  f"{best[0] * 1e3:.2f} ms, with " + ", ".join(f"{op} {c[0]}" for op, c in best[1].items())
                  + "\n(single-operator moves only: see question 8.6 in the README)")
        except NotImplementedError as err:
            print("mcmc_step: not implemented yet", err)
        print("now grade it: minipar check 08", flush=True)
