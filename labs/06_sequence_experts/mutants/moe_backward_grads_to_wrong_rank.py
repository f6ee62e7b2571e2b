"""Planted bug: the experts' input gradients go back in expert order, not in arrival order

The rows' gradients sit expert by expert after the experts' backward; the all-to-all-v that
returns them sends the first rows to rank 0, the next to rank 1 ... so they must first be put
back in the order the rows arrived (by source rank). Without that, a token gets the gradient of
another rank's token, or of another token of its own rank.

EXPECT_TASK: 6.8
EXPECT_MESSAGE: rank 0: dx[0] holds the gradient of rank 1's token 1 through expert 2
EXPECT_MESSAGE: the rows' gradients went back to the wrong rank or position
"""
import types

from minipar.experts import MoE
from minipar.labs import lab06_solution as reference
from minipar.labs.lab06_solution import *  # noqa: F401,F403  everything else is right
from minipar.xp import namespace


def _backward_rows(self, d_out, ectx):
    xp = namespace(d_out)
    d_recv, _ = self.dispatch(d_out, ectx["send_counts"])  # the output gradients to the experts: right
    d_in = MoE._experts_backward_input(self, xp.take(d_recv, ectx["perm"], axis=0), ectx)  # expert-major
    return self.combine(d_in, ectx["recv_counts"])  # BUG: sent back expert-major, not in arrival order


def moe_backward(comm, x, dy, w_router, experts, k, capacity_factor, aux_weight):
    layer = reference._layer(comm, x, w_router, experts, k, capacity_factor, aux_weight).to(x)
    layer.aux_scale = 1.0 / comm.size
    layer._experts_backward_input = types.MethodType(_backward_rows, layer)
    y, ctx = layer.forward(x)
    dx = layer.backward(dy, ctx)
    grads = dict(layer.named_grads())
    return y, ctx["aux"], dx, grads["router.w"], [tuple(grads[f"expert{e}.{n}"] for n in ("fc1.w", "fc1.b", "fc2.w",
                                                                                         "fc2.b"))
                                                  for e in sorted(layer.experts())]
