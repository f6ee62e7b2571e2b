"""The search: every configuration it returns is valid and fits, a planted invalid one is refused,
and ``minipar plan`` prints one-line errors and writes exactly the JSON keys of the issue."""
import json
import subprocess
import sys

import numpy as np
import pytest

from minipar.cli import main
from minipar.errors import UsageError
from minipar.plan import Config, ModelSpec, Problem, model, predict, preset, search
from minipar.plan.search import enumerate_configs

SMALL = ModelSpec(layers=8, hidden=512, heads=16, seq=256, vocab=1000, name="small")
JSON_KEYS = {"tp", "pp", "dp", "cp", "zero", "microbatch", "schedule", "chunks", "recompute", "sequence_parallel", "ep",
             "fits", "memory_gb", "step_time_s", "tflops_per_gpu", "mfu"}


def valid(prob, c: Config) -> list[str]:
    """The rules of minipar.plan.search, checked independently; returns what is broken."""
    m, why = prob.model, []
    if c.tp * c.pp * c.dp * c.cp != prob.gpus:
        why.append("tp pp dp cp != gpus")
    if m.heads % c.tp or m.kv % c.tp or (m.ef if m.experts else m.f) % c.tp:
        why.append("tp does not divide heads")
    if c.cp > 1 and m.seq % (2 * c.cp):
        why.append("cp does not split the sequence")
    if prob.batch % (c.dp * c.microbatches):
        why.append("batch does not divide")
    nmb = c.microbatches
    if c.schedule == "interleaved" and (c.pp == 1 or m.layers % (c.pp * c.chunks) or nmb % c.pp or c.chunks < 2):
        why.append("interleaved rules")
    if c.schedule != "interleaved" and c.chunks != 1:
        why.append("chunks without interleaving")
    if c.zero >= 2 and c.pp > 1:
        why.append("ZeRO-2/3 with pp")
    if c.zero and c.dp * c.cp == 1:
        why.append("ZeRO without data parallelism")
    if c.sequence_parallel and c.tp == 1:
        why.append("SP without tp")
    return why


def test_every_enumerated_configuration_is_valid():
    prob = Problem(SMALL, 16, 8, preset("a100-40gb"), 64)
    cfgs, eligible = enumerate_configs(prob)
    assert len(cfgs) > 1000
    bad = [(cfgs.config(i), valid(prob, cfgs.config(i))) for i in range(len(cfgs)) if valid(prob, cfgs.config(i))]
    assert bad == []
    assert set(np.unique(cfgs.tp[eligible])) <= {1, 2, 4, 8}  # no cross-node tp unless asked
    assert 16 in set(cfgs.tp[~eligible])  # still evaluated, to say why it loses


def test_the_validity_check_catches_planted_invalid_configurations():
    prob = Problem(SMALL, 16, 8, preset("a100-40gb"), 64)
    for c in (Config(tp=3, dp=5), Config(tp=2, pp=2, dp=4, zero=3), Config(tp=1, dp=16, sequence_parallel=True),
              Config(tp=2, pp=1, dp=8, schedule="interleaved", chunks=2), Config(tp=16, dp=1, microbatches=3)):
        assert valid(prob, c)
        with pytest.raises(UsageError):
            predict(prob, c) if c.tp * c.dp * c.pp == 16 else enumerate_configs(prob, {"tp": c.tp, "dp": c.dp})


def test_search_returns_valid_fitting_configurations_best_first():
    prob = Problem(model("megatron-7.5b"), 32, 8, preset("a100-40gb"), 128)
    res = search(prob, top=5)
    steps = [res.ev["step"][i] for i in res.ranked]
    assert steps == sorted(steps) and len(steps) == 5
    for i in res.ranked:
        c = res.cfgs.config(i)
        assert valid(prob, c) == [] and res.ev["mem"]["fits"][i] and c.tp <= 8
    # no configuration left unsimulated can beat the winner by its own lower bound
    assert np.nanmin(res.ev["lower_bound"][res.ev["mem"]["fits"] & res.eligible]) <= steps[0]
    # the winner's prediction is what predict() says for it alone
    again = predict(prob, res.best)
    assert again.step_time_s == pytest.approx(steps[0], rel=1e-12)


def test_search_holds_fixed_choices_and_evaluates_one_when_all_are_fixed():
    prob = Problem(model("megatron-7.5b"), 32, 8, preset("a100-80gb"), 128)
    fixed = dict(tp=4, pp=2, dp=4, cp=1, zero=1, microbatches=16, schedule="interleaved", chunks=2,
                 recompute="selective", sequence_parallel=True)
    cfgs, _ = enumerate_configs(prob, fixed)
    assert len(cfgs) == 1 and cfgs.config(0) == Config(**fixed)
    # fixing the micro-batch size instead (--microbatch 2: 128 / (dp 4 x 2) = 16 micro-batches) is the same
    by_size = dict({k: v for k, v in fixed.items() if k != "microbatches"}, microbatch=2)
    cfgs, _ = enumerate_configs(prob, by_size)
    assert len(cfgs) == 1 and cfgs.config(0) == Config(**fixed)
    res = search(prob, {"tp": 8}, top=3)
    assert all(res.cfgs.config(i).tp == 8 for i in res.ranked)


def test_nothing_fits_lists_the_smallest_footprints():
    prob = Problem(model("gpt3-175b"), 8, 8, preset("a100-40gb"), 8)
    res = search(prob, top=3)
    assert res.stats["fit"] == 0
    totals = [res.ev["mem"]["total"][i] for i in res.ranked]
    assert totals == sorted(totals) and totals[0] > prob.capacity


def _plan(*args, capsys):
    """(exit code, what it printed: stdout, then stderr) of ``minipar plan ARGS``."""
    try:
        code = main(["plan", *args])
    except SystemExit as exit_:  # refused by an argument's type, as argparse refuses
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out + out.err


def test_json_has_exactly_the_listed_keys(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, text = _plan("--layers", "8", "--hidden", "512", "--heads", "16", "--seq", "256", "--vocab", "1000",
                       "--gpus", "16", "--global-batch", "64", "--hardware", "a100-40gb", "--top", "3",
                       "--json", str(out), capsys=capsys)
    assert code == 0, text
    data = json.loads(out.read_text())
    assert list(data) == ["configs"] and len(data["configs"]) == 3
    for c in data["configs"]:
        assert set(c) == JSON_KEYS
        assert set(c["memory_gb"]) == {"params", "grads", "optimizer", "activations", "total"}
        assert c["memory_gb"]["total"] == pytest.approx(sum(c["memory_gb"][k] for k in ("params", "grads", "optimizer",
                                                                                        "activations")))
    steps = [c["step_time_s"] for c in data["configs"]]
    assert steps == sorted(steps)
    assert "why the others lose" in text and "rule of thumb" in text and "best:" in text


@pytest.mark.parametrize("args,needle", [
    (["--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--tp", "3"], "--tp 3 must divide"),
    (["--layers", "8", "--gpus", "8", "--global-batch", "8"], "missing --hidden"),
    (["--model", "nope", "--gpus", "8", "--global-batch", "8"], "--model 'nope'"),
    (["--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--zero", "3", "--pp", "2"], "ZeRO-2/3"),
    (["--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--link", "pcie"], "--link emulates"),
    (["--model", "gpt3-175b", "--gpus", "64", "--global-batch", "6", "--dp", "64"],
     "--global-batch 6 is not a multiple of dp 64 = 64"),
    (["--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--tp", "8", "--pp", "8", "--zero", "1"],
     "no valid configuration"),
    (["--model", "gpt3-175b", "--gpus", "0", "--global-batch", "8"], "argument --gpus: expected a whole number >= 1"),
])
def test_cli_errors_are_one_line(args, needle, capsys):
    code, text = _plan(*args, capsys=capsys)
    assert code == 2
    assert text.count("\n") == 1 and text.startswith("minipar plan: error:") and needle in text, text


def test_bad_emulated_link_is_refused_before_anything_runs():
    out = subprocess.run([sys.executable, "-m", "minipar", "--link", "carrier-pigeon", "lessons"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "carrier-pigeon" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("verb", [["plan"], ["bench", "machine"], ["bench", "links"], ["run", "planning"], ["bench", "plan"],
                                  ["bench", "offload"], ["run", "data_parallel"]])
def test_new_verbs_have_help_with_an_example(verb, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*verb, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "example" in out.lower() and "\n  minipar " in out
