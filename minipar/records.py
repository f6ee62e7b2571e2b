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


def write_json(path: str, data, label: str = "wrote", **options) -> str:
    """Write ``data`` to ``path`` as indented JSON (``options`` go to ``json.dump``: ``default=float``)
    and say so: ``wrote PATH``; returns the path."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1, **options)
    print(f"{label} {path}", flush=True)
    return str(path)
