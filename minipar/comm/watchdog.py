"""The watchdog: a blocked job is reported and ended, never left hanging.

Every blocking call of a communicator (send, recv, wait, sendrecv, barrier, builtin
collectives) first writes *what it is about to wait on* into ``Watchdog.state``::

    ("recv", "from rank 2", tag 0, 32 bytes, t_enter)

and clears it when the call returns. That is one tuple assignment per call.

A daemon thread per rank wakes every ``POLL`` seconds. When its rank has been inside one
call for longer than ``timeout`` seconds it *fires*:

1. it creates ``<report_dir>/fire`` (atomically; the first rank to fire owns the report),
2. every rank's thread sees that file and writes ``<report_dir>/rank.<r>`` describing what
   its rank is doing right now (blocked in which call, or computing, or finished),
3. the owner waits up to ``GRACE`` seconds for all reports, prints them once, and aborts the
   whole job (``MPI_Abort``, or ``os._exit`` under torchrun, whose agent then stops the rest).

The report directory is a temporary folder that rank 0 creates at start-up and announces with
the engine's own broadcast, so it must be visible to every rank: true on one host; across
hosts each rank's report then only reaches its own host's folder (the job still ends).

The timeout defaults to 60 s; set it with ``minipar.init(watchdog=SECONDS)``, the
``MINIPAR_WATCHDOG`` environment variable, or ``--watchdog`` on the CLI; 0 turns it off.
"""
from __future__ import annotations

import os
import sys
import threading
import time

DEFAULT_TIMEOUT = 60.0
POLL = 0.2
GRACE = 3.0


def timeout_from_env(default: float = DEFAULT_TIMEOUT) -> float:
    value = os.environ.get("MINIPAR_WATCHDOG", "")
    try:
        return float(value) if value else default
    except ValueError:
        raise ValueError(f"MINIPAR_WATCHDOG must be a number of seconds, got {value!r}") from None


class Watchdog:
    def __init__(self, rank: int, size: int, timeout: float, report_dir: str | None, abort):
        self.rank, self.size = rank, size
        self.timeout = float(timeout)
        self.report_dir = report_dir
        self.abort = abort  # callable(exit_code) that ends every rank
        self.state = None  # (op, where, tag, nbytes, t_enter) while inside a blocking call
        self.last = None  # the last call that completed (for "computing since ...")
        self.last_t = time.monotonic()
        self.finished = False
        self._written = False
        if self.timeout > 0 and report_dir is not None:
            threading.Thread(target=self._loop, name="minipar-watchdog", daemon=True).start()

    # called by the communicator around every blocking call ------------------------------
    def enter(self, op, where, tag, nbytes):
        self.state = (op, where, tag, nbytes, time.monotonic())

    def leave(self):
        if self.state is not None:
            self.last = self.state
        self.state = None
        self.last_t = time.monotonic()

    # the thread -------------------------------------------------------------------------
    def describe(self) -> str:
        now = time.monotonic()
        st = self.state
        if st is not None:
            op, where, tag, nbytes, t0 = st
            if self.finished:
                return f"finished its work, waiting for the others in {op} {where} for {now - t0:.1f} s"
            tag_s = f" tag {tag}" if tag is not None else ""
            return f"blocked in {op} {where}{tag_s} ({nbytes} bytes) for {now - t0:.1f} s"
        if self.finished:
            return "finished its work (waiting for the others to exit)"
        if self.last is not None:
            op, where = self.last[0], self.last[1]
            return f"not in a communication call: running Python for {now - self.last_t:.1f} s since its last call ({op} {where})"
        return f"not in a communication call: running Python for {now - self.last_t:.1f} s (no call yet)"

    def _loop(self):
        fire = os.path.join(self.report_dir, "fire")
        while True:
            time.sleep(POLL)
            st = self.state
            if os.path.exists(fire):
                self._write_report()
                continue
            if st is not None and time.monotonic() - st[4] > self.timeout:
                try:
                    fd = os.open(fire, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    continue  # another rank fired first; it prints the report
                os.write(fd, str(self.rank).encode())
                os.close(fd)
                self._write_report()
                self._collect_and_abort()
                return

    def _write_report(self):
        if self._written:
            return
        self._written = True
        path = os.path.join(self.report_dir, f"rank.{self.rank}")
        with open(path + ".tmp", "w") as f:
            f.write(self.describe())
        os.replace(path + ".tmp", path)

    def _collect_and_abort(self):
        deadline = time.monotonic() + GRACE
        paths = [os.path.join(self.report_dir, f"rank.{r}") for r in range(self.size)]
        while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
            time.sleep(0.05)
        lines = [
            f"minipar watchdog: rank {self.rank} made no progress for {self.timeout:g} s "
            f"(a deadlock, or a send/recv without its partner). What every rank is doing:"
        ]
        for r, p in enumerate(paths):
            try:
                with open(p) as f:
                    lines.append(f"  rank {r}: {f.read()}")
            except OSError:
                lines.append(f"  rank {r}: no report (process exited or unresponsive)")
        lines.append("Aborting the job. Raise the limit with --watchdog SECONDS or MINIPAR_WATCHDOG.")
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
        time.sleep(1.0)  # let the launcher forward the report before the abort tears the job down
        self.abort(3)
