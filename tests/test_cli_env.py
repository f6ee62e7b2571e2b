"""``minipar --watchdog/--link`` reach the ranks a verb launches, and leave ``os.environ`` as
main found it; ``minipar.libc`` finds prctl and glibc where they are, and nothing elsewhere."""
import os

import minipar.cli as cli
from minipar import launcher, libc


def test_main_in_process_leaves_os_environ_as_it_found_it(monkeypatch, capsys):
    monkeypatch.setenv("MINIPAR_LINK", "pcie")  # already set by the caller: restored, not dropped
    monkeypatch.delenv("MINIPAR_WATCHDOG", raising=False)
    before = dict(os.environ)
    assert cli.main(["--watchdog", "7", "--link", "nvlink", "lessons"]) == 0
    assert "minipar" in capsys.readouterr().out
    assert dict(os.environ) == before  # a main that set them in os.environ for its ranks would leave both behind


def test_the_verb_and_its_ranks_see_the_settings_while_it_runs(monkeypatch):
    monkeypatch.delenv("MINIPAR_WATCHDOG", raising=False)
    seen = {}

    def verb(args):  # what a verb's launch would give its ranks
        seen.update({k: launcher.rank_env().get(k) for k in ("MINIPAR_WATCHDOG", "MINIPAR_LINK")})
        return 0

    monkeypatch.setattr(cli, "_run", verb)
    assert cli.main(["--watchdog", "7", "--link", "nvlink", "lessons"]) == 0
    assert seen == {"MINIPAR_WATCHDOG": "7.0", "MINIPAR_LINK": "nvlink"}  # a main that dropped them fails here
    assert "MINIPAR_WATCHDOG" not in os.environ


def test_job_settings_restores_even_when_the_verb_fails(monkeypatch):
    monkeypatch.setenv("MINIPAR_LINK", "pcie")
    try:
        with launcher.job_settings({"MINIPAR_LINK": "ethernet", "MINIPAR_WATCHDOG": None}):
            assert os.environ["MINIPAR_LINK"] == "ethernet" and "MINIPAR_WATCHDOG" not in os.environ
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert os.environ["MINIPAR_LINK"] == "pcie"


def test_libc_finds_prctl_and_glibc_here_and_nothing_elsewhere(monkeypatch):
    assert libc.prctl() is not None and libc.glibc() is not None  # this machine: Linux, glibc
    monkeypatch.setattr(libc.sys, "platform", "darwin")
    assert libc.prctl() is None  # no prctl(2) off Linux

    class Musl:  # a C library without glibc's gnu_get_libc_version
        def __init__(self, *a, **k):
            pass

        mallopt = object()

    monkeypatch.setattr(libc.ctypes, "CDLL", Musl)
    assert libc.glibc() is None  # a check by name alone ("libc loaded") would hand musl's to mallopt
