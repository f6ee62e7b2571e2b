"""Lab 09, task 9.3: f and g as torch.autograd.Functions, graded through the Megatron MLP that
uses them (``tp_mlp``: a colwise Linear, GELU, a rowwise Linear), against one process and by bytes.

Each rank is handed the whole input and its shards only: rows r of W1 and b1 (the colwise layer),
columns r of W2 (the rowwise layer), and the whole b2. The forward and the backward are graded
apart: the forward must send exactly one ring all-reduce of the output (g's forward; f's forward
sends nothing), the backward exactly one of the input's gradient (f's backward; g's backward
sends nothing). Values in float64 against one process, 1e-12 (only the order of the sums over
the hidden features differs). A rowwise output that was never summed over the ranks is named.
"""
from __future__ import annotations

from .checks import chunk_counts, compare, expect_traffic, ranks, ring_traffic, stop
from .lab09_rules import run_learner

SHAPES = ((4, 3, 8, 12), (5, 8, 24))  # (batch, [tokens,] features C, hidden features H): H divides by 2 and 3


def draw(shape, seed):
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def check_tp_mlp(comm, fn):
    import torch.nn.functional as F

    p, r = comm.size, comm.rank
    for k, shape in enumerate(SHAPES):
        *lead, C, H = shape
        case = f"x of shape {(*lead, C)}, {H} hidden features, {ranks(p)}"
        X, W1, B1, W2, B2 = (draw(s, 30 + 5 * k + i) for i, s in enumerate(((*lead, C), (H, C), (H,), (C, H), (C,))))
        R = draw((*lead, C), 40 + k)
        X, W1, B1, W2, B2 = (t.clone().requires_grad_() for t in (X, W1, B1, W2, B2))
        y = F.gelu(X @ W1.T + B1) @ W2.T + B2  # one process: the whole hidden layer
        (y * R).sum().backward()
        x = X.detach().clone().requires_grad_()
        mine = [W1.detach().chunk(p, 0)[r], B1.detach().chunk(p, 0)[r], W2.detach().chunk(p, 1)[r], B2.detach()]
        w1, b1, w2, b2 = (t.contiguous().clone().requires_grad_() for t in mine)
        fwd, fails = run_learner(comm, fn, "tp_mlp", lambda: fn(comm, x, w1, b1, w2, b2))
        out = fwd.out if fwd is not None else None
        bwd, more = (None, []) if fails or out is None else run_learner(
            comm, fn, "tp_mlp", lambda: (out * R).sum().backward())
        fails = fails or more
        fails = fails or output_failures(comm, out, y.detach(), x, w1, b1, w2, b2, case)
        n = X.numel()
        nbytes, msgs = ring_traffic(chunk_counts(n, p), r, 8)
        fails = fails or expect_traffic(comm, fwd, f"the forward: one ring all-reduce of the output ({n} doubles: g's "
                                                   f"forward; f's forward sends nothing; {case})", nbytes, msgs)
        fails = fails or expect_traffic(comm, bwd, f"the backward: one ring all-reduce of the input's gradient ({n} "
                                                   f"doubles: f's backward; g's backward sends nothing; {case})",
                                        nbytes, msgs)
        wants = (("x", x, X.grad), ("w1 (my rows of W1)", w1, W1.grad.chunk(p, 0)[r]),
                 ("b1 (my rows of b1)", b1, B1.grad.chunk(p, 0)[r]),
                 ("w2 (my columns of W2)", w2, W2.grad.chunk(p, 1)[r]), ("b2", b2, B2.grad))
        for name, leaf, want in wants:
            fails = fails or compare(comm, leaf.grad, want, f"the gradient of {name}", f"{case}; one process")
        if stop(comm, fails):
            return fails
    return []


def output_failures(comm, out, want, x, w1, b1, w2, b2, case):
    """The output against one process; when it is this rank's own partial sum, say so."""
    import torch
    import torch.nn.functional as F

    if out is not None and out.shape == want.shape and not torch.allclose(out, want, rtol=1e-12, atol=1e-12):
        with torch.no_grad():
            partial = F.gelu(x @ w1.T + b1) @ w2.T
        if torch.allclose(out, partial + b2, rtol=1e-12, atol=1e-12) or torch.allclose(out, partial, rtol=1e-12,
                                                                                        atol=1e-12):
            return [f"rank {comm.rank}: the output is this rank's own partial sum (its hidden features times its "
                    f"columns of W2), not the sum over the {comm.size} ranks ({case}): the rowwise layer's output "
                    f"goes through g, whose forward is an all-reduce"]
    return compare(comm, out if out is None else out.detach(), want, "the output", f"{case}; one process")
