"""Lab 08's reference: minipar's own pieces under the names the exercise uses."""
from ..autoparallel import search, transitions
from ..autoparallel.sharding import P, R, Shard


def transition_cost(src, dst, shape, m, itemsize, alpha, beta, gamma):
    steps = transitions.redistribution_steps((src,), (dst,))  # one step on one axis, or none when src == dst
    return (steps[0].kind if steps else None,
            sum(transitions.step_time(s, shape, (m,), (0,), itemsize, alpha, beta, gamma) for s in steps))


def redistribute(comm, x, src, dst, shape):
    return transitions.redistribute(comm, x, (src,), (dst,), shape)


def redistribute_2d(mesh, x, src, dst, shape):
    return transitions.redistribute(mesh, x, src, dst, shape)


def op_layout(kind, choice, ins, params, out):
    """The rule ``minipar.autoparallel.ops`` tabulates per operator, said once for every operator:
    split along a dim, a tensor holding it is Shard(its position); an input without it is needed
    whole (R); an output without it was summed over it (P), and so is a parameter added to such an
    output (the bias of a row split); attention split along T needs every key (R)."""
    if choice == "-" or choice.startswith("@"):
        return [R] * len(ins), {p: R for p in params}, R if choice == "-" else P

    def placed(dims, otherwise):
        return Shard(dims.index(choice)) if choice in dims else otherwise

    y = placed(out, P)
    if kind == "attention" and choice == "T":
        return [R], {}, y
    return [placed(d, R) for d in ins], {p: placed(d, P if y == P else R) for p, d in params.items()}, y


def mcmc_step(strategy, cost, space, simulate, rng, beta=30.0):
    candidate = search.propose(strategy, space, search.movable(space), rng)
    c = simulate(candidate)
    if search.accept(c, cost, rng, beta):
        return candidate, c, True
    return strategy, cost, False
