"""Lab 07's checks, in one process (the generic lab tests in test_labs.py run them on ranks):
every typical mistake a check names is caught *and* named, wrong results of every shape are
refused, the planner is refused behind any wrapper, and 7.4's space is exactly what the rules
allow."""
import pytest

from minipar.labs import lab07, lab07_reference, lab07_choose as choose
from minipar.labs import lab07_solution as S
from minipar.plan.memory import stored_activations  # noqa: F401  (called by a wrapped "solution" below)


def answers(cases, mistakes, key, reference):
    """{case: mistake's value} for every case where the mistake named ``key`` differs from the answer
    (computed here, outside the graded call: the watch would refuse the planner inside it)."""
    out = {}
    for c in cases:
        want = reference(*c)
        for text, value in mistakes(*c).items():
            if key in text and value is not None and not lab07.close(value, want, 1e-9):
                out[c] = value
    return out


def wrong_from(table, reference_values):
    def fn(*case):
        return table.get(case, reference_values[case])
    return fn


def caught_and_named(key, cases, mistakes, reference, check):
    """A function that answers right except where the mistake ``key`` differs: ``check`` fails it
    once, naming that mistake."""
    cases = [tuple(c) for c in cases]
    table = answers(cases, mistakes, key, reference)
    assert table, f"no case tells {key!r} from the answer"
    fails = check(None, wrong_from(table, {c: reference(*c) for c in cases}))
    assert len(fails) == 1 and f"you computed {key}" in fails[0], fails


ACT_MISTAKES = ["no split of the 10 sbh", "everything split by t", "nothing split by t", "no attention scores",
                "the scores kept", "everything kept", "nothing kept", "the whole block input", "no dropout masks",
                "one sequence"]


@pytest.mark.parametrize("key", ACT_MISTAKES)
def test_every_activation_mistake_is_caught_and_named(key):
    caught_and_named(key, lab07.ACT_CASES, lab07.activation_mistakes, lab07_reference.reference_activation_bytes,
                     lab07.check_activation_bytes)


def _inflight_variant(key):
    """A peak_inflight written with the mistake ``key`` (from the hints' own variants)."""
    cases = {tuple(map(tuple, a)): (p, m, v) for _, p, m, v, a in lab07.inflight_cases()}
    table = {}
    for acts, (p, m, v) in cases.items():
        want = [max(lab07.inflight_profile(ops)) for ops in acts]
        for text, value in lab07.inflight_mistakes(p, m, v, [list(o) for o in acts]).items():
            if key in text and value != want:
                table[acts] = value
    right = {acts: [max(lab07.inflight_profile(ops)) for ops in acts] for acts in cases}
    return table, lambda actions: table.get(tuple(map(tuple, actions)), right[tuple(map(tuple, actions))])


@pytest.mark.parametrize("key", ["1F1B's formula", "every micro-batch held to the end", "micro-batches, not",
                                 "the activations freed at I", "only B frees"])
def test_every_inflight_mistake_is_caught_and_named(key):
    table, fn = _inflight_variant(key)
    assert table, f"no schedule tells {key!r} from the answer"
    fails = lab07.check_peak_inflight(None, fn)
    assert len(fails) == 1 and f"you computed {key}" in fails[0], fails


def counted(actions):  # a right answer, written here (the reference would be refused inside the call)
    out = []
    for ops in actions:
        held, most = set(), 0
        for stage, kind, mb in ops:
            (held.add if kind == "F" else held.discard)((stage, mb)) if kind != "I" else None
            most = max(most, len(held))
        out.append(most)
    return out


def test_inflight_refuses_other_shapes_of_answer():
    assert lab07.check_peak_inflight(None, counted) == []
    worst = lab07.check_peak_inflight(None, lambda actions: max(counted(actions)))
    assert "one number: return one count per rank" in worst[0]
    short = lab07.check_peak_inflight(None, lambda actions: counted(actions)[:1] if len(actions) > 1 else [1])
    assert "counts, expected one per rank" in short[0]
    assert "expected a list" in lab07.check_peak_inflight(None, lambda actions: None)[0]


AR_MISTAKES = ["a flat ring across the nodes", "a flat ring on the intra-node link", "the whole N across the nodes",
               "the inter-node all-reduce over all n", "no all-gather inside the node", "no latency",
               "each ring all-reduce as one pass"]


@pytest.mark.parametrize("key", AR_MISTAKES)
def test_every_all_reduce_mistake_is_caught_and_named(key):
    caught_and_named(key, [c[1:] for c in lab07.AR_CASES], lab07.all_reduce_mistakes, lab07.hierarchical_time,
                     lab07.check_dp_all_reduce_time)


def test_the_planner_is_refused_behind_a_wrapper_and_the_reference_is_not_watched():
    def wrapped(s, b, h, a, t=1, sp=False, recompute="none"):
        return helper(s, b, h, a, t, sp, recompute)

    def helper(*args):  # one more level of indirection, still outside minipar
        return S.activation_bytes(*args)

    fails = lab07.check_activation_bytes(None, wrapped)
    assert "activation_bytes called minipar.labs.lab07_solution.activation_bytes" in fails[0], fails
    assert lab07.check_activation_bytes(None, S.activation_bytes) == []
    # a minipar module in between (not the planner itself) still leads to the planner's calls
    from minipar.figures import plan as figplan
    fails = lab07.check_dp_all_reduce_time(None, lambda *a: figplan.cells("megatron-1.7b", 8, 16) and 0.0)
    assert "dp_all_reduce_time called minipar.plan." in fails[0], fails  # the planner, however reached


def test_choose_config_refuses_what_does_not_fit_is_invalid_or_slow():
    label, job, table = choose.case(1)
    cap = job["capacity_bytes"]
    over = min((c for c, e in table.items() if e.memory_bytes > cap), key=lambda c: table[c].step_s)
    slow = max((c for c, e in table.items() if e.memory_bytes <= cap), key=lambda c: table[c].step_s)

    best = {}  # the right answers, found here (the reference would be refused inside the call)
    for i in range(len(choose.CHOOSE_CASES)):
        _, j, t = choose.case(i)
        best[j["layers"]] = min((c for c, e in t.items() if e.memory_bytes <= j["capacity_bytes"]),
                                key=lambda c: (t[c].step_s, t[c].memory_bytes))

    def picking(cfg, at=1):
        def fn(job, predict):
            pick = cfg if job["layers"] == choose.case(at)[1]["layers"] else best[job["layers"]]
            return dict(zip(choose.KEYS, pick))
        return fn

    assert choose.check_choose_config(None, picking(best[job["layers"]])) == []
    fails = choose.check_choose_config(None, picking(over))
    assert "cannot run, however fast" in fails[0] and f"> the {cap / 1e9:.1f} GB a GPU holds" in fails[0], fails
    assert "slower than the best that fits" in choose.check_choose_config(None, picking(slow))[0]
    assert "tp=16 crosses the node" in choose.check_choose_config(None, picking((16, 1, 2, 1, "none"), 2))[0]
    assert "expected a dict" in choose.check_choose_config(None, lambda job, predict: (1, 1, 8, 1, "none"))[0]
    with pytest.raises(ValueError, match="pp=8 does not divide the 36 layers"):
        choose.predictor(job, table, lab07_reference.Watch(), [])(1, 8, 1, 1, "none")


@pytest.mark.parametrize("i", range(len(choose.CHOOSE_CASES)))
def test_the_space_is_every_configuration_the_rules_allow(i):
    _, job, table = choose.case(i)
    allowed = {(t, p, d, b, r) for t in range(1, job["gpus"] + 1) for p in range(1, job["layers"] + 1)
               for d in [job["gpus"] // (t * p)] if d >= 1 for b in range(1, job["batch"] + 1)
               for r in choose.RECOMPUTE if choose.invalid(job, t, p, d, b, r) is None}
    assert allowed == set(table)
    fits = [c for c, e in table.items() if e.memory_bytes <= job["capacity_bytes"]]
    assert fits and len(fits) < len(table)  # memory decides something in every case


def two_level_on_ranks(comm):
    """Rank side: the two-level all-reduce against the engine's, on nodes of 2 and of 3 ranks
    (an odd element count: uneven chunks), and once with a planted bug (the all-reduce across the
    nodes skipped: every node keeps only its own sum)."""
    from minipar.lessons import planning

    out = {k: planning.two_level_runs(comm, k, nbytes=8 * 1001, slowdown=1.0, steps=1)["error"] for k in (2, 3)}
    good = planning.two_level_all_reduce
    planning.two_level_all_reduce = lambda intra, inter, x: good(intra, inter.split(inter.rank, 0), x)
    try:
        out["skips the nodes"] = planning.two_level_runs(comm, 2, nbytes=8 * 1001, slowdown=1.0, steps=1)["error"]
    finally:
        planning.two_level_all_reduce = good
    return out


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_level_all_reduce_equals_the_engines_and_a_skipped_level_does_not():
    from minipar import launch

    for errors in launch(6, "tests.test_lab07:two_level_on_ranks", quiet=True).results:
        assert errors[2] <= 1e-12 and errors[3] <= 1e-12, errors  # float64: only the order of the sums differs
        assert errors["skips the nodes"] > 0.1, errors


def test_mistaken_arguments_are_refused_before_any_rank_starts():
    from minipar.lessons.planning import feel, hierarchical_time

    with pytest.raises(ValueError, match=r"pairs=\[\('ddp', 'nvlnk'\)\]: each pair is \(run, link\)"):
        feel(pairs=[("ddp", "nvlnk")])
    with pytest.raises(ValueError, match="n=12 ranks must fit one node of per_node=8 or fill whole nodes"):
        hierarchical_time(1 << 20, 12, 8, (1e-6, 1e-10), (1e-5, 1e-9))


DECODE_MISTAKES = ["compute-bound arithmetic", "every rank reading all the weights", "an all-reduce of the whole weight",
                   "memory time + compute time", "the memory time only", "no all-reduce", "one all-reduce per layer"]


@pytest.mark.parametrize("key", DECODE_MISTAKES)
def test_every_decode_mistake_is_caught_and_named(key):
    def check(comm, fn):  # the learner's arguments: the case's machine is four of them
        return lab07.check_decode_time(comm, lambda W, L, h, t, B, bw, peak, a, b, w: fn(W, L, h, t, B, (bw, peak, a, b), w))

    caught_and_named(key, [c[1:] for c in lab07.DECODE_CASES], lab07.decode_mistakes, lab07.token_seconds_of_case, check)


def test_decode_time_refuses_the_planner():
    from minipar.plan import inference

    fails = lab07.check_decode_time(None, lambda *a: inference.token_seconds(*a))
    assert "decode_time called minipar.plan.inference.token_seconds" in fails[0], fails


PARAMS_MISTAKES = ["K and V as wide as Q", "two MLP matrices", "a bias in every RMSNorm", "LayerNorms without their bias",
                   "the output layer counted though it is tied", "no output layer", "no biases",
                   "biases where the model has none", "no final norm", "one norm per block"]


@pytest.mark.parametrize("key", PARAMS_MISTAKES)
def test_every_parameter_count_mistake_is_caught_and_named(key):
    from minipar.labs import lab07_params as P

    caught_and_named(key, P.PARAMS_CASES, P.params_mistakes, P.reference_model_params, P.check_model_params)


def test_parameter_counts_refuse_other_shapes_and_the_planner():
    from minipar.labs import lab07_params as P

    right = {tuple(c): P.reference_model_params(*c) for c in P.PARAMS_CASES}
    assert P.check_model_params(None, lambda *c: right[c]) == []
    assert "expected 968 parameters" in P.check_model_params(None, lambda *c: str(right[c]))[0]
    assert "expected 968 parameters" in P.check_model_params(None, lambda *c: right[c] + 1)[0]
    assert right[tuple(P.PARAMS_CASES[6])] == 8_030_261_248 and right[tuple(P.PARAMS_CASES[7])] == 70_553_706_496
    fails = P.check_model_params(None, lambda *c: S.model_params(*c))
    assert "model_params called minipar.labs.lab07_solution.model_params" in fails[0], fails
