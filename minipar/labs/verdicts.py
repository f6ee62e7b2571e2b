"""How ``minipar check`` reads a job that died: which task killed it, and the message the learner
reads for it (the grader, ``minipar.labs.grader``, runs the jobs; this module only reads what
their ranks printed and the files they wrote).

* ``cause``:   how the job died (an exit, a budget or the memory limit, a hang, an exception, ...)
* ``culprit``: the task it died in, from the watchdog's report and each rank's ``Doing`` file
* ``explain``: the message, at the learner's line and the rank that raised (``reported``)
"""
from __future__ import annotations

import os
import re

from ..comm.watchdog import users
from ..launcher import LaunchError
from ..trace import in_library, shown
from .checks import ranks

# megabytes a rank's resident memory may grow by inside one task (or the exercise's import): the
# reference grows by 20 at most, on either backend; a loop that never ends and allocates is stopped
# here, at its line, before it takes the machine's memory (the watchdog reads the rank's resident
# memory: an address-space limit, RLIMIT_AS, would also count what the engines map and never touch)
MEMORY = 512


def not_implemented(task, text=None):
    """The report of a task whose function raised NotImplementedError(text)."""
    if text in (None, f"lab {task.key}"):
        return f"not implemented yet (raise NotImplementedError(\"lab {task.key}\") is still there)"
    return f"not implemented yet: it raised NotImplementedError({text!r})"


def read_doing(folder, n):
    """{rank: what it was doing} from the ranks' files (a rank that never wrote is left out)."""
    out = {}
    for r in range(n):
        try:
            with open(os.path.join(folder, f"rank.{r}")) as f:
                out[r] = f.read()
        except OSError:
            pass
    return out


def _watchdog_lines(out):
    """The watchdog's headline and its line per rank, stripped."""
    report = out[out.index("minipar watchdog"):].splitlines()
    return report[0], [ln.strip() for ln in report if ln.startswith("  rank ")]


_REPORT = re.compile(r"^rank (\d+) (?:raised|crashed):$")  # a rank's exception, or the launcher's crash report
_FRAME = re.compile(r'^  File "(.*)", line (\d+), in (.*)$')
_NOISE = ("Abort(", "application called", "=====", "=   ", "YOUR APPLICATION TERMINATED", "This typically refers",
          "Please see the FAQ")  # MPI_Abort's line and hydra's banner around a rank that ended badly


def _engine_noise(line: str) -> bool:
    return line.startswith(_NOISE)


def learners(path: str) -> bool:
    """A frame in ``path`` is the learner's: code of a real file outside the engines and outside
    minipar, its lesson drivers too (the watchdog counts those as the user's; here the user is the
    learner, whose exercise may call them, never the other way round)."""
    return users(path) and not in_library(os.path.abspath(path))


def reported(out: str):
    """(rank, lines to show) for the first exception (or crash) a rank reported in ``out``: the
    learner's innermost frame (file, line, its source), the frame that raised when it is deeper
    (inside minipar or an engine; not for a crash, whose innermost Python frame is only where the
    rank happened to be), and the exception; without a learner's frame, the report's last lines.
    Always that one rank's report, never a line of another rank's."""
    lines = [re.sub(r"^\[rank\d+\]: ", "", ln) for ln in out.splitlines()]  # torch's prefix
    start = next(i for i, ln in enumerate(lines) if _REPORT.match(ln))
    rank, block = _REPORT.match(lines[start]).group(1), []
    crashed = lines[start].endswith("crashed:")
    for ln in lines[start + 1:]:
        if _REPORT.match(ln) or re.match(r"^rank \d+: ", ln) or _engine_noise(ln):
            break
        block.append(ln)
    tracebacks = [i for i, ln in enumerate(block) if ln.startswith("Traceback (most recent call last)")]
    block = block[tracebacks[-1] + 1:] if tracebacks else block  # a chained exception: the last one
    frames, said = [], []
    for ln in block:
        m = _FRAME.match(ln)
        if m and not said:
            frames.append([*m.groups(), None])
        elif ln.startswith("    ") and frames and not said:
            frames[-1][3] = frames[-1][3] or ln.strip()  # its source line (carets after it)
        elif ln.strip() or said:
            said.append(ln)
    while said and not said[-1].strip():
        said.pop()
    mine = [i for i, f in enumerate(frames) if learners(f[0])]
    if not mine:
        return rank, [ln for ln in block if ln.strip()][-6:]
    shown_frames = [frames[mine[-1]]] + ([frames[-1]] if mine[-1] < len(frames) - 1 and not crashed else [])
    out_lines = []
    for k, (path, line, function, source) in enumerate(shown_frames):
        if k and mine[-1] < len(frames) - 2:
            out_lines.append("  ...")
        out_lines.append(f'  File "{shown(os.path.abspath(path))}", line {line}, in {function}')
        out_lines += [f"    {source}"] if source else []
    return rank, out_lines + _plain(said, frames[mine[-1] + 1:])


def _plain(said, inside):
    """The exception's lines; a gloo abort on a message that does not fit its buffer said as MPI
    says it (gloo's own words: "8 vs 0. Received data size doesn't match expected size")."""
    text = " ".join(ln.strip() for ln in said)
    sizes = re.search(r"(\d+) vs (\d+)\. Received data size doesn't match expected size", text)
    if not sizes:
        return said
    op = next((f[2] for f in inside if os.sep + os.path.join("minipar", "comm") + os.sep in f[0]), "receive")
    sent, room = map(int, sizes.groups())
    return [f"{op}: the message is {'larger' if sent > room else 'smaller'} than buf ({sent} bytes arrived, buf "
            f"holds {room}): gloo aborted the process"]


def cause(err: LaunchError, doing: dict) -> str:
    """How a job died: "exit" (the exercise called sys.exit), "stuck" (the watchdog found a rank
    running Python, not communicating, past its task's budget or while the others waited for it),
    "memory" (the watchdog found a rank's memory grown past ``MEMORY`` inside its task),
    "gone" (a rank vanished while the others waited), "hang", "not implemented", "raised",
    "crashed" (a rank died of a fatal signal: an engine's C++ abort, a segfault; the launcher
    reports the stack it was on), "killed" (the hard time limit), or "vanished" (no rank said a
    word: os._exit, a signal)."""
    out = err.output
    if any(w.startswith("exited ") for w in doing.values()):
        return "exit"
    if "minipar watchdog" in out:
        headline, lines = _watchdog_lines(out)
        if _MEMORY.search(headline):
            return "memory"
        if any("not in a communication call" in ln for ln in lines):
            return "stuck"
        return "gone" if any("no report (process exited" in ln for ln in lines) else "hang"
    if "NotImplementedError" in out:
        return "not implemented"
    if re.search(r"^rank \d+ raised:$", out, re.M):
        return "raised"
    if re.search(r"^rank \d+ crashed:$", out, re.M):
        return "crashed"
    return "killed" if err.returncode == 124 else "vanished"


FINAL = ("exit", "stuck", "memory", "gone", "vanished")  # verdicts a job that died gives at once: alone would say the same
_MEMORY = re.compile(r"rank (\d+) used (\d+) MB in (.+?), (\d+) MB more than when it began \(its limit: (\S+) MB more\)")


def culprit(err: LaunchError, doing: dict, keys):
    """The task the job died in ("loading": the exercise's import), or None if unknown: the task
    whose budget ran out, the one a rank exited in, the one the rank that raised was running, or
    else the first one a rank was still running."""
    budget = re.search(r"(?:did not finish|MB in) task (\S+?)(?: in |,)", err.output)
    if budget:
        return budget.group(1)
    exits = [w.split(": ")[0].removeprefix("exited ") for w in doing.values() if w.startswith("exited ")]
    if exits:
        return exits[0].removeprefix("task ")
    raised = re.search(r"^rank (\d+) (?:raised|crashed):$", err.output, re.M)
    states = ([doing.get(int(raised.group(1)), "")] if raised else []) + list(doing.values())
    running = [w.removeprefix("task ") for w in states if w.removeprefix("task ") in keys]
    if running:
        return running[0]
    return "loading" if "loading" in doing.values() else None


def explain(err: LaunchError, n: int, task, doing: dict) -> str:
    """The failure message of ``task`` (or of the exercise's import, when the ranks died loading
    it) for a job that died."""
    out, on, how = err.output, ranks(n), cause(err, doing)
    loading = bool(doing) and all(w == "loading" for w in doing.values())
    if how == "exit":
        r, w = next((r, w) for r, w in doing.items() if w.startswith("exited "))
        what, said = w.removeprefix("exited ").split(": ", 1)
        if what == "loading":
            return f"the exercise ended the process while it was imported (rank {r}): {said}; nothing can be graded"
        return (f"exited on {on} (rank {r}): {said}, inside {task.function}: a graded function returns its "
                f"result, it never ends the process")
    if how in ("stuck", "memory", "gone", "hang"):
        headline, lines = _watchdog_lines(out)
        seen = "\n".join("        " + ln for ln in lines)
        what = "the exercise's import" if loading else f"task {task.key}"
        if how == "memory":
            r, used, _, grew, limit = _MEMORY.search(headline).groups()
            mine = next((ln for ln in lines if ln.startswith(f"rank {r}:")), f"rank {r}:")
            at = mine.partition("; at ")[2]
            others = "\n".join("        " + ln for ln in lines if ln != mine)
            return (f"{what} ran out of its memory on {on}: rank {r} used {used} MB, {grew} MB more than when it "
                    f"began (the limit: {limit} MB more; a loop that never ends, allocating as it goes?)"
                    + (f", at {at}" if at else "") + (f"\n        the other ranks:\n{others}" if others else ""))
        if how == "stuck":
            took = re.search(r"did not finish .+? in ([\d.]+) s|made no progress for ([\d.]+) s", headline)
            took = next((s for s in took.groups() if s), "?") if took else "?"
            stuck = next(ln for ln in lines if "not in a communication call" in ln)
            at = stuck.partition("; at ")[2]
            others = "\n".join("        " + ln for ln in lines if ln != stuck)
            return (f"{what} did not finish in {took} s on {on} (a loop that never ends, or a sleep?): "
                    f"{stuck.split(':')[0]} was running Python, not communicating" + (f", at {at}" if at else "")
                    + (f"\n        the other ranks:\n{others}" if others else ""))
        if how == "gone":
            gone = ", ".join(ln.split(":")[0] for ln in lines if "no report (process exited" in ln)
            return (f"{gone} exited without finishing task {task.key} on {on} (no exception: os._exit, a signal or "
                    f"a crash); the others waited for it:\n" + seen)
        return f"hangs on {on} (deadlock or a send without its recv). The watchdog saw:\n" + seen
    if how == "not implemented":
        said = re.search(r"NotImplementedError: (.*)", out)
        return not_implemented(task, said.group(1).strip() if said else None)
    if how in ("raised", "crashed"):
        rank, shown_lines = reported(out)
        verb = "raised an exception" if how == "raised" else "crashed (the process was ended by a fatal signal)"
        return f"{verb} on {on} (rank {rank}):\n" + "\n".join("        " + ln for ln in shown_lines)
    if how == "killed":
        tb = [ln for ln in out.splitlines() if ln.strip() and not _engine_noise(ln)]
        return f"did not finish on {on} within the job's hard time limit:\n" + "\n".join("        " + ln for ln in tb[-6:])
    what = "while it was imported" if loading else f"without finishing task {task.key}"
    return (f"the exercise exited {what}, on {on} (os._exit, a signal or a crash: no exception was raised; exit "
            f"code {err.returncode})")
