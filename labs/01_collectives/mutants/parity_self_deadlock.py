"""Planted bug: even ranks send first, odd ranks receive first: deadlocks on 1 rank

Ordering by parity breaks the send-send cycle of a ring for every p >= 2. But on one rank
the right neighbour is the rank itself: an (even) rank that sends to itself before receiving
waits forever, because a synchronous send needs its receive to start.

EXPECT_TASK: 1.1
EXPECT_MESSAGE: hangs on 1 rank (deadlock or a send without its recv)
EXPECT_MESSAGE: rank 0: blocked in send to rank 0 tag 0
"""
from minipar.labs.lab01_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import chunk_bounds, copy, empty  # noqa: F401


def ring_pass(comm, x):
    buf = empty(x.shape, like=x)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if comm.rank % 2 == 0:  # BUG on 1 rank: a synchronous send to yourself never completes
        comm.send(x, right)
        comm.recv(buf, left)
    else:
        comm.recv(buf, left)
        comm.send(x, right)
    return buf
