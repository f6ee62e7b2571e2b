"""The tour and the figure generators run and write non-empty images (pixels are not compared)."""
import pathlib
import subprocess
import sys

import pytest

from minipar.course import LESSONS

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_tour_first_lesson(tmp_path):
    out = subprocess.run([sys.executable, "-m", "minipar", "tour", "--only", "01", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks passed" in out.stdout and "FAIL" not in out.stdout
    assert "[1/1] 01 collectives" in out.stdout  # progress is shown
    for name in LESSONS[0].figures:
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda ls: ls.name)
def test_figure_generators_write_images(lesson, tmp_path):
    out = subprocess.run([sys.executable, "-m", "minipar", "figures", "--only", lesson.key, "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=580, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in lesson.figures:
        path = tmp_path / name
        assert path.stat().st_size > 10_000, f"{name} missing or empty"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_lesson_has_its_pieces():
    for ls in LESSONS:
        assert (ROOT / ls.lab / "README.md").exists() and (ROOT / ls.lab / "exercise.py").exists(), ls.lab
        assert (ROOT / ls.notebook).exists(), ls.notebook
        for name in ls.figures:
            assert (ROOT / "figures" / name).exists(), f"figures/{name} is not committed"
        assert name in (ROOT / "figures" / "README.md").read_text()
