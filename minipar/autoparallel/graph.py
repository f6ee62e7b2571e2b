"""The operator graph of a small model, the choices of each operator, and strategies.

    g = block_graph(B=4, T=16, C=32, n_heads=4, H=128)
    [op.name for op in g.ops]   # ln1.mean, ln1.var, ln1.norm, attn.qkv, attn.core, attn.proj, res1, ...
    choices(g.op("mlp.fc1"), (4,))   # ('B', 'T', 'out', 'in', '-')  on a 1-D mesh of 4 ranks

A *strategy* gives every operator one choice per mesh axis, e.g. ``{"mlp.fc1": ("out",), ...}``
on a 1-D mesh or ``("B", "out")`` on a 2-D one (Sample on axis 0, Parameter on axis 1). From
it :func:`layout` derives the placements of everything the operator touches; operators
connect through their tensors, and wherever a producer's output placement is not what a
consumer needs, the executor inserts a redistribution.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from . import ops
from .sharding import P, R, Partial, Shard, block, pid


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple
    dims: tuple  # a name per dim: ("B", "T", "C")


@dataclass(eq=False)
class Op:
    name: str
    kind: str
    inputs: tuple  # tensor names
    output: str
    params: dict = field(default_factory=dict)  # qualified parameter name -> global shape
    attrs: dict = field(default_factory=dict)
    megatron: str = "-"  # this operator's choice in Megatron-LM's tensor parallelism

    def params_named(self, short):
        return self.attrs["pnames"][short]

    def __repr__(self):
        return f"Op({self.name}: {self.kind})"


class Graph:
    """Tensors and operators, in topological order (the order they are added)."""

    def __init__(self, name):
        self.name, self.tensors, self.ops, self.inputs = name, {}, [], []

    def op(self, name) -> Op:
        return next(o for o in self.ops if o.name == name)

    def producer(self, tensor) -> Op | None:
        return next((o for o in self.ops if o.output == tensor), None)

    def param_shapes(self) -> dict:
        return {p: s for o in self.ops for p, s in o.params.items()}

    def input(self, name, shape, dims):
        self.tensors[name] = Tensor(name, tuple(shape), tuple(dims))
        self.inputs.append(name)
        return name

    def _add(self, name, kind, inputs, shape, dims, params=None, megatron="-", **attrs):
        self.tensors[name] = Tensor(name, tuple(shape), tuple(dims))
        self.ops.append(Op(name, kind, tuple(inputs), name, dict(params or {}), attrs, megatron))
        return name

    # ------------------------------------------------------------------ building blocks

    def linear(self, name, x, out_shape, out_dims, in_axis=0, out_axis=0, megatron="-"):
        """y = x @ w + b over the feature dims after (B, T); w is (*in, *out)."""
        tx = self.tensors[x]
        in_shape, out_shape = tx.shape[2:], tuple(out_shape)
        pnames = {"w": f"{name}.w", "b": f"{name}.b"}
        return self._add(name, "linear", (x,), tx.shape[:2] + out_shape, tx.dims[:2] + tuple(out_dims),
                         {pnames["w"]: in_shape + out_shape, pnames["b"]: out_shape}, megatron,
                         pnames=pnames, n_in=len(in_shape), in_axis=in_axis, out_axis=out_axis)

    def layernorm(self, prefix, x, eps=1e-5):
        """LayerNorm as three operators: the mean and the variance (independent, so they may run
        on different ranks at once) and the normalization with the weights."""
        t = self.tensors[x]
        B, T, C = t.shape
        mu = self._add(f"{prefix}.mean", "mean", (x,), (B, T, 1), ("B", "T", "1"), C=C)
        var = self._add(f"{prefix}.var", "var", (x,), (B, T, 1), ("B", "T", "1"), C=C)
        pnames = {"gamma": f"{prefix}.gamma", "beta": f"{prefix}.beta"}
        return self._add(f"{prefix}.norm", "norm", (x, mu, var), t.shape, t.dims,
                         {pnames["gamma"]: (C,), pnames["beta"]: (C,)}, pnames=pnames, eps=eps)

    def attention(self, prefix, x, n_heads):
        """qkv projection (heads kept as a dim), causal attention per head, output projection."""
        B, T, C = self.tensors[x].shape
        hs = C // n_heads
        qkv = self.linear(f"{prefix}.qkv", x, (3, n_heads, hs), ("qkv", "heads", "hs"), out_axis=1, megatron="out")
        y = self._add(f"{prefix}.core", "attention", (qkv,), (B, T, n_heads, hs), ("B", "T", "heads", "hs"),
                      megatron="heads")
        return self.linear(f"{prefix}.proj", y, (C,), ("C",), in_axis=0, megatron="in")

    def mlp(self, prefix, x, H):
        C = self.tensors[x].shape[-1]
        h = self.linear(f"{prefix}.fc1", x, (H,), ("H",), megatron="out")
        g = self._add(f"{prefix}.gelu", "gelu", (h,), self.tensors[h].shape, self.tensors[h].dims, megatron="H",
                      last="H")
        return self.linear(f"{prefix}.fc2", g, (C,), ("C",), megatron="in")

    def add(self, name, a, b):
        t = self.tensors[a]
        return self._add(name, "add", (a, b), t.shape, t.dims, last=t.dims[-1])

    def mse(self, name, pred, target):
        t = self.tensors[pred]
        n = 1
        for s in t.shape:
            n *= s
        return self._add(name, "mse", (pred, target), (), (), last=t.dims[-1], N=n)


# --------------------------------------------------------------------------- the models


def mlp_graph(B, T, C, H, V=None):
    """x -> fc1 -> GeLU -> fc2 [-> head (C -> V)] -> MSE loss against a target."""
    g = Graph("mlp" if V is None else "mlp+head")
    x = g.input("x", (B, T, C), ("B", "T", "C"))
    y = g.mlp("mlp", x, H)
    if V is not None:
        y = g.linear("head", y, (V,), ("V",), megatron="out")
    g.mse("loss", y, g.input("target", g.tensors[y].shape, g.tensors[y].dims))
    return g


def block_graph(B, T, C, n_heads, H):
    """A pre-LN transformer block: h = x + attn(ln1(x)); out = h + mlp(ln2(h)); MSE loss."""
    g = Graph("block")
    x = g.input("x", (B, T, C), ("B", "T", "C"))
    h = g.add("res1", x, g.attention("attn", g.layernorm("ln1", x), n_heads))
    out = g.add("res2", h, g.mlp("mlp", g.layernorm("ln2", h), H))
    g.mse("loss", out, g.input("target", (B, T, C), ("B", "T", "C")))
    return g


# --------------------------------------------------------------------------- choices and layouts


def choices(op, mesh_shape) -> tuple:
    """An operator's choice names on one mesh axis: its parallelizable dims, "-" (replicated) and,
    without weights, "@k" (only coordinate k computes). Every axis offers the same names."""
    names = list(ops.rules(op)) + ["-"]
    if not ops.has_weights(op):
        names += [f"@{k}" for k in range(max(mesh_shape))]
    return tuple(names)


@dataclass(frozen=True)
class Layout:
    """Placements (a tuple over mesh axes) of an operator's inputs, parameters and output, and
    of their gradients in the backward."""
    ins: tuple
    params: dict
    out: tuple
    split: tuple  # per axis: does the axis divide the work?
    on: tuple  # per axis: the only coordinate that computes ("@k"), or None
    din: tuple = ()  # the gradients' placements: of each input,
    dparams: dict = field(default_factory=dict)  # of each parameter,
    dout: tuple = ()  # and the output gradient the backward needs
    stored: dict = field(default_factory=dict)  # where each parameter lives (see storage())
    id: dict = field(default_factory=dict)  # pid() of each of the above: "out", "dout", ("in", k), ...

    def computes(self, coords) -> bool:
        return all(k is None or c == k for c, k in zip(coords, self.on))

    def grad(self, placements) -> tuple:
        """The placement of the gradient of a tensor used in ``placements``: S(d) -> S(d),
        P -> R, R -> P where the axis divides the work, else R."""
        return tuple(pl if isinstance(pl, Shard) else R if isinstance(pl, Partial) else P if s else R
                     for pl, s in zip(placements, self.split))


def storage(placements) -> tuple:
    """Where a parameter lives: its placement with Partial read as Replicate (a Partial bias is
    the stored bias on coordinate 0 and zeros elsewhere, made locally)."""
    return tuple(R if isinstance(pl, Partial) else pl for pl in placements)


def layout(op, choice) -> Layout:
    """The placements a choice (one name per mesh axis) gives an operator."""
    cache = op.__dict__.setdefault("_layouts", {})
    if choice not in cache:
        per_axis = []
        for c in choice:
            if c == "-" or c.startswith("@"):
                rule = ops.Rule((R,) * len(op.inputs), {p: R for p in op.params}, P if c != "-" else R)
            else:
                rule = ops.rules(op)[c]
            per_axis.append(rule)
        ins = tuple(tuple(r.ins[k] for r in per_axis) for k in range(len(op.inputs)))
        params = {p: tuple(r.params[p] for r in per_axis) for p in op.params}
        lay = Layout(ins, params, tuple(r.out for r in per_axis), tuple(c != "-" for c in choice),
                     tuple(int(c[1:]) if c.startswith("@") else None for c in choice))
        din, dparams = tuple(lay.grad(pl) for pl in ins), {p: lay.grad(pl) for p, pl in params.items()}
        stored = {p: storage(pl) for p, pl in params.items()}
        ids = {"out": pid(lay.out), "dout": pid(lay.grad(lay.out)),
               **{("in", k): pid(pl) for k, pl in enumerate(ins)}, **{("din", k): pid(pl) for k, pl in enumerate(din)},
               **{("dp", p): pid(pl) for p, pl in dparams.items()}, **{("st", p): pid(pl) for p, pl in stored.items()}}
        cache[choice] = Layout(ins, params, lay.out, lay.split, lay.on, din, dparams, lay.grad(lay.out), stored, ids)
    return cache[choice]


def valid(graph, op, choice, mesh_shape) -> bool:
    """Every piece non-empty on every rank, and "@k" inside the axis."""
    if len(choice) != len(mesh_shape) or any(c not in choices(op, mesh_shape) for c in choice):
        return False
    if any(c.startswith("@") and int(c[1:]) >= m for c, m in zip(choice, mesh_shape)):
        return False
    return _nonempty(graph, op.name, tuple(choice), tuple(mesh_shape))


def _nonempty(graph, name, choice, mesh_shape):
    cache = graph.__dict__.setdefault("_valid", {})
    key = (name, choice, mesh_shape)
    if key not in cache:
        op, lay = graph.op(name), layout(graph.op(name), choice)
        shapes = [graph.tensors[t].shape for t in op.inputs] + list(op.params.values()) + [graph.tensors[op.output].shape]
        pls = list(lay.ins) + list(lay.params.values()) + [lay.out]
        n = 1
        for m in mesh_shape:
            n *= m
        coords = [tuple(int(c) for c in co) for co in product(*(range(m) for m in mesh_shape))]
        cache[key] = all(b > a or s == 0 for shape, pl in zip(shapes, pls) for co in coords
                         for (a, b), s in zip(block(shape, pl, mesh_shape, co), shape)) and n > 0
    return cache[key]


def space(graph, mesh_shape) -> dict:
    """Every operator's valid choices (tuples over the mesh axes): the search space."""
    return {op.name: [c for c in product(choices(op, mesh_shape), repeat=len(mesh_shape))
                      if valid(graph, op, c, mesh_shape)] for op in graph.ops}


def hand_written(graph, mesh_shape) -> dict:
    """The classic strategies, where they fit: data parallel, Megatron tensor parallel, a
    sequence split (and data x tensor parallel on a 2-D mesh)."""
    n = len(mesh_shape)
    cands = {"data parallel": {op.name: ("B",) * n for op in graph.ops},
             "Megatron TP": {op.name: (op.megatron,) * n for op in graph.ops},
             "sequence split": {op.name: ("T",) * n for op in graph.ops}}
    if n == 2:
        cands["DP x TP"] = {op.name: ("B", op.megatron) for op in graph.ops}
    return {k: s for k, s in cands.items() if all(valid(graph, graph.op(o), c, mesh_shape) for o, c in s.items())}


def describe(graph, strategy) -> list[str]:
    """One line per operator: its choice and SOAP category per axis."""
    w = max(len(op.name) for op in graph.ops)
    return [f"{op.name:<{w}}  " + ", ".join(f"{c} ({ops.category(c)})" for c in strategy[op.name]) for op in graph.ops]
