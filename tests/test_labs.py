"""Tests of the tests: for every lab, the skeleton fails, the reference passes, mutants fail as planted."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = sorted(p for p in (ROOT / "labs").iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))
MUTANTS = sorted(m for lab in LABS for m in (lab / "mutants").glob("*.py"))


def check(lab, *args, timeout=600):
    out = subprocess.run([sys.executable, "-m", "minipar", "check", lab, *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def task_lines(text):
    return {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^  (\d+\.\d+) .*?(PASS|FAIL)  (.*)$", text, re.M)}


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_skeleton_fails_every_task(lab):
    code, out = check(lab.name[:2])
    tasks = task_lines(out)
    assert code == 1 and tasks, out
    assert all(status == "FAIL" for status, _ in tasks.values()), out
    assert all("not implemented yet" in msg for _, msg in tasks.values()), out


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.name)
def test_reference_passes_every_task(lab):
    code, out = check(lab.name[:2], "--solution")
    tasks = task_lines(out)
    assert code == 0 and tasks and all(s == "PASS" for s, _ in tasks.values()), out


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_mutant_fails_with_a_pinpointed_message(mutant):
    text = mutant.read_text()
    task = re.search(r"EXPECT_TASK: (\S+)", text).group(1)
    message = re.search(r"EXPECT_MESSAGE: (.+)", text).group(1).strip()
    code, out = check(mutant.parent.parent.name[:2], "--file", str(mutant), "--task", task, "--timeout", "4")
    status, msg = task_lines(out)[task]
    assert code == 1 and status == "FAIL", out
    assert message in msg or message in out, out
