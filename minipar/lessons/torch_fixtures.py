"""What lesson 09's drivers share (``torch_ddp``, ``torch_fsdp``, ``torch_tp``, ``torch_engines``):
a small GPT written in torch, a model with every awkward part, their seeded batches and losses,
training on one process (the reference) and under minipar's DDP (which the ZeRO and FSDP checks
compare with), this rank's share of a batch, one traced call, and the check rows with their error
measures.

The GPT's sizes divide by 1, 2, 3 and 4 ranks (12 heads of 2 features, 12 tokens, a batch of 12
sequences): every engine runs it on the tour's 4 ranks, tensor and sequence parallel included, and
every rank holds an equal share of the batch, so the average of the ranks' gradients is the
whole batch's. The awkward model divides by nothing: its units are padded on every world size.
"""
from __future__ import annotations

import time
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..trace import bytes_sent
from ..xp import chunk_bounds

STEPS, LR = 2, 1e-2  # optimizer steps of every training check, and their learning rate
TOL = 1e-12  # float64 against float64: only the order of the sums differs
SGD = partial(torch.optim.SGD, momentum=0.9)
ADAM = torch.optim.Adam


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v, o (a fused qkv would be split across q, k and v)."""

    def __init__(self, C, n_head, T):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
        self.head_dim = C // n_head
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, C) or, tensor parallel, (B, T, C/p)
        B, T, _ = q.shape  # T from q: sequence parallel, x holds T/p tokens and q all T
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5  # (B, nh, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        return self.o(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head, T):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C), Attention(C, n_head, T)
        self.ln_2, self.mlp = nn.LayerNorm(C), MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final LayerNorm, an output head tied to the embedding."""

    def __init__(self, vocab=32, C=24, n_head=12, n_layer=2, T=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(T, C)
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(Block(C, n_head, T) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)


class Gate(nn.Module):
    """A custom unit that is not an nn.Linear: tanh(x M) * s."""

    def __init__(self, d):
        super().__init__()
        self.mix = nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return torch.tanh(x @ self.mix) * self.scale


class Awkward(nn.Module):
    """A frozen weight, a tied weight, a buffer, a parameter that never gets a gradient, custom
    Gate units, and no size divisible by 2 or 3."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.weight.requires_grad_(False)
        self.gate1, self.gate2 = Gate(7), Gate(7)
        self.tied_a, self.tied_b = nn.Linear(7, 7, bias=False), nn.Linear(7, 7, bias=False)
        self.tied_b.weight = self.tied_a.weight
        self.register_buffer("shift", torch.randn(7))
        self.unused = nn.Parameter(torch.randn(5))
        self.out = nn.Linear(7, 3)

    def forward(self, x):
        h = torch.relu(self.inp(x)) + self.shift
        h = self.gate1(self.frozen(h))
        h = self.gate2(self.tied_a(h))
        return self.out(self.tied_b(h))


def make(kind, seed=0, dtype=torch.float64):
    """The model ``kind`` ("gpt" or "awkward"), seeded: the same weights in every process."""
    torch.manual_seed(seed)
    return (GPT() if kind == "gpt" else Awkward()).to(dtype)


def batch(kind, n=12, seed=1, dtype=torch.float64):
    """(x, y): the whole batch, the same on every rank (the GPT's: n sequences of 12 tokens)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt":
        return torch.randint(0, 32, (n, 12), generator=g), torch.randint(0, 32, (n, 12), generator=g)
    return torch.randn(n, 5, generator=g, dtype=dtype), torch.randn(n, 3, generator=g, dtype=dtype)


def loss_fn(kind, out, y):
    """The mean loss of ``kind``'s output: cross-entropy over the tokens (in float32 when the
    logits are 16-bit), or the mean squared error."""
    if kind == "gpt":
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]) if out.dtype in (torch.float16, torch.bfloat16)
                               else out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.mse_loss(out.to(y.dtype), y)


# --------------------------------------------------------------------------- check rows


def row(what, error, tol=0.0, ok=None):
    """A check row of the lessons' harness (``minipar.lessons.common``): ok when error <= tol,
    unless ``ok`` says otherwise (tol 0: bitwise, or a count that must be 0)."""
    error = float(error)
    return {"what": what, "error": error, "tolerance": tol, "ok": bool(error <= tol) if ok is None else bool(ok)}


def count_row(what, got, want):
    """A row for an exact count (bytes, tensors): its error is |got - want|, its tolerance 0."""
    return row(what, abs(got - want), 0.0)


def rel(a, b):
    """max |a - b| / max |b| (0 for two empty tensors, inf for different shapes)."""
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    return (a - b).abs().max().item() / (b.abs().max().item() or 1.0)


def max_rel(a: dict, b: dict):
    """max over tensors of max |a - b|, over the largest |b| of them all (a gradient that is zero
    in exact arithmetic, a key bias's, is compared at the model's scale, not at its own noise)."""
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    scale = max((b[k].detach().double().abs().max().item() for k in b if b[k].numel()), default=0.0) or 1.0
    return max(((a[k].detach().double() - b[k].detach().double()).abs().max().item() / scale
                for k in a if a[k].numel()), default=0.0)


# --------------------------------------------------------------------------- runs


_MEMO: dict = {}


def memo(fn):
    """Each run once per process (the checks share their runs); runs of a planted bug (an
    ``engine=`` given) are not kept."""
    def run(*args, **kwargs):
        if kwargs.get("engine") is not None:
            return fn(*args, **kwargs)
        key = (fn.__name__, args, tuple(sorted(kwargs.items())))
        if key not in _MEMO:
            _MEMO[key] = fn(*args, **kwargs)
        return _MEMO[key]
    run.__name__, run.__doc__, run.__wrapped__ = fn.__name__, fn.__doc__, fn
    return run


def params(module):
    """{name: a copy of the parameter}."""
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def local(comm, t):
    """This rank's rows of ``t`` (equal shares: every world size of the lesson divides the batch)."""
    a, b = chunk_bounds(t.shape[0], comm.size)[comm.rank]
    return t[a:b]


@memo
def dense_train(kind, opt=SGD, steps=STEPS):
    """The reference: one process, the whole batch, ``steps`` optimizer steps; {name: parameter}."""
    model = make(kind)
    x, y = batch(kind)
    o = opt(model.parameters(), lr=LR)
    for _ in range(steps):
        o.zero_grad()
        loss_fn(kind, model(x), y).backward()
        o.step()
    return params(model)


def traced(comm, fn):
    """(fn(), bytes this rank sent while it ran, its trace events)."""
    comm.tracer.clear()
    comm.tracer.enabled = True
    try:
        out = fn()
    finally:
        comm.tracer.enabled = False
    events = list(comm.tracer.events)
    comm.tracer.clear()
    return out, bytes_sent(events, comm.world_rank(comm.rank)), events


def mark(comm, name):
    """A zero-length compute event named ``name`` in the trace: a moment (the backward's end)."""
    t = time.perf_counter()
    comm.tracer.record("compute", name, t, t)


@memo
def ddp_train(comm, kind, bucket_size_mb=None, opt=SGD, engine=None, steps=STEPS):
    """minipar's DDP on this rank's share of the batch: (params, facts of the last step).
    ``engine``: a class to use instead of ``DistributedDataParallel`` (a planted bug)."""
    from ..torch import DistributedDataParallel

    model = make(kind)
    ddp = (engine or DistributedDataParallel)(model, bucket_size_mb=bucket_size_mb, comm=comm)
    x, y = batch(kind)
    x, y = local(comm, x), local(comm, y)
    o = opt(model.parameters(), lr=LR)
    facts = {}
    for _ in range(steps):
        o.zero_grad()

        def step():
            loss = loss_fn(kind, ddp(x), y)
            loss.backward()
            mark(comm, "backward end")
            ddp.finish_gradient_synchronization()

        _, sent, events = traced(comm, step)
        facts = {"sent": sent, "predicted": ddp_bytes(comm, model, bucket_size_mb), "events": events,
                 "log": list(ddp.reducer.log), "slots": [len(b.slots) for b in ddp.reducer.buckets]}
        o.step()
    return params(model), facts


def ddp_bytes(comm, model, bucket_size_mb):
    """The formula, from the model: a ring all-reduce per bucket, each trainable parameter in one."""
    from ..torch.ddp import make_buckets
    from ..torch.group import ring_bytes, unique_params

    size = None if bucket_size_mb is None else int(bucket_size_mb * 2 ** 20)
    return sum(ring_bytes(b.flat.numel(), comm.size, comm.rank, b.flat.element_size())
               for b in make_buckets(unique_params(model), size))
