"""Bad arguments raise a clear error naming the argument (a world of one rank, in-process)."""
import os
import sys

import numpy as np
import pytest

import minipar
from minipar import collectives as C


@pytest.fixture(scope="module")
def comm():
    return minipar.init("mpi", watchdog=0)


def test_world_of_one(comm):
    assert (comm.rank, comm.size) == (0, 1)
    x = np.random.default_rng(0).standard_normal(5)
    for alg in C.ALGORITHMS:
        np.testing.assert_array_equal(C.all_reduce(comm, x, alg), x)


@pytest.mark.parametrize("call, match", [
    (lambda c, x: C.all_reduce(c, x, algorithm="butterfly"), "algorithm='butterfly'"),
    (lambda c, x: C.all_reduce(c, x, op="mean"), "op='mean'"),
    (lambda c, x: C.broadcast(c, x, root=3), "root=3"),
    (lambda c, x: C.reduce(c, x, root=-1), "root=-1"),
    (lambda c, x: C.all_to_all(c, x[:5].reshape(5)) if False else C.all_gather(c, x, counts=[1, 2]), "counts="),
    (lambda c, x: c.send(x, 1), "dst=1"),
    (lambda c, x: c.recv(x, 2), "src=2"),
    (lambda c, x: c.send(x, 0, tag=-1), "tag=-1"),
    (lambda c, x: c.send(x[::2], 0), "C-contiguous"),
    (lambda c, x: c.send([1.0, 2.0], 0), "expected a numpy array"),
    (lambda c, x: c.split(-2), "color=-2"),
    (lambda c, x: minipar.init("nccl"), "backend='nccl'"),
    (lambda c, x: minipar.init("mpi", device="cuda"), "device='cuda'"),
    (lambda c, x: minipar.launch(0, "minipar.lessons.faults:raise_on"), "n=0"),
    (lambda c, x: minipar.launch(2, "no_colon"), "module:function"),
])
def test_bad_arguments(comm, call, match):
    x = np.random.default_rng(1).standard_normal(6)
    with pytest.raises((ValueError, TypeError), match=match.replace("(", r"\(").replace("[", r"\[")):
        call(comm, x)


def test_all_to_all_needs_divisible_length():
    from types import SimpleNamespace

    fake = SimpleNamespace(size=4, rank=0)
    with pytest.raises(ValueError, match=r"x.shape\[0\]=6 must be divisible by the number of ranks p=4"):
        C.all_to_all(fake, np.zeros(6))


def test_torch_tensor_on_mpi_backend_is_refused(comm):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="use minipar.init\\(backend='torch'\\)"):
        comm.send(torch.ones(2), 0)


def test_a_caught_error_leaves_no_stale_watchdog_state(comm):
    """An exception inside a blocking call, caught by the caller, must not leave the watchdog
    believing the rank is still blocked (it would later report, or fire on, a call long gone)."""
    x = np.random.default_rng(2).standard_normal(4)
    req = comm.isend(x, 0, tag=3)
    with pytest.raises(ValueError, match="larger than buf"):
        comm.recv(np.empty(3), 0, tag=3)  # truncated: MPI raises inside the call
    assert comm.watchdog.state is None  # checked before any other call could clear it
    assert comm.watchdog.describe().startswith("not in a communication call")
    assert comm.watchdog.last[0] == "recv from rank 0 tag 3 (24 bytes)"
    req.wait()
    with pytest.raises(ZeroDivisionError):  # any exception, any call
        comm.watchdog.call("barrier on world", lambda: 1 / 0)
    assert comm.watchdog.state is None


def test_zero_d_arrays_keep_their_shape():
    from minipar.xp import contiguous, from_numpy

    assert contiguous(np.float64(2.5)).shape == ()
    assert from_numpy(np.float64(2.5), np.zeros(3, dtype=np.float32)).shape == ()


def test_the_report_names_the_users_line():
    from minipar import collectives
    from minipar.comm.watchdog import user_line

    line, lineno = user_line(sys._getframe()), sys._getframe().f_lineno
    assert line == f"tests/test_comm_args.py:{lineno}: line, lineno = user_line(sys._getframe()), sys._getframe().f_lineno"

    def inside_the_library():  # a frame of minipar.collectives is skipped for its caller's
        return eval(compile("sys._getframe()", collectives.__file__, "eval"), {"sys": sys})

    frame = inside_the_library()
    assert frame.f_code.co_filename.endswith("minipar/collectives.py")
    assert user_line(frame).startswith("tests/test_comm_args.py:")


def test_the_report_skips_the_engines_frames_for_the_users_line():
    # a torch rank blocked in a receive waits in torch.distributed's ``work.wait()``: that line is
    # the engine's, and the report must name the user's call that led there
    import sysconfig

    from minipar.comm.watchdog import user_line

    engine = os.path.join(sysconfig.get_paths()["purelib"], "torch", "distributed", "distributed_c10d.py")

    def inside_the_engine():
        return eval(compile("sys._getframe()", engine, "eval"), {"sys": sys})

    frame = inside_the_engine()
    assert frame.f_code.co_filename == engine
    assert user_line(frame).startswith("tests/test_comm_args.py:"), user_line(frame)


def test_sendrecv_announces_both_peers_and_tags(comm):
    seen = []  # what the watchdog would report while inside the call (the call itself is faked:
    x = np.random.default_rng(3).standard_normal(4)  # on one rank, tags 5 and 6 never match)
    comm._sendrecv = lambda *a: seen.append(comm.watchdog.describe())
    try:
        comm.sendrecv(x, 0, np.empty(4), 0, sendtag=5, recvtag=6)
    finally:
        del comm._sendrecv
    assert seen[0].startswith("blocked in sendrecv to rank 0 tag 5 (32 bytes) and from rank 0 tag 6 (32 bytes) for ")
    assert "; at tests/test_comm_args.py:" in seen[0]  # (the fake's own line: it is user code)


def test_bad_backend_is_refused_before_any_rank_starts(monkeypatch):
    import minipar.launcher as L
    from minipar.errors import UsageError

    monkeypatch.setattr(L, "run_streaming", lambda *a, **k: pytest.fail("ranks were launched"))
    for kw, match in [({"backend": "nccl"}, "backend='nccl'"), ({"device": "cuda"}, "device='cuda'"),
                      ({"backend": "torch", "device": "tpu"}, "device='tpu'")]:
        with pytest.raises(UsageError, match=match):
            minipar.launch(2, "minipar.lessons.faults:raise_on", **kw)


@pytest.mark.parametrize("output, line, usage", [
    ("rank 0: error: n=5 does not divide 4\nrank 2: error: n=5 does not divide 4\nAbort(1) on node 0\n",
     "rank 0: error: n=5 does not divide 4", True),
    ("rank 2 raised:\n[rank2]: Traceback (most recent call last):\n[rank2]:   File \"x.py\", line 3, in f\n"
     "[rank2]:     g()\n[rank2]: KeyError: 'w'\nAbort(1) on node 2\n", "rank 2 raised KeyError: 'w'", False),
    ("note: rank 1: error: is only quoted here\nminipar watchdog: rank 1 made no progress for 2 s (a deadlock). "
     "What every rank is doing:\n  rank 0: blocked in recv from rank 1 tag 0 (8 bytes) for 2.1 s\n",
     "minipar watchdog: rank 1 made no progress for 2 s (a deadlock).", False),
    ("something\nminipar: job killed after 9 s (hard time limit)\n", "minipar: job killed after 9 s (hard time limit)", False),
])
def test_launch_error_carries_one_line(output, line, usage):
    from minipar.launcher import failure

    err = failure(3, "m:f", 124 if "killed" in output else 1, output)
    assert (err.line, err.usage) == (line, usage)
    assert (str(err) == line) is usage  # a usage error is that line alone; others add the output's tail


def test_nccl_fallback_says_why(monkeypatch):
    torch = pytest.importorskip("torch")
    from minipar.comm.torch_backend import choose_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert choose_engine("cpu", 4) == ("gloo", None)
    assert choose_engine("cuda", 1) == ("nccl", None)
    engine, why = choose_engine("cuda", 4)
    assert engine == "gloo" and "4 ranks on 1 GPU" in why and "NCCL needs a GPU per rank" in why
