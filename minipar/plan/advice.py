"""Words for the numbers: why the runners-up lose, and the rule of thumb of the Hugging Face
guide "Efficient Training on Multiple GPUs" (docs/sources.md) beside the search.

The guide's last section, "which strategy to use when", decides by three questions: one GPU, one
node or many; does the model fit on one GPU, does its largest layer; is the interconnect fast. Each leaf lists
techniques, usually fastest first. ``rule_of_thumb`` walks that tree for a problem;
``compare_rule`` finds the best configuration that uses only the rule's first choice and says
where the search agrees or why it does not.
"""
from __future__ import annotations

import numpy as np

from .config import Problem
from .memory import stored_activations
from .search import Result, alternatives, simulate_rows

FAST_INTER_NODE = 12.5e9  # bytes/s per GPU: 100 Gb/s and up counts as a fast inter-node link
LABEL = {"compute": "compute", "tp_comm": "TP comm", "pp_bubble": "PP bubble + p2p", "dp_comm": "DP comm",
         "zero3_gathers": "ZeRO-3 gathers", "cp_ring": "CP ring", "ep_alltoall": "EP all-to-all",
         "optimizer": "optimizer step"}
AXIS_NAME = {"tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP", "zero": "ZeRO", "recompute": "recompute", "schedule": "schedule",
             "sequence_parallel": "SP", "microbatch": "micro-batch"}


# Every leaf of the rule of thumb, as something minipar runs on real ranks.
RUNS = {"DDP": "minipar run data_parallel (DDP: buckets, overlap)",
        "ZeRO": "minipar run data_parallel (ZeRO-1/2/3; minipar memory --stage N)",
        "ZeRO + offload": "minipar run data_parallel [--offload-dir DIR] (CPU and NVMe offload; minipar bench offload)",
        "+ Memory-Centric Tiling": "minipar run data_parallel (a Linear gathered tile by tile under ZeRO-3: "
                                   "minipar.zero.tiled_linear)",
        "ZeRO-3 + Memory-Centric Tiling": "minipar run data_parallel (ZeRO-3; a Linear too large to gather whole, "
                                          "tile by tile: minipar.zero.tiled_linear)",
        "PP": "minipar run pipeline --schedule 1f1b", "TP": "minipar run tensor_parallel",
        "PP+TP+DP": "minipar train -n 8 --dp 2 --pp 2 --tp 2",
        "DP+PP+TP+ZeRO-1": "minipar train -n 8 --dp 2 --pp 2 --tp 2 --zero 1"}


def gb(x) -> str:
    return f"{x / 1e9:.3g} GB"


def why_loses(res: Result, axis: str, value, i: int) -> str:
    """One line: why the best configuration with ``axis == value`` loses to the winner."""
    prob, ev, mem = res.prob, res.ev, res.ev["mem"]
    w = res.ranked[0]
    name = f"{AXIS_NAME[axis]}={value}"
    if not mem["fits"][i]:
        parts = {k: mem[k][i] for k in ("params", "grads", "optimizer", "activations")}
        big = max(parts, key=parts.get)
        return f"{name} needs {gb(mem['total'][i])} > {gb(prob.capacity)} ({big} {gb(parts[big])})"
    t = res.cfgs.tp[i]
    dt = {k: ev["parts"][k][i] - ev["parts"][k][w] for k in LABEL}
    worst = max(dt, key=dt.get)
    slower = ev["step"][i] / ev["step"][w] - 1
    if t > prob.gpus_per_node and not res.eligible[i]:
        return (f"TP={t} crosses the node: its all-reduces go over {prob.hw.inter.name} "
                f"(TP comm {ev['parts']['tp_comm'][i]:.3g} s vs {ev['parts']['tp_comm'][w]:.3g} s per step)")
    more = mem["total"][i] - mem["total"][w]
    if abs(slower) < 0.005 and gb(mem["total"][i]) != gb(mem["total"][w]) and more > 0:
        # a tie on time (under 0.5%) lost on memory: say how much more it needs
        return (f"{name}: as fast ({ev['step'][i]:.3g} s/step) but {gb(mem['total'][i])} per GPU vs "
                f"{gb(mem['total'][w])} [{res.cfgs.config(i).describe(res.prob.batch)}]")
    if dt[worst] <= 0:  # no part is slower: the same step and memory, ranked below by order alone
        return (f"{name}: ties with the best ({ev['step'][i]:.3g} s/step, {gb(mem['total'][i])} per GPU) "
                f"[{res.cfgs.config(i).describe(res.prob.batch)}]")
    # slower, if only by a little (then the percentage gets a decimal: +0.3%, not +0%)
    return (f"{name}: {ev['step'][i]:.3g} s/step ({slower:+.{0 if abs(slower) >= 0.005 else 1}%}), "
            f"{LABEL[worst]} {dt[worst]:+.3g} s [{res.cfgs.config(i).describe(res.prob.batch)}]")


def runners_up(res: Result) -> list[str]:
    return [why_loses(res, a, v, i) for a, v, i in alternatives(res)]


def fits_one_gpu(prob: Problem) -> tuple[bool, bool]:
    """(whole model, largest layer) fit one GPU: model states + activations of one sequence with
    full recomputation; a layer's own states (its parameters x bytes per parameter)."""
    m = prob.model
    bp, bg, k = prob.bytes_per_param()
    per = bp + bg + k
    act = float(stored_activations(prob, 1, 1, 1, False, np.array("full"))) * m.layers
    split, rep = m.layer_params()
    emb, _ = m.embedding_params()
    cap = prob.capacity
    return per * m.params() + act <= cap, per * max(split + rep, emb) <= cap


def rule_of_thumb(prob: Problem) -> tuple[str, list[str]]:
    """(the branch of the Hugging Face guide's tree, its techniques in the guide's order)."""
    whole, layer = fits_one_gpu(prob)
    hw = prob.hw
    if prob.gpus == 1:
        if whole:
            return "one GPU, the model fits", ["DDP"]
        return ("one GPU, the model does not fit" + ("" if layer else ", nor its largest layer"),
                ["ZeRO + offload"] + ([] if layer else ["+ Memory-Centric Tiling"]))
    if prob.gpus <= prob.gpus_per_node:
        if whole:
            return "one node, the model fits one GPU", ["DDP", "ZeRO"]
        if not layer:
            return "one node, the largest layer does not fit one GPU", ["TP", "ZeRO-3 + Memory-Centric Tiling"]
        return "one node, the model does not fit one GPU", ["PP", "ZeRO", "TP"]
    if hw.inter.bandwidth >= FAST_INTER_NODE:
        return f"many nodes, fast inter-node link ({hw.inter.name})", ["ZeRO", "PP+TP+DP"]
    return f"many nodes, slow inter-node link ({hw.inter.name})", ["DP+PP+TP+ZeRO-1"]


def family(cfgs, name: str) -> np.ndarray:
    """Which columns use exactly the techniques the rule names (DP is always allowed)."""
    t, p, z, c = cfgs.tp, cfgs.pp, cfgs.zero, cfgs.cp
    plain = c == 1
    return {"DDP": plain & (t == 1) & (p == 1) & (z == 0),
            "ZeRO": plain & (t == 1) & (p == 1) & (z > 0),
            "ZeRO + offload": plain & (t == 1) & (p == 1),
            "ZeRO-3 + Memory-Centric Tiling": plain & (t == 1) & (p == 1) & (z == 3),
            "PP": plain & (t == 1) & (p > 1),
            "TP": plain & (t > 1) & (p == 1),
            "PP+TP+DP": plain & (z == 0),
            "DP+PP+TP+ZeRO-1": plain & (z <= 1)}[name]


def describe_family(cfg) -> str:
    used = [n for n, on in (("DP", cfg.dp > 1), ("TP", cfg.tp > 1), ("PP", cfg.pp > 1), ("CP", cfg.cp > 1)) if on]
    used += [f"ZeRO-{cfg.zero}"] if cfg.zero else []
    return "+".join(used) or "one GPU"


def compare_rule(res: Result) -> list[str]:
    """The Hugging Face guide's advice for this problem, and how the search's answer relates to it."""
    branch, rule = rule_of_thumb(res.prob)
    lines = [f'rule of thumb (Hugging Face, "Efficient Training on Multiple GPUs": which strategy to use when): {branch}: '
             + ", ".join(f"{i}. {r}" for i, r in enumerate(rule, 1))]
    lines += [f"  {r} runs here: {RUNS[r]}" for r in rule]
    if not res.ranked:
        return lines
    best = res.cfgs.config(res.ranked[0])
    first = rule[0]
    sel = family(res.cfgs, first) & res.eligible
    w = res.ranked[0]
    if sel[w]:
        lines.append(f"  the search agrees: its best ({describe_family(best)}) is the rule's first choice, {first}")
        return lines
    if not sel.any():
        prob = res.prob
        why = (f"{prob.gpus} data-parallel ranks do not divide the global batch {prob.batch}"
               if first in ("DDP", "ZeRO", "ZeRO + offload") and prob.batch % prob.gpus else "no valid configuration uses it")
        lines.append(f"  {first} alone is not possible here ({why}); the search picks {describe_family(best)}"
                     + (f", the rule's choice {rule.index(next(r for r in rule if family(res.cfgs, r)[w]))+1}"
                        if any(family(res.cfgs, r)[w] for r in rule[1:]) else ""))
        return lines
    mem = res.ev["mem"]
    ok = np.flatnonzero(sel & mem["fits"])
    if len(ok) == 0:
        i = np.flatnonzero(sel)[np.argmin(mem["total"][sel])]
        lines.append(f"  the search disagrees: {first} needs at least {gb(mem['total'][i])} per GPU > "
                     f"{gb(res.prob.capacity)}; it picks {describe_family(best)}")
        return lines
    simulate_rows(res, [ok[np.argmin(res.ev["estimate"][ok])]])  # the closest by estimate
    done = ok[~np.isnan(res.ev["step"][ok])]  # and those the search simulated: the table may hold a faster one
    i = done[np.argmin(res.ev["step"][done])]
    slower = res.ev["step"][i] / res.ev["step"][w] - 1
    lines.append(f"  the search picks {describe_family(best)}; the best {first} configuration "
                 f"[{res.cfgs.config(i).describe(res.prob.batch)}] takes {res.ev['step'][i]:.3g} s/step, {slower:+.0%}"
                 + (" (the rule says 'may or may not be faster')" if len(rule) > 1 and rule[1] == "ZeRO" else ""))
    return lines
