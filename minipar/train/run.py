"""What every rank runs for ``minipar train``: the steps, a progress line per step, the run's record.

    from minipar import launch
    out = launch(4, "minipar.train.run:run_rank", cfg=TrainConfig(dp=2, tp=2, steps=5), quiet=False)
    out.results[0]      # {"losses", "step_times_s", "memory", "trace", ...}: rank 0's record

The command line (``minipar.cli.train``) parses and checks the flags, launches this on the ranks,
and prints and writes what rank 0 returns; the loop itself is ``minipar.train.trainer.train``.
"""
from __future__ import annotations

import math

from ..trace import link_bytes, merge
from .trainer import train


def run_rank(comm, cfg, save=None, save_every=0, resume=None, traced=False):
    """Train ``cfg`` (from step 0, or from the checkpoint ``resume`` on this grid), printing a
    progress line per step on world rank 0; checkpoints into ``save`` every ``save_every`` steps;
    ``traced``: the second step traced. Returns the run's record (rank 0's is used)."""
    start, tr = 0, None
    if resume:
        from .checkpoint import resume as load

        tr, start = load(comm, cfg, resume)
        cfg = tr.cfg
    tokens = cfg.batch * cfg.model.seq_len

    def report(step, rec):
        peak = max(m["total"] for m in rec["memory"])
        print(f"step {step:5d}  loss {rec['loss']:.4f}  tokens/s {tokens / rec['time']:9.0f}  "
              f"step {rec['time'] * 1e3:8.1f} ms  peak/rank {peak / 2**20:7.2f} MiB" + expert_line(rec["experts"])
              + (f"  grad norm {rec['grad_norm']:.3g}" if rec["grad_norm"] is not None else "")
              + (f"  loss scale 2^{math.log2(rec['loss_scale']):.0f}" + (" (overflow: step skipped)" if rec["skipped"] else "")
                 if rec["loss_scale"] is not None else ""), flush=True)

    tr, losses, times = train(comm, cfg, report, trainer=tr, start=start, save=save, save_every=save_every,
                              trace_step=min(start + 1, cfg.steps - 1) if traced else None)
    events = merge(comm) if traced else []
    memory = comm.builtin.allgather_object(dict(tr.memory(), coords=tr.grid.coords, cp=tr.grid.cp_rank, rank=comm.rank))
    return {"start": start, "losses": losses, "step_times_s": times, "memory": memory, "trace": events,
            "unigram_entropy": tr.data.unigram_entropy(), "tokens_per_step": tokens, "experts": tr.history,
            "grad_norms": tr.grad_norms, "loss_scales": tr.scales, "skipped": tr.skipped}


def expert_line(experts) -> str:
    """The progress line's MoE part: tokens per expert (fewest .. most, over every layer) and
    the tokens dropped (assignments over capacity, all layers)."""
    if not experts:
        return ""
    kept = [k for e in experts.values() for k in e["kept"]]
    routed = sum(sum(e["routed"]) for e in experts.values())
    dropped = routed - sum(kept)
    return f"  tokens/expert {min(kept)}..{max(kept)}  dropped {dropped} ({dropped / routed:.1%})"


def link_summary(events, n, ranks_per_node) -> dict:
    """Bytes a traced step sent between nodes and inside them (``trace.link_bytes``), all ranks
    together and between nodes per rank."""
    return dict(link_bytes(events), inter_per_rank=[link_bytes(events, r)["inter"] for r in range(n)])
