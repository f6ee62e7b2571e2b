"""Lab 07, task 7.6: the parameters of today's decoder-only models, counted by hand.

Grouped-query attention (K and V narrower than Q), SwiGLU (three MLP matrices), RMSNorm (a weight,
no bias), no biases, an output layer of its own: the shapes after 2022, against the planner's
``plan.models.ModelSpec.params`` on small shapes first, then Llama-3-8B and -70B (whose published
counts the planner matches exactly). A wrong count that equals what a typical mistake gives is
named. A graded function that calls into ``minipar.plan`` is refused (``lab07_reference.Watch``).
"""
from __future__ import annotations

from .lab07_reference import Watch, call_watched, refused

FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp", "norm", "bias", "tied")
PARAMS_CASES = [  # smallest first; (layers, hidden, heads, kv_heads, ffn, vocab, mlp, norm, bias, tied)
    (1, 8, 2, 2, 32, 10, "gelu", "layernorm", True, True),       # a 2021 GPT block
    (2, 8, 4, 2, 32, 10, "gelu", "layernorm", True, True),       # + grouped-query attention
    (2, 8, 4, 2, 24, 10, "swiglu", "layernorm", True, True),     # + SwiGLU
    (2, 8, 4, 1, 24, 10, "swiglu", "rmsnorm", False, True),      # + RMSNorm, no biases
    (3, 8, 4, 2, 24, 10, "swiglu", "rmsnorm", False, False),     # + its own output layer
    (2, 12, 6, 3, 20, 7, "gelu", "rmsnorm", True, False),
    (32, 4096, 32, 8, 14336, 128256, "swiglu", "rmsnorm", False, False),  # Llama-3-8B: 8,030,261,248
    (80, 8192, 64, 8, 28672, 128256, "swiglu", "rmsnorm", False, False),  # Llama-3-70B: 70,553,706,496
]

# Hints, stage by stage (`minipar check 07 --hint 7.6`).
PARAMS_HINTS = {
    "7.6": (
        """Count each weight matrix and vector of one block, then the ends: the embedding, the output
        layer unless it is tied to the embedding, the final norm. Llama-3-8B by hand comes to
        8,030,261,248.""",
        """docs/planner.md ("Today's shapes") has the table. d = hidden / heads. Attention: Q and the projection hidden x heads d each, K and V hidden x
        kv_heads d each (+ biases heads d + 2 kv_heads d + hidden). MLP: gelu 2 matrices hidden x ffn
        (+ ffn + hidden), swiglu 3 (+ 2 ffn + hidden). Two norms per block: layernorm 2 hidden each,
        rmsnorm hidden. Then vocab x hidden, again if not tied, and one more norm.""",
        """
        d = hidden // heads
        attn = 2 * hidden * heads * d + 2 * hidden * kv_heads * d + (heads * d + 2 * kv_heads * d + hidden if bias else 0)
        n_in = 2 if mlp == "swiglu" else 1
        mlp_p = (n_in + 1) * hidden * ffn + (n_in * ffn + hidden if bias else 0)
        norm_p = 2 * hidden if norm == "layernorm" else hidden
        return layers * (attn + mlp_p + 2 * norm_p) + vocab * hidden * (1 if tied else 2) + norm_p
        """,
    ),
}


def reference_model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp, norm, bias, tied) -> int:
    """The planner's count: rotary positions (no parameters), biases on every Linear or none."""
    from ..plan.models import ModelSpec

    return ModelSpec(layers, hidden, heads, 1, vocab, ffn=ffn, kv_heads=kv_heads, mlp=mlp, norm=norm, bias=bias,
                     qkv_bias=bias, tied=tied, positions="rope").params()


def params_mistakes(layers, hidden, heads, kv_heads, ffn, vocab, mlp, norm, bias, tied) -> dict:
    """{the typical mistake: the count it gives} for one case."""
    args = dict(zip(FIELDS, (layers, hidden, heads, kv_heads, ffn, vocab, mlp, norm, bias, tied)))
    ref = reference_model_params(**args)
    norm_p = 2 * hidden if norm == "layernorm" else hidden
    out = {}

    def other(text, **change):
        out[text] = reference_model_params(**{**args, **change})

    if kv_heads < heads:
        other("K and V as wide as Q: with grouped-query attention they are hidden x kv_heads d, not "
              "hidden x heads d", kv_heads=heads)
    if mlp == "swiglu":
        other("two MLP matrices: SwiGLU has three, gate and up (hidden x ffn each) and down (ffn x hidden)",
              mlp="gelu")
    if norm == "rmsnorm":
        other("a bias in every RMSNorm: it has only its weight, hidden values", norm="layernorm")
    else:
        other("LayerNorms without their bias: a LayerNorm has a weight and a bias, 2 hidden", norm="rmsnorm")
    if tied:
        other("the output layer counted though it is tied: it is the embedding matrix itself", tied=False)
    else:
        other("no output layer: untied, it is a vocab x hidden matrix of its own", tied=True)
    if bias:
        other("no biases: this model's Q, K, V, projection and MLP matrices have them", bias=False)
    else:
        other("biases where the model has none (Llama has no bias in any Linear)", bias=True)
    out["no final norm: one more norm follows the last block"] = ref - norm_p
    if layers > 1:  # one block: the same count as no final norm
        out["one norm per block: there are two, before attention and before the MLP"] = ref - layers * norm_p
    return out


def check_model_params(comm, fn):
    watch = Watch()
    for case in PARAMS_CASES:
        call = "model_params(" + ", ".join(f"{k}={v!r}" for k, v in zip(FIELDS, case)) + ")"
        got, calls = call_watched(fn, *case, watch=watch)
        if calls:
            return refused("model_params", calls, "count the matrices yourself (README: the table)")
        want = reference_model_params(*case)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != want:
            named = next((f"; you computed {text}" for text, value in params_mistakes(*case).items()
                          if not isinstance(got, bool) and isinstance(got, (int, float)) and got == value), "")
            return [f"{call} = {got!r}, expected {want:,} parameters{named}"]
    return []
