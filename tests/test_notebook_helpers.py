"""What the notebooks show: check tables folded under a summary line that names every failure, and
knobs that always leave a static figure (and redraw it in place when a kernel turns them)."""
import pathlib

import pytest

from minipar.cli.notebooks import check_rows, problems
from minipar.figures import notebook as N

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rows(*failing):
    out = [{"what": f"check {i}", "error": 1e-16 * i, "tolerance": 1e-12, "ok": True} for i in range(1, 12)]
    for name in failing:
        out.append({"what": name, "error": 0.5, "tolerance": 1e-12, "ok": False})
    return out


def test_summary_line_counts_the_checks_and_names_each_failing_one():
    assert N.summary_line(rows(), ranks=4) == \
        "11 checks passed, worst rel. error 1.1e-15 (tolerance 1e-12; backend numpy, 4 ranks)"
    line = N.summary_line(rows("planted bug", "second bug"), ranks=4)
    assert line.startswith("FAILED 2 of 13 checks: planted bug (rel. error 5.0e-01 > tolerance 1e-12); second bug")
    assert "passed" not in line and line.endswith("(backend numpy, 4 ranks)")
    assert N.summary_line(rows()[:1]).startswith("1 check passed") and "one process" in N.summary_line(rows()[:1])


def test_fold_hides_the_table_when_all_pass_and_opens_it_on_a_failure():
    ok, bad = N.fold(rows(), ranks=4), N.fold(rows("planted <bug>"), ranks=4)
    assert ok["text/html"].startswith("<details><summary") and "11 checks passed" in ok["text/html"]
    assert ok["text/html"].count("max rel. error") == 11  # the whole table, one click away
    assert bad["text/html"].startswith("<details open>") and "FAILED 1 of 12 checks: planted &lt;bug&gt;" in bad["text/html"]
    assert N.fold(rows(), prefix="check 1")["text/plain"].startswith("3 checks passed")  # check 1, 10, 11


def test_the_notebook_runner_reads_the_rows_of_a_folded_table():
    """``make notebooks`` and the notebook tests must still see a FAIL row inside a folded table."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("checks(rows)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data=N.fold(rows("planted bug"), ranks=4))]
    got = check_rows(nb)
    assert len(got) == 12 and [r["what"] for r in got if not r["ok"]] == ["planted bug"]
    assert problems(nb) == ["FAIL planted bug (max rel. error 5.0e-01, tolerance 1e-12)"]


class Shown:
    """IPython.display.display, recorded: what was displayed, and the updates of each display."""

    def __init__(self):
        self.items, self.updates = [], []

    def __call__(self, obj, display_id=None, **_):
        self.items.append(obj)
        if display_id:
            return self

    def update(self, obj):
        self.updates.append(obj)


@pytest.fixture
def shown(monkeypatch):
    import IPython.display

    record = Shown()
    monkeypatch.setattr(IPython.display, "display", record)
    return record


def test_knobs_without_a_kernel_show_the_static_figure_at_the_defaults(shown, tmp_path, capsys):
    from IPython.display import Image

    from minipar.figures.pipeline import plot_schedule

    assert not N.live()  # no kernel here
    box = N.knobs(plot_schedule, str(tmp_path / "s.png"), dict(schedule="1f1b", p=4, m=8), schedule=["gpipe", "1f1b"],
                  p=(2, 8), m=(1, 32))
    assert box is None and len(shown.items) == 1 and isinstance(shown.items[0], Image)
    assert shown.items[0].data[:8] == b"\x89PNG\r\n\x1a\n"  # a picture, in the stored notebook and on the site
    assert "static figure at schedule=1f1b, p=4, m=8" in capsys.readouterr().out


def test_knobs_in_a_kernel_redraw_through_the_library_and_say_why_when_refused(shown, tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    calls = []

    def draw(path, **values):
        calls.append(values)
        if values["m"] % values["p"]:
            raise ValueError("m must be a multiple of p")
        (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
        return str(tmp_path / "x.png")

    monkeypatch.setenv(N.STATIC, "1")
    assert not N.live()  # make notebooks stores the static figure only
    box = N.knobs(draw, "unused.png", dict(p=4, m=8), interactive=True, p=(2, 8), m=[4, 6, 8])
    p, m = box.children
    m.value = 4
    assert calls == [dict(p=4, m=8), dict(p=4, m=4)] and len(shown.updates) == 1  # redrawn in place
    m.value = 6
    assert shown.updates[-1] == "p=4, m=6: m must be a multiple of p"


def test_stored_notebooks_show_summary_lines_and_static_figures():
    """The stored outputs: no check row printed as a long table, and a picture under every knob."""
    nbformat = pytest.importorskip("nbformat")
    knobs_seen = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for c in (c for c in nb.cells if c.cell_type == "code"):
            streams = "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")
            assert "max rel. error" not in streams, f"{path.name}: a check table printed unfolded:\n{c.source}"
            if "knobs(" in c.source:
                knobs_seen += 1
                assert any("image/png" in o.get("data", {}) for o in c.outputs), f"{path.name}: knobs without a figure"
                assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c.outputs)
        assert any("checks passed" in o.get("data", {}).get("text/html", "") for c in nb.cells
                   if c.cell_type == "code" for o in c.outputs), f"{path.name}: no summary line"
    assert knobs_seen == 3  # the planner (07), the pipeline schedule (03), ZeRO per stage (04)


def test_every_ungraded_question_has_an_answer_to_reveal():
    """A lab README's "Question (N.M, not graded)" is followed by a folded answer, before the next heading."""
    import re

    questions = 0
    for readme in sorted((ROOT / "labs").glob("*/README.md")):
        text = readme.read_text()
        for q in re.finditer(r"\*\*Questions? \((?:[0-9.]+, )?not graded\)", text):
            questions += 1
            after = text[q.end():].split("\n#", 1)[0]
            answer = re.search(r"<details>\n<summary>[^<]+</summary>\n\n(.+?)\n</details>", after, re.S)
            assert answer and len(answer[1].split()) > 40, f"{readme.parent.name}: a question without an answer"
    assert questions == 9  # one per lab: 01 to 09
