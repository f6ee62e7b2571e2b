"""The models the planner knows: a GPT block stack, its parameters and its FLOPs.

    m = model("gpt3-175b")                 # or ModelSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
    m.params()                             # 174.6e9 (Narayanan et al. 2021's formula, + final LayerNorm)
    model_flops(m, batch=1536)             # FLOPs of one step: forward + backward, no recomputation

A block is Megatron's GPT layer: LayerNorm, attention (QKV, scores, softmax, AV, projection),
LayerNorm, MLP (hidden -> ffn -> hidden, GeLU). Per layer and sequence of s tokens, forward
(Korthikanti et al. 2022, appendix A; Narayanan et al. 2021, sec. 5.1):

    matmuls with weights   2 s (4 h^2 + 2 h ffn)      (QKV 6sh^2, projection 2sh^2, MLP 4 s h ffn)
    attention scores       4 s^2 h                    (Q K^T and softmax(.) V, 2 s^2 h each)
    LM head                2 s h V                    (once, after the last layer)

Backward is twice the forward. Full recomputation runs the layers' forward once more; selective
recomputation runs only the attention-score part again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError

SAVES = ("megatron", "minipar")


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int = 0  # MLP width; 0 means 4 * hidden
    name: str = "custom"
    position_embeddings: bool = True  # learned positions (s * h parameters); False for ALiBi/RoPE
    dropout: bool = True  # dropout masks are stored (1 byte per element), as in Megatron's GPT
    qkv_bias: bool = True  # Megatron's QKV projection has a bias; minipar's GPT has none
    saves: str = "megatron"  # which tensors a block keeps for its backward: ``minipar.activations``'s tables

    def __post_init__(self):
        for k in ("layers", "hidden", "heads", "seq"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UsageError(f"--{k} must be a positive integer, got {v!r}")
        if not isinstance(self.vocab, int) or self.vocab < 0:
            raise UsageError(f"--vocab must be a non-negative integer, got {self.vocab!r}")
        if self.hidden % self.heads:
            raise UsageError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.saves not in SAVES:
            raise UsageError(f"saves={self.saves!r}: choose one of {', '.join(SAVES)}")

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    # parameters -----------------------------------------------------------------------------
    def layer_params(self) -> tuple[int, int]:
        """(split by tensor parallelism, replicated) parameters of one block.

        Split: QKV (3h^2 + 3h bias, or no bias), projection weight h^2, MLP weights 2 h ffn, fc1
        bias ffn. Replicated on every TP rank: projection and fc2 biases, two LayerNorms (2h each).
        """
        h, f = self.hidden, self.f
        return 4 * h * h + 2 * h * f + (3 * h if self.qkv_bias else 0) + f, 6 * h

    def embedding_params(self) -> tuple[int, int]:
        """(vocabulary embedding, split over TP; position embedding, replicated)."""
        return self.vocab * self.hidden, (self.seq * self.hidden if self.position_embeddings else 0)

    def params(self) -> int:
        """All parameters: blocks, embeddings (tied with the LM head), final LayerNorm."""
        split, rep = self.layer_params()
        emb, pos = self.embedding_params()
        return self.layers * (split + rep) + emb + pos + 2 * self.hidden


def layer_flops(m: ModelSpec, tokens_per_seq: float):
    """(weight matmul, attention score) forward FLOPs of one block for ONE sequence, split over
    ``tokens_per_seq`` query tokens (s, or s/cp with context parallelism)."""
    h = m.hidden
    return 2 * tokens_per_seq * (4 * h * h + 2 * h * m.f), 4 * tokens_per_seq * m.seq * h


def model_flops(m: ModelSpec, batch: float) -> float:
    """FLOPs the model needs for one step of ``batch`` sequences: 3x forward, no recomputation.
    For the standard block: 72 B L s h^2 (1 + s/6h + V/12hL) (Korthikanti et al. 2022, eq. 7)."""
    mm, att = layer_flops(m, m.seq)
    return 3 * batch * (m.layers * (mm + att) + 2 * m.seq * m.hidden * m.vocab)


def executed_flops(m: ModelSpec, batch: float, recompute: str) -> float:
    """FLOPs actually run: the model's, plus the recomputed forward (full: whole blocks;
    selective: attention scores only). Full: 96 B L s h^2 (1 + s/6h + V/16hL), Narayanan eq. 3."""
    mm, att = layer_flops(m, m.seq)
    extra = {"none": 0, "selective": att, "full": mm + att}[recompute]
    return model_flops(m, batch) + batch * m.layers * extra


# Named models. Megatron's table (Narayanan et al. 2021, Table 1) uses V = 51200, s = 2048.
def _megatron(name, heads, hidden, layers):
    return ModelSpec(layers, hidden, heads, 2048, 51200, name=name)


MODELS = {m.name: m for m in [
    _megatron("gpt3-175b", 96, 12288, 96),
    _megatron("megatron-1.7b", 24, 2304, 24),
    _megatron("megatron-3.6b", 32, 3072, 30),
    _megatron("megatron-7.5b", 32, 4096, 36),
    _megatron("megatron-18b", 48, 6144, 40),
    _megatron("megatron-39b", 64, 8192, 48),
    _megatron("megatron-76b", 80, 10240, 60),
    _megatron("megatron-145b", 96, 12288, 80),
    _megatron("megatron-310b", 128, 16384, 96),
    _megatron("megatron-530b", 128, 20480, 105),
    _megatron("megatron-1t", 160, 25600, 128),
    _megatron("megatron-22b", 64, 6144, 48),  # Korthikanti et al. 2022, Table 3
    # BLOOM: ALiBi (no position embeddings), vocab 250880 (bigscience tr11-176B-ml)
    ModelSpec(70, 14336, 112, 2048, 250880, name="bloom-176b", position_embeddings=False),
    ModelSpec(12, 768, 12, 1024, 50257, name="gpt2"),  # the Hugging Face guide's DDP benchmark model
]}


def minipar_gpt(gpt) -> ModelSpec:
    """The planner's view of lesson 05's GPT (``minipar.train.GPTConfig``): no dropout, no QKV
    bias, learned positions, the head tied to the embedding, and minipar's layers' saved tensors."""
    return ModelSpec(gpt.n_layers, gpt.d_model, gpt.n_heads, gpt.seq_len, gpt.vocab, ffn=gpt.hidden,
                     name="minipar-gpt", dropout=False, qkv_bias=False, saves="minipar")


def model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise UsageError(f"--model {name!r}: choose one of {', '.join(MODELS)}, or give --layers --hidden "
                         f"--heads --seq --vocab")
    return MODELS[name]


def with_overrides(m: ModelSpec, **kw) -> ModelSpec:
    """``m`` with the given fields replaced (None values ignored)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    return replace(m, **kw) if kw else m
