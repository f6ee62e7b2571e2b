"""Planted bug: the backward sends its input gradient to the next rank instead of the previous

The gradient of stage s goes back to stage s-1; this sends it "to the right", to rank + 1,
like the forward's activation. On 2 ranks the right and the left neighbour are the same rank,
so the bug hides; the first schedule on 3 ranks (GPipe, p=3) exposes it. (The pairing is
written out here, not taken from minipar's answer: a graded call that runs minipar's answer is
refused as such.)

EXPECT_TASK: 3.4
EXPECT_MESSAGE: gpipe p=3 m=3 v=1, rank 1's action 1B0 sends its gradient to rank 2 with tag 1; the gradient of 1B0 must go to stage 0, which lives on rank 0
"""
from minipar.labs.lab03_solution import *  # noqa: F401,F403  everything else is right
from minipar.pipeline.execute import act_tag, grad_tag


def peer_and_tag(action, schedule):
    s, kind, i = action
    m, last, owner = schedule.microbatches, schedule.total_stages - 1, schedule.stage_to_rank
    if kind == "F":
        return ((owner[s - 1], act_tag(s, i, m)) if s > 0 else None,
                (owner[s + 1], act_tag(s + 1, i, m)) if s < last else None)
    if kind in "BI":
        return ((owner[s + 1], grad_tag(s, i, m)) if s < last else None,
                ((owner[s] + 1) % schedule.ranks, grad_tag(s - 1, i, m)) if s > 0 else None)  # BUG: the next rank, not stage s-1's
    return None, None
