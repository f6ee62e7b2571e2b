"""`minipar notebook NN`: a stored notebook read in the terminal or as HTML, with no Jupyter server.

The README's path starts with it; here it runs as written there, from a fresh folder (nothing of
the checkout in the working directory), and must not start or reach a kernel or a server.
"""
from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from minipar.cli import main
from minipar.cli.notebooks import find, png_size, render_text

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SERVERS = ("jupyter_client", "jupyter_server", "ipykernel", "nbclient", "zmq", "notebook", "jupyterlab")


def readme_path_command() -> str:
    """The command that reads notebook NN in the README's "The path, lesson by lesson"."""
    text = (ROOT / "README.md").read_text()
    path = text[text.index("**The path, lesson by lesson**"):]
    path = path[:path.index("\n## ")]
    return re.search(r"`(minipar notebook NN)`", path)[1]


def joined(text) -> str:
    return text if isinstance(text, str) else "".join(text)


def test_the_readmes_path_command_reads_notebook_01_from_a_fresh_folder(tmp_path):
    command = readme_path_command().replace("NN", "01").split()
    script = pathlib.Path(sys.executable).with_name("minipar")
    argv = [str(script), *command[1:]] if script.exists() else [sys.executable, "-m", "minipar", *command[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    nb = json.loads(find("01").read_text())
    first = joined(nb["cells"][0]["source"]).splitlines()[0]
    assert first == "# Lesson 1 — collectives from send/recv" and first in out.stdout
    stream = next(joined(o["text"]) for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "stream")
    assert stream.splitlines()[0] in out.stdout, "a stored output is missing"
    assert "In [1]:" in out.stdout and "[figure 1: PNG" in out.stdout
    assert list(tmp_path.iterdir()) == [], "reading wrote into the working folder"
    # nothing of a kernel or a server is imported, let alone started
    probe = ("import io, sys, contextlib\nfrom minipar.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['notebook', '01'])\n"
             f"print(rc, sorted(m for m in sys.modules if m.split('.')[0] in {SERVERS!r}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=120)
    assert out.stdout.strip() == "0 []", out.stdout + out.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_and_output_of_a_notebook_is_in_its_text(path):
    nb = json.loads(path.read_text())
    text = render_text(nb, path.stem)
    figures = 0
    for cell in nb["cells"]:
        for line in joined(cell["source"]).splitlines():
            assert line.rstrip() in text, line
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream":
                assert all(line.rstrip() in text for line in joined(o["text"]).splitlines())
            figures += "image/png" in o.get("data", {})
    assert text.count("[figure ") == figures


def test_images_are_written_and_named_with_their_size(tmp_path):
    nb = json.loads(find("03").read_text())
    text = render_text(nb, "03_pipeline", tmp_path / "figs")
    files = sorted((tmp_path / "figs").glob("*.png"))
    assert files and len(files) == text.count("[figure ")
    for f in files:
        assert f"written to {f}]" in text
        w, h = png_size(f.read_bytes())
        assert w > 100 and h > 100 and f"{w} x {h} pixels" in text


def test_html_is_one_page_with_every_figure_inline(tmp_path):
    out = tmp_path / "03.html"
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert main(["notebook", "3", "--html", str(out)]) == 0
    assert f"wrote {out}" in said.getvalue()
    page = out.read_text()
    nb = json.loads(find("03").read_text())
    pngs = [joined(o["data"]["image/png"]) for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert pngs and all(p.strip()[:200] in page for p in pngs)
    assert base64.b64decode(pngs[0])[:4] == b"\x89PNG"


@pytest.mark.parametrize("key", ["99", "00", "zero", ""])
def test_an_unknown_notebook_is_one_line_and_exit_2(key, capsys):
    assert main(["notebook", key]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "the notebooks are 01, 02" in out.err, out.err


def test_a_lesson_name_reads_its_notebook():
    assert find("pipeline") == find("03") == find("3")
