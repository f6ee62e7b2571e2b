"""Records as JSON: the one writer of every command, benchmark and driver that takes ``--json``,
and the folder where measurements of this machine are kept outside the repository."""
from __future__ import annotations

import json
import os


def cache_dir() -> str:
    """``$MINIPAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/minipar`` (``~/.cache/minipar``): where what a
    command measured on this machine is kept (the search's calibration, ``minipar bench machine``)."""
    return os.environ.get("MINIPAR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "minipar")


def output_problem(path: str) -> str | None:
    """Why a file written at the end of a run could not be written at ``path`` (its folder
    missing or read-only, a folder by that name), or None: checked before the work starts, so a
    typo costs nothing instead of the run's results."""
    if not path.strip():
        return "expected a file name, got ''"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{path!r}: the folder {os.path.dirname(path) or '.'!r} does not exist (create it first; the file is written after the run)"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{path!r}: the folder {os.path.dirname(path) or '.'!r} is not writable"
    if os.path.isdir(path):
        return f"{path!r} is a folder, expected a file name"
    return None


def write_json(path: str, data, label: str = "wrote", **options) -> str:
    """Write ``data`` to ``path`` as indented JSON (``options`` go to ``json.dump``: ``default=float``)
    and say so: ``wrote PATH``; returns the path."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1, **options)
    print(f"{label} {path}", flush=True)
    return str(path)
