"""minipar.nn: every hand-written backward checked three ways.

1. against torch autograd on the same float64 inputs (functional pairs),
2. against central finite differences (no torch needed),
3. the same module code on torch tensors (float64, float32, CUDA when present) against NumPy.

Plus the module contract other lessons rely on: backward == backward_input + backward_weight
bitwise, contexts owned by the caller, parameter names, to(like).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import minipar.nn as nn
from minipar.xp import copy, to_numpy

B, T, C, NH, H = 2, 5, 8, 2, 12  # batch, sequence, channels, heads, MLP hidden


def rel_err(a, b):
    """max |a - b| / max |b|: one number per array, insensitive to a few tiny entries of b."""
    a, b = to_numpy(a), to_numpy(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def randomize(model, rng):
    """Perturb every param so that init values (gamma = 1, beta = 0, b = 0) cannot hide a bug."""
    for _, p in model.named_parameters():
        p[...] = p + 0.3 * rng.standard_normal(p.shape)
    return model


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


# --------------------------------------------------------------------------- 1. vs torch autograd
# float64 on both sides and the same math, only the order of operations differs (BLAS blocking,
# fused kernels), so results agree to ~1e-15; 1e-10 leaves room yet catches any wrong term.
ORACLE_TOL = 1e-10


def autograd(torch, f, arrays, dy):
    """f applied to float64 leaf tensors made from ``arrays``; returns (out, grads) for dL/dout = dy."""
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = f(*leaves)
    out.backward(torch.tensor(dy))
    return out.detach().numpy(), [t.grad.numpy() for t in leaves]


@pytest.mark.torch
@pytest.mark.parametrize("shape, bias", [((B, T, C), True), ((B * T, C), False)])
def test_linear_vs_autograd(torch, shape, bias):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal(shape), rng.standard_normal((C, H)), rng.standard_normal(H)
    dy = rng.standard_normal(shape[:-1] + (H,))
    y, ctx = nn.linear_forward(x, w, b if bias else None)
    dx = nn.linear_backward_input(dy, ctx)
    dw, db = nn.linear_backward_weight(dy, ctx)
    if bias:
        ty, (tdx, tdw, tdb) = autograd(torch, lambda x, w, b: x @ w + b, [x, w, b], dy)
        assert rel_err(db, tdb) < ORACLE_TOL
    else:
        ty, (tdx, tdw) = autograd(torch, lambda x, w: x @ w, [x, w], dy)
        assert db is None
    assert rel_err(y, ty) < ORACLE_TOL
    assert rel_err(dx, tdx) < ORACLE_TOL
    assert rel_err(dw, tdw) < ORACLE_TOL


@pytest.mark.torch
def test_gelu_vs_autograd(torch):
    rng = np.random.default_rng(2)
    x, dy = 2 * rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    y, ctx = nn.gelu_forward(x)
    ty, (tdx,) = autograd(torch, lambda x: torch.nn.functional.gelu(x, approximate="tanh"), [x], dy)
    assert rel_err(y, ty) < ORACLE_TOL
    assert rel_err(nn.gelu_backward(dy, ctx), tdx) < ORACLE_TOL


@pytest.mark.torch
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_vs_autograd(torch, axis):
    rng = np.random.default_rng(3)
    x, dy = 3 * rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    y, ctx = nn.softmax_forward(x, axis=axis)
    ty, (tdx,) = autograd(torch, lambda x: torch.softmax(x, dim=axis), [x], dy)
    assert rel_err(y, ty) < ORACLE_TOL
    assert rel_err(nn.softmax_backward(dy, ctx), tdx) < ORACLE_TOL


@pytest.mark.torch
def test_layernorm_vs_autograd(torch):
    rng = np.random.default_rng(4)
    x = 3 * rng.standard_normal((B, T, C)) + rng.standard_normal((B, T, 1))  # rows with offsets
    gamma, beta, dy = rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal((B, T, C))
    y, ctx = nn.layernorm_forward(x, gamma, beta)
    dx, dgamma, dbeta = nn.layernorm_backward(dy, ctx)
    layer_norm = torch.nn.functional.layer_norm
    ty, (tdx, tdgamma, tdbeta) = autograd(
        torch, lambda x, g, b: layer_norm(x, (C,), g, b, eps=1e-5), [x, gamma, beta], dy)
    for ours, theirs in [(y, ty), (dx, tdx), (dgamma, tdgamma), (dbeta, tdbeta)]:
        assert rel_err(ours, theirs) < ORACLE_TOL


@pytest.mark.torch
@pytest.mark.parametrize("causal", [True, False])
def test_attention_vs_autograd(torch, causal):
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((B, NH, T, C // NH)) for _ in range(4))
    out, ctx = nn.attention_forward(q, k, v, causal=causal)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    tout, tgrads = autograd(torch, lambda q, k, v: sdpa(q, k, v, is_causal=causal), [q, k, v], dout)
    assert rel_err(out, tout) < ORACLE_TOL
    for ours, theirs in zip(nn.attention_backward(dout, ctx), tgrads):
        assert rel_err(ours, theirs) < ORACLE_TOL


@pytest.mark.torch
def test_losses_vs_autograd(torch):
    rng = np.random.default_rng(6)
    TF = torch.nn.functional
    pred, target = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    loss, dpred = nn.mse_loss(pred, target)
    tloss, (tdpred,) = autograd(torch, lambda p: TF.mse_loss(p, torch.tensor(target)), [pred], 1.0)
    assert rel_err(loss, tloss) < ORACLE_TOL and rel_err(dpred, tdpred) < ORACLE_TOL

    logits, labels = 2 * rng.standard_normal((B, T, C)), rng.integers(0, C, (B, T))
    loss, dlogits = nn.cross_entropy(logits, labels)
    flat_labels = torch.tensor(labels).reshape(-1)  # torch wants (N, V) logits and (N,) labels
    tloss, (tdlogits,) = autograd(torch, lambda z: TF.cross_entropy(z.reshape(-1, C), flat_labels), [logits], 1.0)
    assert rel_err(loss, tloss) < ORACLE_TOL and rel_err(dlogits, tdlogits) < ORACLE_TOL


# --------------------------------------------------------------------------- 2. finite differences
# Central differences: truncation error ~h^2 (1e-10) plus rounding ~1e-16 * |L| / h (~1e-10), so
# ~1e-9 of the gradient's scale. 1e-7 is comfortably above that and far below any real mistake.
FD_TOL, FD_H = 1e-7, 1e-5


def numerical_grad(loss, a):
    """d loss() / d a by central differences, perturbing each entry of ``a`` in place."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + FD_H
        up = loss()
        a[i] = old - FD_H
        down = loss()
        a[i] = old
        g[i] = (up - down) / (2 * FD_H)
    return g


def check_fd(forward, arrays, analytic, rng):
    """L = sum(forward() * r) with a random r, so dL/dy = r; compare analytic(r) with FD."""
    r = rng.standard_normal(forward().shape)
    grads = analytic(r)
    for name, a in arrays.items():
        assert rel_err(grads[name], numerical_grad(lambda: np.sum(forward() * r), a)) < FD_TOL, name


def test_linear_fd():
    rng = np.random.default_rng(10)
    arrays = {"x": rng.standard_normal((2, 3, 4)), "w": rng.standard_normal((4, 5)),
              "b": rng.standard_normal(5)}

    def analytic(dy):
        _, ctx = nn.linear_forward(**arrays)
        dw, db = nn.linear_backward_weight(dy, ctx)
        return {"x": nn.linear_backward_input(dy, ctx), "w": dw, "b": db}

    check_fd(lambda: nn.linear_forward(**arrays)[0], arrays, analytic, rng)


def test_gelu_fd():
    rng = np.random.default_rng(11)
    arrays = {"x": 2 * rng.standard_normal((3, 7))}
    check_fd(lambda: nn.gelu_forward(arrays["x"])[0], arrays,
             lambda dy: {"x": nn.gelu_backward(dy, nn.gelu_forward(arrays["x"])[1])}, rng)


def test_layernorm_fd():
    rng = np.random.default_rng(12)
    arrays = {"x": 2 * rng.standard_normal((2, 3, 6)), "gamma": rng.standard_normal(6),
              "beta": rng.standard_normal(6)}

    def analytic(dy):
        dx, dgamma, dbeta = nn.layernorm_backward(dy, nn.layernorm_forward(**arrays)[1])
        return {"x": dx, "gamma": dgamma, "beta": dbeta}

    check_fd(lambda: nn.layernorm_forward(**arrays)[0], arrays, analytic, rng)


def test_attention_fd():
    rng = np.random.default_rng(13)
    arrays = {name: rng.standard_normal((2, 2, 4, 3)) for name in "qkv"}

    def analytic(dout):
        return dict(zip("qkv", nn.attention_backward(dout, nn.attention_forward(**arrays)[1])))

    check_fd(lambda: nn.attention_forward(**arrays)[0], arrays, analytic, rng)


def test_losses_fd():
    rng = np.random.default_rng(15)
    pred, target = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    fd = numerical_grad(lambda: nn.mse_loss(pred, target)[0], pred)
    assert rel_err(nn.mse_loss(pred, target)[1], fd) < FD_TOL
    logits, labels = 2 * rng.standard_normal((2, 3, 5)), rng.integers(0, 5, (2, 3))
    fd = numerical_grad(lambda: nn.cross_entropy(logits, labels)[0], logits)
    assert rel_err(nn.cross_entropy(logits, labels)[1], fd) < FD_TOL


def test_block_fd():
    rng = np.random.default_rng(14)
    block = randomize(nn.Block(C, NH, rng, d_hidden=H), rng)
    x = rng.standard_normal((B, 3, C))
    arrays = {"x": x, **dict(block.named_parameters())}  # the model's own arrays, perturbed in place

    def analytic(dy):
        block.zero_grad()
        dx = block.backward(dy, block.forward(x)[1])
        return {"x": dx, **dict(block.named_grads())}

    check_fd(lambda: block.forward(x)[0], arrays, analytic, rng)


def test_block_is_causal():
    """Changing the last position's input changes the last output and no earlier one."""
    rng = np.random.default_rng(16)
    block = randomize(nn.Block(C, NH, rng, d_hidden=H), rng)
    x = rng.standard_normal((B, T, C))
    x2 = x.copy()
    x2[:, -1] = rng.standard_normal((B, C))
    y, y2 = block.forward(x)[0], block.forward(x2)[0]
    assert np.array_equal(y[:, :-1], y2[:, :-1]) and not np.allclose(y[:, -1], y2[:, -1])


# --------------------------------------------------------------------------- 3. one code, two backends


def block_step(block, x, labels):
    """Forward, cross-entropy on the outputs (channels as classes), full backward."""
    y, ctx = block.forward(x)
    loss, dy = nn.cross_entropy(y, labels)
    dx = block.backward(dy, ctx)
    return {"y": y, "loss": loss, "dx": dx, **{name: copy(g) for name, g in block.named_grads()}}


@pytest.mark.torch
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype, tol", [
    ("float64", 1e-12),  # same float64 math, only BLAS summation order differs
    ("float32", 1e-5),   # float32 rounding (~6e-8 per op) against the float64 NumPy reference
])
def test_block_on_torch_equals_numpy(torch, device, dtype, tol):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(20)
    block = randomize(nn.Block(C, NH, rng, d_hidden=H), rng)
    x, labels = rng.standard_normal((B, T, C)), rng.integers(0, C, (B, T))
    want = block_step(block, x, labels)

    like = torch.zeros(1, dtype=getattr(torch, dtype), device=device)
    block.zero_grad()
    block.to(like)
    assert all(p.dtype == like.dtype and p.device == like.device for _, p in block.named_parameters())
    got = block_step(block, torch.as_tensor(x, device=device).to(like.dtype),
                     torch.as_tensor(labels, device=device))
    for name in want:
        assert rel_err(got[name], want[name]) < tol, name


# --------------------------------------------------------------------------- 4. module contract


def make_linear(rng):
    return nn.Linear(C, H, rng), (B, T, C), (B, T, H)


def make_block(rng):
    return nn.Block(C, NH, rng, d_hidden=H), (B, T, C), (B, T, C)


@pytest.mark.parametrize("make", [make_linear, make_block])
def test_backward_is_backward_input_plus_backward_weight(make):
    model1, x_shape, y_shape = make(np.random.default_rng(30))
    model2, _, _ = make(np.random.default_rng(30))  # identical weights
    rng = np.random.default_rng(31)
    x, dy = rng.standard_normal(x_shape), rng.standard_normal(y_shape)

    dx1 = model1.backward(dy, model1.forward(x)[1])

    ctx = model2.forward(x)[1]
    dx2 = model2.backward_input(dy, ctx)
    assert all(not g.any() for _, g in model2.named_grads()), "backward_input touched a weight grad"
    assert model2.backward_weight(dy, ctx) is None

    assert np.array_equal(dx1, dx2)
    for (name, g1), (_, g2) in zip(model1.named_grads(), model2.named_grads()):
        assert g1.any() and np.array_equal(g1, g2), name


def test_backward_weight_needs_backward_input_first():
    rng = np.random.default_rng(32)
    block = nn.Block(C, NH, rng)
    y, ctx = block.forward(rng.standard_normal((B, T, C)))
    with pytest.raises(RuntimeError, match="backward_input"):
        block.backward_weight(rng.standard_normal(y.shape), ctx)


def test_microbatches_in_flight():
    """Two forwards, then backwards in a pipeline's order (B of 1, B of 0, W of 0, W of 1):
    the same grads, bitwise, as running the micro-batches one after the other."""
    rng = np.random.default_rng(33)
    xs, dys = rng.standard_normal((2, B, T, C)), rng.standard_normal((2, B, T, C))
    one_by_one, interleaved = (nn.Block(C, NH, np.random.default_rng(34)) for _ in range(2))

    for x, dy in zip(xs, dys):
        one_by_one.backward(dy, one_by_one.forward(x)[1])

    ctxs = [interleaved.forward(x)[1] for x in xs]
    interleaved.backward_input(dys[1], ctxs[1])
    interleaved.backward_input(dys[0], ctxs[0])
    interleaved.backward_weight(dys[0], ctxs[0])
    interleaved.backward_weight(dys[1], ctxs[1])

    for (name, g1), (_, g2) in zip(one_by_one.named_grads(), interleaved.named_grads()):
        assert np.array_equal(g1, g2), name


def test_names_count_accumulate_and_zero_grad():
    rng = np.random.default_rng(35)
    block = nn.Block(C, NH, rng, d_hidden=H)
    assert [n for n, _ in block.named_parameters()] == [
        "ln1.gamma", "ln1.beta", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b",
        "ln2.gamma", "ln2.beta", "mlp.fc1.w", "mlp.fc1.b", "mlp.fc2.w", "mlp.fc2.b"]
    assert [n for n, _ in block.named_grads()] == [n for n, _ in block.named_parameters()]
    linears = (C * 3 * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C)  # qkv, proj, fc1, fc2
    assert block.num_params() == 2 * 2 * C + linears
    assert block.params == {} and block.attn.qkv.params["w"].shape == (C, 3 * C)

    seq = nn.Sequential(nn.Linear(C, H, rng), nn.GeLU(), nn.Linear(H, C, rng, bias=False))
    assert [n for n, _ in seq.named_parameters()] == ["0.w", "0.b", "2.w"]
    assert len(seq) == 3 and isinstance(seq[1], nn.GeLU)

    x, dy = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    seq.backward(dy, seq.forward(x)[1])
    once = [g.copy() for _, g in seq.named_grads()]
    seq.backward(dy, seq.forward(x)[1])  # grads accumulate: g + g == 2g exactly
    assert all(np.array_equal(g, 2 * g0) for (_, g), g0 in zip(seq.named_grads(), once))
    seq.zero_grad()
    assert all(not g.any() for _, g in seq.named_grads())


def test_import_does_not_import_torch():
    code = "import sys, minipar.nn, minipar.optim; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_to_converts_to_fresh_arrays(dtype):
    rng = np.random.default_rng(36)
    lin = nn.Linear(C, H, rng)
    old_w = lin.params["w"]
    assert lin.to(np.zeros(1, dtype=dtype)) is lin
    for _, a in [*lin.named_parameters(), *lin.named_grads()]:
        assert isinstance(a, np.ndarray) and a.dtype == dtype
    lin.params["w"][...] = 7  # an in-place update (what an optimizer does) ...
    assert not (old_w == 7).any()  # ... leaves arrays kept from before untouched, even in float64


def test_a_batch_of_single_rows_is_one_matrix_product(monkeypatch):
    """A decode step at batch B, (B, 1, d) @ w, must read w once: one (B, d) @ w product, not B
    matrix-vector products (NumPy's stacked matmul); sequences of many rows stay stacked."""
    import minipar.nn.functional as F

    seen = []
    real = F.matmul
    monkeypatch.setattr(F, "matmul", lambda a, b: seen.append(a.shape) or real(a, b))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8))
    x = rng.standard_normal((5, 1, 16))
    y, _ = F.linear_forward(x, w)
    assert seen == [(5, 16)] and y.shape == (5, 1, 8)
    np.testing.assert_allclose(y, x @ w, rtol=1e-12)
    seen.clear()
    F.linear_forward(rng.standard_normal((5, 3, 16)), w)
    assert seen == [(5, 3, 16)]
