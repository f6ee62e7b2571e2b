"""Rank side of tests/test_torch_engines.py: lesson 09's checks (``minipar.lessons.torch_ddp``,
``torch_fsdp``, ``torch_tp``, ``torch_engines``: the ones the tour and the notebook run), the
planted bugs that must fail them, and a script that makes its own process group. Launched as
``tests.torch_engines_ranks:NAME``; rows are ``{"what", "ok", "error", "tolerance"}`` (tolerance
0: bitwise).
"""
from __future__ import annotations

import time

import torch

from minipar.lessons.torch_ddp import check_ddp, check_sharded, ddp_facts
from minipar.lessons.torch_engines import check_world_of_one
from minipar.lessons.torch_fixtures import LR, SGD, STEPS, TOL, Block, batch, dense_train, local, loss_fn, make, \
    max_rel, params, rel, row
from minipar.lessons.torch_fsdp import check_fsdp, check_fsdp_mixed
from minipar.lessons.torch_tp import check_tp, gpt_plan


# --------------------------------------------------------------------------- planted bugs


def planted(comm):
    """{bug: [the checks it fails]}, each bug planted in a subclass or patched in."""
    from minipar.torch import DistributedDataParallel, FullyShardedDataParallel, tp
    from minipar.torch.ddp import GradientReducer
    from minipar.torch.fsdp import Unit

    class TiedTwice(DistributedDataParallel):
        def params_of(self, module):  # a hook per *name*: the tied weight has two slots, two all-reduces
            return [p for _, p in module.named_parameters(remove_duplicate=False) if p.requires_grad]

    class EarlyFlush(GradientReducer):
        def full(self, bucket):  # the bucket starts while its last gradient is still to come
            return len(bucket.arrived) >= len(bucket.slots) - 1

    class EarlyDDP(DistributedDataParallel):
        reducer_class = EarlyFlush

    class FreedUnit(Unit):
        def backward_weights(self):  # freed after the forward, never gathered again: the memory is gone
            return torch.zeros(self.n_pad, dtype=self.compute, device=self.shard.device)

    class FreedFSDP(FullyShardedDataParallel):
        unit_class = FreedUnit

    class Fp16Unit(Unit):
        def full_gradient(self, grad):  # the gradient left in the compute dtype
            return grad.contiguous().clone()

    class Fp16FSDP(FullyShardedDataParallel):
        unit_class = Fp16Unit

    out = {"tied weight all-reduced twice": failing(check_ddp(comm, ("gpt",), engine=TiedTwice)),
           "bucket flushed before its last gradient": failing(check_ddp(comm, ("gpt",), engine=EarlyDDP)),
           "FSDP unit freed before its backward": failing(check_fsdp(comm, ("gpt",), engine=FreedFSDP, mixed=False))}
    out["gradient left in fp16"] = failing(check_fsdp_mixed(comm, engine=Fp16FSDP))
    good = tp.rowwise_forward
    tp.rowwise_forward = lambda module, comm, sequence, x: torch.nn.functional.linear(x, module.weight, module.bias)
    try:
        out["rowwise layer without its all-reduce"] = failing(check_tp(comm, sequences=(False,), against_torch=False))
    finally:
        tp.rowwise_forward = good
    return out


def failing(rows):
    return sorted({r["what"] for r in rows if not r["ok"]})


# --------------------------------------------------------------------------- one launch per world size


def battery(comm, engines=("ddp", "sharded", "fsdp", "tp", "one"), bugs=False):
    """Every check of ``engines`` at this world size: ({check: row}, facts, seconds per engine,
    and with ``bugs`` the planted bugs' failing checks and a tiny run of the overlap benchmark)."""
    checks = {"ddp": check_ddp, "sharded": check_sharded, "fsdp": check_fsdp, "tp": check_tp,
              "one": check_world_of_one}
    rows, seconds = {}, {}
    for name in engines:
        t = time.perf_counter()
        for r in checks[name](comm):
            rows[r["what"]] = r
        seconds[name] = time.perf_counter() - t
    t = time.perf_counter()
    caught = planted(comm) if bugs else {}
    seconds["planted bugs"] = time.perf_counter() - t
    facts = ddp_facts(comm)
    if bugs:
        from minipar.bench.torch_engines import overlap

        facts["bench"] = overlap(comm, layers=3, width=64, batch=8, steps=2)
    return rows, facts, seconds, caught




# --------------------------------------------------------------------------- a process group the script made


def user_group(rank, world, port, path):
    """What a user's script does under mp.spawn: its own dist.init_process_group("gloo"), no
    minipar.init, every engine with comm=None. Writes {check: row} to ``path``.rank."""
    import datetime
    import os
    import pickle

    import torch.distributed as dist

    from minipar.torch import DistributedDataParallel, FullyShardedDataParallel, ShardedOptimizer, parallelize

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    rows = []
    try:
        model = make("gpt")
        ddp = DistributedDataParallel(model, bucket_size_mb=0.004)
        o = ShardedOptimizer(model.parameters(), torch.optim.SGD, momentum=0.9, lr=LR)
        x, y = batch("gpt")
        comm = ddp.comm
        for _ in range(STEPS):
            o.zero_grad()
            loss_fn("gpt", ddp(local(comm, x)), local(comm, y)).backward()
            ddp.finish_gradient_synchronization()
            o.step()
        rows.append(row("user group: DDP + ShardedOptimizer == one process", max_rel(params(model), dense_train("gpt")),
                        TOL))
        rows.append(row("user group: one communicator over the default group", 0,
                        ok=o.comm is comm and comm.size == world and comm.group is None))
        model = make("gpt")
        fsdp = FullyShardedDataParallel(model, units=(Block,))
        sgd = SGD(model.parameters(), lr=LR)
        for _ in range(STEPS):
            sgd.zero_grad()
            loss_fn("gpt", fsdp(local(comm, x)), local(comm, y)).backward()
            fsdp.finish_gradient_synchronization()
            sgd.step()
        got = fsdp.full_state_dict()
        rows.append(row("user group: FSDP == one process", max_rel({k: got[k] for k in params(make("gpt"))},
                                                                   dense_train("gpt")), TOL))
        model = make("gpt")
        parallelize(model, gpt_plan(), None)
        rows.append(row("user group: parallelize == one process", rel(model(x), make("gpt")(x)), TOL))
    finally:
        dist.destroy_process_group()
    with open(f"{path}.{rank}", "wb") as f:
        pickle.dump(rows, f)
