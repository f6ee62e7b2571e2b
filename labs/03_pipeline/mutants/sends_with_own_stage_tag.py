"""Planted bug: the forward tags its output with its own stage instead of the receiving stage

Stage s sends its activation with act_tag(s, i, m), but stage s+1 waits for act_tag(s+1, i, m):
the two sides of the message disagree, and on real ranks the receive never matches (a hang).

EXPECT_TASK: 3.4
EXPECT_MESSAGE: gpipe p=2 m=3 v=1, rank 0's action 0F0 sends with tag 0; expected act_tag(stage=1, microbatch=0, m=3) = 6 (the tag names the stage the message goes *into*)
"""
from minipar.labs.lab03_solution import *  # noqa: F401,F403  everything else is right
from minipar.labs.lab03_solution import peer_and_tag as _right
from minipar.pipeline.execute import act_tag


def peer_and_tag(action, schedule):
    s, kind, i = action
    recv, send = _right(action, schedule)
    if kind == "F" and send is not None:
        send = (send[0], act_tag(s, i, schedule.microbatches))  # BUG: should be stage s + 1
    return recv, send
