"""Models for the minipar.torch tests: a small GPT in torch, and a model with every awkward part."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v, o (a fused qkv would be split across q, k and v)."""

    def __init__(self, C, n_head, T):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
        self.head_dim = C // n_head
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, C) or, tensor parallel, (B, T, C/p)
        B, T, _ = q.shape  # T from q: sequence parallel, x holds T/p tokens and q all T
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5  # (B, nh, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        return self.o(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head, T):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C), Attention(C, n_head, T)
        self.ln_2, self.mlp = nn.LayerNorm(C), MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final LayerNorm, an output head tied to the embedding."""

    def __init__(self, vocab=32, C=24, n_head=6, n_layer=2, T=6):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(T, C)
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(Block(C, n_head, T) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)


class Gate(nn.Module):
    """A custom unit that is not an nn.Linear: tanh(x M) * s."""

    def __init__(self, d):
        super().__init__()
        self.mix = nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return torch.tanh(x @ self.mix) * self.scale


class Awkward(nn.Module):
    """A frozen weight, a tied weight, a buffer, a parameter that never gets a gradient, custom
    Gate units, and no size divisible by 2 or 3."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 7)
        self.frozen = nn.Linear(7, 7)
        self.frozen.weight.requires_grad_(False)
        self.gate1, self.gate2 = Gate(7), Gate(7)
        self.tied_a, self.tied_b = nn.Linear(7, 7, bias=False), nn.Linear(7, 7, bias=False)
        self.tied_b.weight = self.tied_a.weight
        self.register_buffer("shift", torch.randn(7))
        self.unused = nn.Parameter(torch.randn(5))
        self.out = nn.Linear(7, 3)

    def forward(self, x):
        h = torch.relu(self.inp(x)) + self.shift
        h = self.gate1(self.frozen(h))
        h = self.gate2(self.tied_a(h))
        return self.out(self.tied_b(h))


def make(kind, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return (GPT() if kind == "gpt" else Awkward()).to(dtype)


def batch(kind, n=6, seed=1, dtype=torch.float64):
    """(x, y): the whole batch, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gpt":
        return torch.randint(0, 32, (n, 6), generator=g), torch.randint(0, 32, (n, 6), generator=g)
    return torch.randn(n, 5, generator=g, dtype=dtype), torch.randn(n, 3, generator=g, dtype=dtype)


def loss_fn(kind, out, y):
    if kind == "gpt":
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]) if out.dtype in (torch.float16, torch.bfloat16)
                               else out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.mse_loss(out.to(y.dtype), y)
