"""Every `minipar ...` command of the README runs, in the README's order, as a learner copies it.

The commands are the lines of the README's fenced blocks that start with `minipar `: each is cut
at its description (two or more spaces), its `[optional]` parts dropped, and run in one temporary
folder (so `--save ckpt/` and then `--checkpoint ckpt/` meet, and nothing is written into the
checkout). A smaller job stands in where the README's would take minutes: `FAST` below, the same
verb and flags. A non-zero exit fails the test, naming the README's line.

Not run here: `make tour` (`minipar tour` on every lesson, which tests/test_tour_figures.py runs
in part), `make test` (the suite this test is in), `make lab` and `make notebooks` (JupyterLab;
every notebook re-executed, as tests/test_notebooks.py does), `make site` (tests/test_site.py
builds it), and the `mpiexec`/`torchrun` lines (the engines' launchers: tests/test_launchers.py).
"""
from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (a pattern of the README's command, what runs instead): each the same command on a smaller job;
# ^...$ replaces a whole command, anything else the words it matches
FAST = [
    (r"^minipar tour$", "minipar tour --only 01 -n 2"),  # every lesson: what `make tour` is for
    (r"^minipar tour --no-figures$", "minipar tour --no-figures --only 01 -n 2"),
    (r"--steps 300", "--steps 2"),  # the checkpoint `generate` reads: an untrained one is enough to run
    (r"--steps 5", "--steps 1"),
    (r"--microbatches 8", "--microbatches 4"),
    (r"^minipar check 01$", "minipar check 01 --solution --task 1.1"),  # the copied skeleton fails by design
    (r"^minipar check 01 --backend torch$", "minipar check 01 --backend torch --solution --task 1.1"),
    (r"^minipar bench collectives -n 4", "minipar bench collectives -n 2 --sizes 8 --budget 0.01"),
    (r"^minipar bench tp -n 2$", "minipar bench tp -n 2 --sizes 8 --reps 1 --budget 0.01"),
    (r"^minipar figures", "minipar figures --only 01 --quick"),
    (r"--budget 20", "--budget 1 --reps 1"),
    (r"^minipar run -n 3 torch_engines$", "minipar run -n 2 torch_engines --quick"),
    (r"^minipar bench torch$", "minipar bench torch --layers 2 --width 64 --batch 8 --steps 1"),
    (r"^minipar check 09$", "minipar check 09 --solution --task 9.3"),  # no lab 09 workspace in that folder
]


def readme_commands(text: str) -> list[str]:
    """The `minipar ...` lines of ``text``'s fenced blocks, in order, without their descriptions
    and `[optional]` parts."""
    commands = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            if line.startswith("minipar "):
                command = re.split(r"\s{2,}|\s+#", line.strip())[0]
                commands.append(re.sub(r"\s*\[[^\]]*\]", "", command))
    return commands


def fast(command: str) -> str:
    for slow, quick in FAST:
        command = re.sub(slow, quick, command)
    return command


def test_readme_commands_are_found_and_cut_at_their_descriptions():
    text = "```\nminipar tour [--backend torch]      every lesson\nmake test   # all\n```\n" \
           "minipar outside a block\n```\nminipar generate --prompt \"41>\"   text # a comment\n```\n"
    assert readme_commands(text) == ["minipar tour", 'minipar generate --prompt "41>"']
    commands = readme_commands((ROOT / "README.md").read_text())
    assert len(commands) >= 15 and "minipar lessons" in commands, commands
    saves = [i for i, c in enumerate(commands) if "--save ckpt/" in c]
    reads = [i for i, c in enumerate(commands) if "--checkpoint ckpt/" in c]
    assert saves and reads and saves[0] < reads[0], "the README must make its checkpoint before generate reads it"


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_every_readme_command_runs_in_order(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for command in readme_commands((ROOT / "README.md").read_text()):
        argv = shlex.split(fast(command))
        out = subprocess.run([sys.executable, "-m", "minipar", *argv[1:]], cwd=tmp_path, env=env, text=True,
                             capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f"README: `{command}` (ran `{fast(command)}`) exited {out.returncode}:\n" \
                                    + (out.stdout + out.stderr)[-3000:]
