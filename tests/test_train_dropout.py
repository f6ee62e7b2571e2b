"""Lesson 05 with ``--dropout``: every grid draws one process's masks, so its losses stay one process's.

A mask element is a function of (seed, step, layer, site, global row, position, column) through
Philox (``minipar.nn.dropout``). The pure checks cut a one-process mask the way a grid does (rows
over dp and micro-batches, zigzag positions over cp, a T/tp share under SP, columns over tp) and
require the pieces to be its slices, bit for bit; the rank checks train grids against one process
(1e-12), with recomputation replaying the masks (on torch: tests/test_train_torch.py, two of its grids
drop). Each planted bug of dropout must fail them.
"""
import numpy as np
import pytest

from minipar import launch, nn
from minipar.context_parallel import SeqLayout
from minipar.errors import UsageError
from minipar.lessons.common import merge_rows
from minipar.lessons.train import MOE, SHORT, make_config
from minipar.nn.dropout import Draw
from minipar.train.config import check_shapes
from minipar.train.mutants import planted
from minipar.train.trainer import train_reference

P = 0.3
B, T, D = 8, 8, 12  # global batch, positions, columns of one site


def one_process(draw, site="hidden"):
    draw.at(rows=np.arange(B))
    return nn.Dropout(draw, 2, site, (T, D)).mask(np.zeros(1))  # (B, T, D)


def grid_mask(draw, dp, m, cp, tp, sp):
    """The masks every rank of a dp x cp x tp grid draws, with m micro-batches, put back
    together: the hidden site holds my positions and my columns, a residual site (SP) my
    T/tp share of my positions and every column."""
    out = np.full((B, T, D), -1.0)
    b = B // dp // m
    for d in range(dp):
        for i in range(m):
            rows = d * (B // dp) + i * b + np.arange(b)
            draw.at(rows=rows)
            for c in range(cp):
                pos = SeqLayout(T, cp).positions(c) if cp > 1 else np.arange(T)
                for t in range(tp):
                    if sp:  # a residual site: my TP rank's share of my positions, every column
                        n = len(pos) // tp
                        mine, cols = pos[t * n:(t + 1) * n], (0, D)
                        site = "mlp"
                    else:
                        mine, cols, site = pos, (t * D // tp, (t + 1) * D // tp), "hidden"
                        site = "hidden"
                    piece = nn.Dropout(draw, 2, site, (T, D), mine, cols).mask(np.zeros(1))
                    out[np.ix_(rows, mine, np.arange(*cols))] = piece
    return out


@pytest.mark.parametrize("dp,m,cp,tp,sp", [(1, 1, 1, 2, False), (2, 2, 1, 3, False), (1, 2, 2, 2, False),
                                           (2, 1, 2, 2, True), (1, 1, 1, 4, True)])
def test_every_grid_draws_the_slices_of_one_process_mask(dp, m, cp, tp, sp):
    draw = Draw(P, seed=3)
    draw.at(step=5)
    want = one_process(draw, "mlp" if sp else "hidden")
    got = grid_mask(draw, dp, m, cp, tp, sp)
    assert np.array_equal(got, want)
    assert abs(want.mean() - (1 - P)) < 0.1  # a mask that keeps 1 - p of the elements


def test_a_mask_depends_on_step_layer_site_and_seed_and_replays():
    draw = Draw(P, seed=3)
    draw.at(step=5)
    first = one_process(draw)
    assert np.array_equal(first, one_process(draw))  # drawn again (recomputation): the same
    draw.at(step=6)
    assert not np.array_equal(first, one_process(draw))
    draw.at(step=5)
    assert not np.array_equal(first, one_process(draw, "mlp"))
    assert not np.array_equal(first, one_process(Draw(P, seed=4)))


def test_dropout_scales_what_it_keeps_and_its_backward_is_the_same_mask():
    draw = Draw(P, seed=0)
    draw.at(step=1, rows=np.arange(B))
    drop = nn.Dropout(draw, 0, "attn", (T, D))
    x = np.random.default_rng(0).standard_normal((B, T, D))
    y, mask = drop.forward(x)
    np.testing.assert_array_equal(y, x * mask * (1 / (1 - P)))  # kept elements scaled by 1 / (1 - p)
    assert np.array_equal(y == 0, mask == 0) and 0 < mask.mean() < 1
    np.testing.assert_array_equal(drop.backward_input(x, mask), y)
    assert nn.Dropout().forward(x)[0] is x  # no draw: the identity


def test_a_seed_shared_inside_the_tp_region_repeats_one_mask_on_every_shard():
    draw = Draw(P, seed=3)
    with planted("dropout_shared_in_tp"):
        got = grid_mask(draw, 1, 1, 1, 2, False)
    left, right = got[..., :D // 2], got[..., D // 2:]
    assert np.array_equal(left, right)  # Megatron's bug: both TP ranks drew TP rank 0's mask
    assert not np.array_equal(got, one_process(draw))


@pytest.mark.parametrize("p", [-0.1, 1, 1.5, float("nan"), True, "0.1"])
def test_a_dropout_outside_0_1_is_refused(p):
    with pytest.raises(UsageError, match="--dropout"):
        check_shapes(make_config(model=SHORT, dropout=p), 1)


def test_the_reference_drops():
    dropped, _ = train_reference(make_config(model=SHORT, steps=2, dropout=P))
    free, _ = train_reference(make_config(model=SHORT, steps=2))
    assert dropped[0] != free[0]


GRIDS = [
    dict(model=SHORT, dp=1, pp=1, tp=2),  # the hidden layer's columns over tp
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, sequence_parallel=True, recompute="full"),  # zigzag, SP, replayed
    dict(model=SHORT, dp=2, pp=2, tp=1, schedule="interleaved", chunks=2, microbatches=2, recompute="selective"),
    dict(model=SHORT, dp=1, pp=1, tp=1, schedule="gpipe", microbatches=2, recompute="full"),  # B0 after F1
    dict(model=MOE, dp=2, pp=1, tp=2, microbatches=2),  # the reference's rows in (micro-batch, replica) order
]
MUTANTS = [
    ("dropout_shared_in_tp", dict(model=SHORT, dp=1, pp=1, tp=2)),
    ("dropout_per_rank_seed", dict(model=SHORT, dp=2, pp=1, tp=1)),
    ("dropout_replay_redraws", dict(model=SHORT, dp=1, pp=1, tp=1, schedule="gpipe", microbatches=2, recompute="full")),
]


ACCOUNTED = [dict(model=SHORT, dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True),
             dict(model=SHORT, dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=2, recompute="full")]


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_every_grid_drops_like_one_process_and_each_planted_bug_breaks_it():
    """One job (4 ranks): the grids against one process, the activation bytes with the masks
    against the formula, then each planted bug of dropout on its grid."""
    cases = ([(None, "grids", dict(c, dropout=P), 3) for c in GRIDS]
             + [(None, "accounting", dict(c, dropout=P)) for c in ACCOUNTED]
             + [(m, "grids", dict(cfg, dropout=P), 2) for m, cfg in MUTANTS])
    out = launch(4, "minipar.lessons.train:check_mutants", quiet=True, job_timeout=170, cases=cases)
    rows = merge_rows(out.results)
    right = [r for r in rows if r["what"].startswith("None: ")]
    assert sum("dropout" in r["what"] and "losses of 3 steps" in r["what"] for r in right) == len(GRIDS)
    assert sum("activation bytes" in r["what"] for r in right) == len(ACCOUNTED)  # the masks counted, to the byte
    assert all(r["ok"] for r in right), [r for r in right if not r["ok"]]
    for mutant, _ in MUTANTS:
        named = [r for r in rows if r["what"].startswith(mutant + ":") and "losses of" in r["what"]]
        assert named and not any(r["ok"] for r in named), (mutant, named)


def test_the_notebooks_dropout_figure_checks_its_tiling(monkeypatch):
    """Notebook 05's masks (``figures.train_features.dropout_tiles``): the TP shards tile one process's mask
    and the shared seed's do not; a keep_mask that counts from the shard's own column 0 (the
    shared seed everywhere) fails the tiling row."""
    from minipar.figures import train_features as F
    from minipar.nn import dropout

    rows = F.dropout_tiles(T=4, H=16, tp=4)["rows"]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    keep = dropout.keep_mask
    monkeypatch.setattr(dropout, "keep_mask", lambda key, rows, shape, positions, cols, p: keep(
        key, rows, shape, positions, None if cols is None else (0, cols[1] - cols[0]), p))
    tiling, caught = F.dropout_tiles(T=4, H=16, tp=4)["rows"]
    assert not tiling["ok"] and caught["ok"]
