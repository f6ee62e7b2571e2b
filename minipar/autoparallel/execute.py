"""Run any strategy on real ranks: forward, loss and backward, with redistributions in between.

    mesh = Mesh((4,), comm)
    ex = Executor(mesh, graph, strategy, params, inputs, like=comm.asarray(np.zeros(1)))
    loss, grads = ex.step()            # this rank's addend of the loss, its parameter pieces' gradients

A strategy becomes a *program* (:func:`build_program`): a list of instructions that every rank
runs in the same order. The simulator reads the very same list, so what it predicts is what
runs.

- ``Compute(op, "fwd")``: the operator's forward on this rank's pieces (skipped, zeros out,
  on ranks an "@k" choice leaves idle).
- ``Move("act", t, src, dst)``: redistribute activation t to the placement a consumer needs
  (once per placement: a second consumer wanting the same one reuses it).
- ``Compute(op, "bwd")``: the operator's backward.
- ``Move("grad", t, src, dst)``: the gradient a consumer produced for t, redistributed to the
  placement the producer's backward needs, and summed with the other consumers'.
- ``Move("param", p, src, dst)``: a parameter's gradient to where the parameter lives (a
  replicated weight used on a batch split: Partial -> Replicate, data parallelism's all-reduce).

Graph inputs (x, the target) are data: every rank loads the piece it needs, outside the step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import ops
from .graph import layout
from .sharding import block, local_block, local_shape
from .transitions import redistribute
from ..xp import from_numpy, to_numpy, zeros


class Compute(NamedTuple):
    op: str
    phase: str  # "fwd" or "bwd"


class Move(NamedTuple):
    what: str  # "act", "grad" or "param"
    name: str  # the tensor or parameter
    src: tuple
    dst: tuple
    op: str = ""  # grad: the consumer whose gradient this is
    k: int = -1  # grad: which input of that consumer
    first: bool = True  # grad: the first contribution (later ones are added to it)
    key: tuple = ()  # (what, name, src id, dst id, first): what the simulator caches it by


@dataclass
class Program:
    instructions: list
    layouts: dict  # op name -> Layout
    loads: list  # (graph input, placements) pairs the ranks load before the step
    strategy: dict


def build_program(graph, strategy) -> Program:
    """The instructions of one training step (forward, loss, backward) under ``strategy``."""
    lay = {op.name: layout(op, tuple(strategy[op.name])) for op in graph.ops}
    made = {op.output: lay[op.name] for op in graph.ops}  # tensor -> its producer's layout
    have, loads, prog = {}, [], []
    for op in graph.ops:
        L = lay[op.name]
        for k, t in enumerate(op.inputs):
            if t in graph.inputs:
                if (t, L.ins[k]) not in loads:
                    loads.append((t, L.ins[k]))
            elif L.id["in", k] not in have[t]:
                P = made[t]
                prog.append(Move("act", t, P.out, L.ins[k], key=("act", t, P.id["out"], L.id["in", k])))
                have[t].add(L.id["in", k])
        prog.append(Compute(op.name, "fwd"))
        have[op.output] = {L.id["out"]}
    started = set()
    for op in reversed(graph.ops):
        L = lay[op.name]
        prog.append(Compute(op.name, "bwd"))
        for k, t in enumerate(op.inputs):
            if t in graph.inputs:
                continue
            P, first = made[t], t not in started
            prog.append(Move("grad", t, L.din[k], P.dout, op.name, k, first,
                             ("grad", t, L.id["din", k], P.id["dout"], first)))
            started.add(t)
        for p in L.params:
            prog.append(Move("param", p, L.dparams[p], L.stored[p], key=("param", p, L.id["dp", p], L.id["st", p])))
    return Program(prog, lay, loads, dict(strategy))


class Executor:
    """One rank's side of a strategy: its parameter pieces, and :meth:`step`.

    ``params`` / ``inputs``: the full NumPy arrays (every rank draws the same); each rank keeps
    only its pieces, converted like ``like`` (the backend's array kind and dtype).
    """

    def __init__(self, mesh, graph, strategy, params, inputs, like):
        self.mesh, self.graph, self.like = mesh, graph, like
        self.program = build_program(graph, strategy)
        lay, co = self.program.layouts, mesh.coords
        self.A = lambda a: from_numpy(np.array(a, order="C"), like)  # noqa: E731
        self.params = {}  # parameter -> my piece of it, where it lives
        self.used = {}  # parameter -> the piece the forward uses (a Partial bias: zeros off coordinate 0)
        for op in graph.ops:
            L = lay[op.name]
            for p, pl in L.params.items():
                self.params[p] = self.A(local_block(params[p], L.stored[p], mesh.shape, co))
                self.used[p] = redistribute(mesh, self.params[p], L.stored[p], pl, params[p].shape)
        self.loaded = {(t, pl): self.A(local_block(inputs[t], pl, mesh.shape, co)) for t, pl in self.program.loads}

    def held_elements(self) -> int:
        """Elements of parameters this rank holds (what a memory check counts)."""
        return sum(int(np.prod(p.shape)) for p in self.params.values())

    def step(self):
        """One forward + backward. Returns (my addend of the loss as a float, {param: my gradient})."""
        g, mesh, lay = self.graph, self.mesh, self.program.layouts
        acts = {}
        for (t, pl), a in self.loaded.items():
            acts.setdefault(t, {})[pl] = a
        ctx, grads, pending, pgrads = {}, {}, {}, {}
        loss_name = g.ops[-1].output
        for ins in self.program.instructions:
            if isinstance(ins, Compute) and ins.phase == "fwd":
                op, L = g.op(ins.op), lay[ins.op]
                if L.computes(mesh.coords):
                    x = [acts[t][L.ins[k]] for k, t in enumerate(op.inputs)]
                    out_block = block(g.tensors[op.output].shape, L.out, mesh.shape, mesh.coords)
                    y, ctx[op.name] = ops.forward(op, x, {p: self.used[p] for p in op.params}, out_block)
                else:
                    y = self._zeros(op.output, L.out)
                acts[op.output] = {L.out: y}
                if op.output == loss_name:
                    grads[loss_name] = y * 0 + 1.0  # d loss / d loss, on every rank (R)
            elif isinstance(ins, Compute):
                op, L = g.op(ins.op), lay[ins.op]
                dout = grads.pop(op.output)
                if L.computes(mesh.coords):
                    dins, dps = ops.backward(op, dout, ctx.pop(op.name))
                else:
                    dins, dps = [self._zeros(t, L.ins[k]) for k, t in enumerate(op.inputs)], {}
                for k, d in enumerate(dins):
                    pending[op.name, k] = d
                pgrads.update(dps)
            elif ins.what == "act":
                acts[ins.name][ins.dst] = self._move(ins, acts[ins.name][ins.src])
            elif ins.what == "grad":
                d = self._move(ins, pending.pop((ins.op, ins.k)))
                grads[ins.name] = d if ins.first else grads[ins.name] + d
            else:
                pgrads[ins.name] = self._move(ins, pgrads[ins.name])
        return float(to_numpy(acts[loss_name][lay[g.ops[-1].name].out])), pgrads

    def _shape(self, name):
        t = self.graph.tensors.get(name)
        return t.shape if t is not None else self.graph.param_shapes()[name]

    def _move(self, ins, x):
        return redistribute(self.mesh, x, ins.src, ins.dst, self._shape(ins.name))

    def _zeros(self, tensor, placements):
        shape = local_shape(self.graph.tensors[tensor].shape, placements, self.mesh.shape, self.mesh.coords)
        return zeros(shape, like=self.like)  # not via NumPy: from_numpy turns a 0-d loss into shape (1,)
