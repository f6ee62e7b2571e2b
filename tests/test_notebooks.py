"""Every notebook executes top to bottom (CPU, real ranks) with every check row ok, and is stored
executed, with its outputs, so that it reads the same where it is browsed without running it."""
import pathlib

import pytest

from minipar.cli.notebooks import check_rows, notebooks, problems

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks()


def test_the_notebooks_are_found():
    assert [p.name for p in NOTEBOOKS][:4] == ["01_collectives.ipynb", "02_tensor_parallel.ipynb", "03_pipeline.ipynb",
                                               "04_data_parallel_zero.ipynb"]


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_every_check_passes(path):
    pytest.importorskip("nbclient")
    from minipar.cli.notebooks import execute

    nb = execute(path, timeout=300)
    assert not problems(nb), problems(nb)
    assert any(o.get("output_type") == "display_data" for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_notebook_is_executed_with_its_outputs(path):
    """Stored as `make notebooks` writes it: every code cell run once, in order, outputs and figures kept."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not executed top to bottom: make notebooks"
    assert all(c.outputs for c in code if "print(" in c.source or "display(" in c.source), "outputs missing"
    figures = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
    assert figures >= sum(c.source.count("display(") for c in code)
    assert not problems(nb), problems(nb)


@pytest.mark.timeout(120)
def test_a_failing_check_row_fails_the_notebook(tmp_path, capsys):
    """A cell that prints a FAIL row: the run reports it and does not store the notebook."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from minipar.cli.notebooks import main

    rows = "[{'what': 'ring all_reduce', 'error': 1e-16, 'tolerance': 1e-12, 'ok': True}, " \
           "{'what': 'planted bug', 'error': 0.5, 'tolerance': 1e-12, 'ok': False}]"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from minipar.lessons.common import format_rows"),
        nbformat.v4.new_code_cell(f"print(format_rows({rows}))")])
    path = tmp_path / "planted.ipynb"
    nbformat.write(nb, path)
    before = path.read_text()
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "NOT written" in out and "FAIL planted bug (max rel. error 5.0e-01, tolerance 1e-12)" in out
    assert path.read_text() == before  # nothing stored
    # the same rows, read back: one ok, one FAIL; and a notebook without rows is a problem too
    printed = nbformat.v4.new_output("stream", name="stdout", text="  ok   a  max rel. error 0.0e+00 (tolerance 0e+00)\n"
                                                                   "  FAIL b  max rel. error 1.0e+00 (tolerance 0e+00)\n")
    nb.cells[1].outputs = [printed]
    assert [(r["ok"], r["what"]) for r in check_rows(nb)] == [(True, "a"), (False, "b")]
    nb.cells[1].outputs = []
    assert problems(nb) == ["prints no check row (ok/FAIL ... max rel. error ... (tolerance ...))"]
