"""Read the notebooks without a server (``minipar notebook NN``), and execute them, store them
with their outputs, and read the check rows they print.

    minipar notebook 01                          # notebook 01 as stored, in the terminal: nothing runs
    minipar notebook 01 --html 01.html           # the same as a web page (figures inline), via nbconvert
    minipar notebook 01 --images figs/           # the terminal form, its figures written as PNG files
    python -m minipar.cli.notebooks                              # every notebooks/*.ipynb, in place
    python -m minipar.cli.notebooks notebooks/03_pipeline.ipynb  # just this one
    make notebooks                                           # the same as the first python line

``minipar notebook NN`` reads the stored notebook (JSON) and prints each markdown cell as its
text, each code cell with its stored outputs (the plain-text form of each; a figure as one line
naming its size, or the file ``--images`` wrote it to). No kernel, no Jupyter server.

Each notebook runs top to bottom in a fresh kernel (real ranks, as in the lessons) and is
written back with every output: the text, the tables and the figures, so that it reads the
same where notebooks are browsed without running them. A notebook prints its checks the way
``minipar.lessons.common.format_rows`` does::

      ok   ring all_reduce float64 n=1000   max rel. error 1.1e-16 (tolerance 1e-12)
      FAIL ...

or shows them folded under one summary line (``minipar.figures.notebook.checks``: its plain-text
form keeps every row, and that is what is read here). Knobs (``minipar.figures.notebook.knobs``)
are stored as their static figure: the run sets ``MINIPAR_NOTEBOOK_STATIC``.

A notebook that raises, prints no check row, or prints a FAIL row is reported and *not*
written back. Executing needs nbclient and ipykernel (the ``test`` and ``notebooks`` extras);
reading needs nothing beyond minipar, and ``--html`` nbconvert (a dependency of minipar).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import re
import struct
import sys
import time

from ..course import LESSONS
from ..errors import UsageError
from ..figures.notebook import STATIC
from .common import positive_float, progress, with_example

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\s*(ok|FAIL)\s+(.+?)\s+max rel\. error\s+(\S+)\s+\(tolerance\s+([^)]+)\)\s*$", re.MULTILINE)


def notebooks() -> list[pathlib.Path]:
    """The course's notebooks, in order."""
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def execute(path, timeout: float = 900):
    """Run the notebook at ``path`` top to bottom in a fresh kernel (cwd: its folder); returns
    the executed notebook (nbformat), not yet written anywhere."""
    import nbclient
    import nbformat

    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    before = os.environ.get(STATIC)
    os.environ[STATIC] = "1"  # the kernel inherits it: knobs store their static figure, no widget
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        if before is None:
            del os.environ[STATIC]
        else:
            os.environ[STATIC] = before
    return nb


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    text = output.get("data", {}).get("text/plain", "") if "text/html" in output.get("data", {}) else ""
    return (text if isinstance(text, str) else "".join(text)) + "\n"


def printed(nb) -> str:
    """Everything the code cells printed (stream outputs) and the plain text of what they displayed
    as HTML (a folded check table), in order."""
    return "".join(_text(o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def check_rows(nb) -> list[dict]:
    """The check rows the notebook printed: {"ok", "what", "error", "tolerance"} each."""
    return [{"ok": m[1] == "ok", "what": m[2], "error": m[3], "tolerance": m[4]} for m in ROW.finditer(printed(nb))]


def problems(nb) -> list[str]:
    """What is wrong with an executed notebook: exceptions, FAIL rows, or no check row at all."""
    out = [f"raised {o.get('ename')}: {o.get('evalue')}" for c in nb.cells if c.cell_type == "code"
           for o in c.get("outputs", []) if o.get("output_type") == "error"]
    rows = check_rows(nb)
    out += [f"FAIL {r['what']} (max rel. error {r['error']}, tolerance {r['tolerance']})" for r in rows if not r["ok"]]
    if not rows:
        out.append("prints no check row (ok/FAIL ... max rel. error ... (tolerance ...))")
    return out


# --------------------------------------------------------------------------- minipar notebook NN


def find(key: str) -> pathlib.Path:
    """The stored notebook of lesson ``key`` ("01", "1" or the lesson's name, as `minipar lessons`
    lists them); UsageError naming the notebooks there are."""
    for ls in LESSONS:
        if ls.notebook and str(key) in (ls.key, ls.key.lstrip("0"), ls.name):
            path = ROOT / ls.notebook
            if not path.is_file():
                raise UsageError(f"notebook {key}: {path} is missing (a copy of minipar without its notebooks/?)")
            return path
    keys = ", ".join(ls.key for ls in LESSONS if ls.notebook)
    raise UsageError(f"no notebook {key!r}: the notebooks are {keys} (see `minipar lessons`)")


def _joined(text) -> str:
    return text if isinstance(text, str) else "".join(text)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    return struct.unpack(">II", data[16:24]) if data[:8] == b"\x89PNG\r\n\x1a\n" else (0, 0)


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line.strip() else line.rstrip() for line in text.rstrip("\n").split("\n"))


def render_text(nb: dict, stem: str = "notebook", images: pathlib.Path | None = None) -> str:
    """The stored notebook ``nb`` (its JSON, as a dict) as plain text: markdown cells as written,
    code cells indented under ``In [n]:`` with their stored outputs under ``Out:``. A figure is one
    line; with ``images`` (a folder) it is also written there, as ``<stem>_cell<i>_<k>.png``."""
    parts, figure = [], 0
    for i, cell in enumerate(nb.get("cells", [])):
        source = _joined(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            parts.append(source.rstrip())
            continue
        if cell.get("cell_type") != "code":
            continue
        count = cell.get("execution_count")
        parts.append(f"In [{count if count is not None else ' '}]:\n" + _indent(source))
        shown = []
        for out in cell.get("outputs", []):
            kind, data = out.get("output_type"), out.get("data", {})
            if kind == "stream":
                shown.append(_joined(out.get("text", "")))
            elif kind == "error":
                shown.append(f"{out.get('ename')}: {out.get('evalue')}")
            elif "image/png" in data:
                figure += 1
                png = base64.b64decode(_joined(data["image/png"]))
                w, h = png_size(png)
                line = f"[figure {figure}: PNG, {w} x {h} pixels"
                if images is not None:
                    images.mkdir(parents=True, exist_ok=True)
                    path = images / f"{stem}_cell{i}_{figure}.png"
                    path.write_bytes(png)
                    line += f", written to {path}]"
                else:
                    line += "; see it with --images DIR or --html FILE]"
                shown.append(line)
            elif "text/plain" in data:
                shown.append(_joined(data["text/plain"]))
            elif data:
                shown.append(f"[{', '.join(data)} output: see it with --html FILE]")
        text = "\n".join(s.rstrip("\n") for s in shown if s.strip())
        if text:
            parts.append("Out:\n" + _indent(text))
    return "\n\n".join(parts) + "\n"


def render_html(path: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Write the stored notebook at ``path`` as one HTML page (its figures inline) to ``out``."""
    import warnings

    from nbconvert import HTMLExporter

    with warnings.catch_warnings():  # without IPython installed: "IPython3 lexer unavailable", Python 3's is used
        warnings.filterwarnings("ignore", message="IPython3 lexer unavailable")
        body, _ = HTMLExporter().from_filename(str(path))
    out.write_text(body, encoding="utf-8")
    return out


def cmd_notebook(args) -> int:
    path = find(args.key)
    if args.html:
        out = render_html(path, pathlib.Path(args.html))
        print(f"wrote {out} ({path.name} as stored, with its outputs and figures): open it in a browser")
        return 0
    nb = json.loads(path.read_text(encoding="utf-8"))
    header = (f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: stored executed, "
              f"the outputs of a real run (nothing runs now)")
    images = pathlib.Path(args.images) if args.images else None
    sys.stdout.write(header + "\n" + "=" * len(header) + "\n\n" + render_text(nb, path.stem, images))
    return 0


def add_verbs(top) -> None:
    """Add ``minipar notebook NN`` to ``top`` (``minipar``'s subparsers)."""
    n = top.add_parser("notebook", help="read a lesson's notebook in the terminal (or as HTML): no Jupyter server",
                       description="Prints notebook NN as stored (executed, with the outputs of a real run): markdown "
                                   "as text, each code cell with its outputs. Nothing runs.",
                       **with_example("minipar notebook 01 | less\n  minipar notebook 01 --html 01.html   "
                                      "# a web page, figures inline"))
    n.add_argument("key", metavar="NN", help="the lesson's key, e.g. 01 (the notebooks: `minipar lessons`)")
    n.add_argument("--html", metavar="FILE", help="write the notebook as one HTML page to FILE instead (nbconvert)")
    n.add_argument("--images", metavar="DIR", help="also write each figure to DIR as a PNG file, named in the text")
    n.set_defaults(func=cmd_notebook)


def main(argv=None) -> int:
    import nbformat

    p = argparse.ArgumentParser(prog="python -m minipar.cli.notebooks", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", help="notebooks to run (default: every notebooks/*.ipynb)")
    p.add_argument("--timeout", type=positive_float, default=900, help="seconds per cell (default 900)")
    args = p.parse_args(argv)
    paths = [pathlib.Path(x) for x in args.paths] or notebooks()
    bad = 0
    for i, path in enumerate(progress(paths, desc="notebooks", total=len(paths), unit="notebook"), 1):
        print(f"[{i}/{len(paths)}] executing {path} ...", flush=True)
        t0 = time.perf_counter()
        try:
            nb = execute(path, args.timeout)
            wrong = problems(nb)
        except Exception as err:  # noqa: BLE001  (a cell that raised: report it, run the next notebook)
            nb, wrong = None, [f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"]
        took = time.perf_counter() - t0
        if wrong:
            bad += 1
            print(f"      NOT written ({took:.0f} s):" + "".join(f"\n        {w}" for w in wrong), flush=True)
            continue
        nbformat.write(nb, path)
        print(f"      {len(check_rows(nb))} check rows ok; wrote {path} with its outputs ({took:.0f} s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
