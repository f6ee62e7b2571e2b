"""Activation recomputation: keep less between the forward and the backward, compute it again.

    y, ctx = forward(block, x, "selective")      # "none" | "selective" | "full"
    dx = backward_input(block, dy, ctx, "selective")
    backward_weight(block, dy, ctx, "selective")
    dx = backward(block, dy, ctx, "selective")    # both at once: a fused B action

none       the block's whole ctx is kept (every tensor its backward reads).
selective  the attention core's probabilities p (B, nh, T, T) are dropped; the backward
           recomputes them from q and k (Korthikanti et al. 2022: the part of the activations
           that grows with T^2 costs little to recompute). No communication is repeated.
full       only the block's input x is kept; the backward runs the block's forward again
           (its tensor-parallel collectives included) to rebuild the ctx, then backs through it.
           Per layer: one more forward, about a third more compute. Dropout masks are drawn
           again: the same ones only if the draw depends on where the forward runs, not on how
           many draws came before (``minipar.nn.dropout``: the trainer points it at the
           micro-batch before each action; torch.utils.checkpoint restores the RNG state).

The block is any module with the usual ``forward -> (y, ctx)``, ``backward_input``,
``backward_weight``; selective expects a pre-LN ``Block`` (its ctx["attn"]["att"] is the
attention core's; a context-parallel core, ctx["attn"]["core"], keeps no probabilities). With
the backward split (zero-bubble schedules), the ctx rebuilt by full recomputation stays alive
from backward_input to backward_weight. A fused backward (``backward``) rebuilds, uses and drops
it in one go: a stage that backs through its blocks one ``backward`` at a time holds one rebuilt
ctx at a time, which is what full recomputation is for.
"""
from __future__ import annotations

from .functional import drop_probs

MODES = ("none", "selective", "full")


def forward(block, x, mode="none"):
    """(y, ctx) where ctx keeps what ``mode`` keeps."""
    if mode not in MODES:
        raise ValueError(f"recompute={mode!r}: choose one of {MODES}")
    y, ctx = block.forward(x)
    if mode == "full":
        return y, {"x": x}  # everything else is dropped here
    if mode == "selective" and "att" in ctx["attn"]:  # a ring or Ulysses core keeps no probabilities
        ctx["attn"]["att"] = drop_probs(ctx["attn"]["att"])
    return y, ctx


def backward_input(block, dy, ctx, mode="none"):
    """dx; with ``full`` the forward runs again first and its ctx is kept for backward_weight."""
    if mode == "full":
        _, ctx["inner"] = block.forward(ctx["x"])
        return block.backward_input(dy, ctx["inner"])
    return block.backward_input(dy, ctx)


def backward_weight(block, dy, ctx, mode="none"):
    block.backward_weight(dy, ctx.pop("inner") if mode == "full" else ctx)


def backward(block, dy, ctx, mode="none"):
    """dx, and the block's weight gradients, back to back; with ``full`` the rebuilt ctx dies here."""
    if mode == "full":
        _, ctx = block.forward(ctx["x"])
    return block.backward(dy, ctx)
