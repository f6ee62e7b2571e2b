"""FlexFlow's execution simulator: predict a strategy's step time without running it.

    sim = Simulator(graph, mesh_shape=(4,), costs=costs)
    r = sim.run(strategy)         # r.time: predicted seconds of forward + backward
                                  # r.bytes[rank]: what each rank sends, exact to the byte

The strategy's program (:func:`minipar.autoparallel.execute.build_program`, the same list of
instructions the executor runs) becomes a task graph on the ranks:

- a compute task per rank for each operator's forward and backward; its duration is the
  operator's time on that rank's pieces, measured once on this machine (``Costs.table``, see
  :mod:`minipar.autoparallel.calibrate`);
- a communication task per sub-communicator for each collective step of a redistribution,
  lasting what the alpha-beta(-gamma) model says (``transitions.step_time`` with the fitted
  alpha, beta, gamma); a local step (a slice, a zero fill) and adding up gradients cost their
  bytes times the measured copy time.

Every rank runs its tasks in program order. A compute task starts when its rank is free; a
collective starts when the last rank of its group arrives, and holds all of them until it ends
(minipar's collectives block). The step time is when the last rank finishes. Two operators on
different ranks ("@k") overlap by themselves: each rank simply skips the other's task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .execute import Compute, build_program
from .sharding import Mesh, block, local_shape
from .transitions import COMMUNICATING, local_bytes, redistribution_steps, step_bytes, step_time


def signature(graph, op, lay, coords, mesh_shape):
    """What an operator's compute time depends on: its kind and the shapes of its local pieces
    (and for split queries, how many keys they see). Equal signatures share one measurement."""
    shp = lambda shape, pl: local_shape(shape, pl, mesh_shape, coords)  # noqa: E731
    ins = tuple(shp(graph.tensors[t].shape, lay.ins[k]) for k, t in enumerate(op.inputs))
    prm = tuple(shp(op.params[p], lay.params[p]) for p in op.params)
    out = shp(graph.tensors[op.output].shape, lay.out)
    extra = ()
    if op.kind == "attention":
        t0, t1 = block(graph.tensors[op.output].shape, lay.out, mesh_shape, coords)[1]
        extra = (t1 - t0, t1)
    return (op.kind, ins, prm, out, extra)


@dataclass
class Costs:
    """Everything the simulator knows about this machine.

    table: repr(signature) -> (forward seconds, backward seconds); missing signatures fall back to
    ``flop_time`` seconds per (rough) flop plus ``op_overhead``. alpha, beta, gamma: the
    collectives' fit; copy: seconds per byte written by a local step.
    """
    alpha: float
    beta: float
    gamma: float = 0.0
    copy: float = 0.0
    table: dict = field(default_factory=dict)
    flop_time: float = 1e-9
    op_overhead: float = 0.0
    itemsize: int = 8
    comm: bool = True  # False: a simulator that ignores communication (to show what it misses)

    def compute(self, sig, phase) -> float:
        measured = self.table.get(repr(sig))
        if measured is not None:
            return measured[0 if phase == "fwd" else 1]
        return self.op_overhead + self.flop_time * flops(sig) * (1 if phase == "fwd" else 2)


def flops(sig) -> float:
    """A rough forward flop count from a signature (the fallback of :class:`Costs`)."""
    kind, ins, prm, out, extra = sig
    if kind == "linear":
        return 2 * prod(ins[0]) * prod(out[2:])
    if kind == "attention":
        B, _, _, nh, hs = ins[0]
        tq, tk = extra
        return 4 * B * nh * tq * tk * hs
    return 4 * prod(ins[0])


@dataclass
class SimResult:
    time: float  # predicted step seconds (the last rank to finish)
    compute: list  # per rank: seconds computing
    comm: list  # per rank: seconds inside collectives (waiting for the group included)
    bytes: list  # per rank: bytes sent, exact
    tasks: list  # (ranks, kind, name, start, end), when recorded


class Simulator:
    """Predicts step times of strategies for one graph on one mesh; remembers the tasks of every
    instruction it has seen, so the search's many small changes re-simulate quickly."""

    def __init__(self, graph, mesh_shape, costs: Costs):
        self.graph, self.mesh, self.costs = graph, Mesh(mesh_shape), costs
        self._tasks = {}

    def run(self, strategy, record=False) -> SimResult:
        program = build_program(self.graph, strategy)
        n = self.mesh.size
        clock, busy, comm, sent, log = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n, []
        for ins in program.instructions:
            for kind, tasks, *labels in self._tasks_of(ins, program):
                if kind == "local":  # one duration per rank, no waiting for anyone
                    for r, secs in enumerate(tasks):
                        if record and secs:
                            log.append(([r], labels[0][r] if labels else "copy", _name(ins), clock[r], clock[r] + secs))
                        clock[r] += secs
                        busy[r] += secs
                    continue
                for group, secs, nbytes in tasks:  # a collective: starts when its last rank arrives
                    end = max(clock[r] for r in group) + secs
                    if record:
                        log.append((group, "comm", _name(ins), end - secs, end))
                    for r, b in zip(group, nbytes):
                        comm[r] += end - clock[r]
                        sent[r] += b
                        clock[r] = end
        return SimResult(max(clock), busy, comm, sent, log)

    def _tasks_of(self, ins, program):
        """[("local", [seconds per rank], [label per rank]?) or ("comm", [(group, seconds, [bytes per rank])])]."""
        key = (ins, program.strategy[ins.op]) if isinstance(ins, Compute) else ins.key
        if key not in self._tasks:
            self._tasks[key] = (self._compute_tasks(ins, program.layouts[ins.op]) if isinstance(ins, Compute)
                                else self._move_tasks(ins))
        return self._tasks[key]

    def _compute_tasks(self, ins, lay):
        g, m, c = self.graph, self.mesh, self.costs
        op, secs, labels = g.op(ins.op), [], []
        for r in range(m.size):
            co = m.coords_of(r)
            labels.append("compute" if lay.computes(co) else "zeros")
            if lay.computes(co):
                secs.append(c.compute(signature(g, op, lay, co, m.shape), ins.phase))
            else:  # an idle rank of an "@k" choice writes zeros
                pls = [lay.out] if ins.phase == "fwd" else list(lay.ins)
                shapes = [g.tensors[op.output].shape] if ins.phase == "fwd" else [g.tensors[t].shape for t in op.inputs]
                secs.append(c.copy * c.itemsize * sum(prod(local_shape(s, pl, m.shape, co)) for s, pl in zip(shapes, pls)))
        return [("local", secs, labels)]

    def _move_tasks(self, ins):
        g, m, c = self.graph, self.mesh, self.costs
        shape = g.tensors[ins.name].shape if ins.name in g.tensors else g.param_shapes()[ins.name]
        out = []
        for step in redistribution_steps(ins.src, ins.dst):
            if step.kind in COMMUNICATING:
                tasks = []
                for group in m.groups(step.axis):
                    co = m.coords_of(group[0])
                    secs = step_time(step, shape, m.shape, co, c.itemsize, c.alpha, c.beta, c.gamma) if c.comm else 0.0
                    tasks.append((list(group), secs, [step_bytes(step, shape, m.shape, m.coords_of(r), c.itemsize)
                                                      for r in group]))
                out.append(("comm", tasks))
            else:
                out.append(("local", [c.copy * local_bytes(step, shape, m.shape, m.coords_of(r), c.itemsize)
                                      for r in range(m.size)]))
        if ins.what == "grad" and not ins.first:  # adding to the other consumers' gradient
            out.append(("local", [c.copy * c.itemsize * prod(local_shape(shape, ins.dst, m.shape, m.coords_of(r)))
                                  for r in range(m.size)]))
        return out


def _name(ins):
    return f"{ins.op} {ins.phase}" if isinstance(ins, Compute) else f"{ins.what} {ins.name}"


def predicted_bytes(graph, strategy, mesh_shape, itemsize=8) -> list:
    """Bytes each rank sends in one step of ``strategy``: the simulator's count, exact."""
    return Simulator(graph, mesh_shape, Costs(0.0, 0.0, itemsize=itemsize)).run(strategy).bytes


def signatures(graph, mesh_shape, strategies=None) -> dict:
    """Every signature a search (or the given strategies) may ask for -> one (op, layout, coords)
    that has it: what calibration measures."""
    from .graph import layout, space

    mesh, out = Mesh(mesh_shape), {}
    sp = space(graph, mesh_shape) if strategies is None else {
        o.name: sorted({tuple(s[o.name]) for s in strategies}) for o in graph.ops}
    for op in graph.ops:
        for choice in sp[op.name]:
            lay = layout(op, choice)
            for r in range(mesh.size):
                co = mesh.coords_of(r)
                if lay.computes(co):
                    out.setdefault(signature(graph, op, lay, co, mesh_shape), (op, lay, co))
    return out

