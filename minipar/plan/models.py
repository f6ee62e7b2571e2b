"""The models the planner knows: a transformer block stack, its parameters and its FLOPs.

    m = model("gpt3-175b")                 # or ModelSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
    m.params()                             # 174.6e9 (Narayanan et al. 2021's formula, + final LayerNorm)
    model("llama3-8b").params()            # 8,030,261,248: GQA, SwiGLU, RMSNorm, untied output layer
    model("mixtral-8x7b").active_params()  # 12,879,925,248 of 46,702,792,704: top-2 of 8 experts
    model_flops(m, batch=1536)             # FLOPs of one step: forward + backward, no recomputation

A block is Megatron's GPT layer: norm, attention (Q, K, V, scores, softmax, AV, projection), norm,
MLP. The 2021-2022 GPT block (the default ModelSpec) has LayerNorms, biases, learned positions,
q heads = KV heads, a GeLU MLP (hidden -> ffn -> hidden) and the LM head tied to the embedding;
today's blocks change some of these, each a field:

    kv_heads     grouped-query attention: K and V are h x (kv_heads d) with d = head_dim (h / heads
                 unless given); Q and the projection h x (heads d)
    mlp          "gelu": 2 matrices h x ffn; "swiglu": 3 (gate, up, down)
    norm         "layernorm": weight and bias, 2h; "rmsnorm": weight only, h. qk_norm: an RMSNorm
                 of d on every q and k head (Qwen3), 2d per layer
    bias         biases of the projection and MLP matrices (qkv_bias: of Q, K, V); Llama has none
    tied         the LM head is the embedding; False: a separate output matrix V x h
    positions    "learned" (s h parameters), "rope" or "alibi" (none)
    experts      mixture of experts: EVERY layer's MLP is `experts` MLPs of width expert_ffn
                 (default ffn), a router h x experts picks top_k of them per token, and
                 shared_experts more (same width) see every token

Tensor parallelism splits Q, K, V (whole heads: tp must divide heads and kv_heads; we refuse
otherwise rather than replicate K and V as Megatron does when tp > kv_heads), the projection, the
MLP matrices (every expert's, column/row parallel; expert parallelism, ``Config.ep``, splits the routed experts
further: ``expert_params``), the QKV and first-MLP
biases, the vocabulary embedding and output layer; norms, the other biases and the router are
replicated (``layer_params``).

FLOPs per layer and sequence of s tokens, forward (Korthikanti et al. 2022, appendix A;
Narayanan et al. 2021, sec. 5.1): 2 per multiply-add of a weight a token meets, and the two
attention products, which have one row per q head whatever kv_heads is:

    matmuls with weights   2 s P_active               P_active: Q, K, V, projection, the MLP
                                                       matrices of top_k + shared experts, router
                                                       (GPT: 4 h^2 + 2 h ffn)
    attention scores       4 s^2 heads d              (Q K^T and softmax(.) V, 2 s^2 h each);
                                                       halved with causal_flops (Megatron since
                                                       2025 counts only the unmasked half)
    LM head                2 s h V                    (once, after the last layer)

Backward is twice the forward. Full recomputation runs the layers' forward once more; selective
recomputation runs only the attention-score part again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError

SAVES = ("megatron", "minipar")
MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "alibi")


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int = 0  # MLP width; 0 means 4 * hidden
    name: str = "custom"
    positions: str = "learned"  # "learned" (s * h parameters), "rope" or "alibi" (none)
    dropout: bool = True  # dropout masks are stored (1 byte per element), as in Megatron's GPT
    qkv_bias: bool = True  # Megatron's QKV projection has a bias; minipar's GPT has none
    saves: str = "megatron"  # which tensors a block keeps for its backward: ``minipar.activations``'s tables
    kv_heads: int = 0  # K and V heads (grouped-query attention); 0 means heads
    head_dim: int = 0  # d, width of a head; 0 means hidden / heads
    mlp: str = "gelu"  # "gelu" (2 matrices) or "swiglu" (3: gate, up, down)
    norm: str = "layernorm"  # "layernorm" (2h) or "rmsnorm" (h)
    qk_norm: bool = False  # an RMSNorm of d on every q and k head
    bias: bool = True  # biases of the projection and MLP matrices
    tied: bool = True  # the LM head is the embedding matrix; False: its own V x h
    experts: int = 0  # routed experts per layer (every layer); 0: a dense MLP
    top_k: int = 0  # experts a token visits (with experts > 0)
    shared_experts: int = 0  # experts every token visits
    expert_ffn: int = 0  # an expert's MLP width; 0 means ffn
    causal_flops: bool = False  # count half the attention-score FLOPs (the causal mask's half)

    def __post_init__(self):
        for k in ("layers", "hidden", "heads", "seq"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UsageError(f"--{k} must be a positive integer, got {v!r}")
        for k in ("vocab", "ffn", "kv_heads", "head_dim", "experts", "top_k", "shared_experts", "expert_ffn"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 0:
                raise UsageError(f"--{k.replace('_', '-')} must be a non-negative integer, got {v!r}")
        if not self.head_dim and self.hidden % self.heads:
            raise UsageError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.heads % self.kv:
            raise UsageError(f"--heads {self.heads} is not divisible by --kv-heads {self.kv}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise UsageError(f"--top-k {self.top_k} must be between 1 and --experts {self.experts}")
        if not self.experts and (self.top_k or self.shared_experts or self.expert_ffn):
            raise UsageError("--top-k, --shared-experts and --expert-ffn need --experts")
        for k, options in (("saves", SAVES), ("mlp", MLPS), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, k) not in options:
                raise UsageError(f"--{k} {getattr(self, k)!r}: choose one of {', '.join(options)}")

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        """K and V heads."""
        return self.kv_heads or self.heads

    @property
    def d(self) -> int:
        """Width of one head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def ef(self) -> int:
        """An expert's MLP width."""
        return self.expert_ffn or self.f

    @property
    def mlp_width(self) -> int:
        """The width a token's MLP output is computed over: ffn, or (top_k + shared) x expert_ffn."""
        return (self.top_k + self.shared_experts) * self.ef if self.experts else self.f

    def tp_splits(self, tp: int) -> bool:
        """Whether ``tp`` ranks can share every layer: whole q heads and KV heads, and the MLP width."""
        return self.heads % tp == 0 and self.kv % tp == 0 and (self.ef if self.experts else self.f) % tp == 0

    # parameters -----------------------------------------------------------------------------
    def _mlp_params(self, width: int) -> tuple[int, int]:
        """(split, replicated) of one MLP of ``width``: 2 or 3 matrices h x width; with biases, the
        first layer's (width per input matrix: split) and the last layer's (h: replicated)."""
        n_in = 2 if self.mlp == "swiglu" else 1
        return (n_in + 1) * self.hidden * width + (n_in * width if self.bias else 0), (self.hidden if self.bias else 0)

    def _attention_params(self) -> tuple[int, int]:
        """(split, replicated): Q, O h x heads d, K, V h x kv d (+ their biases); projection bias."""
        h, q, kv = self.hidden, self.heads * self.d, self.kv * self.d
        split = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.qkv_bias else 0)
        return split, (h if self.bias else 0) + (2 * self.d if self.qk_norm else 0)

    def _norm(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_params(self, active: bool = False) -> tuple[int, int]:
        """(split by tensor parallelism, replicated) parameters of one block (``active``: only the
        experts a token visits, top_k + shared).

        Split: Q, K, V, projection weights, MLP weights (every expert's), the QKV and first-layer
        MLP biases. Replicated on every TP rank: the projection and last-layer MLP biases, two
        norms, the q/k norms, the router h x experts. GPT: 4h^2 + 2h ffn + 3h + ffn split, 6h
        replicated.
        """
        a_split, a_rep = self._attention_params()
        if not self.experts:
            m_split, m_rep = self._mlp_params(self.f)
        else:
            n = (self.top_k if active else self.experts) + self.shared_experts
            e_split, e_rep = self._mlp_params(self.ef)
            m_split, m_rep = n * e_split, n * e_rep + self.hidden * self.experts
        return a_split + m_split, a_rep + m_rep + 2 * self._norm()

    def linears(self) -> list[int]:
        """The weights of a block's Linear modules in forward order (before tp splits them):
        Megatron's fused QKV h x (q + 2 kv), the projection, the first MLP layer (SwiGLU: gate and
        up fused) and the last; with experts, the first and last layer of each expert in turn.
        DeepSpeed's ZeRO-3 gathers module by module."""
        h, q, kv = self.hidden, self.heads * self.d, self.kv * self.d
        f = self.ef if self.experts else self.f
        mlp = [(2 if self.mlp == "swiglu" else 1) * h * f, h * f] * (self.experts + self.shared_experts or 1)
        return [h * (q + 2 * kv), h * q, *mlp]

    def largest_linear(self) -> int:
        return max(self.linears())

    def expert_params(self) -> tuple[int, int]:
        """(split by tensor parallelism, replicated) parameters of one block's routed experts: the
        part expert parallelism divides (shared experts and the router stay on every ep rank)."""
        if not self.experts:
            return 0, 0
        e_split, e_rep = self._mlp_params(self.ef)
        return self.experts * e_split, self.experts * e_rep

    def embedding_params(self) -> tuple[int, int]:
        """(vocabulary embedding, split over TP; position embedding, replicated)."""
        return self.vocab * self.hidden, (self.seq * self.hidden if self.positions == "learned" else 0)

    def head_params(self) -> int:
        """The output layer's own matrix V x h (split over TP): none when tied to the embedding."""
        return 0 if self.tied else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        return self._norm()

    def params(self, active: bool = False) -> int:
        """All parameters: blocks, embeddings, output layer (when untied), final norm."""
        split, rep = self.layer_params(active)
        emb, pos = self.embedding_params()
        return self.layers * (split + rep) + emb + pos + self.head_params() + self.final_norm_params()

    def active_params(self) -> int:
        """Parameters one token uses: ``params`` with top_k + shared experts per layer (the router
        and the embedding counted, as Mixtral's "12.9B active" does)."""
        return self.params(active=True)

    def matmul_params(self) -> int:
        """Weights of one block a token multiplies by: Q, K, V, projection, the MLP matrices of
        its top_k + shared experts, the router (GPT: 4 h^2 + 2 h ffn)."""
        h, q, kv = self.hidden, self.heads * self.d, self.kv * self.d
        n_mat = 3 if self.mlp == "swiglu" else 2
        router = h * self.experts
        return 2 * h * q + 2 * h * kv + n_mat * h * self.mlp_width + router


def layer_flops(m: ModelSpec, tokens_per_seq: float):
    """(weight matmul, attention score) forward FLOPs of one block for ONE sequence, split over
    ``tokens_per_seq`` query tokens (s, or s/cp with context parallelism)."""
    att = 4 * tokens_per_seq * m.seq * m.heads * m.d
    return 2 * tokens_per_seq * m.matmul_params(), att / 2 if m.causal_flops else att


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


# Llama's block: RoPE, RMSNorm, SwiGLU, no biases, no dropout, an untied output layer.
_LLAMA = dict(positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, qkv_bias=False, dropout=False, tied=False)


def _llama(name, layers, hidden, heads, ffn):  # Llama 3: 8 KV heads, vocabulary 128256, 8K context
    return ModelSpec(layers, hidden, heads, 8192, 128256, ffn=ffn, name=name, kv_heads=8, **_LLAMA)


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
    ModelSpec(70, 14336, 112, 2048, 250880, name="bloom-176b", positions="alibi"),
    ModelSpec(12, 768, 12, 1024, 50257, name="gpt2"),  # the Hugging Face guide's DDP benchmark model
    # Today's shapes (Hugging Face config.json of each; sources and counts in docs/planner.md)
    _llama("llama3-8b", 32, 4096, 32, 14336),
    _llama("llama3-70b", 80, 8192, 64, 28672),
    _llama("llama3-405b", 126, 16384, 128, 53248),
    ModelSpec(32, 4096, 32, 32768, 32000, ffn=14336, name="mixtral-8x7b", kv_heads=8, experts=8, top_k=2, **_LLAMA),
    ModelSpec(48, 2048, 32, 4096, 151936, ffn=6144, name="qwen3-30b-a3b", kv_heads=4, head_dim=128, qk_norm=True,
              experts=128, top_k=8, expert_ffn=768, **_LLAMA),
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
