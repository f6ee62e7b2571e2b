"""Lesson 05 checkpoints: saved on one grid, resumed on another with the uninterrupted losses; one
writer per folder, damaged or mismatched files named, a kill at any moment leaves one to resume."""
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from minipar import launch
from minipar.launcher import LaunchError
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, ODD, SHORT, make_config

CASES = [
    (dict(dp=2, pp=2, tp=2, schedule="1f1b", microbatches=2, zero=1),
     [dict(dp=1, pp=4, tp=2, schedule="zb-h1", microbatches=2), dict(dp=1, pp=1, tp=1)]),
    (dict(model=ODD, batch=12, dp=2, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True),
     [dict(dp=1, pp=3, tp=1, schedule="1f1b", microbatches=3), dict(dp=3, pp=1, tp=1, zero=1)]),
    # a change of cp: saved on cp = 2 (ZeRO-1 over dp x cp), resumed on cp = 1 and on cp = 4 with Ulysses
    (dict(model=SHORT, dp=2, pp=1, cp=2, tp=1, zero=1),
     [dict(dp=1, pp=1, cp=1, tp=1), dict(dp=1, pp=1, cp=4, tp=2, cp_attention="ulysses")]),
    # experts written by the ranks that hold them; resumed with the same dp and m (the same routing groups)
    (dict(model=MOE, dp=2, pp=1, tp=1, microbatches=2), [dict(dp=2, pp=2, tp=1, microbatches=2)]),
]


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_resume_on_other_grids_continues_the_same_losses(tmp_path):
    out = launch(8, "minipar.lessons.train:check_checkpoint_cases", quiet=True, job_timeout=600, directory=str(tmp_path), cases=CASES)
    rows = merge_rows(out.results)
    assert len(rows) == sum(len(resumed) + 2 for _, resumed in CASES)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert sorted(os.listdir(tmp_path / "case0")) == [".lock", "latest", "step000003", "step000006"]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path):
    from minipar.train.checkpoint import load_full, read_index

    with pytest.raises(LaunchError):
        launch(1, "minipar.lessons.train:save_then_crash", quiet=True, directory=str(tmp_path))
    assert os.path.exists(tmp_path / ".tmp-step000002" / "index.json")  # written, never committed
    path, index = read_index(str(tmp_path))
    assert path.endswith("step000001") and index["step"] == 1
    _, full = load_full(str(tmp_path))
    assert set(full["param"]) == set(full["m"]) == set(full["v"]) and "embed.wte" in full["param"]


@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_greedy_generation_is_identical_at_tp_1_2_4(tmp_path):
    out = launch(4, "minipar.lessons.train:check_generation", quiet=True, job_timeout=600, directory=str(tmp_path))
    rows = out.results[0]
    assert [r["what"] for r in rows][:2] == ["generation at TP=4: KV cache = no cache", "greedy tokens identical at TP = 1, 2, 4"]
    assert all(r["ok"] for r in rows)
    assert set(rows[-1]["times"]) == {1, 2, 4}


@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_a_local_argmax_is_caught_by_the_tp_identity_check(tmp_path):
    """Wrong way: each rank's own best column as the next token differs between TP sizes."""
    out = launch(4, "minipar.lessons.train:check_generation", quiet=True, job_timeout=600, directory=str(tmp_path),
                 mutant="local_argmax", tps=(1, 4))
    named = [r for r in out.results[0] if r["what"].startswith("greedy tokens identical")]
    assert named and not named[0]["ok"]


# ---------------------------------------------------------------- faults, on a world of one, in-process

@pytest.fixture(scope="module")
def comm():
    import minipar

    return minipar.init("mpi", watchdog=0)


def trained(comm, directory, steps=1, save_every=1):
    """A 1-rank trainer after ``steps`` steps, checkpointed into ``directory`` every ``save_every``."""
    from minipar.lessons.train import make_config
    from minipar.train.trainer import train

    tr, _, _ = train(comm, make_config(steps=steps), save=str(directory), save_every=save_every)
    return tr


@pytest.mark.timeout(60)
def test_a_flipped_block_in_a_shard_is_named_on_load(comm, tmp_path):
    """4 KiB overwritten inside a shard's data: the load refuses it, naming the file, in one line."""
    from minipar.errors import UsageError
    from minipar.train.checkpoint import load_full

    trained(comm, tmp_path)
    shard = tmp_path / "step000001" / "rank00000.safetensors"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
    shard.write_bytes(bytes(data))
    with pytest.raises(UsageError) as err:
        load_full(str(tmp_path))
    assert "\n" not in str(err.value) and str(shard) in str(err.value) and "sha256" in str(err.value)


@pytest.mark.timeout(60)
def test_a_crash_during_the_first_save_resumes_from_the_newest_complete_step(comm, tmp_path, monkeypatch):
    """The first checkpoint renamed into place, the process dead before it wrote ``latest``: a
    resume finds the step all the same (it used to answer "No such file ... index.json")."""
    from minipar.train.checkpoint import load_full, read_index

    replace = os.replace

    def dies_at_latest(src, dst, **kw):
        if os.path.basename(dst) == "latest":
            raise KeyboardInterrupt("killed (planted) before latest was written")
        return replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", dies_at_latest)
    with pytest.raises(KeyboardInterrupt):
        trained(comm, tmp_path)
    monkeypatch.undo()
    assert not (tmp_path / "latest").exists() and (tmp_path / "step000001" / "index.json").exists()
    path, index = read_index(str(tmp_path))
    assert path.endswith("step000001") and index["step"] == 1
    assert "embed.wte" in load_full(str(tmp_path))[1]["param"]


@pytest.mark.timeout(60)
def test_a_kill_while_a_step_is_replaced_leaves_it_loadable(comm, tmp_path, monkeypatch):
    """Saving a step that exists (a second run into the same folder): killed at the moment the
    new folder is renamed into place, the folder still holds that step, complete."""
    from minipar.train.checkpoint import load_full, read_index

    tr = trained(comm, tmp_path, steps=2)
    rename, replace = os.rename, os.replace

    def dies_moving_the_new_folder_in(move):
        def moved(src, dst, **kw):
            if os.path.basename(src).startswith(".tmp-"):
                raise KeyboardInterrupt("killed (planted) while replacing the step")
            return move(src, dst, **kw)
        return moved

    monkeypatch.setattr(os, "rename", dies_moving_the_new_folder_in(rename))
    monkeypatch.setattr(os, "replace", dies_moving_the_new_folder_in(replace))
    from minipar.train.saving import save

    with pytest.raises(KeyboardInterrupt):
        save(tr, str(tmp_path), 2)
    monkeypatch.undo()
    path, index = read_index(str(tmp_path))
    assert index["step"] == 2
    _, full = load_full(str(tmp_path))
    assert set(full["param"]) == set(full["m"]) and "embed.wte" in full["param"]


@pytest.mark.timeout(60)
def test_stale_temporary_folders_go_only_with_the_lock(comm, tmp_path):
    """A crashed save's ``.tmp-step*``: a reader leaves it (a writer may be using it); the next
    writer, holding the folder's lock, removes it."""
    from minipar.train.checkpoint import read_index
    from minipar.train.saving import save

    tr = trained(comm, tmp_path)
    with pytest.raises(RuntimeError, match="planted"):
        save(tr, str(tmp_path), 2, crash_before_commit=True)
    read_index(str(tmp_path))
    assert (tmp_path / ".tmp-step000002").exists()
    save(tr, str(tmp_path), 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "latest", "step000001", "step000003"]


@pytest.mark.timeout(60)
def test_a_shape_that_does_not_fit_names_the_tensor(comm, tmp_path):
    """A piece the index says is larger than what the file holds, and an index whose model does
    not match the tensors: both name the tensor (it used to be numpy's "could not broadcast")."""
    import json

    from minipar.errors import UsageError
    from minipar.lessons.train import make_config
    from minipar.train.checkpoint import load_full, resume

    trained(comm, tmp_path)
    index_path = tmp_path / "step000001" / "index.json"
    original = json.loads(index_path.read_text())
    index = json.loads(index_path.read_text())
    piece = index["tensors"]["h.0.mlp.fc1.w"][0]
    piece["shard_shape"][0] *= 4
    index_path.write_text(json.dumps(index))
    with pytest.raises(UsageError, match=r"param h\.0\.mlp\.fc1\.w .*rank00000\.safetensors.* holds \d+ numbers, the index says \d+"):
        load_full(str(tmp_path))
    index = dict(original, model=dict(original["model"], d_hidden=original["model"]["d_model"] * 2))
    index_path.write_text(json.dumps(index))
    with pytest.raises(UsageError, match=r"h\.0\.mlp\.fc1\.w: the checkpoint holds shape \(16, 64\), its model \(16, 32\)"):
        resume(comm, make_config(steps=2), str(tmp_path))


def test_the_train_package_has_no_import_cycle():
    """Function-level imports count: checkpoint (resume builds a Trainer) -> trainer, and the
    trainer's loop saves through ``saving``, which imports neither."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "minipar" / "train"
    edges = {}
    for f in root.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        edges[f.stem] = deps & {g.stem for g in root.glob("*.py")}

    def reaches(a, b, seen=()):
        return any(d == b or (d not in seen and reaches(d, b, seen + (d,))) for d in edges.get(a, ()))

    assert [m for m in ("checkpoint", "saving", "trainer") if reaches(m, m)] == []


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_second_writer_fails_at_once_naming_the_holder(comm, tmp_path):
    """Two trainings saving into one folder: the second stops before its first step, naming the
    first (pid, host, command), in one line from the command line too."""
    from minipar.errors import UsageError

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-m", "minipar", "train", "-n", "1", "--steps", "100000", "--save-every", "1000",
                              "--save", str(tmp_path / "ckpt")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env)
    try:
        for line in first.stdout:
            if line.startswith("step "):
                break  # training: the folder is its own
        with pytest.raises(UsageError) as err:
            trained(comm, tmp_path / "ckpt")
        message = str(err.value)
        assert "\n" not in message and "ckpt" in message and "minipar train" in message, message
        assert re.search(rf"pid \d+ on {re.escape(socket.gethostname())}", message), message
        out = subprocess.run([sys.executable, "-m", "minipar", "train", "-n", "1", "--steps", "2", "--save", str(tmp_path / "ckpt")],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stdout + out.stderr
        assert out.stderr.startswith("minipar: error: rank 0: error: checkpoint folder") and "in use" in out.stderr, out.stderr
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGTERM


@pytest.mark.timeout(60)
def test_the_clips_norm_type_is_kept_and_resumed(comm, tmp_path):
    """A run clipped by the largest element (--clip-norm-type inf) resumes with that norm, not L2."""
    from minipar.train.checkpoint import resume
    from minipar.train.trainer import train

    cfg = make_config(model=SHORT, steps=2, clip=0.5, clip_norm_type=float("inf"))
    train(comm, cfg, save=str(tmp_path), save_every=1)
    tr, start = resume(comm, make_config(model=SHORT, steps=2), str(tmp_path / "step000001"))
    assert (start, tr.cfg.clip, tr.cfg.clip_norm_type) == (1, 0.5, float("inf"))
