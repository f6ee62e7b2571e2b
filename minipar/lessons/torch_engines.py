"""Lesson 09 on real ranks: minipar's engines on torch modules (``minipar.torch``), every message
through minipar's collectives, checked against one process, against torch's own engines and by
the bytes the trace saw.

    minipar run -n 3 torch_engines                  # every check (the torch backend: gloo on CPU)
    minipar tour --only 09                          # the tour's share
    from minipar import launch
    out = launch(2, "minipar.lessons.torch_engines:tour", backend="torch")

The checks live in ``torch_ddp`` (DistributedDataParallel, ShardedOptimizer), ``torch_fsdp``
(FullyShardedDataParallel, mixed precision, memory) and ``torch_tp`` (parallelize); their models
and harness in ``torch_fixtures``. The lesson runs on the torch backend only: it teaches engines
for ``torch.nn.Module``; on MPI there is no autograd to hook into.

Every world size the batch divides (1, 2, 3, 4, 6, 12) runs every check; bitwise comparisons
(tolerance 0) hold on 2 ranks, where a sum of two terms does not depend on its order.
"""
from __future__ import annotations

import contextlib
import io

from . import torch_ddp, torch_fsdp, torch_tp
from .torch_fixtures import LR, TOL, Block, dense_train, make, max_rel, row


def check_world_of_one(comm):
    """Every engine on a one-rank communicator (each rank alone): the dense result, no bytes, and
    each engine says once on stderr that it sends nothing."""
    import torch

    from ..torch import FullyShardedDataParallel, ShardedOptimizer

    one = comm.split(comm.rank, name="alone")
    err = io.StringIO()
    rows = []
    with contextlib.redirect_stderr(err):
        got, facts = torch_ddp.ddp_train(one, "gpt")
        rows.append(row("world of 1: DDP == one process, sends nothing", max_rel(got, dense_train("gpt")), TOL,
                        ok=facts["sent"] == 0 and max_rel(got, dense_train("gpt")) <= TOL))
        model = make("gpt")
        o = ShardedOptimizer(model.parameters(), torch.optim.SGD, comm=one, lr=LR)
        FullyShardedDataParallel(make("gpt"), units=(Block,), comm=one)
        torch_ddp.ddp_train(one, "gpt", steps=1)
    said = err.getvalue().splitlines()
    rows.append(row("world of 1: each engine says 'a no-op' once", 0,
                    ok=len(said) == 3 and all("a no-op" in s for s in said) and o.optimizer is not None))
    return rows


CHECKS = {"ddp": torch_ddp.check_ddp, "sharded": torch_ddp.check_sharded, "fsdp": torch_fsdp.check_fsdp,
          "tp": torch_tp.check_tp, "one": check_world_of_one, "parts": torch_ddp.check_ddp_parts}


def verify(comm, engines=tuple(CHECKS), kinds=("gpt", "awkward"), against_torch=True):
    """Every check of ``engines`` at this world size on the models ``kinds`` (against torch's own
    engines too): the lesson's rows, the same order on every rank."""
    rows = []
    for name in engines:
        fn = CHECKS[name]
        rows += fn(comm) if name in ("one", "parts") else fn(comm, kinds, against_torch=against_torch)
    return rows


def tour(comm):
    """The tour's share: every engine on the GPT against one process and by its bytes, DDP's
    overlap, FSDP's ledger and mixed precision, and DDP against torch's own (the other
    comparisons with torch, and the awkward model: ``verify``, ``minipar run torch_engines``)."""
    return (torch_ddp.check_ddp(comm, ("gpt",)) + torch_ddp.check_sharded(comm, ("gpt",), against_torch=False)
            + torch_fsdp.check_fsdp(comm, ("gpt",), against_torch=False)
            + torch_tp.check_tp(comm, against_torch=False))


def measured(comm, quick=False):
    """What lesson 09's figures draw, in one launch: one traced DDP step (``torch_ddp.timeline``)
    and every rank's memory under DDP and FSDP (``torch_fsdp.memory_per_rank``); rank 0's records."""
    kw = dict(layers=4, width=128, batch_rows=64, bucket_size_mb=0.125, steps=2) if quick else {}
    return {"timeline": torch_ddp.timeline(comm, **kw), "memory": torch_fsdp.memory_per_rank(comm)}


def main(argv=None):
    """``python -m minipar.lessons.torch_engines`` under torchrun: every check, rows printed by rank 0."""
    import minipar

    from .common import format_rows, merge_rows

    comm = minipar.init("torch")
    rows = merge_rows(comm.builtin.allgather_object(verify(comm)))
    if comm.rank == 0:
        print(format_rows(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
