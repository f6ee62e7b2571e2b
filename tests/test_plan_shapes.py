"""Today's model shapes (GQA, SwiGLU, RMSNorm, untied output, mixture of experts) and precision
conventions in the planner: exact published parameter counts, and the 2021-2022 presets' numbers
unchanged to the byte and the FLOP (snapshotted before these shapes were added)."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from minipar.cli import main
from minipar.errors import UsageError
from minipar.memory import Precision, precision_table
from minipar.plan.config import Config, Configs, Problem
from minipar.plan.hardware import preset
from minipar.plan import memory as plan_memory
from minipar.plan.memory import block_tensors, inflight, memory, rank_params
from minipar.plan.models import MODELS, ModelSpec, executed_flops, layer_flops, model_flops

ROOT = Path(__file__).resolve().parents[1]

# published totals (Hugging Face model cards / safetensors metadata; docs/planner.md cites them)
PUBLISHED = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800,
             "mixtral-8x7b": 46_702_792_704, "qwen3-30b-a3b": 30_532_122_624}
ACTIVE = {"mixtral-8x7b": 12_879_925_248, "qwen3-30b-a3b": 3_353_032_704}


def test_llama3_8b_by_hand():
    """32 layers x (q 4096^2 + k, v 2 x 4096 x 1024 + o 4096^2 + 3 x 4096 x 14336 + 2 norms 4096)
    + 2 x 128256 x 4096 (embedding, untied output) + 4096 (final norm)
    = 32 x 218,112,000 + 1,050,673,152 + 4096 = 8,030,261,248."""
    by_hand = 32 * (4096**2 + 2 * 4096 * 1024 + 4096**2 + 3 * 4096 * 14336 + 2 * 4096) + 2 * 128256 * 4096 + 4096
    assert by_hand == 8_030_261_248 == MODELS["llama3-8b"].params()


@pytest.mark.parametrize("name", PUBLISHED)
def test_new_presets_have_their_published_counts(name):
    m = MODELS[name]
    assert m.params() == PUBLISHED[name]
    assert m.active_params() == ACTIVE.get(name, PUBLISHED[name])


def test_mixtral_active_by_hand():
    """Per layer: attention 2 x 4096^2 + 2 x 4096 x 1024, two norms 2 x 4096, router 4096 x 8, and
    2 of the 8 experts (3 x 4096 x 14336 each); + embedding, output layer, final norm."""
    attn = 2 * 4096**2 + 2 * 4096 * 1024 + 2 * 4096 + 4096 * 8
    ends = 2 * 32000 * 4096 + 4096
    assert MODELS["mixtral-8x7b"].active_params() == 32 * (attn + 2 * 3 * 4096 * 14336) + ends
    assert MODELS["mixtral-8x7b"].params() == 32 * (attn + 8 * 3 * 4096 * 14336) + ends


LAYOUTS = [dict(tp=1, pp=1, dp=1),
           dict(tp=8, pp=4, dp=2, zero=1, microbatches=8, sequence_parallel=True, recompute="selective"),
           dict(tp=4, pp=2, dp=4, cp=2, zero=3, microbatches=4, schedule="interleaved", recompute="full"),
           dict(tp=2, pp=8, dp=2, zero=2, microbatches=16)]
MINIPAR_GPT = ModelSpec(4, 64, 8, 32, 96, ffn=256, name="minipar-gpt", dropout=False, qkv_bias=False, saves="minipar")

BEFORE = {  # name: (params, model FLOPs of 8 sequences, executed FLOPs (none, selective, full),
            #        per LAYOUTS entry: (first rank's total, its activations, last rank's total, its activations) bytes)
    "gpt3-175b": (174615846912, 17636441387433984, (17636441387433984, 17794771061833728, 23494639340224512),
        [(3345773625344, 551920074752, 3345773625344, 551920074752), (75977023488, 20560478208, 60428984320, 5263851520),
         (53650667520, 7071596544, 51675199488, 5146411008), (402703773696, 299976622080, 140568383488, 38067503104)]),
    "megatron-1.7b": (1652230656, 184151017783296, (184151017783296, 191572721270784, 241669219811328),
        [(59181670400, 32745979904, 59181670400, 32745979904), (1640661120, 967311360, 976434304, 350224384),
         (1054747776, 508035072, 1279676544, 742391808), (18635534208, 17137926144, 4045164928, 2589982720)]),
    "megatron-3.6b": (3562168320, 386547056640000, (386547056640000, 398916562452480, 510242114764800),
        [(110996357120, 54001664000, 110996357120, 54001664000), (3111241728, 1717567488, 1869789184, 538968064),
         (1883051008, 771751936, 2040349696, 941621248), (33351068672, 30433869824, 7122043904, 4261412864)]),
    "megatron-7.5b": (7467786240, 792473005719552, (792473005719552, 812264215019520, 1049758726619136),
        [(189261021184, 69776441344, 189261021184, 69776441344), (5188791296, 2575302656, 3284659200, 754974720),
         (3335804928, 1098907648, 3390347264, 1170210816), (47493933056, 41741713408, 11364272128, 5687476224)]),
    "megatron-18b": (18449756160, 1911088648028160, (1911088648028160, 1944073996861440, 2537810275860480),
        [(410916945920, 115720847360, 410916945920, 115720847360), (10476352512, 4290772992, 7246861312, 1186988032),
         (7168158720, 1774190592, 7042354176, 1673527296), (74789280768, 62612570112, 20385074176, 8321499136)]),
    "megatron-39b": (39096041472, 3999473546035200, (3999473546035200, 4052250104168448, 5318887499366400),
        [(810153148416, 184616484864, 810153148416, 184616484864), (19640295424, 6861881344, 14443716608, 1832910848),
         (13819465728, 2701131776, 13412651008, 2327838720), (124717793280, 100126425088, 37476417536, 13035896832)]),
    "megatron-76b": (76050739200, 7720633211289600, (7720633211289600, 7803096583372800, 10276997745868800),
        [(1504750796800, 287938969600, 1504750796800, 287938969600), (35185041920, 10716446720, 27058782720, 2799697920),
         (25076689920, 4005560320, 24237870080, 3208642560), (215877539840, 166765527040, 70314403840, 21390950400)]),
    "megatron-145b": (145622261760, 14707342411038720, (14707342411038720, 14839283806371840, 19589174038364160),
        [(2790071336960, 460115148800, 2790071336960, 460115148800), (63491395584, 17137926144, 50510270464, 4408213504),
         (45394753536, 6064963584, 43821938688, 4542431232), (336465223680, 250047627264, 118017703936, 31826378752)]),
    "megatron-310b": (310130540544, 31115079554433024, (31115079554433024, 31326185786966016, 41459284948549632),
        [(5697702461440, 735613812736, 5697702461440, 735613812736), (125461889024, 27413970944, 104696217600, 6983516160),
         (92069535744, 9428795392, 89330720768, 6757023744), (581230215168, 399968829440, 231576551424, 50616860672)]),
    "megatron-530b": (529600819200, 52920869034393600, (52920869034393600, 53209490836684800, 70526798974156800),
        [(9338059161600, 864446054400, 9338059161600, 864446054400), (210183132160, 38545653760, 180991185920, 9772728320),
         (154221363200, 12666798080, 150299770880, 8829009920), (835257630720, 508014100480, 391039262720, 64172851200)]),
    "megatron-1t": (1008038758400, 100404309472051200, (100404309472051200, 100844114123161600, 133829462956441600),
        [(17445317017600, 1316696883200, 17445317017600, 1316696883200), (373886771200, 57094963200, 330685952000, 14417920000),
         (282958604800, 18717081600, 276824537600, 12687769600), (1306115558400, 725614592000, 671465395200, 91435827200)]),
    "megatron-22b": (22074273792, 2287121624727552, (2287121624727552, 2326704043327488, 3039187578126336),
        [(524072714240, 170884333568, 524072714240, 170884333568), (12465297408, 5146411008, 8594077696, 1400897536),
         (8410053632, 2109734912, 8183585792, 1908408320), (105416613888, 91200946176, 25997578240, 11895046144)]),
    "bloom-176b": (176247242752, 17728594205736960, (17728594205736960, 17863284380139520, 23520271705047040),
        [(3292947546112, 472991662080, 3292947546112, 472991662080), (78001910784, 17997758464, 65039700992, 5035261952),
         (55007303680, 6341787648, 54699079680, 6033506304), (381142465536, 262596984832, 153601731584, 35055992832)]),
    "gpt2": (124439808, 6999559372800, (6999559372800, 7308797018112, 8700366422016),
        [(4562284544, 2571247616, 4562284544, 2571247616), (163814016, 81002496, 147266176, 72303616),
         (108665856, 55836672, 257553408, 206294016), (1824554880, 1572864000, 651806080, 407179264)]),
    "minipar-gpt": (207488, 336592896, (336592896, 344981504, 445644800),
        [(4136576, 816768, 4136576, 816768), (235200, 141440, 120176, 45616),
         (190336, 55808, 206400, 75712), (1245696, 923648, 442368, 137600)]),
}


def every_chunk_keeps_the_ends(prob, cfg):
    """The in-flight counts as they were before the interleaved fix: every chunk in flight on the
    first (last) rank counted as keeping the embedding's (LM head's) tensors."""
    fl, ll, _, _ = real_inflight_columns(prob, cfg)
    return fl, ll, fl, ll


real_inflight_columns = plan_memory.inflight_columns


def test_only_the_first_stage_keeps_the_embeddings_tensors_under_interleaving():
    """pp = 2, v = 2, m = 4, rank 0: F s0m0 F s0m1 F s2m0 F s2m1 F s0m2 (5 held, 3 of stage 0)
    B s2m0 F s0m3 (5 held, 4 of stage 0) B s2m1 F s2m2 B s0m0 ...: at most 4 of the 5 keep the
    embedding's tensors; rank 1 (stages 1 and 3) holds 3, at most 1 of the last stage. pp = 8,
    v = 2: 23 in flight on rank 0, at most 16 of stage 0. Without interleaving, all of them."""
    assert inflight("interleaved", 2, 4, 2) == (5, 3, 4, 1)
    assert inflight("interleaved", 8, 64, 2)[::2] == (23, 16)
    assert inflight("1f1b", 8, 64, 1) == (8, 1, 8, 1)


@pytest.mark.parametrize("name", BEFORE)
def test_todays_presets_are_unchanged(name, monkeypatch):
    """The snapshot was taken before the interleaved schedule's fix above: it is reproduced with
    the old count, and every other number is unchanged."""
    monkeypatch.setattr(plan_memory, "inflight_columns", every_chunk_keeps_the_ends)
    m = MINIPAR_GPT if name == "minipar-gpt" else MODELS[name]
    params, flops, executed, mems = BEFORE[name]
    assert m.params() == params
    assert model_flops(m, 8) == flops
    assert tuple(executed_flops(m, 8, r) for r in ("none", "selective", "full")) == executed
    for lay, want in zip(LAYOUTS, mems):
        c = Config(**lay)
        prob = Problem(m, c.tp * c.pp * c.dp * c.cp, 8, preset("a100-80gb"), c.dp * c.microbatches * 2)
        mem = memory(prob, Configs.of([c]))
        got = tuple(float(mem[end][k][0]) for end in ("first", "last") for k in ("total", "activations"))
        assert got == want, lay


def test_gqa_changes_no_attention_score_flops_and_causal_halves_them():
    m = MODELS["llama3-8b"]
    mm, att = layer_flops(m, m.seq)
    assert att == layer_flops(replace(m, kv_heads=32), m.seq)[1] == 4 * m.seq**2 * 4096
    assert mm < layer_flops(replace(m, kv_heads=32), m.seq)[0]
    assert layer_flops(replace(m, causal_flops=True), m.seq) == (mm, att / 2)


# Megatron-LM's "Distributed Optimizer" guide: bytes per parameter, (non-distributed, distributed)
MEGATRON = {("fp16", "fp16"): (20, "4 + 16/d"), ("fp16", "fp32"): (18, "6 + 12/d"), ("fp32", "fp32"): (16, "8 + 8/d")}


def test_precision_table_is_megatrons_and_the_docs():
    for (params, grads), (total, dist) in MEGATRON.items():
        bp, bg, k = Precision(params, grads).bytes
        assert bp + bg + k == total and f"{bp + bg} + {k}/d" == dist
    doc = (ROOT / "docs" / "planner.md").read_text()
    assert "\n".join(precision_table()) in doc


def test_precision_reaches_the_planner():
    m, c = MODELS["llama3-8b"], Config(dp=8, zero=1)
    base = Problem(m, 8, 8, preset("a100-80gb"), 8)
    states = {}
    for prec in (None, Precision("bf16"), Precision("bf16", "bf16")):
        mem = memory(replace(base, precision=prec), Configs.of([c]))
        states[prec] = sum(float(mem[k][0]) for k in ("params", "grads", "optimizer"))
    psi = m.params()
    assert states[None] == pytest.approx(psi * (4 + 12 / 8))
    assert states[Precision("bf16")] == pytest.approx(psi * (6 + 12 / 8))
    assert states[Precision("bf16", "bf16")] == pytest.approx(psi * (4 + 16 / 8))


@pytest.mark.parametrize("kw,needle", [
    (dict(hidden=4095), "not divisible by --heads"),
    (dict(kv_heads=5), "--heads 32 is not divisible by --kv-heads 5"),
    (dict(experts=8, top_k=9), "--top-k 9 must be between 1 and --experts 8"),
    (dict(top_k=2), "need --experts"),
    (dict(mlp="relu"), "--mlp 'relu'"),
])
def test_inconsistent_shapes_are_refused(kw, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        replace(MODELS["llama3-8b"], **kw)


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama3-8b", "--kv-heads", "5"], "--kv-heads 5"),
    (["--model", "llama3-70b", "--tp", "16"], "the 8 KV heads"),
    (["--model", "mixtral-8x7b", "--top-k", "9"], "--top-k 9"),
    (["--model", "gpt2", "--grad-dtype", "bf16"], "--grad-dtype needs --precision"),
    (["--model", "gpt2", "--precision", "fp16", "--grad-dtype", "bf16"], "gradients in bf16 with fp16 weights"),
    (["--model", "gpt2", "--distributed-optimizer", "--zero", "2"], "--distributed-optimizer is ZeRO-1"),
])
def test_cli_refuses_in_one_line(args, needle, capsys):
    code = main(["plan", "--gpus", "64", "--global-batch", "64", "--allow-cross-node-tp", *args])
    text = capsys.readouterr().out
    assert code == 2 and text.count("\n") == 1 and needle in text, text


def test_cli_plans_a_moe_with_overrides_and_says_its_limits(capsys):
    code = main(["plan", "--model", "mixtral-8x7b", "--experts", "16", "--top-k", "4", "--gpus", "32",
                 "--global-batch", "32", "--tp", "8", "--pp", "2", "--precision", "bf16", "--distributed-optimizer", "--top", "1"])
    text = capsys.readouterr().out
    assert code == 0
    assert "16 experts, top 4" in text and "over ep of the dp ranks (ep searched)" in text
    assert "2 + 4 + 12 = 18 bytes per parameter" in text and "zero=1" in text


def test_llama_block_activations_by_hand():
    """Llama-3-8B's block, 16-bit, no dropout, b = 1: the norm, QKV, projection, norm and MLP inputs
    (5 e s h), q (e s h), K and V (2 e s kv, kv = 8 x 128 = 1024), SwiGLU's gate and up (2 e s f),
    the down projection's input (e s f), the softmax (e a s^2)."""
    m = MODELS["llama3-8b"]
    s, h, f, kv, a, e = m.seq, 4096, 14336, 1024, 32, 2
    mem = block_tensors(Problem(m, 1, 1, preset("a100-80gb"), 1), 1, 1, 1, False)
    assert sum(mem.values()) == e * s * (6 * h + 2 * kv + 3 * f) + e * a * s * s


def test_untied_output_layer_is_split_over_tp_on_the_last_rank():
    m = MODELS["llama3-8b"]
    split, rep = m.layer_params()
    emb, head, norm = 128256 * 4096, 128256 * 4096, 4096
    for pp, first_want, last_want in ((1, 32 * (split / 8 + rep) + (emb + head) / 8 + norm, None),
                                      (2, 16 * (split / 8 + rep) + emb / 8, 16 * (split / 8 + rep) + head / 8 + norm)):
        first, last, _ = rank_params(Problem(m, 8 * pp, 8, preset("a100-80gb"), 8), Configs.of([Config(tp=8, pp=pp)]))
        assert float(first[0]) == first_want
        assert last_want is None or float(last[0]) == last_want
