"""``minipar run pipeline``: executes on real ranks, writes the JSON summary and the trace."""
from __future__ import annotations

import functools
import json

import pytest
from .conftest import minipar

KEYS = {"schedule", "stages", "microbatches", "measured_bubble_fraction",
        "simulated_bubble_fraction", "theory_bubble_fraction", "max_grad_error"}


minipar = functools.partial(minipar, timeout=120)  # this file's jobs' limit


def test_bad_schedule_arguments_exit_2_without_launching():
    r = minipar("run", "-n", "2", "pipeline", "--schedule", "interleaved", "--microbatches", "3")
    assert r.returncode == 2 and "divisible" in r.stderr


@pytest.mark.mpi
@pytest.mark.timeout(150)
def test_run_pipeline_writes_json_and_trace(tmp_path):
    js, tr = tmp_path / "out.json", tmp_path / "trace.json"
    r = minipar("run", "-n", "2", "pipeline", "--schedule", "zb-h1", "--microbatches", "4",
                "--width", "16", "--batch", "4", "--repeats", "1", "--json", str(js), "--trace", str(tr))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(js.read_text())
    assert KEYS <= set(out)
    assert (out["schedule"], out["stages"], out["microbatches"]) == ("zb-h1", 2, 4)
    assert out["max_grad_error"] <= 1e-12
    assert out["theory_bubble_fraction"] == pytest.approx(1 / 13)
    for k in ("measured_bubble_fraction", "simulated_bubble_fraction", "replayed_bubble_fraction"):
        assert 0.0 <= out[k] < 1.0
    names = {e["name"] for e in json.loads(tr.read_text())["traceEvents"] if e.get("cat") == "compute"}
    assert {"0F0", "1I3", "0W3"} <= names
    assert "measured" in r.stdout and "simulated" in r.stdout and "theory" in r.stdout
