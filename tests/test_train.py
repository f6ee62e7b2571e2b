"""Lesson 05, one process: the GPT against torch autograd, its pieces, the shape checks, the formulas."""
import numpy as np
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.nn import cross_entropy
from minipar.train.data import Data, decode, encode
from minipar.train.model import GPT, GPTConfig
from minipar.train.trainer import TrainConfig, check_shapes

CFG = GPTConfig(vocab=32, d_model=16, n_heads=8, n_layers=2, seq_len=8)


def _grads(model, ids, labels):
    model.zero_grad()
    logits, ctx = model.forward(ids)
    loss, dlogits = cross_entropy(logits, labels)
    model.backward(dlogits, ctx)
    return float(loss), {n: np.array(g) for n, g in model.named_grads()}


def _max_rel(got, want):
    return max(np.max(np.abs(got[k] - want[k])) / np.max(np.abs(want[k])) for k in want)


@pytest.mark.torch
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt_equals_torch_autograd(recompute):
    """Losses and every gradient equal torch autograd's (float64, 1e-12): the tied head included."""
    pytest.importorskip("torch")
    from minipar.train.torch_oracle import oracle_loss_and_grads

    model = GPT(CFG, seed=3)
    model.recompute = recompute
    tok = np.random.default_rng(4).integers(0, CFG.vocab, (4, CFG.seq_len + 1))
    loss, grads = _grads(model, tok[:, :-1], tok[:, 1:])
    want_loss, want = oracle_loss_and_grads(dict(model.named_parameters()), tok[:, :-1], tok[:, 1:], CFG)
    assert sorted(grads) == sorted(want)
    assert abs(loss - want_loss) / want_loss <= 1e-12
    assert _max_rel(grads, want) <= 1e-12


@pytest.mark.torch
def test_untied_head_is_caught_by_the_oracle():
    """Wrong way: a head with its own copy of wte misses half of wte's gradient."""
    pytest.importorskip("torch")
    from minipar.nn import LMHead
    from minipar.train.torch_oracle import oracle_loss_and_grads

    model = GPT(CFG, seed=3)
    model.head = LMHead(None, wte=model.embed.params["wte"])
    tok = np.random.default_rng(4).integers(0, CFG.vocab, (4, CFG.seq_len + 1))
    loss, grads = _grads(model, tok[:, :-1], tok[:, 1:])
    _, want = oracle_loss_and_grads(dict(model.embed.named_parameters(prefix="embed.")) | {
        n: p for n, p in model.named_parameters() if not n.startswith(("embed.", "head."))}, tok[:, :-1], tok[:, 1:], CFG)
    assert np.max(np.abs(grads["embed.wte"] - want["embed.wte"])) / np.max(np.abs(want["embed.wte"])) > 1e-3


def test_selective_and_full_recompute_keep_less():
    from minipar.train.trainer import held_bytes
    from minipar.xp import storage

    tok = np.random.default_rng(0).integers(0, CFG.vocab, (2, CFG.seq_len))
    sizes = {}
    for mode in ("none", "selective", "full"):
        model = GPT(CFG)
        model.recompute = mode
        _, ctx = model.forward(tok)
        sizes[mode] = held_bytes(ctx, {storage(p)[0] for _, p in model.named_parameters()})
    assert sizes["none"] > sizes["selective"] > sizes["full"]
    b, T, C, a, L = 2, CFG.seq_len, CFG.d_model, CFG.n_heads, CFG.n_layers
    assert sizes["none"] - sizes["selective"] == L * b * a * T * T * 8  # exactly the probabilities
    assert sizes["full"] == L * b * T * C * 8 + 8 * b * T + 8 * (b * T * (C + 1) + b * T * C)  # inputs, ids, ln_f, head


def test_embedding_backward_adds_repeated_tokens():
    """The scatter-add: a token that appears twice gets both gradients (assignment keeps one)."""
    from minipar.nn import Embedding

    emb = Embedding(5, 3, np.random.default_rng(0))
    ids = np.array([[1, 1, 2]])
    dy = np.random.default_rng(1).standard_normal((1, 3, 3))
    emb.backward_weight(dy, {"ids": ids})
    assert np.allclose(emb.grads["wte"][1], dy[0, 0] + dy[0, 1]) and np.allclose(emb.grads["wte"][2], dy[0, 2])
    wrong = np.zeros((5, 3))
    wrong[ids.reshape(-1)] += dy.reshape(-1, 3)  # the mistake index_add exists for
    assert not np.allclose(wrong[1], emb.grads["wte"][1])


def test_data_order_is_a_function_of_the_step():
    data = Data.sorting(seed=0, lines=500)
    a, b = data.batch(7, 4, 16), Data.sorting(seed=0, lines=500).batch(7, 4, 16)
    assert np.array_equal(a, b) and not np.array_equal(a, data.batch(8, 4, 16))
    assert decode(encode("3142>1234\n")) == "3142>1234\n"
    line = decode(data.tokens[data.starts[3]:]).split("\n")[0]
    digits, answer = line.split(">")
    assert answer == "".join(sorted(digits))
    assert data.unigram_entropy() > 2.0


@pytest.mark.parametrize("kw,world,needle", [
    (dict(tp=3), 3, "n_heads=8 is not divisible"),
    (dict(model=GPTConfig(n_heads=6, d_model=12, vocab=32), tp=3), 3, "vocab=32 is not divisible"),
    (dict(pp=3), 3, "n_layers=8 is not divisible by pp x chunks = 3"),
    (dict(pp=4, schedule="interleaved", microbatches=4, model=GPTConfig(n_layers=4)), 4, "n_layers=4 is not divisible by pp x chunks = 8"),
    (dict(dp=2, microbatches=3), 2, "--batch=32 is not divisible by dp x microbatches = 2 x 3"),
    (dict(pp=2, schedule="interleaved", microbatches=3, batch=12), 2, "--microbatches=3 is not divisible by --pp=2"),
    (dict(dp=2, pp=2, tp=2), 6, "-n 6: the grid dp=2 x pp=2 x tp=2 needs 8 ranks"),
    (dict(tp=2, sequence_parallel=True, model=GPTConfig(seq_len=7)), 2, "seq_len=7 is not divisible by --tp=2"),
    (dict(zero=4), 1, "--zero=4"),
    (dict(zero=2, reshard=True), 1, "--reshard with --zero=2"),
    (dict(schedule="naive"), 1, "--schedule='naive'"),
    (dict(dp=2, pp=2, tp=2, cp=2), 8, "-n 8: the grid dp=2 x pp=2 x cp=2 x tp=2 needs 16 ranks"),
    (dict(cp=3), 3, "--cp=3: seq_len=8 is not divisible by 2 x cp = 6"),
    (dict(cp_attention="flash"), 1, "--cp-attention='flash'"),
    (dict(cp=2, tp=2, cp_attention="ulysses", model=GPTConfig(n_heads=2)), 4, "the 1 heads of a TP rank"),
    (dict(cp=2, tp=4, sequence_parallel=True, model=GPTConfig(seq_len=12)), 8, "seq_len=12 / cp = 6 is not divisible by --tp=4"),
    (dict(dp=3, model=GPTConfig(n_experts=4)), 3, "--experts=4 is not divisible by --dp=3"),
    (dict(model=GPTConfig(n_experts=2, top_k=3)), 1, "--top-k=3"),
    (dict(dp=2, cp=2, model=GPTConfig(n_experts=4)), 4, "--experts with --cp=2"),
    (dict(tp=2, sequence_parallel=True, model=GPTConfig(n_experts=2)), 2, "--experts with --sequence-parallel"),
])
def test_shapes_that_do_not_fit_are_refused_naming_the_dimension(kw, world, needle):
    cfg = TrainConfig(**kw)
    with pytest.raises(UsageError, match=None) as info:
        check_shapes(cfg, world)
    assert needle in str(info.value)


def test_every_8_rank_factorization_fits():
    fits = [(d, p, t) for d in (1, 2, 4, 8) for p in (1, 2, 4, 8) for t in (1, 2, 4, 8) if d * p * t == 8]
    assert len(fits) == 10
    for d, p, t in fits:
        check_shapes(TrainConfig(dp=d, pp=p, tp=t, microbatches=2), 8)


def test_every_8_rank_factorization_with_cp_fits():
    fits = [(d, p, c, t) for d in (1, 2, 4, 8) for p in (1, 2, 4, 8) for c in (1, 2, 4, 8) for t in (1, 2, 4, 8)
            if d * p * c * t == 8]
    assert len(fits) == 20
    for d, p, c, t in fits:
        check_shapes(TrainConfig(GPTConfig(seq_len=16), dp=d, pp=p, cp=c, tp=t, microbatches=2), 8)


def test_grid_groups_on_four_axes():
    """Each group is a slice of arange(n).reshape(dp, pp, cp, tp): the colours of ``axis_color``
    put exactly those ranks together; three axes keep lesson 05's colours. Wrong way: the
    gradient group without cp (dp alone) is a different partition."""
    from minipar.grid import axis_color

    shape = (2, 3, 2, 2)
    ranks = np.arange(24).reshape(shape)
    want = {"tp": lambda d, p, c, t: ranks[d, p, c, :], "cp": lambda d, p, c, t: ranks[d, p, :, t],
            "pp": lambda d, p, c, t: ranks[d, :, c, t], "dp": lambda d, p, c, t: ranks[:, p, c, t],
            "dp+cp": lambda d, p, c, t: ranks[:, p, :, t]}
    for axis, members in want.items():
        for pos in np.ndindex(*shape):
            mine = axis_color(shape, pos, axis)
            same = sorted(int(ranks[q]) for q in np.ndindex(*shape) if axis_color(shape, q, axis) == mine)
            assert same == sorted(members(*pos).reshape(-1).tolist()), (axis, pos)
    for pos in np.ndindex(2, 3, 2):  # three axes: the colours lesson 05 always had
        d, p, t = pos
        assert [axis_color((2, 3, 2), pos, a) for a in ("tp", "pp", "dp")] == [d * 3 + p, d * 2 + t, p * 2 + t]
    group = {axis_color(shape, q, "dp+cp") for q in np.ndindex(*shape)}
    assert len(group) == 6 and len({axis_color(shape, q, "dp") for q in np.ndindex(*shape)}) == 12


def test_position_embedding_of_cp_ranks_adds_their_positions():
    """Each cp rank adds the wpe rows of its zigzag positions; the cp ranks' gradients, summed,
    are the dense gradient. Wrong way: the dense layer on a rank's rows adds rows 0 ... T/cp-1."""
    from minipar.context_parallel import ContextParallelPositionEmbedding, SeqLayout
    from minipar.nn import PositionEmbedding

    rng = np.random.default_rng(7)
    T, cp, C = 8, 2, 3
    dense = PositionEmbedding(T, C, rng)
    x, dy = rng.standard_normal((2, T, C)), rng.standard_normal((2, T, C))
    y, _ = dense.forward(x)
    dense.backward_weight(dy, {})
    lay, total = SeqLayout(T, cp), np.zeros((T, C))
    for c in range(cp):
        pos = ContextParallelPositionEmbedding(dense, lay.positions(c))
        assert np.array_equal(pos.forward(lay.shard(x, c))[0], lay.shard(y, c))
        pos.backward_weight(lay.shard(dy, c), {})
        total += pos.grads["wpe"]
        wrong, _ = PositionEmbedding.forward(dense, lay.shard(x, c))
        assert not np.allclose(wrong, lay.shard(y, c))
    assert np.allclose(total, dense.grads["wpe"], rtol=1e-14, atol=0)


def test_parameter_count_with_experts():
    for cfg in (GPTConfig(), GPTConfig(n_experts=4, top_k=2), GPTConfig(n_experts=3, d_hidden=8)):
        assert GPT(cfg).num_params() == cfg.num_params()
    assert GPTConfig(n_experts=4).num_params() > 3 * GPTConfig().num_params() // 2  # the experts are most of it


def test_memory_formula_reproduces_korthikanti():
    """The per-layer formula in docs/train.md, in mixed precision with Megatron's choices, is
    34 s b h + 5 a s^2 b; with TP, SP and selective recomputation their variants."""
    from minipar.activations import drop_scores, megatron_block

    def megatron_layer_bytes(s, b, h, a, t=1, sp=False, selective=False):
        tensors = megatron_block(b, s, h, 4 * h, a, t, sp=sp)  # 16-bit, dropout, MLP 4h
        return sum((drop_scores("megatron", tensors) if selective else tensors).values())

    s, b, h, a, t = 2048, 4, 4096, 32, 8
    assert megatron_layer_bytes(s, b, h, a) == 34 * s * b * h + 5 * a * s * s * b
    assert megatron_layer_bytes(s, b, h, a, t=t) == s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t
    assert megatron_layer_bytes(s, b, h, a, t=t, sp=True) == s * b * h * 34 / t + 5 * a * s * s * b / t
    assert megatron_layer_bytes(s, b, h, a, t=t, sp=True, selective=True) == s * b * h * 34 / t


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_full_recompute_lowers_the_peak_inside_the_backward():
    """Full recomputation keeps only each block's input between F and B (the ledger), and the fused
    B rebuilds one block at a time, so the peak *inside* the step falls too: below what no
    recomputation keeps between actions. A stage that ran backward_input over every block before
    any backward_weight held every rebuilt ctx at once: 41 MiB here, above no recomputation's 31."""
    peaks = {mode: launch(1, "tests.ranks:step_peak", quiet=True, recompute=mode).results[0]
             for mode in ("none", "full")}
    (none_peak, none_held), (full_peak, full_held) = peaks["none"], peaks["full"]
    assert full_held < none_held / 4, peaks  # between actions: the block inputs only
    assert full_peak < none_held and full_peak < none_peak / 2, peaks
