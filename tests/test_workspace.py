"""The learner's workspace (``minipar lab start``), staged hints (``minipar check NN --hint T``)
and the answer on request (``minipar lab solution``): solving the labs in a workspace never
touches the skeletons the suite grades."""
import functools
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from minipar.course import labs

from .test_cli import in_process
from .test_labs import ROOT, check, skeleton_fails_every_task, solved
from .conftest import minipar

LABS = labs()


minipar = functools.partial(minipar, timeout=120)  # this file's jobs' limit


def fingerprint(folder):
    """{path: sha256} of every file under ``folder``, and what git says differs there."""
    files = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    git = subprocess.run(["git", "diff", "--stat", "--", str(folder)], cwd=ROOT, capture_output=True, text=True)
    return files, git.stdout if git.returncode == 0 else None


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_solving_every_lab_in_its_workspace_leaves_the_skeletons_the_tests_grade(tmp_path):
    before = fingerprint(ROOT / "labs")
    for ls in LABS:
        out = minipar("lab", "start", ls.key, cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        work = tmp_path / "minipar-labs" / Path(ls.lab).name / "exercise.py"
        assert f"wrote minipar-labs/{Path(ls.lab).name}/exercise.py" in out.stdout, out.stdout
        work.write_text(solved(ls).read_text())  # the learner has solved every task of every lab
    for ls in LABS:  # what test_skeleton_fails_every_task does, from the folder holding the solved work
        skeleton_fails_every_task(ls, cwd=tmp_path)
    assert fingerprint(ROOT / "labs") == before, "a command wrote into the repository's labs/"
    code, out = check("01", cwd=tmp_path)  # the workspace is what `minipar check 01` grades: solved, it passes
    assert code == 0 and "grading ./minipar-labs/01_collectives/exercise.py" in out, out


def test_lab_start_refuses_an_existing_exercise_in_one_line_unless_forced(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "minipar-labs" / "01_collectives" / "exercise.py"
    skeleton = (ROOT / "labs" / "01_collectives" / "exercise.py").read_text()
    code, out, err = in_process(["lab", "start", "01"], capsys, monkeypatch)
    assert code == 0 and work.read_text() == skeleton and "minipar check 01" in out, (out, err)
    work.write_text("# my work\n")
    code, out, err = in_process(["lab", "start", "1"], capsys, monkeypatch)
    assert code == 2 and not out and err.count("\n") == 1 and "--force" in err, (out, err)
    assert work.read_text() == "# my work\n"
    code, out, err = in_process(["lab", "start", "01", "--force"], capsys, monkeypatch)
    assert code == 0 and work.read_text() == skeleton, (out, err)
    code, out, err = in_process(["lab", "start", "01", "mine"], capsys, monkeypatch)  # a folder of one's own
    assert code == 0 and (tmp_path / "mine" / "exercise.py").read_text() == skeleton
    assert f"minipar check 01 --file {Path('mine') / 'exercise.py'}" in out, out


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_inside_a_workspace_check_grades_it_and_lab_start_never_nests(tmp_path, capsys, monkeypatch):
    """A learner who cd's into their workspace: `minipar check 01` grades the exercise there (it
    said "no workspace here", and `lab start` then nested a blank skeleton inside it, which
    `check` graded: 0 tasks passing, the work looking lost)."""
    monkeypatch.chdir(tmp_path)
    assert in_process(["lab", "start", "01"], capsys, monkeypatch)[0] == 0
    work = tmp_path / "minipar-labs" / "01_collectives"
    (work / "exercise.py").write_text(solved(LABS[0]).read_text())
    code, out = check("01", "--task", "1.6", cwd=work)
    assert code == 0 and "grading ./exercise.py" in out and "1/1 tasks pass" in out, out
    monkeypatch.chdir(work)
    code, out, err = in_process(["lab", "start", "01"], capsys, monkeypatch)
    assert code == 2 and "you are in this workspace: grade it with `minipar check 01`" in err, (out, err)
    code, out, err = in_process(["lab", "start", "02"], capsys, monkeypatch)  # a sibling, not a nest
    assert code == 0 and "wrote ../02_tensor_parallel/exercise.py" in out, (out, err)
    assert (tmp_path / "minipar-labs" / "02_tensor_parallel" / "exercise.py").exists()
    assert not (work / "minipar-labs").exists() and solved(LABS[0]).read_text() == (work / "exercise.py").read_text()


def test_lab_start_names_the_hints_before_the_answer(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(["lab", "start", "01"], capsys, monkeypatch)
    commands = [ln for ln in out.splitlines() if ln.startswith("  minipar")]
    assert code == 0 and not any("solution" in c for c in commands), out
    assert out.index("--hint 1.1") < out.index("minipar lab solution 01"), out


def test_check_without_a_workspace_says_how_to_start_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(["check", "02"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "`minipar lab start 02`" in err, (out, err)


def test_hints_come_in_stages_remembered_in_the_workspace(tmp_path, capsys, monkeypatch):
    from minipar.labs.lab01 import HINTS

    monkeypatch.chdir(tmp_path)
    assert in_process(["lab", "start", "01"], capsys, monkeypatch)[0] == 0
    shown = []
    for stage in (1, 2, 3, 3):  # the next unseen stage each time; the last one again at the end
        code, out, err = in_process(["check", "01", "--hint", "1.3"], capsys, monkeypatch)
        assert code == 0 and f"hint {stage} of 3" in out, (out, err)
        shown.append(out)
    assert HINTS["1.3"][0].split()[0] in shown[0] and "minipar lab solution 01 --task 1.3" in shown[-1]
    assert json.loads((tmp_path / "minipar-labs" / "01_collectives" / ".hints.json").read_text()) == {"1.3": 3}
    code, out, _ = in_process(["check", "01", "--hint", "1.3", "--stage", "1"], capsys, monkeypatch)
    assert code == 0 and "hint 1 of 3" in out
    code, out, err = in_process(["check", "01", "--hint", "1.9"], capsys, monkeypatch)
    assert code == 2 and not out and err.count("\n") == 1 and "1.1, 1.2, 1.3, 1.4, 1.5, 1.6" in err, err
    code, out, err = in_process(["check", "01", "--hint", "1.3", "--stage", "4"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1, err


def test_every_task_of_every_lab_has_at_least_two_hint_stages():
    from minipar.labs.workspace import tasks

    for ls in LABS:
        graded, hints = tasks(ls)
        assert set(hints) == {t.key for t in graded}, f"lab {ls.key}: hints for {sorted(hints)}"
        for t in graded:
            stages = hints[t.key]
            assert isinstance(stages, tuple) and len(stages) >= 2, f"task {t.key} has {len(stages)} hint stage(s)"
            assert all(isinstance(s, str) and s.strip() for s in stages), f"task {t.key}: an empty hint"


def test_lab_solution_prints_the_reference_after_a_notice(capsys, monkeypatch):
    code, out, err = in_process(["lab", "solution", "01", "--task", "1.3"], capsys, monkeypatch)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("you asked for the solution"), (out, err)
    assert "minipar/labs/lab01_solution.py:" in out and "def ring_reduce_scatter(comm, x):" in out
    assert "def _ring_reduce_scatter(" in out  # and the ring loop minipar's reduce_scatter runs
    code, out, err = in_process(["lab", "solution", "01", "--task", "2.1"], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "1.1, 1.2" in err, err
