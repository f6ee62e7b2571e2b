"""The grading rules of minipar.labs.checks on their own (one process, no ranks): each rule
passes the right thing and refuses the wrong one. The labs' tests (test_labs.py) then show
them refusing real solutions that skip the technique."""
import pathlib
import sys

import numpy as np
import pytest

from minipar.labs import checks
from minipar.trace import shown
from minipar.trace import Event


class FakeBuiltin:
    def all_reduce(self, x):
        return x


class FakeComm:
    def __init__(self, rank=0, size=2):
        self.rank, self.size, self.builtin = rank, size, FakeBuiltin()

    def world_rank(self, r):
        return r


def events(*sends):
    return [Event(0, kind, "world", 0.0, 1.0, nbytes, peer) for kind, nbytes, peer in sends]


def test_ring_traffic_counts_every_chunk_but_the_skipped_one():
    # 7 elements on 3 ranks: chunks of 3, 2, 2; rank 1 sends chunks 0 and 2 in the
    # reduce-scatter (not its own), chunks 0 and 1 in the all-gather (not its right neighbour's)
    assert checks.ring_traffic([3, 2, 2], 1, 8, ("reduce-scatter",)) == (5 * 8, 2)
    assert checks.ring_traffic([3, 2, 2], 1, 8, ("all-gather",)) == (5 * 8, 2)
    assert checks.ring_traffic([3, 2, 2], 2, 8) == ((5 + 4) * 8, 4)  # all-gather skips chunk 0
    assert checks.ring_traffic([1, 1, 0, 0], 0, 8, ("reduce-scatter",)) == (8, 1)  # empty chunks: no message
    assert checks.ring_traffic([5], 0, 8) == (0, 0)


def test_expect_traffic_passes_the_exact_count_and_names_each_mistake():
    comm = FakeComm()
    ok = checks.Graded(None, events(("sendrecv", 16, 1), ("isend", 16, 1)))
    assert checks.expect_traffic(comm, ok, "a ring", 32, 2, [1]) == []
    none = checks.Graded(None, [])
    assert "sent 0 bytes through comm" in checks.expect_traffic(comm, none, "a ring", 32, 2)[0]
    assert "did you use a builtin collective" in checks.expect_traffic(comm, none, "a ring", 32, 2)[0]
    assert "sent 48 bytes" in checks.expect_traffic(comm, checks.Graded(None, events(("send", 48, 1))), "a ring", 32)[0]
    one = checks.Graded(None, events(("send", 32, 1)))
    assert "sent 1 messages" in checks.expect_traffic(comm, one, "a ring", 32, 2)[0]
    assert "sent to ranks [0]" in checks.expect_traffic(comm, checks.Graded(None, events(("send", 32, 0))),
                                                        "a ring", 32, 1, [1])[0]


def test_builtin_calls_are_recorded_during_the_call_only_and_the_class_is_restored():
    comm = FakeComm()
    method = FakeBuiltin.all_reduce
    log = []
    with checks._record_builtin(comm, log):
        assert comm.builtin.all_reduce(3) == 3  # the call still runs
    assert log == ["all_reduce"] and FakeBuiltin.all_reduce is method
    comm.builtin.all_reduce(3)
    assert log == ["all_reduce"]
    msg = checks.no_builtin(comm, checks.Graded(None, [], log), "f", "comm.sendrecv")
    assert "called comm.builtin.all_reduce inside f" in msg[0] and "use comm.sendrecv" in msg[0]
    assert checks.no_builtin(comm, checks.Graded(None, []), "f", "x") == []


def test_poisoned_keeps_only_the_owned_part():
    a = np.arange(12.0).reshape(3, 4)
    p = checks.poisoned(a, (slice(None), slice(1, 3)))
    assert np.array_equal(p[:, 1:3], a[:, 1:3]) and np.isnan(p[:, [0, 3]]).all()
    comm = FakeComm()
    msg = checks.compare(comm, p.sum(axis=1), a.sum(axis=1), "the sum", "case", owns="columns 1:3")
    assert "is NaN at element 0" in msg[0] and "it holds only columns 1:3" in msg[0]
    assert checks.compare(comm, p[:, 1:3].sum(axis=1), a[:, 1:3].sum(axis=1), "the sum", "case") == []


def test_watched_sees_the_whole_matrix_used_but_not_a_slice():
    x, w = np.ones((2, 4)), checks.watched(np.ones((4, 6)))
    own = {"w": (w, 12, "columns 0:3")}
    comm = FakeComm()
    y = x @ w[:, :3] + 1.0  # slice first: 12 elements of w
    assert type(y) is np.ndarray and checks.used_only_own(comm, own, "f") == []
    (x @ w)[:, :3]  # the whole product, sliced afterwards
    assert "computed with 24 elements of w at once" in checks.used_only_own(comm, own, "f")[0]
    w2 = checks.watched(np.ones((4, 6)))
    np.dot(x, w2)
    assert max(w2.log) == 24


def test_watched_tensor_sees_what_watched_sees():
    """The torch twin: views and copies stay watched, what a computation returns is plain, and the
    whole matrix used (then sliced) is refused with the NumPy version's message."""
    torch = pytest.importorskip("torch")
    x = torch.ones((2, 4), dtype=torch.float64)
    w = checks.watched(torch.ones((4, 6), dtype=torch.float64))
    own = {"w": (w, 12, "columns 0:3")}
    comm = FakeComm()
    y = x @ w[:, :3] + 1.0  # slice first: 12 elements of w
    assert type(y) is torch.Tensor and checks.used_only_own(comm, own, "f") == []
    v = w.T.reshape(6, 4)[:3].clone().contiguous()  # views and copies compute nothing
    assert v.log is w.log and w.log == [12]
    assert [c.log is w.log for c in w.split(3, dim=1)] == [True, True] and w.shape == (4, 6)
    (x @ w)[:, :3]  # the whole product, sliced afterwards
    assert "computed with 24 elements of w at once" in checks.used_only_own(comm, own, "f")[0]
    w2 = checks.watched(torch.ones((4, 6), dtype=torch.float64))
    torch.einsum("ij,jk->ik", x, w2).sum()
    w2.sum(axis=0)
    assert w2.log == [24, 24]
    p = checks.poisoned(torch.arange(12.0).reshape(3, 4), (slice(None), slice(1, 3)))
    assert torch.isnan(p[:, [0, 3]]).all() and not torch.isnan(p[:, 1:3]).any()


def test_memory_counts_what_the_call_holds_not_what_the_grader_does_inside_it():
    mem = checks.Memory()
    kept = []
    with mem:
        kept.append(np.ones(10_000))  # 80 kB held
        with mem.paused():
            np.ones(100_000).sum()  # the grader's temporary, 800 kB
    assert 80_000 <= mem.peak < 120_000
    assert checks.held_at_most(FakeComm(), checks.Graded(None, [], peak=mem.peak), 50_000, "f", "the rule")
    assert not checks.held_at_most(FakeComm(), checks.Graded(None, [], peak=mem.peak), 200_000, "f", "the rule")


# --------------------------------------------------------------------------- whose messages, whose code

LIBRARY = pathlib.Path(checks.__file__).resolve().parents[1]  # .../minipar
HERE = str(pathlib.Path(__file__).resolve())


def learners_fn(comm, x):
    return x


def made(*frames, kind="send", nbytes=8, peer=1):
    """One event whose origin is ``frames``: (path relative to minipar/ or absolute, line, function)."""
    origin = tuple((f if f.startswith("/") else str(LIBRARY / f), line, name) for f, line, name in frames)
    return checks.Graded(None, [Event(0, kind, "world", 0.0, 1.0, nbytes, peer, origin)])


def test_trace_origin_is_the_chain_from_the_caller_out_to_the_users_line():
    from minipar.trace import origin

    def send_here():
        return origin(), sys._getframe().f_lineno

    chain, line = send_here()
    assert chain == ((HERE, line, "send_here"),)  # outside minipar: the chain stops at the user's frame


def test_sent_by_learner_passes_the_learners_messages_and_names_minipars():
    comm, learner = FakeComm(), (HERE, 12, "learners_fn")
    ring = [("collectives.py", 140, "ring_steps"), ("collectives.py", 225, "all_reduce"), learner]
    assert checks.sent_by_learner(comm, made(learner), learners_fn, "f", "comm.send") == []
    assert checks.sent_by_learner(comm, made(*ring), learners_fn, "f", "x", checks.COLLECTIVES) == []
    msg = checks.sent_by_learner(comm, made(*ring, kind="irecv"), learners_fn, "ring_all_reduce", "comm.sendrecv")
    assert msg == [f"rank 0's irecv from rank 1 (8 bytes) was made by minipar's own code, "
                   f"{shown(str(LIBRARY / 'collectives.py'))}:140 in ring_steps(), called at "
                   f"{shown(HERE)}:12: write ring_all_reduce's messages yourself, with comm.sendrecv"]
    # through minipar.collectives, but called by minipar's answer (the lab's solution module)
    answer = ring[:2] + [("labs/lab04_solution.py", 9, "average_gradients"), learner]
    msg = checks.sent_by_learner(comm, made(*answer), learners_fn, "average_gradients", "x", checks.COLLECTIVES)
    assert "was made by minipar's own code, " in msg[0] and "lab04_solution.py:9 in average_gradients()" in msg[0]
    # a callback the grader handed the learner (the pipeline of a training step) sends the grader's messages
    callback = [("pipeline/execute.py", 200, "run_schedule"), ("labs/lab05_step.py", 70, "pipeline"), learner]
    assert checks.sent_by_learner(comm, made(*callback), learners_fn, "train_step", "x", checks.COLLECTIVES) == []
    # minipar's answer graded as the reference (--solution) is minipar's by design; events without origin are skipped
    from minipar.labs.lab01_solution import ring_all_reduce
    assert checks.sent_by_learner(comm, made(*ring), ring_all_reduce, "ring_all_reduce", "x") == []
    assert checks.sent_by_learner(comm, checks.Graded(None, events(("send", 8, 1))), learners_fn, "f", "x") == []


LEARNER = '''
from minipar.pipeline import schedules as S


def gpipe(p, m):
    return S.gpipe(p, m).actions


def bubble_fraction(events, p):
    from minipar.labs import lab03_solution
    return lab03_solution.bubble_fraction(events, p)
'''


def test_answers_see_minipars_answer_run_inside_the_learners_call_however_it_was_reached(tmp_path):
    import importlib.util

    from minipar.pipeline import schedules

    path = tmp_path / "exercise.py"
    path.write_text(LEARNER)
    spec = importlib.util.spec_from_file_location("exercise_under_test", path)
    mine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mine)
    before = sys.getprofile()
    with checks.Answers(["minipar.pipeline.schedules:gpipe", "minipar.labs.lab03_solution:gpipe"], str(path)) as ran:
        schedules.gpipe(2, 2)  # the check's own call of the reference: not the learner's
        assert ran.refused("gpipe") == []
        mine.gpipe(2, 2)  # through a module alias
    assert sys.getprofile() is before
    assert ran.refused("gpipe") == [f"gpipe ran minipar's own minipar.pipeline.schedules.gpipe (called at {path}:6: "
                                    f"return S.gpipe(p, m).actions): write gpipe yourself"]
    with checks.Answers(["minipar.labs.lab03_solution:bubble_fraction"], str(path)) as ran:
        mine.bubble_fraction([(0, 0, 1), (1, 0, 1)], 2)  # the solution module, imported inside the function
    assert "bubble_fraction ran minipar's own minipar.labs.lab03_solution.bubble_fraction" in ran.refused("bubble_fraction")[0]
    with checks.Answers(["minipar.pipeline.schedules:gpipe"], None) as ran:  # minipar's reference graded: no watch
        mine.gpipe(2, 2)
    assert ran.refused("gpipe") == []


def test_attempt_says_not_implemented_or_invalid_and_ranks_agree_in_number():
    def missing():
        raise NotImplementedError("lab 3.1")

    def broken():
        raise KeyError("no such stage")

    assert checks.attempt(lambda: 3) == (3, None)
    assert checks.attempt(missing) == (None, "not implemented yet (lab 3.1)")
    assert checks.attempt(broken, {LookupError: "not a valid schedule"}) == (None, "not a valid schedule:\n'no such stage'")
    assert (checks.ranks(1), checks.ranks(3)) == ("1 rank", "3 ranks")
