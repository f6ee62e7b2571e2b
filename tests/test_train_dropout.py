"""Lesson 05 with ``--dropout``: every grid draws one process's masks, so its losses stay one process's.

A mask element is a function of (seed, step, layer, site, global index) through Philox
(``minipar.nn.dropout``): (row, position, column) at the embedding, the residuals and the MLP's
hidden layer, (row, head, query, key) on the attention probabilities. The pure checks cut a
one-process mask the way a grid does (rows over dp and micro-batches, zigzag positions over cp, a
T/tp share under SP, columns and heads over tp, ring attention's chunk pairs, Ulysses' order) and
require the pieces to be its slices, bit for bit; the rank checks train grids against one process
(1e-12), with recomputation replaying the masks (on torch: tests/test_train_torch.py, three of its
grids drop, one with ring attention). Each planted bug of dropout must fail them.
"""
import numpy as np
import pytest

from minipar import launch, nn
from minipar.context_parallel import SeqLayout, allowed, block_attention, blocks, empty_state, finish, merge
from minipar.context_parallel.ring import _pairs
from minipar.context_parallel.ulysses import _order
from minipar.errors import UsageError
from minipar.lessons.common import merge_rows, rel_error
from minipar.lessons.train import MOE, SHORT, label, make_config
from minipar.nn import functional as F
from minipar.nn.dropout import AttentionDropout, Draw
from minipar.train.config import check_shapes
from minipar.train.mutants import planted
from minipar.train.reference import train_reference

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


# --------------------------------------------------------------------------- attention probabilities

NH, TA = 4, 6  # heads, positions: one process's probabilities are (B, NH, TA, TA)


def one_process_probs(draw):
    draw.at(rows=np.arange(2))
    pos = np.arange(TA)
    return AttentionDropout(draw, 1, np.arange(NH), TA).keep(np.zeros(1), pos, pos)  # (2, NH, TA, TA)


def split_probs(draw, how):
    """One process's probability mask put back together from the pieces a split draws: ``tp``
    each TP rank its heads; ``ring`` each cp rank, block by block, its queries against the keys of
    the rank the block came from (zigzag chunk pairs, padding included: T = 6 over 4 chunks of 2);
    ``ulysses`` each cp rank its heads over the sequence in the all-to-all's order."""
    out = np.full((2, NH, TA, TA), 2, dtype=np.int8)  # 2: never written
    draw.at(rows=np.arange(2))
    like = np.zeros(1)
    if how == "tp":
        for t in range(2):
            drop = AttentionDropout(draw, 1, np.arange(t * NH // 2, (t + 1) * NH // 2), TA)
            out[:, t * NH // 2:(t + 1) * NH // 2] = drop.keep(like, np.arange(TA), np.arange(TA))
        return out
    lay, drop = SeqLayout(TA, 2), AttentionDropout(draw, 1, np.arange(NH), TA)
    if how == "ring":
        for r in range(2):
            for j in range(2):
                for qs, ks, _ in _pairs(lay, r, j, causal=False):
                    qp, kp = lay.positions(r)[qs], lay.positions(j)[ks]
                    got = drop.keep(like, qp, kp)  # (2, NH, c, c)
                    real = np.ix_(qp < TA, kp < TA)
                    out[np.ix_(range(2), range(NH), qp[qp < TA], kp[kp < TA])] = got[:, :, real[0], real[1]]
        return out
    order = _order(lay)  # ulysses: rank c holds heads c NH/2 ... over every position, in this order
    for c in range(2):
        h = slice(c * NH // 2, (c + 1) * NH // 2)
        got = drop.keep(like, order, order, h)  # (2, NH/2, T padded, T padded)
        real = order < TA
        out[:, h] = got[:, :, real][:, :, :, real][:, :, np.argsort(order[real])][..., np.argsort(order[real])]
    return out


@pytest.mark.parametrize("how", ["tp", "ring", "ulysses"])
def test_every_split_of_the_attention_draws_the_pieces_of_one_process_mask(how):
    """Heads over tp, queries over cp with the keys arriving block by block (ring) or re-laid out
    (Ulysses): the pieces are one process's (b, h, q, k) mask, bit for bit. Indexing by the head's
    local index (the shared seed's bug) breaks the heads split; by the key's index in the block
    at hand breaks both context-parallel cores (one process, where local is global, is unchanged)."""
    from minipar.train.mutants import planted

    draw = Draw(P, seed=3)
    want = one_process_probs(draw)
    assert np.array_equal(split_probs(draw, how), want)
    assert abs(want.mean() - (1 - P)) < 0.1
    bug = "dropout_probs_local_head" if how == "tp" else "dropout_probs_local_key"
    with planted(bug):
        assert np.array_equal(one_process_probs(draw), want)
        assert not np.array_equal(split_probs(draw, how), want)


def test_the_probability_mask_depends_on_head_layer_and_step():
    draw = Draw(P, seed=3)
    first = one_process_probs(draw)
    assert not np.array_equal(first[:, 0], first[:, 1])  # each head its own stream
    assert not np.array_equal(first[0], first[1])  # each row
    draw.at(step=1)
    assert not np.array_equal(first, one_process_probs(draw))


def dropped_attention(rng):
    q, k, v, dout = (rng.standard_normal((1, 2, 5, 3)) for _ in range(4))
    keep = rng.random((1, 2, 5, 5)) >= P
    return q, k, v, dout, keep


def test_dense_attention_dropout_backward_is_the_gradient_and_selective_replays_it():
    """Finite differences of sum(out * r) against attention_backward with the forward's keep; with
    p dropped (selective), replay() brings the same mask back, and nothing else will do."""
    rng = np.random.default_rng(4)
    q, k, v, dout, keep = dropped_attention(rng)
    arrays = {"q": q, "k": k, "v": v}
    out, ctx = F.attention_forward(q, k, v, keep=keep, rate=P)
    np.testing.assert_allclose(out, F.attention_forward(q, k, v)[1][3] * keep / (1 - P) @ v, rtol=1e-13)
    grads = dict(zip("qkv", F.attention_backward(dout, ctx)))
    for name, a in arrays.items():
        fd = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            old = a[i]
            a[i] = old + 1e-6
            up = np.sum(F.attention_forward(q, k, v, keep=keep, rate=P)[0] * dout)
            a[i] = old - 1e-6
            fd[i] = (up - np.sum(F.attention_forward(q, k, v, keep=keep, rate=P)[0] * dout)) / 2e-6
            a[i] = old
        assert rel_error(grads[name], fd) < 1e-7, name
    replayed = F.attention_backward(dout, F.drop_probs(ctx), replay=lambda: keep)
    assert all(np.array_equal(a, b) for a, b in zip(replayed, grads.values()))
    redrawn = F.attention_backward(dout, F.drop_probs(ctx), replay=lambda: rng.random(keep.shape) >= P)
    assert rel_error(redrawn[2], grads["v"]) > 1e-2  # a recompute that draws a fresh mask
    with pytest.raises(ValueError, match="replay"):
        F.attention_backward(dout, F.drop_probs(ctx))


def test_blocks_drop_the_normalised_probabilities_as_one_process_does():
    """Ring attention's kernel over 3 key blocks, each with its piece of the mask, merged:
    out = sum_k drop(p_k) v_k / sum_k p_k equals the dense dropped attention, and the block
    backward its gradients. Normalising by the dropped sum (sum_k drop(p_k)) is caught."""
    rng = np.random.default_rng(5)
    q, k, v, dout, keep = dropped_attention(rng)
    want, ctx = F.attention_forward(q, k, v, keep=keep, rate=P)
    dwant = F.attention_backward(dout, ctx)
    pos, cuts = np.arange(5), ((0, 2), (2, 3), (3, 5))

    def ring(kernel):
        state = empty_state(q)
        for a, b in cuts:
            state = merge(state, kernel(q, k[..., a:b, :], v[..., a:b, :], allowed(pos, pos[a:b], 5, True),
                                        keep=keep[..., a:b], rate=P))
        return finish(state)

    out, lse = ring(block_attention)
    assert rel_error(out, want) <= 1e-12
    delta, got = blocks.row_delta(dout, out), [np.zeros_like(q) for _ in range(3)]
    for a, b in cuts:
        g = blocks.block_attention_backward(q, k[..., a:b, :], v[..., a:b, :], dout, lse, delta,
                                            allowed(pos, pos[a:b], 5, True), keep=keep[..., a:b], rate=P)
        got[0] += g[0]
        got[1][..., a:b, :] += g[1]
        got[2][..., a:b, :] += g[2]
    assert max(rel_error(x, y) for x, y in zip(got, dwant)) <= 1e-12

    def dropped_normaliser(q, k, v, mask, keep, rate):
        acc, m, _ = block_attention(q, k, v, mask, keep=keep, rate=rate)
        p = np.exp(blocks._scores(q, k, mask, 1 / np.sqrt(q.shape[-1])) - blocks._finite(m))
        return acc, m, np.sum(F.dropped(p, keep, rate), axis=-1, keepdims=True)

    with np.errstate(invalid="ignore", divide="ignore"):  # a row whose one key was dropped: 0 / 0
        assert rel_error(np.nan_to_num(ring(dropped_normaliser)[0]), want) > 1e-2


def test_selective_recomputation_replays_the_attention_mask_where_the_draw_points():
    """A dense Block with dropout everywhere: selective's gradients bitwise equal to keeping p,
    when the draw points at the forward's (step, rows) again; a backward drawn at another
    micro-batch (``dropout_replay_redraws``'s mistake) gives other gradients."""
    from minipar.nn import recompute as rc
    from minipar.train.model import GPT, GPTConfig, place_dropout

    gpt = place_dropout(GPT(GPTConfig(**SHORT), seed=0), Draw(P, seed=1), SHORT["seq_len"])
    blk, x = gpt.h.children()["0"], np.random.default_rng(6).standard_normal((2, SHORT["seq_len"], SHORT["d_model"]))
    draw = blk.attn.drop.draw

    def grads(mode, rows_in_backward):
        blk.zero_grad()
        draw.at(step=0, rows=np.arange(2))
        y, ctx = rc.forward(blk, x, mode)
        draw.at(rows=rows_in_backward)
        dx = rc.backward(blk, np.ones_like(y), ctx, mode)
        return [dx] + [np.array(g) for _, g in blk.named_grads()]

    kept = grads("none", np.arange(2, 4))  # kept masks: where the draw points later does not matter
    assert all(np.array_equal(a, b) for a, b in zip(grads("selective", np.arange(2)), kept))
    assert max(rel_error(a, b) for a, b in zip(grads("selective", np.arange(2, 4)), kept)) > 1e-3


@pytest.mark.parametrize("p", [-0.1, 1, 1.5, float("nan"), True, "0.1"])
def test_a_dropout_outside_0_1_is_refused(p):
    with pytest.raises(UsageError, match="--dropout"):
        check_shapes(make_config(model=SHORT, dropout=p), 1)


def test_the_reference_drops():
    dropped, _ = train_reference(make_config(model=SHORT, steps=2, dropout=P))
    free, _ = train_reference(make_config(model=SHORT, steps=2))
    assert dropped[0] != free[0]


# every site drops on every grid: the embedding (first stage), the residuals, the MLP's hidden layer, the probabilities
GRIDS = [
    dict(model=SHORT, dp=1, pp=1, tp=2),  # the hidden layer's columns and the heads over tp
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, sequence_parallel=True, recompute="full"),  # zigzag, SP, the ring, replayed
    dict(model=SHORT, dp=1, pp=1, cp=2, tp=2, cp_attention="ulysses", recompute="selective"),  # the all-to-all's order
    dict(model=SHORT, dp=2, pp=2, tp=1, schedule="interleaved", chunks=2, microbatches=2, recompute="selective"),
    dict(model=SHORT, dp=1, pp=1, tp=1, schedule="gpipe", microbatches=2, recompute="full"),  # B0 after F1
    dict(model=MOE, dp=2, pp=1, tp=2, microbatches=2),  # the reference's rows in (micro-batch, replica) order
]
MUTANTS = [
    ("dropout_shared_in_tp", dict(model=SHORT, dp=1, pp=1, tp=2)),
    ("dropout_per_rank_seed", dict(model=SHORT, dp=2, pp=1, tp=1)),
    ("dropout_replay_redraws", dict(model=SHORT, dp=1, pp=1, tp=1, schedule="gpipe", microbatches=2, recompute="full")),
    ("dropout_replay_redraws", dict(model=SHORT, dp=1, pp=2, tp=1, schedule="interleaved", chunks=2, microbatches=2,
                                    recompute="selective")),  # the probabilities' masks drawn again at the last F's rows
    ("dropout_probs_local_head", dict(model=SHORT, dp=1, pp=1, tp=2)),
    ("dropout_probs_local_key", dict(model=SHORT, dp=1, pp=1, cp=2, tp=1)),
    ("dropout_embed_per_rank", dict(model=SHORT, dp=1, pp=1, tp=2, sequence_parallel=True)),
]


ACCOUNTED = [dict(model=SHORT, dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=2, sequence_parallel=True),
             dict(model=SHORT, dp=1, pp=2, tp=2, schedule="zb-h1", microbatches=2, recompute="full"),
             dict(model=SHORT, dp=1, pp=2, tp=2, microbatches=2, recompute="selective"),  # the probabilities' masks dropped
             dict(model=SHORT, dp=1, pp=1, cp=2, tp=2)]  # ring attention keeps no mask


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
    for mutant, cfg in MUTANTS:  # on each of its grids, the losses' check fails
        grid = label(make_config(**dict(cfg, dropout=P)))
        named = [r for r in rows if r["what"].startswith(f"{mutant}: {grid}") and "losses of" in r["what"]]
        assert named and not any(r["ok"] for r in named), (mutant, grid, named)


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
