"""Planted bug: the MoE backward leaves out the load-balancing loss's gradient

The loss's value is right (aux is computed and returned), but its gradient never reaches the
router: only the gates' gradient does. The balancing loss then pushes nothing towards even
loads. Here: minipar's expert-parallel layer with the balancing loss's gradient weighted 0.

EXPECT_TASK: 6.8
EXPECT_MESSAGE: rank 0: d_router misses the load-balancing loss's gradient
"""
from minipar.labs import lab06_solution as reference
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    layer = reference._layer(comm, x, w_router, experts, k, capacity_factor, aux_weight).to(x)
    layer.aux_scale = 0.0  # BUG: the balancing loss's gradient dropped
    y, ctx = layer.forward(x)
    dx = layer.backward(dy, ctx)
    grads = dict(layer.named_grads())
    return y, ctx["aux"], dx, grads["router.w"], [tuple(grads[f"expert{e}.{n}"] for n in ("fc1.w", "fc1.b", "fc2.w",
                                                                                         "fc2.b"))
                                                  for e in sorted(layer.experts())]
