"""Lab 09 (from minipar to PyTorch): the tasks and their checks, on the torch backend only.

Each check runs on every rank as ``check(comm, fn)`` with the learner's class or function, drives
torch's autograd through it (the learner's code runs inside the forward, the backward and
autograd's hooks), and returns failure messages. The rules (``minipar.labs.checks``, and this
lab's own):

* no engine: while the learner's code runs, a call into torch's DistributedDataParallel, FSDP,
  DTensor (and DeviceMesh), torch.distributed.nn's differentiable collectives, or minipar's own
  engines (``minipar.torch``, this lab's answers) is seen however it was reached, and fails the
  task in one line naming the call (:class:`EngineCalls`); ``comm.builtin`` is refused;
* traffic: exactly the bytes and messages of minipar's ring collectives the technique sends
  (each gradient once, in one bucket; the gathers in the compute dtype, the gradient's
  reduce-scatter in the master dtype; one all-reduce forward and one backward for the MLP); a
  builtin collective sends 0 bytes through comm;
* values: against one process on the whole batch (float64, 1e-12) and, where the order of the
  sums allows it, bitwise: DDP's averages on 2 ranks against the average of the ranks' own
  gradients (a sum of two terms does not depend on its order);
* when: a DDP bucket's ring may not start before its last gradient is in, and every bucket's must
  start before the backward ends (read from the trace against the times autograd completed each
  gradient, taken by the grader's own hooks);
* memory: an FSDP unit's gathered weights are freed when its forward returns (every tensor made
  during the forward is followed until it is freed: ``minipar.labs.lab09_fsdp``).

World sizes 2 and 3: 2 for the bitwise checks, 3 for a ring with more than one step per phase and
sizes that do not divide (padding).
"""
from __future__ import annotations

import time

from .checks import chunk_counts, compare, expect_traffic, ranks, ring_traffic, stop
from .grader import Task
from .lab09_rules import run_learner, sends

TITLE = "from minipar to PyTorch: DDP's gradient hooks, an FSDP unit, f and g as autograd functions"
HERE = "minipar.labs.lab09"
SIZES = (2, 3)

TASKS = [  # core, all three: the learner writes when and what each rank sends, from the contract
    Task("9.1", "DDP's hook and bucket flush", "GradientBuckets", f"{HERE}:check_gradient_buckets", sizes=SIZES,
         budget=30.0, tier="core"),
    Task("9.2", "an FSDP unit", "fsdp_unit", "minipar.labs.lab09_fsdp:check_fsdp_unit", sizes=SIZES, budget=30.0,
         tier="core"),
    Task("9.3", "f and g, autograd functions", "tp_mlp", "minipar.labs.lab09_tp:check_tp_mlp", sizes=SIZES,
         budget=30.0, tier="core"),
]

# Hints, stage by stage (`minipar check 09 --hint 9.1`): a nudge naming the idea and what to read,
# the shape of the code, then near-pseudocode. The answer: `minipar lab solution 09 --task 9.1`.
HINTS = {
    "9.1": (
        """Autograd calls a parameter's post-accumulate-grad hook (Tensor.register_post_accumulate_grad_hook)
        the moment its .grad is complete, while the backward goes on with the layers before it. DDP's
        trick is to start the all-reduce of a bucket from the hook that brings in its last gradient.
        This lab's README, "Background", says when a bucket may go and how to start a ring without
        waiting for it.""",
        """__init__: the trainable parameters (module.parameters() lists a tied weight once), reversed,
        packed greedily into buckets; per bucket a flat zero buffer, and per parameter where its slot
        is; one hook per parameter. hook(param): copy param.grad into its slot, count it; when the count
        reaches the bucket's size, start the bucket's ring: gen = ring_steps(comm, flat, tag=...) and
        next(gen) posts its first step without waiting. finish(): drain(gen) each bucket, divide by
        comm.size, copy each slot back into its parameter's .grad, reset the counts.""",
        """
        hook(param):  bucket, a, b = where[id(param)]
                      bucket.flat[a:b] = param.grad.reshape(-1); bucket.count += 1
                      if bucket.count == len(bucket.params):
                          bucket.ring = ring_steps(comm, bucket.flat, tag=TAG + bucket.index); next(bucket.ring, None)
        finish():     for each bucket: drain(bucket.ring); bucket.flat /= comm.size
                                       param.grad.copy_(bucket.flat[a:b].view_as(param)) for its params
                                       bucket.count, bucket.ring = 0, None
        """,
    ),
    "9.2": (
        """A torch.autograd.Function has a forward and a backward you write; autograd keeps only what
        forward saves with ctx.save_for_backward. Save the shard and the input, never the gathered
        weights: they are freed when forward returns and gathered again in backward. This lab's
        README, "Background", says how the backward gets the unit's gradients without them.""",
        """forward(ctx, shard, x, comm, layer, n, compute_dtype): all_gather(comm, shard cast to the
        compute dtype)[:n] is w; y = layer(w, x cast); save shard and x. backward(ctx, dy): gather w
        again, make w and x leaves that require grad, recompute layer(w, x) under torch.enable_grad()
        and ask torch.autograd.grad for (dw, dx) given dy; pad dw with zeros to comm.size x S in the
        shard's dtype, reduce_scatter it and divide by comm.size: that is the shard's gradient.""",
        """
        forward:  w = all_gather(comm, shard.detach().to(cd))[:n]; y = layer(w, x.to(cd))
                  ctx.save_for_backward(shard, x); return y
        backward: w = all_gather(comm, shard.to(cd))[:n].requires_grad_(); xd = x.detach().to(cd).requires_grad_()
                  with torch.enable_grad(): dw, dx = torch.autograd.grad(layer(w, xd), (w, xd), dy)
                  g = zeros(comm.size * S, dtype=shard.dtype); g[:n] = dw
                  return reduce_scatter(comm, g) / comm.size, dx.to(x.dtype), None, None, None, None
        """,
    ),
    "9.3": (
        """Lesson 02's conjugate pair: f is the identity going forward and an all-reduce going back; g
        is an all-reduce going forward and the identity going back. Each is a torch.autograd.Function
        whose forward and backward call minipar.collectives.all_reduce. Lesson 02's table of the
        pair is in this lab's README, "Background".""",
        """CopyToRanks.forward(ctx, comm, x): keep comm on ctx, return x (a view of it);
        backward(ctx, dx): return None for comm, and all_reduce(ctx.comm, dx) for x. SumFromRanks:
        forward returns all_reduce(comm, y); backward returns None, dy.""",
        """
        class CopyToRanks:  forward: ctx.comm = comm; return x.view_as(x)
                            backward: return None, all_reduce(ctx.comm, dx.contiguous())
        class SumFromRanks: forward: return all_reduce(comm, y.contiguous())
                            backward: return None, dy
        """,
    ),
}


# --------------------------------------------------------------------------- 9.1 DDP's hooks and buckets


BUCKETS = (0, 4096, 10 ** 9)  # bytes: a bucket per parameter, a few parameters each, one bucket


def gpt_case(comm, seed):
    """The lesson's GPT (its head tied to the embedding), its position embedding frozen, and this
    rank's share of a batch drawn with ``seed``: (model, x, y, the whole batch)."""
    from ..lessons.torch_fixtures import batch, local, make

    model = make("gpt")
    model.wpe.weight.requires_grad_(False)
    x, y = batch("gpt", seed=seed)
    return model, local(comm, x), local(comm, y), (x, y)


def expected_buckets(model, bucket_bytes):
    """The contract's buckets: the trainable parameters, each once, in reverse order of
    registration, packed in order while a bucket stays <= bucket_bytes, never splitting one."""
    params = [p for p in model.parameters() if p.requires_grad]
    out, size = [], 0
    for p in reversed(params):
        nb = p.numel() * p.element_size()
        if out and size + nb <= bucket_bytes:
            out[-1].append(p)
            size += nb
        else:
            out.append([p])
            size = nb
    return out


def reference_gradients(comm, seed):
    """({name: this rank's own gradient}, {name: the whole batch's gradient on one process})."""
    from ..lessons.torch_fixtures import loss_fn

    grads = []
    for whole in (False, True):
        model, x, y, (X, Y) = gpt_case(comm, seed)
        loss_fn("gpt", model(X if whole else x), Y if whole else y).backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    return grads


def check_gradient_buckets(comm, fn):
    from ..lessons.torch_fixtures import loss_fn

    p = comm.size
    for bucket_bytes in BUCKETS:
        model, _, _, _ = gpt_case(comm, 1)
        names = {id(q): n for n, q in model.named_parameters()}
        arrived = []  # (time, param): when autograd completed each gradient, before the learner's hook saw it
        for q in model.parameters():
            if q.requires_grad:
                q.register_post_accumulate_grad_hook(lambda q: arrived.append((time.perf_counter(), q)))
        g, fails = run_learner(comm, fn, "GradientBuckets", lambda: fn(comm, model, bucket_bytes))
        if stop(comm, fails):
            return fails
        hooks = g.out
        for step, seed in enumerate((1, 2), 1):
            case = f"bucket_bytes={bucket_bytes}, step {step}, {ranks(p)}"
            _, x, y, _ = gpt_case(comm, seed)
            model.zero_grad(set_to_none=True)
            arrived.clear()
            end = []

            def step_call():
                loss_fn("gpt", model(x), y).backward()
                end.append(time.perf_counter())
                hooks.finish()

            g, fails = run_learner(comm, fn, "GradientBuckets", step_call)
            own, dense = reference_gradients(comm, seed)
            avg = {n: comm.builtin.all_reduce(w) / p for n, w in own.items()}  # every rank, before any verdict
            fails = fails or step_failures(comm, g, model, names, expected_buckets(model, bucket_bytes), arrived,
                                           end[0], own, avg, dense, case)
            if stop(comm, fails):
                return fails
    return []


def step_failures(comm, g, model, names, buckets, arrived, end, own, avg, dense, case):
    """What is wrong with one step: the frozen parameter, the traffic, a bucket started early,
    the values, the overlap (in that order: the first failure is the message)."""
    p, r = comm.size, comm.rank
    if model.wpe.weight.grad is not None:
        return [f"rank {r}: wpe.weight does not require a gradient, yet has a .grad after finish() ({case}): "
                f"hook and bucket only the parameters that require one"]
    sizes = [sum(q.numel() for q in b) for b in buckets]
    traffic = [ring_traffic(chunk_counts(n, p), r, 8) for n in sizes]
    fails = expect_traffic(comm, g, f"one ring all-reduce per bucket, each trainable parameter in one bucket once "
                                    f"({len(buckets)} buckets of {sizes} doubles, {case})",
                           sum(b for b, _ in traffic), sum(m for _, m in traffic),
                           hint="a weight used in two places (the GPT's token embedding is its output head) is one "
                                "parameter with one gradient: all-reduce it once")
    if fails:
        return fails
    msgs = sends(g.events)
    owner = {id(q): k for k, b in enumerate(buckets) for q in b}
    left = [len(b) for b in buckets]
    complete, may = 0, 0  # buckets whose last gradient is in; the messages they may have sent
    for t, q in arrived:
        early = sum(1 for s, _ in msgs if s < t)
        if early > may:
            k = owner[id(q)]
            return [f"rank {r}: {early} messages had been sent when the gradient of {names[id(q)]} arrived, but only "
                    f"{complete} buckets were complete, which send {may} ({case}): bucket {k} "
                    f"({', '.join(names[id(x)] for x in buckets[k])}) started its all-reduce before its last "
                    f"gradient was in: a bucket is flushed once every one of its gradients is copied into it"]
        k = owner.get(id(q))
        if k is not None:
            left[k] -= 1
            if left[k] == 0:
                complete, may = complete + 1, may + traffic[k][1]
    params = dict(model.named_parameters())
    for n, mine in own.items():
        got = params[n].grad
        fails = said_mistake(comm, got, avg[n], mine, n, case) or compare(
            comm, got, dense[n], f"the gradient of {n} after finish()", f"{case}; one process, tolerance 1e-12")
        if not fails and p == 2:  # a sum of two terms does not depend on its order: bitwise
            fails = compare(comm, got, avg[n], f"the gradient of {n} after finish()",
                            f"{case}; bitwise against the average of the two ranks' own gradients", tol=0.0)
        if fails:
            return fails
    if p > 1:
        return overlap_failures(comm, msgs, buckets, names, arrived, end, case)
    return []


def said_mistake(comm, got, avg, own, name, case):
    """A message for a gradient that is this rank's own, the sum, or the average divided again."""
    import torch

    if got is None:
        return [f"rank {comm.rank}: {name} has no .grad after finish() ({case}): write each average into its "
                f"parameter's .grad"]
    if got.shape != avg.shape or torch.equal(got, avg):
        return []
    p = comm.size
    for other, what in ((own, "this rank's own gradient, not the average over the ranks: was its bucket's "
                              "all-reduce finished before finish() returned, and its result copied back?"),
                        (avg * p, "the sum over the ranks, not the average: divide by comm.size"),
                        (avg / p, "the average divided by comm.size again: averaged twice?")):
        if torch.allclose(got, other, rtol=1e-12, atol=1e-15):
            return [f"rank {comm.rank}: the gradient of {name} after finish() is {what} ({case})"]
    return []


def overlap_failures(comm, msgs, buckets, names, arrived, end, case):
    """Every bucket's ring posted its first message before the backward ended (a first message is
    recognised by its size: this rank's first chunk of that bucket), and with two buckets or more
    some message left before the last gradient was in."""
    r, p = comm.rank, comm.size
    first = [chunk_counts(sum(q.numel() for q in b), p)[(r - 1) % p] * 8 for b in buckets]
    before = [nb for t, nb in msgs if t < end]
    for k, size in enumerate(first):
        if before.count(size) < first.count(size):
            return [f"rank {r}: the all-reduce of bucket {k} ({', '.join(names[id(q)] for q in buckets[k])}) had not "
                    f"started when loss.backward() returned ({case}): DDP starts each bucket's all-reduce from the "
                    f"hook that completes it, during the backward; finish() only waits for them"]
    if len(buckets) > 1 and not any(t < max(a for a, _ in arrived) for t, _ in msgs):
        return [f"rank {r}: no message left before the last gradient was accumulated ({len(buckets)} buckets, {case}): "
                f"start each bucket's all-reduce from the hook that completes it, so that it overlaps the rest of "
                f"the backward"]
    return []
