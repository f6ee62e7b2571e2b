"""Lab 03: pipeline schedules, their bubbles, and the messages between stages.

Fill in each function below, then run it on real ranks and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/03_pipeline/exercise.py     # your schedules, their bubble, one real step
    torchrun --standalone --nproc-per-node 4 minipar-labs/03_pipeline/exercise.py   # the same, torch
    minipar check 03                                               # grade every task
    minipar check 03 --task 3.2                                    # grade one task
    minipar check 03 --backend torch                               # grade it on torch tensors

A schedule is data: one list of actions per rank. ``Action(stage, kind, microbatch)`` prints as
``1F3`` (stage 1, forward, micro-batch 3); kinds are "F" (forward) and "B" (backward). With one
stage per rank (this lab), stage s lives on rank s. The demo below (and the grader) checks
your schedules with minipar's validator and draws them as a grid (see the README).
"""
from typing import NamedTuple

import minipar


class Action(NamedTuple):
    """One step of a schedule: Action(1, "F", 3) is stage 1's forward of micro-batch 3 ("1F3")."""
    stage: int
    kind: str  # "F" forward, "B" backward (task 3.4 also meets "I" and "W": a split backward)
    microbatch: int

    def __str__(self):
        return f"{self.stage}{self.kind}{self.microbatch}"

    __repr__ = __str__


def act_tag(stage, microbatch, m):
    """The tag of the activation going *into* ``stage`` for ``microbatch`` (task 3.4)."""
    return 2 * (stage * m + microbatch)


def grad_tag(stage, microbatch, m):
    """The tag of the gradient coming back *into* ``stage`` (sent by stage + 1) (task 3.4)."""
    return 2 * (stage * m + microbatch) + 1


def gpipe(p, m):
    """GPipe (fill-drain) on p ranks with m micro-batches: a list of p lists of Action.

    Rank r runs the forwards of all m micro-batches on its stage r, in order, then their m
    backwards, also in order 0..m-1 (first in, first out, as torch's ScheduleGPipe does).
    p=2, m=2: [[0F0, 0F1, 0B0, 0B1], [1F0, 1F1, 1B0, 1B1]].
    """
    # TODO(lab3.1): two comprehensions per rank
    raise NotImplementedError("lab 3.1")


def one_f_one_b(p, m):
    """1F1B (PipeDream-Flush, Megatron) on p ranks with m micro-batches: a list of p lists of Action.

    Rank r warms up with min(p-1-r, m) forwards; then, while forwards are left, it runs one
    forward and then one backward (the oldest micro-batch still waiting); it cools down with
    the remaining backwards. Rank r then never holds more than min(p-r, m) micro-batches'
    activations: the grader checks that bound. Must work for m < p and m = 1 too.
    p=2, m=3: [[0F0, 0F1, 0B0, 0F2, 0B1, 0B2], [1F0, 1B0, 1F1, 1B1, 1F2, 1B2]].
    """
    # TODO(lab3.2): warm-up forwards, steady F/B pairs, cool-down backwards
    raise NotImplementedError("lab 3.2")


def bubble_fraction(events, p):
    """The bubble: the fraction of all rank-time spent idle, idle / (p * makespan).

    events: (rank, start, end) of every action that ran, on all p ranks (from
    minipar.pipeline.simulate, or from a measured trace: then times do not start at 0).
    The makespan runs from the first start to the last end; every rank is counted for the
    whole makespan, busy or not. Works with ints, floats and fractions.Fraction alike.
    """
    # TODO(lab3.3): total rank-time, minus the busy time, over the total rank-time
    raise NotImplementedError("lab 3.3")


def peer_and_tag(action, schedule):
    """The messages of one action on the executor: (recv, send), each (rank, tag) or None.

    recv: where the input of this action comes from; send: where its output goes.
    - F on stage s receives the activation from stage s-1 (stage 0 reads the data instead) and
      sends its output to stage s+1 (the last stage computes the loss instead).
    - B (and I, the input half of a split backward) on stage s receives the gradient from
      stage s+1 (the last stage gets it from the loss) and sends the input gradient to
      stage s-1 (stage 0 has no one to send to).
    - W (the weight half of a split backward) sends and receives nothing.
    Ranks: stage k lives on rank schedule.stage_to_rank[k] (not always rank k: with v chunks
    per rank, stage k lives on rank k % p; a peer may be this very rank).
    Tags name the stage a message goes *into* (m = schedule.microbatches):
      activation into stage k for micro-batch i: act_tag(k, i, m)  = 2 * (k * m + i)
      gradient back into stage k for micro-batch i: grad_tag(k, i, m) = 2 * (k * m + i) + 1
    """
    s, kind, i = action
    # TODO(lab3.4): the F case, the B/I case, the W case
    raise NotImplementedError("lab 3.4")


if __name__ == "__main__":
    from minipar.labs.lab03 import demo
    demo(minipar.init("auto"), gpipe, one_f_one_b, bubble_fraction, peer_and_tag)  # torch under torchrun
