"""Execute the notebooks, store them with their outputs, and read the check rows they print.

    python -m minipar.cli.notebooks                              # every notebooks/*.ipynb, in place
    python -m minipar.cli.notebooks notebooks/03_pipeline.ipynb  # just this one
    make notebooks                                           # the same as the first line

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
written back. Needs the ``notebooks`` extra (``pip install -e ".[notebooks]"``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
import time

from ..figures.notebook import STATIC
from .common import positive_float, progress

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
