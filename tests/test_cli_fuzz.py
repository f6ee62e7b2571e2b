"""Odd values through every verb's numeric flags: one line and a non-zero exit, never a traceback,
a hang, or a success for nonsense; and nothing is launched for them.

In-process (``minipar.cli.main``) with the launchers replaced by a stand-in that records the
launch instead, so a case costs milliseconds. A seeded sample of (verb, flag, value) runs each
time; ``MINIPAR_FUZZ_ALL=1`` runs every one.
"""
import os
import random
import signal

import pytest

ODD = ["0", "-1", "nan", "inf", "1e400", "1000000000000", "", "abc"]

# verb (its argv up to the flag, otherwise valid), its numeric flags, and per flag the odd values
# that are fine (exit 0, or a launch, allowed); the rest must be refused
ZERO = {"0"}
VERBS = {
    "train": (["train"], {"-n": set(), "--dp": set(), "--pp": set(), "--tp": set(), "--cp": set(),
                          "--experts": ZERO, "--top-k": set(), "--capacity-factor": set(), "--aux-weight": ZERO,
                          "--microbatches": set(), "--zero": ZERO, "--layers": set(), "--d-model": set(),
                          "--heads": set(), "--seq-len": set(), "--batch": set(), "--lr": set(), "--steps": set(),
                          "--save-every": ZERO}),
    "generate": (["generate", "--checkpoint", "CKPT"], {"-n": set(), "--tp": set(), "--tokens": set(), "--eval": ZERO}),
    "bench train": (["bench", "train"], {"--steps": set(), "--batch": set(), "--rounds": set()}),
    "run": (["run", "collectives"], {"-n": set()}),
    "run pipeline": (["run", "-n", "2", "pipeline"], {"--microbatches": set(), "--chunks": {"0", "-1"}, "--width": set(),
                                                      "--batch": set(), "--layers": set(), "--repeats": set()}),
    "bench collectives": (["bench", "collectives", "-n", "2"], {"-n": set(), "--sizes": set(), "--budget": {"1000000000000"}}),
    "bench tp": (["bench", "tp"], {"-n": set(), "--sizes": set(), "--tokens": set(), "--reps": set(),
                                   "--budget": {"1000000000000"}, "--rounds": set()}),
    "bench offload": (["bench", "offload"], {"-n": set(), "--width": set(), "--steps": set()}),
    "bench links": (["bench", "links"], {"--slowdown": {"1000000000000"}, "--steps": set()}),
    "bench machine": (["bench", "machine"], {"-n": set()}),
    "memory": (["memory", "--params", "1e9"], {"--params": {"1000000000000"}, "--dp": set()}),
    "plan": (["plan", "--model", "megatron-1.7b", "--gpus", "8", "--global-batch", "64"],
             {"--gpus": set(), "--gpus-per-node": set(), "--global-batch": set(), "--top": set(),
              "--link-slowdown": {"1000000000000"}}),
    "infer": (["infer", "--model", "llama3-8b"], {"--tp": set(), "--pp": set(), "--batch": set(), "--context": set(),
                                                  "--prompt": set(), "--layers": set(), "--heads": set()}),
    "schedule": (["schedule", "1f1b"], {"--stages": set(), "--microbatches": set(), "--chunks": set()}),
    "search": (["search"], {"--ranks": set(), "--budget": {"1000000000000"}, "--reps": set()}),
    "tour": (["tour"], {"-n": set()}),
    "check": (["check", "01"], {"--timeout": ZERO | {"1000000000000"}}),
    "watchdog": ([], {"--watchdog": ZERO | {"1000000000000"}}),
}
# the ``--chunks`` of 1f1b is not used (interleaved only): 0 and -1 there are ignored, as documented;
# a budget or slowdown of 10^12 is a long run the user asked for, not a mistake the parser can see

CASES = [(verb, flag, value) for verb, (_, flags) in VERBS.items() for flag in flags for value in ODD]
SAMPLE = CASES if os.environ.get("MINIPAR_FUZZ_ALL") else random.Random(20261125).sample(CASES, 160)


class Launched(Exception):
    """What the stand-in launchers raise: the verb got as far as starting ranks."""


class Hang(Exception):
    pass


@pytest.fixture
def no_launch(monkeypatch, tmp_path):
    import minipar.cli.collectives
    import minipar.cli.common
    import minipar.bench.train
    import minipar.cli.course
    import minipar.cli.data_parallel
    import minipar.cli.planning
    import minipar.labs.grader
    import minipar.launcher
    import minipar.train.checkpoint
    from minipar.train.config import DEFAULT_MODEL

    def launched(*args, **kwargs):
        raise Launched()

    for mod, name in ((minipar.launcher, "launch"), (minipar.launcher, "run_streaming"), (minipar.cli.course, "launch"),
                      (minipar.cli.collectives, "relaunch"), (minipar.cli.common, "relaunch"), (minipar.labs.grader, "main")):
        monkeypatch.setattr(mod, name, launched)
    index = {"model": dict(DEFAULT_MODEL), "train": {"batch": 32}, "step": 0}
    monkeypatch.setattr(minipar.train.checkpoint, "read_index", lambda d: (d, index))
    for verb in ("cmd_machine", "bench_links"):  # these measure in this process: stand-ins too
        monkeypatch.setattr(minipar.cli.planning, verb, launched)
    monkeypatch.setattr(minipar.cli.data_parallel, "bench_offload", launched)
    monkeypatch.setattr(minipar.bench.train, "run", launched)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIPAR_WATCHDOG", raising=False)
    monkeypatch.delenv("MINIPAR_LINK", raising=False)


def run(argv, seconds=10):
    """(exit code, or "launched") of ``minipar ARGV`` in this process; raises what escapes it."""
    from minipar import cli

    def alarm(*_):
        raise Hang(f"minipar {' '.join(argv)} ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return cli.main(argv)
    except SystemExit as exit_:
        return exit_.code
    except Launched:
        return "launched"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("verb,flag,value", SAMPLE, ids=[f"{v} {f} {x!r}" for v, f, x in SAMPLE])
def test_odd_value(verb, flag, value, no_launch, capsys):
    prefix, flags = VERBS[verb]
    argv = [*prefix, flag, value] + (["lessons"] if verb == "watchdog" else [])
    code = run(argv)  # a traceback or a hang fails the test here, with minipar's frames shown
    out = capsys.readouterr()
    if value in flags[flag]:
        return
    assert code not in (0, None, "launched"), f"minipar {' '.join(argv)}: {code}\n{out.out}{out.err}"
    assert "Traceback" not in out.err and out.err.startswith("minipar") and out.err.count("\n") == 1, out.err
