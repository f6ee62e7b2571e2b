"""Planted bug: the balancing loss over this rank's tokens only

f_e and P_e must count every rank's tokens (the balancing group is the whole layer): the
counts and the probability sums are summed over the ranks first. Computed from the rank's own
tokens, every rank has a loss of its own, and a gradient that balances only its own tokens.

EXPECT_TASK: 6.8
EXPECT_MESSAGE: rank 0: aux is the balancing loss of your own tokens only
"""
import types

import numpy as np

from minipar.experts.routing import aux_loss
from minipar.labs import lab06_solution as reference
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import from_numpy, namespace, to_numpy


def _own_aux(self, parts, probs):
    (rt,), n = parts, probs.shape[0]
    sums = to_numpy(namespace(probs).sum(probs, axis=0))
    aux, coeff = aux_loss(rt.routed, sums, n, self.k, self.aux_weight)  # BUG: no sum over the ranks
    return aux, from_numpy(np.broadcast_to(coeff / n, probs.shape).copy(), like=probs)


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    layer = reference._layer(comm, x, w_router, experts, k, capacity_factor, aux_weight).to(x)
    layer.aux_scale = 1.0 / comm.size
    layer._aux = types.MethodType(_own_aux, layer)
    y, ctx = layer.forward(x)
    dx = layer.backward(dy, ctx)
    grads = dict(layer.named_grads())
    return y, ctx["aux"], dx, grads["router.w"], [tuple(grads[f"expert{e}.{n}"] for n in ("fc1.w", "fc1.b", "fc2.w",
                                                                                         "fc2.b"))
                                                  for e in sorted(layer.experts())]
