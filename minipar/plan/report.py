"""What ``minipar plan`` prints for a search result: the ranked configurations with their step
time, TFLOP/s, MFU and memory, the best one's breakdown, why the others lose, and the rule of
thumb beside it (``report``); and the same configurations as JSON (``to_json``).

    from minipar.plan import search
    from minipar.plan.report import report
    print(report(search(prob)))
"""
from __future__ import annotations

from .advice import LABEL, compare_rule, gb, runners_up


def _mem_cells(mem, i):
    return " ".join(f"{mem[k][i] / 1e9:7.1f}" for k in ("params", "grads", "optimizer", "activations", "total"))


def report(res) -> str:
    prob, ev, mem = res.prob, res.ev, res.ev["mem"]
    m = prob.model
    lines = [f"minipar plan: {m.name} ({m.params() / 1e9:.4g}e9 parameters, {m.layers} layers, hidden {m.hidden}, "
             f"{m.heads} heads, seq {m.seq}, vocab {m.vocab}) on {prob.gpus} x {prob.hw.name} "
             f"({prob.gpus_per_node} per node), global batch {prob.batch}",
             f"searched {res.stats['configs']} configurations in {res.seconds:.2f} s ({res.cpu_seconds:.2f} s CPU): "
             f"{res.stats['fit']} fit in "
             f"{gb(prob.capacity)} per GPU; {res.simulated} pipelines simulated (lesson 03's simulator)", ""]
    if m.experts:
        lines.insert(1, f"mixture of experts: {m.experts} experts, top {m.top_k}" + (f" + {m.shared_experts} shared"
                     if m.shared_experts else "") + f", {m.active_params() / 1e9:.4g}e9 parameters per token; the experts split over tp and "
                     "over ep of the dp ranks (ep searched)")
    if prob.precision is not None:
        bp, bg, k = prob.bytes_per_param()
        lines.insert(1, f"precision: {prob.precision.params} weights, {prob.precision.grads} gradients, "
                     f"{bp} + {bg} + {k} = {bp + bg + k} bytes per parameter (Megatron's convention)")
    if not res.stats["fit"]:
        lines.append("NOTHING FITS: the smallest footprints are listed below")
    described = [res.cfgs.config(i).describe(prob.batch) for i in res.ranked]
    width = max([len("configuration"), *map(len, described)])  # the column fits its longest entry
    lines.append(f"{'#':>2} {'configuration':<{width}} {'step s':>8} {'TFLOP/s':>8} {'MFU':>6}   memory GB: "
                 f"{'params':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'total':>7}")
    for r, (i, text) in enumerate(zip(res.ranked, described), 1):
        lines.append(f"{r:>2} {text:<{width}} {ev['step'][i]:8.3g} {ev['tflops_per_gpu'][i]:8.1f} "
                     f"{ev['mfu'][i]:6.1%}              {_mem_cells(mem, i)}" + ("" if mem["fits"][i] else "  (does not fit)"))
    w = res.ranked[0]
    parts = ", ".join(f"{LABEL[k]} {v[w]:.3g} s" for k, v in ev["parts"].items())
    lines += ["", f"best: {res.cfgs.config(w).describe(prob.batch)}",
              f"  memory per GPU: {gb(mem['total'][w])} of {gb(prob.capacity)} (params {gb(mem['params'][w])}, "
              f"grads {gb(mem['grads'][w])}, optimizer {gb(mem['optimizer'][w])}, activations {gb(mem['activations'][w])})"
              + (f"; host {gb(mem['host'][w])}" if prob.offload else ""),
              f"  step {ev['step'][w]:.4g} s = {parts}",
              f"  {ev['tflops_per_gpu'][w]:.1f} TFLOP/s per GPU (executed, recomputation included), "
              f"MFU {ev['mfu'][w]:.1%} (model FLOPs / dense peak {prob.hw.peak_flops / 1e12:.4g} TFLOP/s)"]
    if res.cfgs.zero[w] == 3:
        lines.append(f"  ZeRO-3 ({prob.engine}): each GPU sends {gb(ev['zero3_intra_bytes'][w])} inside its node and "
                     f"{gb(ev['zero3_inter_bytes'][w])} across nodes per step (every block gathered "
                     f"{3 if res.cfgs.recompute[w] == 'full' else 2} times per micro-batch, its gradients reduce-scattered once)")
    why = runners_up(res)
    if why:
        lines += ["", "why the others lose:"] + [f"  {s}" for s in why]
    lines += [""] + compare_rule(res)
    return "\n".join(lines)


def to_json(res) -> dict:
    return {"configs": [res.row(i) for i in res.ranked]}
