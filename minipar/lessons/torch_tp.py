"""Lesson 09 on real ranks, tensor parallel: ``minipar.torch.parallelize`` (Megatron's colwise,
rowwise and sequence splits) on the GPT, against one process, torch's DTensor and its bytes.

    from minipar import launch
    out = launch(2, "minipar.lessons.torch_tp:check_tp", backend="torch")

Tolerance: 1e-12 everywhere (float64; minipar all-reduces q's, k's and v's gradients one by one
where DTensor sums them first, so even torch's is not bitwise).
"""
from __future__ import annotations

from .torch_fixtures import TOL, Block, batch, loss_fn, make, max_rel, rel, row, traced


def gpt_plan(sequence=False, n_layer=2):
    """The Megatron plan of the GPT's blocks: q, k, v and fc colwise, o and proj rowwise (and,
    sequence parallel, the LayerNorms on the tokens)."""
    plan = {}
    for i in range(n_layer):
        b = f"blocks.{i}"
        plan.update({f"{b}.attn.q": "colwise", f"{b}.attn.k": "colwise", f"{b}.attn.v": "colwise",
                     f"{b}.attn.o": "rowwise", f"{b}.mlp.fc": "colwise", f"{b}.mlp.proj": "rowwise"})
        if sequence:
            plan.update({f"{b}.ln_1": "sequence", f"{b}.ln_2": "sequence"})
    if sequence:
        plan["ln_f"] = "sequence"
    return plan


def tp_calls(comm, plan, x=None, C=24, item=8):
    """The collectives one step of the GPT under ``plan`` runs: [(function, n, itemsize)], n the
    elements of the whole tensor each one works on (B x T x C for the activations)."""
    B, T = (batch("gpt")[0] if x is None else x).shape
    n, sequence = B * T * C, "sequence" in plan.values()
    calls = []
    for style in plan.values():
        if style == "colwise":
            calls.append(("sp_gather" if sequence else "f", n, item))
        elif style == "rowwise":
            calls.append(("sp_scatter" if sequence else "g", n, item))
            calls += [("grad", C, item)] if sequence else []  # its bias, added to my tokens only
        else:
            calls += [("grad", C, item), ("grad", C, item)]  # a LayerNorm's weight and bias
    if sequence:
        calls += [("split_tokens", n, item), ("gather_tokens", n, item)]
    return calls


def tp_run(comm, plan, model=None, x=None):
    """(logits, {name: grad}, bytes sent) of one forward and backward of the GPT split by ``plan``."""
    from ..torch import parallelize
    from ..torch.tp import gather_tokens, split_tokens

    model = model or make("gpt")
    parallelize(model, plan, comm)
    if "sequence" in plan.values():
        model.drop.register_forward_hook(lambda m, i, o: split_tokens(comm, o))
        model.ln_f.register_forward_hook(lambda m, i, o: gather_tokens(comm, o))
    x, y = batch("gpt") if x is None else x

    def step():
        logits = model(x)
        loss_fn("gpt", logits, y).backward()
        return logits.detach()

    logits, sent, _ = traced(comm, step)
    return logits, {n: p.grad.detach().clone() for n, p in model.named_parameters()}, sent


def my_part(comm, name, grad, plan):
    """This rank's part of a dense gradient under ``plan``."""
    module, _, what = name.rpartition(".")
    style = plan.get(module)
    if style == "colwise":
        return grad.chunk(comm.size, 0)[comm.rank]
    if style == "rowwise" and what == "weight":
        return grad.chunk(comm.size, 1)[comm.rank]
    return grad


def dtensor_run(comm, plan, sequence_block=False):
    """torch's DTensor tensor parallelism on the same plan: (output, {name: local grad})."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    mesh = init_device_mesh("cpu", (comm.size,))
    seq = "sequence" in plan.values()
    styles = {"colwise": ColwiseParallel(input_layouts=Shard(1)) if seq else ColwiseParallel(),
              "rowwise": RowwiseParallel(output_layouts=Shard(1)) if seq else RowwiseParallel(),
              "sequence": SequenceParallel()}
    model, x, y = block_case(comm) if sequence_block else (make("gpt"), *batch("gpt"))
    parallelize_module(model, mesh, {k: styles[v] for k, v in plan.items()})
    out = model(x)
    (out.sum() if sequence_block else loss_fn("gpt", out, y)).backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad
        grads[n] = (g.full_tensor() if g.placements[0].is_partial() else g.to_local()) if hasattr(g, "to_local") else g
    return out.detach(), grads


def block_case(comm):
    """One Block, sequence parallel: (block, this rank's tokens of x, None)."""
    import torch

    torch.manual_seed(3)
    block = Block(24, 12, 12).double()
    x = torch.randn(2, 12, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    return block, x.chunk(comm.size, 1)[comm.rank].contiguous(), None


def check_tp(comm, kinds=("gpt",), sequences=(False, True), against_torch=True):
    """The GPT split by the Megatron plan (and sequence parallel): logits and gradients == one
    process, bytes == formula; == torch's DTensor ColwiseParallel / RowwiseParallel / SequenceParallel.
    ``kinds``: the plan splits the GPT's Linear layers; without "gpt" there is nothing to check."""
    if "gpt" not in kinds:
        return []
    from ..torch.tp import bytes_per_step

    rows = []
    model = make("gpt")
    x, y = batch("gpt")
    logits = model(x)
    loss_fn("gpt", logits, y).backward()
    dense = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for sequence in sequences:
        plan = gpt_plan(sequence)
        tag = f"TP gpt{' sequence parallel' if sequence else ''}"
        out, grads, sent = tp_run(comm, plan)
        rows.append(row(f"{tag}: logits == one process", rel(out, logits), TOL))
        rows.append(row(f"{tag}: gradients == one process (my shards)",
                        max_rel(grads, {n: my_part(comm, n, g, plan) for n, g in dense.items()}), TOL))
        predicted = bytes_per_step(comm, tp_calls(comm, plan))
        rows.append(row(f"{tag}: traffic == formula", abs(sent - predicted)))
        if comm.size > 1 and not sequence and against_torch:
            t_out, t_grads = dtensor_run(comm, plan)
            rows.append(row(f"{tag}: == torch DTensor ColwiseParallel/RowwiseParallel",
                            max(rel(out, t_out), max_rel(grads, t_grads)), TOL))
    if comm.size > 1 and against_torch:  # sequence parallelism against torch's, on one block
        from ..torch import parallelize

        plan = {"ln_1": "sequence", "ln_2": "sequence", "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
                "attn.o": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
        block, xl, _ = block_case(comm)
        parallelize(block, plan, comm)
        out = block(xl)
        out.sum().backward()
        grads = {n: p.grad for n, p in block.named_parameters()}
        t_out, t_grads = dtensor_run(comm, plan, sequence_block=True)
        t_out = t_out.to_local() if hasattr(t_out, "to_local") else t_out
        rows.append(row("TP block sequence parallel: == torch DTensor SequenceParallel",
                        max(rel(out, t_out), max_rel(grads, t_grads)), TOL))
    return rows
