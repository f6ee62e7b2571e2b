"""minipar train / generate from the shell: flags, progress, --compare, --json, --trace, checkpoints, refusals."""
import functools
import json

import pytest
from .conftest import minipar

TINY = ["--layers", "2", "--d-model", "16", "--heads", "4", "--seq-len", "8", "--batch", "8"]


minipar = functools.partial(minipar, timeout=500)  # this file's jobs' limit


@pytest.mark.parametrize("verb", [["train"], ["generate"], ["bench", "train"]])
def test_help_has_an_example(verb):
    out = minipar(*verb, "--help")
    assert out.returncode == 0 and "\n  minipar " in out.stdout


@pytest.mark.parametrize("args,needle", [
    (["-n", "6", "--dp", "2", "--pp", "2", "--tp", "2"], "-n 6: the grid dp=2 x pp=2 x tp=2 needs 8 ranks"),
    (["-n", "3", "--tp", "3"], "--tp=3: n_heads=8 is not divisible by it"),
    (["-n", "3", "--pp", "3"], "--pp=3: n_layers=8 is not divisible by pp x chunks = 3"),
    (["-n", "2", "--dp", "2", "--microbatches", "3"], "--batch=32 is not divisible by dp x microbatches = 2 x 3"),
    (["-n", "2", "--pp", "2", "--schedule", "interleaved", "--microbatches", "3", "--batch", "30"],
     "--schedule=interleaved: --microbatches=3 is not divisible by --pp=2"),
    (["-n", "8", "--tp", "8", "--sequence-parallel", "--seq-len", "12"], "--sequence-parallel: seq_len=12 is not divisible by --tp=8"),
    (["-n", "6", "--cp", "3", "--tp", "2"], "--cp=3: seq_len=32 is not divisible by 2 x cp = 6 (zigzag: every rank holds two of 2cp equal chunks)"),
    (["-n", "3", "--dp", "3", "--experts", "4"], "--experts=4 is not divisible by --dp=3 (the experts are sharded over the data-parallel ranks)"),
    (["-n", "1", "--dropout", "1"], "--dropout=1.0: the probability of dropping an activation, in [0, 1)"),
    (["-n", "2", "--dp", "2", "--zero", "4"],
     "--zero=4: choose 0 (DDP), 1, 2 or 3 (what ZeRO shards: optimizer state, + gradients, + weights)"),
    (["-n", "2", "--dp", "2", "--zero", "2", "--reshard"], "--reshard with --zero=2: only ZeRO-3 gathers weights to reshard"),
])
def test_bad_shapes_are_one_line_before_any_rank_starts(args, needle):
    out = minipar("train", *args, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == f"minipar train: error: {needle}"
    assert "Traceback" not in out.stderr + out.stdout and out.stdout == ""


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_train_compare_json_trace_save_then_resume_and_generate(tmp_path):
    ck, js, tr = tmp_path / "ck", tmp_path / "run.json", tmp_path / "trace.json"
    out = minipar("train", "-n", "8", "--dp", "2", "--pp", "2", "--tp", "2", "--microbatches", "2", "--steps", "4",
                  "--sequence-parallel", "--compare", "--json", str(js), "--trace", str(tr), "--save", str(ck),
                  "--save-every", "2", *TINY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("\nstep ") == 4 and "tokens/s" in out.stdout and "peak/rank" in out.stdout
    assert "max relative difference" in out.stdout and "(ok, tolerance 1e-12)" in out.stdout
    rec = json.load(open(js))
    assert {"losses", "step_times_s", "tokens_per_s", "memory", "reference_losses"} <= set(rec)
    assert len(rec["losses"]) == 4 and len(rec["memory"]) == 8
    trace = json.load(open(tr))["traceEvents"]
    lanes = {e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    assert {"compute", "tp", "pp", "dp", "emb"} <= lanes
    assert sorted(p.name for p in ck.iterdir()) == [".lock", "latest", "step000002", "step000004"]

    out = minipar("train", "-n", "2", "--cp", "2", "--resume", str(ck / "step000002"), "--steps", "4", "--compare",
                  "--json", str(js), *TINY)
    assert out.returncode == 0, out.stdout + out.stderr  # two cp ranks go on from step 2 like the 8-rank run
    assert "dp=1 pp=1 cp=2 (ring) tp=1 on 2 ranks" in out.stdout
    again = json.load(open(js))
    assert again["start_step"] == 2 and len(again["losses"]) == 2
    assert max(abs(a - b) / b for a, b in zip(again["losses"], rec["losses"][2:])) <= 1e-12

    out = minipar("generate", "--checkpoint", str(ck), "-n", "2", "--tp", "2", "--prompt", "312>", "--tokens", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("312>") and "ms/token" in out.stdout and "TP=2:" in out.stdout
    out = minipar("generate", "--checkpoint", str(ck), "-n", "3", "--tp", "3", timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("minipar generate: error: --tp=3: n_heads=4")


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_train_with_experts_reports_tokens_per_expert_and_drops(tmp_path):
    js = tmp_path / "moe.json"
    out = minipar("train", "-n", "2", "--dp", "2", "--experts", "4", "--top-k", "2", "--capacity-factor", "0.5",
                  "--steps", "2", "--compare", "--json", str(js), *TINY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 experts (top-2, capacity factor 0.5)" in out.stdout and "(ok, tolerance 1e-12)" in out.stdout
    steps = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("tokens/expert" in line and "dropped" in line for line in steps)
    rec = json.load(open(js))
    assert len(rec["tokens_per_expert"]) == len(rec["dropped_tokens"]) == 2
    for kept, routed, dropped in zip(rec["tokens_per_expert"], rec["routed_per_expert"], rec["dropped_tokens"]):
        assert sorted(kept) == ["h.0.mlp", "h.1.mlp"] and all(len(v) == 4 for v in kept.values())
        assert all(sum(routed[k]) == 2 * 8 * 8 for k in routed)  # top-2 of batch x seq_len tokens, per layer
        assert dropped == sum(sum(routed[k]) - sum(kept[k]) for k in kept) > 0  # capacity 0.5 must drop some
