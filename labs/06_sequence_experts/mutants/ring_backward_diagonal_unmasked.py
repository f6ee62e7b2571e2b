"""Planted bug: causal ring attention's backward forgets the mask of the diagonal block

The forward masked the rank's own block (its queries against its own keys); the backward
recomputes the probabilities from lse without that mask, so query i takes a gradient from
keys i+1 ... of its own block, which it never saw. Here: minipar's ring backward, with the
mask lost on its way to the kernel.

EXPECT_TASK: 6.7
EXPECT_MESSAGE: rank 0 computed the diagonal block (its queries against its own keys, 0:3) without the causal mask
"""
from minipar.labs import lab06_solution as reference
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right


def ring_attention_backward(comm, q, k, v, out, dout, lse, attend_backward, causal):
    def unmasked(q, k, v, dout, lse, delta, mask=None):
        return attend_backward(q, k, v, dout, lse, delta)  # BUG: the mask never reaches the kernel
    return reference.ring_attention_backward(comm, q, k, v, out, dout, lse, unmasked, causal)
