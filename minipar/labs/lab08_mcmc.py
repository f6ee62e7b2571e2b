"""Lab 08, task 8.5 (one MCMC step): its check, apart from ``lab08``'s placement checks.

The candidate's ``mcmc_step`` is handed an rng whose ``random()`` is scripted just below and
just above exp(-beta f), at several betas and costs: accepting every slower move, never, or at
another temperature each fail, with the rule the decisions fit; so does a step that draws u for
a candidate that is not slower, or more than once. Then a seeded chain runs on a
fixed table of costs: one operator changed per step, to another of its valid choices, uniformly.
"""
from __future__ import annotations

import math

import numpy as np

from ..autoparallel import build


def mcmc_space():
    """The space 8.5 searches: the MLP on 2 ranks, GeLU fixed to one choice (nothing to move)."""
    from ..autoparallel import space

    sp = space(build("mlp", B=4, T=8, C=8, H=16).graph, (2,))
    sp["mlp.gelu"] = [("B",)]
    return sp


class ScriptedRng:
    """A seeded numpy Generator whose ``random()`` (and ``uniform()``) returns ``u``, counting the draws."""

    def __init__(self, seed, u):
        self.gen, self.u, self.draws = np.random.default_rng(seed), u, 0

    def random(self, *args, **kwargs):
        self.draws += 1
        return self.u

    def uniform(self, low=0.0, high=1.0, size=None):
        self.draws += 1
        return low + (high - low) * self.u

    def __getattr__(self, name):
        return getattr(self.gen, name)


def _step(fn, strategy, cost, sp, simulate, rng, beta):
    """(what mcmc_step returned, or None; a failure message or None)."""
    given = dict(strategy)
    got = fn(given, cost, sp, simulate, rng, beta)
    if given != strategy:
        return None, (f"mcmc_step changed the strategy it was given ({strategy} became {given}): build the candidate "
                      f"as a new dict")
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return None, f"mcmc_step returned {got!r}; expected (strategy, cost, accepted)"
    return got, None


def _simulated(calls):
    return (f"mcmc_step simulated {len(calls)} candidates in one step; it proposes one and simulates it once"
            + (" (a search that never moves: it keeps its start, data parallel, whatever the costs)" if not calls else ""))


def _proposals(fn, sp, start, n=1200):
    """n steps with a seeded rng on a fixed table of costs (a cost per operator's choice, added
    up), beta = 1e9: a slower candidate has probability 0, so the chain only goes downhill."""
    movable, draw_ = [o for o, c in sp.items() if len(c) > 1], np.random.default_rng(5)
    table = {(o, c): float(v) for o, cs in sp.items() for c, v in zip(cs, draw_.random(len(cs)))}
    price = lambda s: 1.0 + sum(table[o, tuple(c)] for o, c in s.items())  # noqa: E731
    rng, seen, cur = np.random.default_rng(8), [], dict(start)
    cost = price(cur)
    for i in range(n):
        calls = []
        got, why = _step(fn, cur, cost, sp, lambda s: calls.append(dict(s)) or price(s), rng, 1e9)  # noqa: B023
        if why:
            return [why]
        if len(calls) != 1:
            return [_simulated(calls)]
        changed = [o for o in sp if tuple(calls[0][o]) != tuple(cur[o])]
        if len(changed) != 1:
            return [f"step {i}: the candidate changes {len(changed)} operators {changed}; a move changes exactly one"
                    + (" (to another of its choices: not its current one, and not an operator with one choice)"
                       if not changed else "")]
        op, new = changed[0], tuple(calls[0][changed[0]])
        if op not in movable or new not in sp[op]:
            return [f"step {i}: the candidate gives {op} the choice {new}, not one of its other valid choices "
                    f"{[c for c in sp[op] if c != cur[op]]}" + (" (it has no other choice: pick among the operators "
                                                                 "with more than one)" if op not in movable else "")]
        c = price(calls[0])
        keep = (calls[0], c, True) if c <= cost else (cur, cost, False)
        if got[0] != keep[0] or got[1] != keep[1] or bool(got[2]) != keep[2]:
            return [f"step {i}: the candidate costs {c:.4f} s, the current strategy {cost:.4f} s; with beta = 1e9 "
                    f"(a slower candidate has probability exp(-1e9 f) = 0) return (the "
                    f"{'candidate, its cost, True' if keep[2] else 'current strategy, its cost, False'}), got "
                    f"accepted={got[2]!r}, cost {got[1]!r}"]
        seen.append((op, new))
        cur, cost = dict(keep[0]), keep[1]
    for op in movable:
        k = sum(o == op for o, _ in seen)
        if not 0.7 * n / len(movable) <= k <= 1.3 * n / len(movable):
            return [f"in {n} seeded steps {op} was proposed {k} times, expected about {n / len(movable):.0f}: pick the "
                    f"operator uniformly among the {len(movable)} with more than one choice"]
        missing = [c for c in sp[op] if (op, c) not in seen and c != cur[op]]
        if missing:
            return [f"in {n} seeded steps {op} never got the choices {missing}: pick uniformly among its other choices"]
    return []


# (f: how much slower the candidate is, beta, u as a fraction of the probability exp(-beta f), the cost in seconds)
PROBES = [(-0.1, 30.0, 0.999, 2e-3), (0.0, 30.0, 0.999, 2e-3), (0.05, 30.0, 0.9, 2e-3), (0.05, 30.0, 1.1, 2e-3),
          (0.2, 5.0, 0.9, 2e-3), (0.2, 5.0, 1.1, 2e-3), (3.0, 0.5, 0.9, 2e-3), (3.0, 0.5, 1.1, 2e-3),
          (0.05, 30.0, 0.9, 5.0), (0.05, 30.0, 1.1, 5.0)]
WRONG = {"it accepts every slower candidate: exp(-beta f) must shrink as f grows (a random walk never settles)":
             lambda f, beta, cost: 1.0,
         "it never accepts a slower candidate (greedy descent: stuck in the first local minimum)":
             lambda f, beta, cost: 0.0,
         "exp(-beta (c - cost)): the change must be relative, (c - cost) / cost, or beta depends on the step's "
         "length (milliseconds here, seconds there)": lambda f, beta, cost: math.exp(-beta * f * cost),
         "exp(-(c - cost) / cost / beta): beta is an inverse temperature, multiply by it":
             lambda f, beta, cost: math.exp(-f / beta),
         "exp(-30 f): use the beta passed in": lambda f, beta, cost: math.exp(-30 * f),
         "exp(-beta (c - cost) / c): divide by the current cost, not the candidate's":
             lambda f, beta, cost: math.exp(-beta * f / (1 + f))}


def _extra_draws(draws, f, move):
    """The message for a step that drew u where Metropolis draws none (a candidate that is not
    slower), or more than once (a slower one)."""
    did = f"drew u = rng.random() {draws} time{'s' if draws > 1 else ''} for {move}"
    rule = ("a candidate that is not slower is taken without a draw" if f <= 0
            else "one u decides a slower candidate")
    return (f"mcmc_step {did}: {rule}; draw u only for a slower candidate, once (the chain's draws are one "
            f"stream: an extra draw changes every later proposal)")


def _acceptance(fn, sp, start):
    """The scripted probes; the first wrong decision, with the rule all the decisions fit."""
    decisions, first = [], None
    for k, (f, beta, frac, cost) in enumerate(PROBES):
        p = math.exp(-beta * f) if f > 0 else 1.0
        u, c = min(frac * p, 0.999), cost * (1 + f)
        rng, cands = ScriptedRng([8, k], u), []
        got, why = _step(fn, start, cost, sp, lambda s: cands.append(dict(s)) or c, rng, beta)
        if why or len(cands) != 1:
            return [why or _simulated(cands)]
        acc, want = bool(got[2]), f <= 0 or u < p
        move = (f"a move {abs(f) * 100:g}% {'slower' if f > 0 else 'faster' if f < 0 else 'as fast'} (beta {beta:g}, "
                f"cost {cost:g} s)")
        if f <= 0 and not acc:
            return [f"mcmc_step rejected {move}: Metropolis always takes a candidate that is not slower"]
        if f > 0 and rng.draws == 0:
            return [f"mcmc_step {'accepted' if acc else 'rejected'} {move} without drawing u = rng.random() from the "
                    f"rng it was given: {list(WRONG)[0 if acc else 1]}; Metropolis accepts it with probability "
                    f"exp(-beta f) = {p:.4f}"]
        if rng.draws > (f > 0):
            return [_extra_draws(rng.draws, f, move)]
        decisions.append((f, beta, cost, u, acc))
        if first is None and acc != want:
            first = (f"mcmc_step {'accepted' if acc else 'rejected'} {move} at u = {u:.4f}: Metropolis accepts with "
                     f"probability exp(-beta (c - cost) / cost) = exp(-{beta:g} x {f:g}) = {p:.4f}, so u "
                     f"{'>=' if acc else '<'} p must be {'rejected' if acc else 'accepted'}")
        keep = (cands[0], c, True) if want else (start, cost, False)
        if first is None and (got[0] != keep[0] or not math.isclose(float(got[1]), keep[1], rel_tol=1e-12)):
            return [f"mcmc_step {'accepted' if want else 'rejected'} {move} but returned cost {got[1]!r} and "
                    f"{'another strategy than the candidate' if want else 'not the current strategy'}: return (the "
                    f"{'candidate, its cost' if want else 'current strategy, its cost'}, {want})"]
    if first is None:
        return []
    fits = [h for h, q in WRONG.items() if all(a == (u < q(f, b, cost) or f <= 0) for f, b, cost, u, a in decisions)]
    return [first + (f"; your rule: {fits[0]}" if fits else "")]


def check_mcmc_step(comm, fn):
    sp = mcmc_space()
    start = {o: c[0] if ("B",) not in c else ("B",) for o, c in sp.items()}  # data parallel
    return _acceptance(fn, sp, start) or _proposals(fn, sp, start)
