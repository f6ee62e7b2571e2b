"""Lab 08's pure-function checks (8.1, 8.4, 8.5), run in one process on the typical mistakes: each
wrong way must fail, with the hint that names it (the answers right, with minipar's own reference
and the exact formula, must pass). The multi-rank tasks and one planted bug per task are covered
by tests/test_labs.py (labs/08_auto_parallel/mutants, tests/labs/skips/08_*)."""
import math

import pytest

from minipar.autoparallel.sharding import P, R, Shard
from minipar.autoparallel.transitions import step_kind
from minipar.labs import lab08 as L, lab08_mcmc as M
from minipar.labs import lab08_solution as S


def test_the_right_answers_pass():
    """minipar's reference, and the mistakes below switched off, pass every case."""
    assert L.check_transition_cost(None, S.transition_cost) == [] == L.check_transition_cost(None, costs())
    assert L.check_op_layout(None, S.op_layout) == [] == L.check_op_layout(None, layouts(None))
    assert M.check_mcmc_step(None, S.mcmc_step) == [] == M.check_mcmc_step(None, chain_step(lambda f, b, cost, c:
                                                                                           math.exp(-b * f)))


def costs(**wrong):
    """transition_cost from the grader's formula, with one mistake switched on."""
    def fn(src, dst, shape, m, item, a, b, g):
        kind = step_kind(src, dst)
        if kind not in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
            return kind, wrong.get("local", 0.0)
        c, avg, whole, uneven = L._piece(kind, src, dst, shape, m, item)
        c = {"whole": whole, "average": avg, "elements": c // item}.get(wrong.get("c"), c)
        swap = {"never": False, "always": True}.get(wrong.get("swap"), uneven)
        t = L._formula(kind, m, c, a, b, 0.0 if "no_gamma" in wrong else g, swap, steps=m if "m_steps" in wrong else None)
        if "gamma_everywhere" in wrong and kind in ("all_gather", "all_to_all"):
            t += (m - 1) * c * g
        if "reduce_scatter" in wrong and kind == "all_reduce":
            t = L._formula("reduce_scatter", m, c, a, b, g, False)
        return kind, t
    return fn


@pytest.mark.parametrize("wrong,hint", [
    (dict(m_steps=1), "you computed m steps: a ring of m ranks needs m-1"),
    (dict(c="whole"), "you computed c = the whole tensor (768 bytes)"),
    (dict(c="average"), "you computed c = the average piece (17.5 bytes): the pieces differ"),
    (dict(c="elements"), "you computed c in elements"),
    (dict(no_gamma=1), "you computed no gamma: a reduction also adds"),
    (dict(gamma_everywhere=1), "you computed gamma on a move that adds nothing up"),
    (dict(swap="never"), "you computed no counts swap: the pieces differ"),
    (dict(swap="always"), "you computed a counts swap although every piece has the same size"),
    (dict(local=1e-6), "a local move sends nothing: it costs 0 here"),
    (dict(reduce_scatter=1), "you computed a reduce-scatter's cost: a ring all-reduce is a reduce-scatter and then"),
])
def test_transition_cost_mistakes_are_named(wrong, hint):
    (message,) = L.check_transition_cost(None, costs(**wrong))
    assert hint in message, message


def test_transition_cost_wrong_collective_is_named():
    def gather_everything(src, dst, *args):
        return ("all_gather" if src != dst else None), 0.0
    (message,) = L.check_transition_cost(None, gather_everything)
    assert "the move is 'all_to_all' (an all-to-all: cut my piece along the new dim, swap), not 'all_gather'" in message


def layouts(wrong):
    """op_layout, right but for one mistake."""
    def fn(kind, choice, ins, params, out):
        xs, ps, y = S.op_layout(kind, choice, ins, params, out)
        split = choice != "-" and not choice.startswith("@")
        if wrong == "attention T splits qkv" and kind == "attention" and choice == "T":
            xs = [Shard(1)]
        if wrong == "@k output replicated" and choice.startswith("@"):
            y = R
        if wrong == "summed output replicated" and split and choice not in out:
            y = R
        if wrong == "missing dim partial" and split:
            xs = [P if choice not in d else x for d, x in zip(ins, xs)]
        if wrong == "bias replicated" and y == P:
            ps = {p: R if choice not in d else pl for (p, d), pl in zip(params.items(), ps.values())}
        if wrong == "everything replicated":
            xs, ps, y = [R] * len(ins), {p: R for p in params}, R
        return xs, ps, y
    return fn


@pytest.mark.parametrize("wrong,hint", [
    ("attention T splits qkv", "attn.core split along 'T'"),
    ("attention T splits qkv", "must be R, you returned S(1): splitting the queries"),
    ("@k output replicated", "the output must be P, you returned R: only rank 0 computes"),
    ("summed output replicated", "it has no dim C: C is summed over, so each rank holds an addend"),
    ("missing dim partial", "must be R, you returned P: it has no dim C: every rank needs all of it"),
    ("bias replicated", "a replicated bias would be added on every rank and counted m times"),
    ("everything replicated", "must be S(0), you returned R: it has B at position 0"),
])
def test_op_layout_mistakes_are_named(wrong, hint):
    (message,) = L.check_op_layout(None, layouts(wrong))
    assert hint in message, message


def chain_step(rule=None, draw=True, mutate=False):
    """mcmc_step with FlexFlow's proposal and the acceptance rule(f, beta, cost, c) -> probability."""
    def fn(strategy, cost, space, simulate, rng, beta=30.0):
        ops = [o for o, c in space.items() if len(c) > 1]
        op = ops[rng.integers(len(ops))]
        others = [c for c in space[op] if c != strategy[op]]
        cand = strategy if mutate else dict(strategy)
        cand[op] = others[rng.integers(len(others))]
        c = simulate(cand)
        if c <= cost:
            return cand, c, True
        f = (c - cost) / cost
        if (rng.random() if draw else 0.0) < rule(f, beta, cost, c):
            return cand, c, True
        return strategy, cost, False
    return fn


@pytest.mark.parametrize("step,hint", [
    (chain_step(lambda f, b, cost, c: 1.0), "your rule: it accepts every slower candidate"),
    (chain_step(lambda f, b, cost, c: 0.0), "your rule: it never accepts a slower candidate (greedy descent"),
    (chain_step(lambda f, b, cost, c: 1.0, draw=False), "without drawing u = rng.random() from the rng it was given"),
    (chain_step(lambda f, b, cost, c: math.exp(-b * (c - cost))), "your rule: exp(-beta (c - cost)): the change must be"),
    (chain_step(lambda f, b, cost, c: math.exp(-f / b)), "beta is an inverse temperature, multiply by it"),
    (chain_step(lambda f, b, cost, c: math.exp(-30 * f)), "your rule: exp(-30 f): use the beta passed in"),
    (chain_step(lambda f, b, cost, c: math.exp(-b * (c - cost) / c)), "divide by the current cost, not the candidate's"),
    (chain_step(lambda f, b, cost, c: math.exp(-b * f), mutate=True), "mcmc_step changed the strategy it was given"),
])
def test_mcmc_step_mistakes_are_named(step, hint):
    (message,) = M.check_mcmc_step(None, step)
    assert hint in message, message


def test_mcmc_step_proposals_must_be_uniform_over_movable_operators():
    def first_choice_only(strategy, cost, space, simulate, rng, beta=30.0):
        ops = [o for o, c in space.items() if len(c) > 1]
        op = ops[rng.integers(len(ops))]
        cand = {**strategy, op: next(c for c in space[op] if c != strategy[op])}
        c = simulate(cand)
        return (cand, c, True) if c <= cost or rng.random() < math.exp(-beta * (c - cost) / cost) else (strategy, cost, False)

    def any_operator(strategy, cost, space, simulate, rng, beta=30.0):
        op = list(space)[rng.integers(len(space))]  # mlp.gelu has a single choice: nothing to move to
        others = [c for c in space[op] if c != strategy[op]] or [strategy[op]]
        cand = {**strategy, op: others[rng.integers(len(others))]}
        c = simulate(cand)
        return (cand, c, True) if c <= cost or rng.random() < math.exp(-beta * (c - cost) / cost) else (strategy, cost, False)

    (message,) = M.check_mcmc_step(None, first_choice_only)
    assert "never got the choices" in message and "pick uniformly among its other choices" in message, message
    (message,) = M.check_mcmc_step(None, any_operator)
    assert "the candidate changes 0 operators" in message and "not an operator with one choice" in message, message
