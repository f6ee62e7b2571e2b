"""minipar.optim: SGD and Adam against torch.optim, on shards, on torch tensors."""
from __future__ import annotations

import numpy as np
import pytest

from minipar.optim import SGD, Adam, adam_step
from minipar.xp import chunk_bounds, to_numpy

SHAPES = [(4, 3), (5,), (2, 3, 2)]
STEPS = 5


def rel_err(a, b):
    a, b = to_numpy(a), to_numpy(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def draws(seed):
    """Initial params and STEPS rounds of grads, all fresh random float64 draws."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s) for s in SHAPES]
    grads = [[rng.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def run_torch(torch, opt_class, params, grads, **kwargs):
    """torch.optim on float64 copies of params; returns the params after every step."""
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    opt = opt_class(ts, **kwargs)
    history = []
    for step_grads in grads:
        for t, g in zip(ts, step_grads):
            t.grad = torch.tensor(g)
        opt.step()
        history.append([t.detach().numpy().copy() for t in ts])
    return history, opt, ts


@pytest.mark.torch
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_torch(torch, weight_decay):
    # float64 on both sides, the same formula; only rounding differs (torch's m uses lerp):
    # ~1e-16 per op, so 1e-12 relative over a few steps catches any wrong term or constant.
    params, grads = draws(1)
    kwargs = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    want, topt, ts = run_torch(torch, torch.optim.Adam, params, grads, **kwargs)

    opt = Adam([p.copy() for p in params], **kwargs)
    for step_grads, want_params in zip(grads, want):
        opt.step(step_grads)
        for p, w in zip(opt.params, want_params):
            assert rel_err(p, w) < 1e-12
    for s, t in zip(opt.state, ts):
        assert rel_err(s["m"], topt.state[t]["exp_avg"]) < 1e-12
        assert rel_err(s["v"], topt.state[t]["exp_avg_sq"]) < 1e-12


@pytest.mark.torch
def test_sgd_matches_torch(torch):
    params, grads = draws(2)
    want, _, _ = run_torch(torch, torch.optim.SGD, params, grads, lr=0.1)
    opt = SGD([p.copy() for p in params], lr=0.1)
    for step_grads, want_params in zip(grads, want):
        opt.step(step_grads)
        for p, w in zip(opt.params, want_params):
            assert rel_err(p, w) < 1e-12  # p - lr*g: at most one rounding apart


def test_adam_on_shards_is_bitwise_equal():
    """What ZeRO relies on: adam_step on 1-D views of a flat buffer, shard by shard, gives
    exactly the numbers of one adam_step on the whole (the update is elementwise)."""
    rng = np.random.default_rng(3)
    n = 11  # not divisible by the 3 shards
    whole = rng.standard_normal(n)
    sharded = whole.copy()
    m1, v1, m2, v2 = (np.zeros(n) for _ in range(4))
    for step in range(1, STEPS + 1):
        grad = rng.standard_normal(n)
        adam_step(whole, grad, m1, v1, step, lr=0.05, weight_decay=0.1)
        for lo, hi in chunk_bounds(n, 3):
            adam_step(sharded[lo:hi], grad[lo:hi], m2[lo:hi], v2[lo:hi], step, lr=0.05, weight_decay=0.1)
    assert np.array_equal(whole, sharded) and np.array_equal(m1, m2) and np.array_equal(v1, v2)


@pytest.mark.torch
def test_adam_on_torch_tensors_equals_numpy(torch):
    params, grads = draws(4)
    ours = Adam([p.copy() for p in params], lr=0.05, weight_decay=0.1)
    theirs = Adam([torch.tensor(p) for p in params], lr=0.05, weight_decay=0.1)
    for step_grads in grads:
        ours.step(step_grads)
        theirs.step([torch.tensor(g) for g in step_grads])
    for p, t in zip(ours.params, theirs.params):
        assert rel_err(t, p) < 1e-12  # float64 both, same lines of code


def test_state_bytes_and_checks():
    params, grads = draws(5)
    n_bytes = sum(p.nbytes for p in params)
    assert Adam(params).state_bytes() == 2 * n_bytes  # m and v, same dtype as the params
    assert Adam([p.astype(np.float32) for p in params]).state_bytes() == n_bytes
    assert SGD(params, lr=0.1).state_bytes() == 0
    with pytest.raises(ValueError, match="grads"):
        Adam(params).step(grads[0][:-1])
