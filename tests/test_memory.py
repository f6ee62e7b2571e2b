"""minipar.memory: the ZeRO paper's numbers, storing vs training, the CLI verb, the Ledger."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from minipar.memory import BYTES, GB, Ledger, calculate, zero_bytes


@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(stage, gb):
    """ZeRO (Rajbhandari et al. 2020), Figure 1: Psi = 7.5B, N = 64, K = 12."""
    res = calculate(7.5e9, 64, stage)
    assert res["total_bytes"] / GB == pytest.approx(gb, abs=0.05)
    assert res["total_bytes"] == res["params_bytes"] + res["grads_bytes"] + res["optimizer_bytes"]


def test_formulas_per_stage():
    psi, n = 1000, 4
    assert zero_bytes(psi, n, 0) == {"params_bytes": 2000, "grads_bytes": 2000, "optimizer_bytes": 12000, "total_bytes": 16000}
    assert zero_bytes(psi, n, 1)["optimizer_bytes"] == 3000 and zero_bytes(psi, n, 1)["grads_bytes"] == 2000
    assert zero_bytes(psi, n, 2)["grads_bytes"] == 500 and zero_bytes(psi, n, 2)["params_bytes"] == 2000
    assert zero_bytes(psi, n, 3)["params_bytes"] == 500
    # the extras a real run has: padding, a gathered layer, a full layer gradient
    assert zero_bytes(psi, n, 3, pad=4, gathered=100, unit_grad=50)["params_bytes"] == 2 * (1004 / 4 + 100)
    assert zero_bytes(psi, n, 2, unit_grad=50)["grads_bytes"] == 2 * (250 + 50)
    off = zero_bytes(psi, n, 2, offload=True)
    assert off["optimizer_bytes"] == 0 and off["host_bytes"] == 3000
    with pytest.raises(ValueError, match="stage"):
        zero_bytes(psi, n, 4)


def test_storing_vs_training():
    """1B parameters: 4 GB to store in fp32, 16 GB of weights + grads + Adam state to train."""
    assert 4 * 1e9 / GB == 4.0
    assert calculate(1e9, 1, 0)["total_bytes"] / GB == 16.0  # mixed precision Adam
    assert calculate(1e9, 1, 0, precision="fp32")["total_bytes"] / GB == 16.0  # 4 + 4 + 8
    assert BYTES[("sgd", "fp32")] == (4, 4, 4)


def parse(argv):
    from minipar.cli.data_parallel import add_memory_command

    p = argparse.ArgumentParser()
    add_memory_command(p.add_subparsers())
    return p.parse_args(argv)


def test_cli_memory_verb(tmp_path, capsys):
    out = tmp_path / "m.json"
    args = parse(["memory", "--params", "7.5e9", "--dp", "64", "--stage", "2", "--json", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "16.641 GB" in text and "ZeRO-2" in text and "to store" in text
    data = json.loads(out.read_text())
    assert set(data) == {"params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes"}
    assert data["total_bytes"] == pytest.approx(16.640625e9)
    args = parse(["memory", "--params", "1e9", "--offload", "--stage", "1", "--dp", "8"])
    assert args.func(args) == 0 and "host" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # a size of 0 is refused by the argument's type
        parse(["memory", "--params", "0"])
    assert refused.value.code == 2 and "argument --params" in capsys.readouterr().err


@pytest.mark.parametrize("text,count", [("7B", 7e9), ("7.5b", 7.5e9), ("350M", 350e6), ("1.3B", 1.3e9),
                                        ("7.5e9", 7.5e9), ("64K", 64e3), ("1T", 1e12), ("7G", 7e9)])
def test_memory_params_takes_model_sizes(text, count):
    """--params reads a model's size as models are named: 7B is 7e9 parameters (powers of ten, not bytes)."""
    assert parse(["memory", "--params", text]).params == count


@pytest.mark.parametrize("text", ["7KB", "7X", "B", "7BB", "-7B", "1e300T"])
def test_memory_params_refuses_what_is_not_a_count(text, capsys):
    with pytest.raises(SystemExit) as refused:
        parse(["memory", "--params", text])
    assert refused.value.code == 2 and "argument --params" in capsys.readouterr().err


def test_ledger_counts_live_arrays_only():
    led = Ledger()
    a, b = np.zeros(100), np.zeros(10, np.float16)
    led.track("params", a)
    led.track("grads", b)
    led.sample()
    view = a[10:]
    del a
    led.sample()  # a is still alive through its view: still counted
    assert led.now()["params"] == 800
    del view
    assert led.now()["params"] == 0 and led.now()["grads"] == 20
    assert led.report()["params_bytes"] == 800 and led.report()["total_bytes"] == 820
