"""Hardware for today's clusters: the H100 / H200 / B200 presets with a source for every number,
fp8 (the matmul rate changes, the bytes per parameter do not), and ``--hardware-file`` for a
user's own cluster, every bad field refused in one line that names it."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from minipar.cli import main
from minipar.errors import UsageError
from minipar.memory import Precision
from minipar.plan.config import Config, Problem
from minipar.plan.hardware import PRESETS, hardware_file, hardware_from_dict, preset
from minipar.plan.models import model
from minipar.plan.predict import predict

ROOT = Path(__file__).resolve().parents[1]
H100 = {"name": "my-h100", "peak_flops": {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 494.5e12},
        "memory_bytes": 80 * 2**30, "hbm_bandwidth": 3350e9, "gpus_per_node": 8,
        "intra": {"bandwidth": 450e9, "latency": 3e-6}, "inter": {"bandwidth": 50e9, "latency": 5e-6},
        "host": {"bandwidth": 64e9, "latency": 5e-6}, "host_bandwidth": 2 * 307.2e9 / 8}


@pytest.mark.parametrize("name", ["h100-80gb", "h200", "b200"])
def test_every_number_of_a_todays_preset_has_its_source_in_the_preset_and_the_doc(name):
    hw = PRESETS[name]
    for k in ("peak_flops", "memory_bytes", "hbm_bandwidth", "intra", "inter", "matmul_fraction"):
        assert hw.sources.get(k) or (k in ("intra", "inter") and getattr(hw, k).source), (name, k)
    assert hw.peaks["fp8"] == pytest.approx(2 * hw.peaks["bf16"], rel=1e-3)  # dense FP8 = 2 x dense BF16
    assert hw.peaks["bf16"] == hw.peak_flops
    row = next(line for line in (ROOT / "docs" / "planner.md").read_text().splitlines() if line.startswith(f"| `{name}`"))
    assert f"{hw.peak_flops / 1e12:g} TFLOP/s" in row and f"{hw.hbm_bandwidth / 1e9:g} GB/s" in row, row


def test_fp8_changes_the_matmul_rate_not_the_master_state():
    """Same configuration in bf16 and fp8 on an H100: every byte equal, the matmuls twice as fast
    (a precision that stored fp8 weights, or left the rate alone, fails)."""
    m, hw = model("llama3-8b"), preset("h100-80gb")
    cfg = Config(tp=2, pp=2, dp=2, microbatches=4, zero=1)
    bf16, fp8 = (predict(Problem(m, 8, 8, hw, 16, precision=Precision(p)), cfg) for p in ("bf16", "fp8"))
    assert fp8.memory_bytes == bf16.memory_bytes
    assert Precision("fp8").bytes == Precision("bf16").bytes == (2, 4, 12)
    slow = replace(hw, peaks={**hw.peaks, "fp8": hw.peaks["bf16"]})  # the rate left alone
    same = predict(Problem(m, 8, 8, slow, 16, precision=Precision("fp8")), cfg)
    assert same.parts["compute"] == pytest.approx(bf16.parts["compute"])
    matmuls = bf16.parts["compute"] - fp8.parts["compute"]  # half the matmul time is saved
    assert 0.3 * bf16.parts["compute"] < matmuls < 0.5 * bf16.parts["compute"]
    assert fp8.step_time_s < bf16.step_time_s


def test_fp8_on_an_a100_is_refused():
    with pytest.raises(UsageError, match="a100-80gb has no fp8 matmul rate"):
        Problem(model("gpt2"), 8, 8, preset("a100-80gb"), 8, precision=Precision("fp8"))


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_hardware_file_is_the_preset_it_describes(tmp_path, suffix):
    path = tmp_path / f"h{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(H100))
    else:
        lines = [f'name = "{H100["name"]}"'] + [f"{k} = {v}" for k, v in H100.items() if not isinstance(v, (dict, str))]
        for k in ("peak_flops", "intra", "inter", "host"):
            lines += [f"[{k}]"] + [f"{kk} = {vv}" for kk, vv in H100[k].items()]
        path.write_text("\n".join(lines) + "\n")
    hw = hardware_file(str(path))
    ref = PRESETS["h100-80gb"]
    for k in ("peak_flops", "memory_bytes", "hbm_bandwidth", "gpus_per_node", "matmul_fraction", "link_fraction",
              "host_bandwidth", "peaks"):
        assert getattr(hw, k) == getattr(ref, k), k
    for k in ("intra", "inter", "host"):
        assert (getattr(hw, k).alpha, getattr(hw, k).bandwidth) == (getattr(ref, k).alpha, getattr(ref, k).bandwidth)
    m, cfg = model("llama3-8b"), Config(tp=8, dp=2, microbatches=2)
    assert predict(Problem(m, 16, 8, hw, 8), cfg).step_time_s == predict(Problem(m, 16, 8, ref, 8), cfg).step_time_s


BAD = [({"gpus_per_node": 0}, "gpus_per_node must be a positive integer"),
       ({"gpus_per_node": 7.5}, "gpus_per_node must be a positive integer"),
       ({"memory_bytes": -1}, "memory_bytes must be a positive number"),
       ({"hbm_bandwidth": "fast"}, "hbm_bandwidth must be a positive number"),
       ({"peak_flops": {"bf16": 0}}, "peak_flops.bf16 must be a positive number"),
       ({"peak_flops": {"fp4": 1e15}}, "peak_flops.fp4: the dtypes are"),
       ({"peak_flops": {"fp8": 1e15}}, "peak_flops needs bf16 or fp16"),
       ({"peak_flops": 989e12}, "peak_flops must be a table"),
       ({"intra": {"bandwidth": 1e9}}, "intra must be a table with bandwidth (bytes/s) and latency (s)"),
       ({"inter": {"bandwidth": 1e9, "latency": -1}}, "inter.latency must be a number of seconds >= 0"),
       ({"inter": {"bandwidth": 0, "latency": 1e-6}}, "inter.bandwidth must be a positive number"),
       ({"link_fraction": 1.5}, "link_fraction must be in (0, 1]"),
       ({"nvlink": 1}, "unknown field 'nvlink'")]


@pytest.mark.parametrize("change,needle", BAD, ids=[b[1][:30] for b in BAD])
def test_a_bad_field_is_named_in_one_line(change, needle):
    with pytest.raises(UsageError) as err:
        hardware_from_dict({**H100, **change}, "c.json")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_missing_field_is_named():
    with pytest.raises(UsageError, match="missing field 'inter'"):
        hardware_from_dict({k: v for k, v in H100.items() if k != "inter"}, "c.json")


def test_the_cli_reads_a_hardware_file_and_refuses_a_broken_one(tmp_path, capsys):
    good, bad, broken = tmp_path / "c.json", tmp_path / "bad.json", tmp_path / "broken.toml"
    good.write_text(json.dumps({**H100, "memory_bytes": 192e9}))
    bad.write_text(json.dumps({**H100, "gpus_per_node": -8}))
    broken.write_text("peak_flops = [\n")
    args = ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--top", "1"]
    assert main([*args, "--hardware-file", str(good)]) == 0
    assert "16 x my-h100 (8 per node)" in capsys.readouterr().out
    for path, needle in ((bad, "gpus_per_node must be a positive integer, got -8"), (broken, "not valid TOML"),
                         (tmp_path / "none.json", "No such file")):
        assert main([*args, "--hardware-file", str(path)]) == 2
        out = capsys.readouterr().out.strip()
        assert needle in out and len(out.splitlines()) == 1, out
    assert main([*args, "--hardware-file", str(good), "--hardware", "h200"]) == 2
    assert "not both" in capsys.readouterr().out
