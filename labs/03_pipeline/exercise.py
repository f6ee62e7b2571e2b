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

Two tiers: the guided tasks (3.1-3.4) write schedules, their bubble and their messages as
data; the core task (3.5) gives only a contract and has you run 1F1B on real ranks, every send
and receive yours.
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
    """The tag of the activation going *into* ``stage`` for ``microbatch`` (tasks 3.4, 3.5)."""
    return 2 * (stage * m + microbatch)


def grad_tag(stage, microbatch, m):
    """The tag of the gradient coming back *into* ``stage`` (sent by stage + 1) (tasks 3.4, 3.5)."""
    return 2 * (stage * m + microbatch) + 1


# ---------------------------------------------------------------- guided: schedules as data, their bubble, their messages

def gpipe(p, m):
    """GPipe (fill-drain) on p ranks with m micro-batches: a list of p lists of Action, rank r's
    actions in the order it runs them (stage r lives on rank r).

    Every forward of the batch runs before any backward, and each phase takes the micro-batches
    in order, first in, first out (as torch's ScheduleGPipe does).
    p=2, m=2: [[0F0, 0F1, 0B0, 0B1], [1F0, 1F1, 1B0, 1B1]].
    """
    # TODO(lab3.1)
    raise NotImplementedError("lab 3.1")


def one_f_one_b(p, m):
    """1F1B (PipeDream-Flush, Megatron) on p ranks with m micro-batches: a list of p lists of Action.

    The same work as GPipe in another order: each backward starts as early as the pipeline lets
    it, so that rank r never holds more than min(p - r, m) micro-batches' activations (forward
    run, backward not yet: the grader checks that bound). A rank runs forwards while it must
    (before any gradient can come back to it), then alternates one forward and one backward, the
    oldest micro-batch first, and ends with the backwards left. It must be a valid schedule (no
    deadlock), for m < p and m = 1 too.
    p=2, m=3: [[0F0, 0F1, 0B0, 0F2, 0B1, 0B2], [1F0, 1B0, 1F1, 1B1, 1F2, 1B2]].
    """
    # TODO(lab3.2)
    raise NotImplementedError("lab 3.2")


def bubble_fraction(events, p):
    """The bubble: the fraction of all rank-time spent idle.

    events: (rank, start, end) of every action that ran, on all p ranks (from
    minipar.pipeline.simulate, or from a measured trace: then times do not start at 0).
    Every rank counts for the whole makespan, from the first start to the last end, busy or
    not. Works with ints, floats and fractions.Fraction alike.
    """
    # TODO(lab3.3)
    raise NotImplementedError("lab 3.3")


def peer_and_tag(action, schedule):
    """The messages of one action on the executor: (recv, send), each (rank, tag) or None.

    recv: where the input of this action comes from; send: where its output goes.
    - F on a stage receives the activation from the stage before (the first stage reads the data
      instead) and sends its output to the stage after (the last stage computes the loss instead).
    - B (and I, the input half of a split backward) receives the gradient from the stage after
      (the last stage gets it from the loss) and sends the input gradient to the stage before
      (the first stage has no one to send to).
    - W (the weight half of a split backward) sends and receives nothing.
    Ranks: stage k lives on rank schedule.stage_to_rank[k] (not always rank k: with v chunks per
    rank several stages share a rank; a peer may be this very rank). Stages run 0 ..
    schedule.total_stages - 1; m = schedule.microbatches.
    Tags name the stage a message goes *into*: act_tag and grad_tag above.
    """
    s, kind, i = action
    # TODO(lab3.4)
    raise NotImplementedError("lab 3.4")


# ---------------------------------------------------------------- core: the executor, yours

def pipeline_step(comm, actions, stage, microbatches, loss):
    """One training step of this rank's pipeline stage, on real ranks: run ``actions`` in order,
    with the messages between the stages.

    Before, on rank r (stage r of p = comm.size stages, one per rank):
      actions       rank r's 1F1B actions, Action(stage, kind, microbatch) with kinds "F" and "B"
      stage         stage.forward(x) -> (y, saved); stage.backward(dy, saved) -> dx, which adds
                    the stage's weight gradients in place. ``saved`` is what the backward of that
                    micro-batch needs: the activations this rank holds until then.
      microbatches  m arrays of one shape and dtype (the first stage's inputs); every activation
                    and every gradient between two stages has that shape and dtype too
      loss          on the last stage: loss(y, i) -> (micro-batch i's share of the batch loss, a
                    float; the gradient of that share by y)
    After: the stage's weight gradients are those of the whole batch; the last stage's rank
    returns the batch loss (the sum of the shares), every other rank None.
    Messages: exactly those the actions make, each once, with the lab's tags (act_tag and
    grad_tag; 3.4's convention, stage k on rank k), and every send completed before returning.
    Sends are synchronous (a send returns once its receive has begun): the order you post them
    in must not deadlock, for any p and m.
    Memory: at most 1F1B's bound, min(p - r, m) micro-batches' saved activations at once.
    minipar's own executor (minipar.pipeline.execute.run_schedule) is refused inside this call.
    """
    # TODO(lab3.5)
    raise NotImplementedError("lab 3.5")


if __name__ == "__main__":
    from minipar.labs.lab03 import demo
    demo(minipar.init("auto"), gpipe, one_f_one_b, bubble_fraction, peer_and_tag, pipeline_step)  # torch under torchrun
