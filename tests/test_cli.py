"""The command line: every verb has help; run and bench do what they print."""
import argparse
import re
import json
import subprocess
import sys

import pytest
from .conftest import minipar




def test_help_lists_the_verbs():
    out = minipar("--help")
    assert out.returncode == 0
    for verb in ("tour", "lessons", "run", "check", "bench", "figures", "schedule", "memory"):
        assert verb in out.stdout


@pytest.mark.parametrize("verb", [["tour"], ["run"], ["check"], ["bench"], ["figures"], ["lessons"], ["schedule"], ["memory"],
                                  ["bench", "collectives"], ["bench", "tp"], ["run", "collectives"], ["run", "pipeline"],
                                  ["run", "tensor_parallel"], ["run", "data_parallel"]])
def test_every_verb_has_help_with_an_example(verb):
    out = minipar(*verb, "--help")
    assert out.returncode == 0 and "example" in out.stdout.lower()
    assert "\n  minipar " in out.stdout or "\n  mpiexec " in out.stdout  # an example command line


def test_lessons():
    out = minipar("lessons")
    assert out.returncode == 0 and "collectives" in out.stdout and "labs/01_collectives" in out.stdout
    assert "verbs: minipar run collectives, minipar bench collectives" in out.stdout
    # every part the registry names is shown, under its lesson
    from minipar.course import LESSONS

    blocks = re.split(r"\n(?=\d\d  )", out.stdout)  # one block per lesson, each starting with its key
    assert len(blocks) == len(LESSONS)
    for ls, block in zip(LESSONS, blocks):
        assert block.startswith(ls.key), (ls.key, block[:40])
        parts = (*ls.drivers, ls.driver, *ls.figures_modules, ls.cli, *ls.verbs, ls.notebook or "", ls.lab or "",
                 ls.grader or "")
        assert all(part in block for part in parts), [part for part in parts if part not in block]


# --------------------------------------------------------------------------- the registry names every verb


def verb_paths(parser, prefix=()):
    """Every verb of ``parser`` as the words that call it: {"tour", "run collectives", "bench tp", ...}."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return {" ".join(prefix)}
    return set().union(*(verb_paths(sub, prefix + (name,)) for g in groups for name, sub in g.choices.items()))


def test_each_lessons_cli_module_adds_exactly_the_verbs_the_registry_lists():
    from minipar.cli import build_parser
    from minipar.cli.course import VERBS
    from minipar.course import LESSONS

    course = verb_paths(build_parser([]))
    assert course == set(VERBS)
    for ls in LESSONS:
        assert ls.cli.startswith("minipar.cli."), ls.cli
        assert verb_paths(build_parser([ls])) - course == set(ls.verbs), f"lesson {ls.key}: {ls.cli} vs its verbs"


def test_every_verb_of_minipar_belongs_to_a_lesson_or_to_the_course():
    from minipar.cli import build_parser
    from minipar.cli.course import VERBS
    from minipar.course import LESSONS

    owners = [("course", v) for v in VERBS] + [(ls.name, v) for ls in LESSONS for v in ls.verbs]
    assert len({v for _, v in owners}) == len(owners), "a verb is listed twice"
    assert verb_paths(build_parser()) == {v for _, v in owners}


@pytest.mark.parametrize("argv,want", [
    (["run", "04"], ["run", "data_parallel"]),
    (["run", "-n", "2", "07", "--json", "p.json"], ["run", "-n", "2", "planning", "--json", "p.json"]),
    (["--watchdog", "9", "run", "--backend", "torch", "auto_parallel"], ["--watchdog", "9", "run", "--backend", "torch", "auto_parallel"]),
    (["run", "--trace", "01", "collectives"], ["run", "--trace", "01", "collectives"]),  # a file named 01 stays one
    (["run", "experts"], ["run", "experts"]),
    (["check", "01"], ["check", "01"]),
])
def test_run_takes_a_lessons_key_for_its_one_run(argv, want):
    """`minipar run 04` is `minipar run data_parallel`: the registry says which verb lesson 04 runs."""
    from minipar.cli.course import run_by_lesson

    assert run_by_lesson(argv) == want


def test_run_of_a_lesson_with_two_runs_names_both_in_one_line():
    for name in ("06", "sequence_experts"):
        out = minipar("run", "-n", "2", name, timeout=60)
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert "minipar run context_parallel, minipar run experts" in out.stderr, out.stderr


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_run_collectives_with_trace(tmp_path):
    out = minipar("run", "-n", "3", "collectives", "--trace", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and "all_reduce:rabenseifner" in out.stdout
    assert json.load(open(tmp_path / "t.json"))["traceEvents"]


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_bench_collectives_json(tmp_path):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    out = minipar("bench", "collectives", "-n", "2", "--sizes", "8", "64K", "--budget", "0.01",
                  "--json", str(js), "--plot", str(png))
    assert out.returncode == 0, out.stdout + out.stderr
    recs = json.load(open(js))
    assert {r["algorithm"] for r in recs} == {"naive", "tree", "recursive_doubling", "ring", "rabenseifner", "builtin"}
    assert {r["bytes"] for r in recs} == {8, 65536}
    for r in recs:
        assert {"algorithm", "bytes", "ranks", "time_s", "algbw_gbs", "busbw_gbs"} <= set(r)
        assert r["ranks"] == 2 and r["time_s"] > 0
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * (2 - 1) / 2)
    assert png.stat().st_size > 10_000


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("lesson", ["tensor_parallel", "data_parallel"])
def test_run_lesson_honours_n_before_the_lesson_name(lesson, tmp_path):
    js, tr = tmp_path / "rows.json", tmp_path / "trace.json"
    out = minipar("run", "-n", "2", lesson, "--json", str(js), "--trace", str(tr))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 2 ranks" in out.stdout
    rows = json.load(open(js))
    assert rows and all(r["ok"] for r in rows)
    ranks = {e["pid"] for e in json.load(open(tr))["traceEvents"] if e["ph"] == "X"}
    assert ranks == {0, 1}


# --------------------------------------------------------------------------- user errors: one line, exit 2, no rank


def in_process(argv, capsys, monkeypatch):
    """(exit code, stdout, stderr) of ``minipar ARGV`` run here, with launching ranks forbidden."""
    import minipar.cli.collectives
    import minipar.cli.course
    import minipar.launcher
    from minipar import cli

    def launched(*args, **kwargs):
        raise AssertionError("ranks were launched")

    for mod, name in ((minipar.launcher, "launch"), (minipar.cli.course, "launch"), (minipar.cli.collectives, "relaunch")):
        monkeypatch.setattr(mod, name, launched)
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


USER_ERRORS = [  # argv, what the one line must name
    (["run", "-n", "0", "collectives"], "argument -n"),
    (["run", "-n", "5", "tensor_parallel"], "-n 5"),
    (["run", "tensor_parallel", "-n", "7"], "-n 7"),
    (["run", "-n", "-1", "data_parallel"], "argument -n"),
    (["run", "-n", "2", "pipeline", "--schedule", "interleaved", "--microbatches", "3"], "--microbatches 3"),
    (["run", "-n", "2", "pipeline", "--width", "0"], "--width 0"),
    (["tour", "-n", "0"], "argument -n"),
    (["bench", "collectives", "-n", "0"], "argument -n"),
    (["bench", "collectives", "-n", "2", "--sizes", "16MB"], "argument --sizes"),
    (["bench", "tp", "-n", "3", "--sizes", "64", "5"], "-n 3"),
    (["bench", "tp", "-n", "0"], "argument -n"),
]


@pytest.mark.parametrize("argv,names", USER_ERRORS, ids=[" ".join(a) for a, _ in USER_ERRORS])
def test_user_errors_are_one_line_before_any_rank(argv, names, capsys, monkeypatch):
    code, out, err = in_process(argv, capsys, monkeypatch)
    assert code == 2 and not out, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("minipar") and "error: " in err and names in err, err


def test_a_usage_error_from_any_verb_is_one_line(capsys, monkeypatch):
    """What the lab lookup raises for ``minipar check 07``; a plain ValueError is a bug and is not hidden."""
    import minipar.labs.grader
    from minipar.errors import UsageError

    def no_such_lab(args):
        raise UsageError(f"no lab {args.lab!r}: see `minipar lessons`")

    monkeypatch.setattr(minipar.labs.grader, "main", no_such_lab)
    assert in_process(["check", "07"], capsys, monkeypatch) == (2, "", "minipar: error: no lab '07': see `minipar lessons`\n")
    monkeypatch.setattr(minipar.labs.grader, "main", lambda args: int("07x"))
    with pytest.raises(ValueError, match="invalid literal"):
        in_process(["check", "07"], capsys, monkeypatch)


def test_tp_size_that_does_not_divide_is_one_line_from_the_shell():
    out = minipar("run", "-n", "5", "tensor_parallel")
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr == ("minipar: error: -n 5: the tensor-parallel model (d_model=48, n_heads=24, d_hidden=96, "
                          "tokens T=24) does not split over 5 ranks; use -n 1, 2, 3, 4, 6, 8, 12 or 24\n")


# --------------------------------------------------------------------------- sizes and -n


@pytest.mark.parametrize("text,size", [("8", 8), ("4K", 4096), ("4k", 4096), ("16M", 16 << 20), ("64MiB", 64 << 20),
                                       ("1G", 1 << 30), ("1.5K", 1536), ("8B", 8), ("2 KiB", 2048)])
def test_human_sizes(text, size):
    from minipar.cli.common import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["16MB", "0", "-4", "1.3", "abc", "4X", "1.5"])
def test_sizes_that_are_not_sizes(text):
    import argparse

    from minipar.cli.common import parse_size

    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        parse_size(text)


def test_minus_n_is_the_number_of_ranks_in_every_verb():
    from minipar.cli import build_parser

    parser = build_parser()
    for argv in (["tour", "-n", "3"], ["run", "-n", "3", "collectives"], ["run", "pipeline", "-n", "3"],
                 ["bench", "collectives", "-n", "3"], ["schedule", "1f1b", "-n", "3"]):
        args = parser.parse_args(argv)
        assert getattr(args, "n", getattr(args, "stages", None)) == 3, argv
    assert parser.parse_args(["bench", "tp", "-n", "2", "3"]).n == [2, 3]  # one job per rank count


# --------------------------------------------------------------------------- verbs do not vanish


def test_a_verb_that_fails_to_import_says_so(tmp_path, monkeypatch, capsys):
    from minipar import cli
    from minipar.course import LESSONS, Lesson

    (tmp_path / "needs_torch_verb.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    (tmp_path / "broken_verb.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = [Lesson(f"9{i}", f"extra{i}", "a lesson whose verbs do not import", "x:tour", cli=module)
             for i, module in enumerate(["needs_torch_verb", "broken_verb", "minipar.no_such_verb"])]
    parser = cli.build_parser(LESSONS + extra)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err  # the optional dependency is not an error
    assert "broken_verb" in err[0] and "No module named 'no_such_dependency_xyz'" in err[0]
    assert "minipar.no_such_verb" in err[1] and "ModuleNotFoundError" in err[1]
    assert "needs_torch_verb: needs torch" in parser.format_help()  # hidden, with a note in --help
    assert "schedule" in parser.format_help()  # the other verbs are still there


# --------------------------------------------------------------------------- defaults that mean something


def test_pipeline_run_defaults_are_the_documented_size():
    """The README's ``minipar run -n 4 pipeline ...`` runs at the size docs/benchmarks_pipeline.md measured."""
    import pathlib
    import re

    from minipar.cli import build_parser

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks_pipeline.md").read_text()
    width, batch = map(int, re.search(r"--width (\d+) --batch (\d+)", doc).groups())
    args = build_parser().parse_args(["run", "-n", "4", "pipeline", "--schedule", "1f1b", "--microbatches", "8"])
    assert (args.width, args.batch) == (width, batch)


def test_pipeline_run_says_why_measured_and_theory_differ():
    from minipar.cli.pipeline import why_they_differ

    r = {"costs": {"F": 0.010, "B": 0.016, "p2p": 0.002}, "measured_bubble_fraction": 0.40,
         "simulated_bubble_fraction": 0.33, "replayed_bubble_fraction": 0.37, "theory_bubble_fraction": 0.273}
    text = why_they_differ(r, 4)
    assert "+12.7 points" in text and "B = 1.60 F" in text and "p2p = 0.20 F" in text and "+3.0 points" in text
    assert "per-call overhead" not in text
    assert "per-call overhead" in why_they_differ({**r, "costs": {"F": 0.0005, "B": 0.001, "p2p": 0.0}}, 2)


# --------------------------------------------------------------------------- progress


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_run_shows_progress_while_it_runs():
    """The first line arrives through a pipe while the ranks still run (not all at the end)."""
    proc = subprocess.Popen([sys.executable, "-m", "minipar", "run", "-n", "2", "collectives"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    running = proc.poll() is None
    rest, err = proc.communicate(timeout=110)
    assert proc.returncode == 0, first + rest + err
    assert "on 2 ranks" in first and running, first
    assert "checks ran in" in rest


def test_verbs_live_only_in_the_cli_and_nothing_below_it_imports_it():
    """A verb (a subcommand parser) is added only under minipar/cli/; no technique, lesson, lab, figure
    or benchmark module imports minipar.cli (``python -m minipar`` in minipar/__main__.py is its entry)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "minipar"
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("cli/") or rel == "__main__.py":
            continue
        package = ["minipar", *rel.split("/")[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                names = [".".join(base + ([node.module] if node.module else []) + [a.name]) for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                names = []
            bad += [f"{rel}:{node.lineno} imports {n}" for n in names if n == "minipar.cli" or n.startswith("minipar.cli.")]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("add_parser", "add_subparsers"):
                bad.append(f"{rel}:{node.lineno} adds a verb ({node.func.attr})")
    assert not bad, "\n".join(bad)
    common = ast.parse((root / "cli" / "common.py").read_text())  # the bottom of the cli: it imports no other cli module
    assert not [n.module for n in ast.walk(common) if isinstance(n, ast.ImportFrom) and n.level == 1]


def test_a_reader_that_leaves_early_gets_no_traceback():
    # ``minipar lessons | head -1``: the pipe closes while minipar still writes
    proc = subprocess.Popen([sys.executable, "-m", "minipar", "lessons"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


BAD_VALUES = [  # argv, what the one line must name: each once a traceback, a hang or a wrong success
    (["train", "--heads", "0"], "argument --heads"),
    (["train", "--d-model", "0"], "argument --d-model"),
    (["train", "--seq-len", "0"], "argument --seq-len"),
    (["train", "--seq-len", "-4"], "argument --seq-len"),
    (["train", "--lr", "nan"], "argument --lr: expected a finite number"),
    (["train", "--lr", "inf"], "argument --lr: expected a finite number"),
    (["train", "--layers", "1000000000000"], "at most 4,096"),
    (["train", "--layers", "4096", "--d-model", "4096"], "parameters: at most 2,000,000,000"),
    (["generate", "--checkpoint", "ck", "-n", "0", "--tp", "0"], "argument -n"),
    (["generate", "--checkpoint", "ck", "--tokens", "-1"], "argument --tokens"),
    (["generate", "--checkpoint", "ck", "--eval", "-5"], "argument --eval"),
    (["train", "--json", "nodir/x.json"], "'nodir' does not exist"),
    (["train", "--trace", "nodir/t.json"], "'nodir' does not exist"),
    (["run", "-n", "2", "collectives", "--json", "nodir/x.json"], "'nodir' does not exist"),
    (["run", "-n", "2", "collectives", "--trace", "nodir/t.json"], "'nodir' does not exist"),
    (["bench", "collectives", "--json", "nodir/x.json"], "'nodir' does not exist"),
    (["schedule", "1f1b", "--json", "nodir/x.json"], "'nodir' does not exist"),
    (["memory", "--params", "1e9", "--json", "nodir/x.json"], "'nodir' does not exist"),
    (["bench", "collectives", "--algorithms", "nosuch"], "invalid choice: 'nosuch'"),
    (["plan", "--gpus", "1000000000000", "--global-batch", "8", "--model", "gpt3-175b"], "at most 131,072"),
    (["schedule", "1f1b", "--stages", "100000", "--microbatches", "100000"], "at most 4,096"),
    (["schedule", "1f1b", "--stages", "1000", "--microbatches", "1000"], "1,000,000 forward actions: at most 50,000"),
    (["run", "-n", "1000000000000", "collectives"], "at most 1024"),
    (["memory", "--params", "1e400"], "argument --params: expected a finite number"),
    (["memory", "--params", "-1"], "argument --params: expected a number > 0"),
    (["--watchdog", "nan", "lessons"], "argument --watchdog"),
]


@pytest.mark.parametrize("argv,names", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_values_are_one_line_before_any_rank(argv, names, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(argv, capsys, monkeypatch)
    assert code == 2 and not out, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("minipar") and "error: " in err and names in err, err


def test_a_bad_watchdog_variable_is_one_line_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("MINIPAR_WATCHDOG", "abc")
    code, out, err = in_process(["run", "-n", "2", "collectives"], capsys, monkeypatch)
    assert (code, out) == (2, "") and err == "minipar: error: MINIPAR_WATCHDOG must be a number of seconds >= 0 (0 = off), got 'abc'\n"


def fake_checkpoint(monkeypatch, step=5):
    import minipar.train.checkpoint
    from minipar.train.config import DEFAULT_MODEL

    index = {"model": dict(DEFAULT_MODEL), "train": {"batch": 32, "lr": 0.003}, "step": step}
    monkeypatch.setattr(minipar.train.checkpoint, "read_index", lambda d: (d, index))


@pytest.mark.parametrize("steps", ["3", "5"])
def test_resume_to_a_step_the_checkpoint_passed_is_one_line(steps, capsys, monkeypatch):
    fake_checkpoint(monkeypatch)
    code, out, err = in_process(["train", "--resume", "ck", "--steps", steps], capsys, monkeypatch)
    assert (code, out) == (2, "") and err.count("\n") == 1 and "the checkpoint is at step 5" in err, err


@pytest.mark.parametrize("flag, value, key", [("--d-model", "128", "d_model"), ("--layers", "7", "n_layers"),
                                               ("--batch", "8", "batch"), ("--lr", "0.5", "lr")])
def test_resume_refuses_a_flag_the_checkpoint_contradicts(flag, value, key, capsys, monkeypatch):
    # the model and its training settings come from the checkpoint: a flag saying otherwise was
    # silently ignored, so the run trained something else than asked
    fake_checkpoint(monkeypatch)
    code, out, err = in_process(["train", "--resume", "ck", "--steps", "9", flag, value], capsys, monkeypatch)
    assert (code, out) == (2, "") and err.count("\n") == 1 and f"{flag}={value}" in err and key in err, err


def test_resume_accepts_flags_that_agree_with_the_checkpoint(capsys, monkeypatch):
    from minipar.train.config import DEFAULT_MODEL

    fake_checkpoint(monkeypatch)
    argv = ["train", "--resume", "ck", "--steps", "9", "--d-model", str(DEFAULT_MODEL["d_model"]), "--batch", "32"]
    with pytest.raises(AssertionError, match="ranks were launched"):  # it got as far as launching
        in_process(argv, capsys, monkeypatch)


def test_an_empty_prompt_is_one_line(capsys, monkeypatch):
    fake_checkpoint(monkeypatch)
    code, out, err = in_process(["generate", "--checkpoint", "ck", "--prompt", ""], capsys, monkeypatch)
    assert (code, out) == (2, "") and err.count("\n") == 1 and "--prompt ''" in err, err


@pytest.mark.parametrize("made", [False, True])
def test_generate_without_a_checkpoint_says_how_to_make_one(made, tmp_path, capsys, monkeypatch):
    ck = tmp_path / "ckpt"
    if made:
        ck.mkdir()  # an empty folder: a train that has not saved yet
    code, out, err = in_process(["generate", "--checkpoint", str(ck)], capsys, monkeypatch)
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"minipar train -n 1 --steps 300 --save {ck}" in err, err


@pytest.mark.parametrize("verb", ["train", "generate"])
def test_a_failed_job_is_one_line_and_its_output_once(verb, capsys, monkeypatch):
    import minipar.launcher
    from minipar.launcher import LaunchError

    if verb == "generate":
        fake_checkpoint(monkeypatch)
    output = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'w'\n"

    def killed(*args, **kwargs):
        raise LaunchError(f"job failed\n{output}", output=output, returncode=1, line="rank 1 raised KeyError: 'w'")

    monkeypatch.setattr(minipar.launcher, "launch", killed)
    argv = [verb, "--checkpoint", "ck"] if verb == "generate" else [verb, "--steps", "2"]
    code = cli_main(argv)
    out = capsys.readouterr()
    assert code == 1
    assert out.err.endswith(f"minipar {verb}: error: rank 1 raised KeyError: 'w'\n"), out.err
    # train echoes the ranks' output as they run; generate is quiet, so it prints it here, once
    assert (out.out + out.err).count("\nKeyError: 'w'\n") == (1 if verb == "generate" else 0) and "launcher.py" not in out.err


def cli_main(argv):
    from minipar import cli

    try:
        return cli.main(argv)
    except SystemExit as exit_:
        return exit_.code
