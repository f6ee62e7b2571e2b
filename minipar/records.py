"""Records as JSON: the one writer of every command, benchmark and driver that takes ``--json``."""
from __future__ import annotations

import json


def write_json(path: str, data, label: str = "wrote") -> None:
    """Write ``data`` to ``path`` as indented JSON and say so: ``wrote PATH``."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"{label} {path}")
