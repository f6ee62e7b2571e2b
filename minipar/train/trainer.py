"""One training step on a DP x PP x CP x TP grid, composed from the lessons before it.

    cfg = TrainConfig(GPTConfig(), dp=2, pp=2, tp=2, schedule="1f1b", microbatches=4)  # config.py
    check_shapes(cfg, world=8)                  # pure: raises UsageError before any rank starts
    trainer = Trainer(comm, cfg)                # on every rank
    for step in range(cfg.steps):
        loss = trainer.step(step)               # the global batch's loss, on every rank

    losses, params = train_reference(cfg)       # reference.py: the same steps in one process, must be equal

A step, on every rank:

1. its DP replica's rows of the global batch (dp coordinate d: rows d*B/dp ...), cut into m
   micro-batches; with cp > 1 only the positions of my cp rank (zigzag: chunks c and 2cp-1-c of
   2cp), inputs and labels alike;
2. the pipeline: lesson 03's executor (``run_schedule``) runs the schedule over the ``pp``
   group; each stage is a GPT slice whose layers are lesson 02's tensor-parallel layers over the
   ``tp`` group (with cp > 1 the attention core is lesson 06's ring attention, or Ulysses, over
   the ``cp`` group; with E experts the MLP is lesson 06's expert-parallel MoE over the dp
   group), and the last stage's loss is the vocab-parallel cross-entropy over the ``tp`` group;
3. after the flush: the tied embedding's gradient summed over the ``emb`` group (first and last
   stage, ``sync_tied``), then lesson 04's engine (DDP, ZeRO-1, 2 or 3) averages every
   replicated gradient over the ``dp_cp`` group (dp x cp ranks), once (``sync_dp``), and takes
   the Adam step. ZeRO-2 and 3 bracket the whole step (``whole_step``): every unit's full
   gradient is open from the first micro-batch to the flush and reduce-scattered once after it;
   ZeRO-3's weights are gathered once before the first micro-batch, or with ``reshard`` a stage's
   around every pipeline action (``before``, ``reshard_after``). Experts are not averaged: each is held by one rank of the dp group, whose dispatch
   already summed every replica's tokens into its gradient; it is divided by dp
   (``sync_experts``) and stepped alone. What the MoE layers report (aux loss, tokens per
   expert) is kept by ``train.experts.ExpertLog``;
4. mixed precision (``precision`` bf16 or fp16, ``minipar.train.precision``): the stages compute
   in 16 bits, every micro-batch's weight gradient is added into float32 gradients (Megatron's
   main_grad), and steps 3 and 5 (the sums over emb and dp x cp, the norm, Adam on float32 master
   weights) run on those. With fp16 the loss gradient is multiplied by the loss scale; after
   step 3, one all-reduce (max) over every rank of the world says whether any gradient anywhere
   is inf or nan (``found_inf``): then every rank skips the step and halves the scale; else every
   gradient is divided by the scale (exact: a power of 2) before 5 (``LossScaler``);
5. with ``clip``, before the Adam step: the global gradient norm, every parameter of the model
   counted once (``clip_grads``: a TP shard on its rank, a parameter whole on every TP rank on
   TP rank 0, the tied embedding on the first stage, one DP replica's average or every ZeRO
   shard, each expert on its owner), one all-reduce of that sum of squares over all ranks, and
   every gradient scaled by the same factor as one process's ``clip_grad_norm_``.

With ``dropout``, every site's mask is a function of the element's global index
(``minipar.nn.dropout``, a Philox stream per global row): before each pipeline action
(``before``) the shared draw moves to the rows of the action's micro-batch, so each rank draws
one process's masks for what it holds, and a recomputed forward draws its F's masks again.

The gradient of the mean loss over the global batch is the mean over the dp x cp ranks of the
mean over their micro-batches, because every micro-batch has the same number of tokens on every
rank: that is why the batch must divide into dp x m equal parts and the sequence into 2cp equal
chunks, and why the losses equal one process's.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from ..collectives import all_reduce
from ..context_parallel import SeqLayout
from ..data_parallel import DDP
from ..grid import Grid, axis_color
from ..nn import Module
from ..nn.dropout import Draw
from ..optim import clip_scale
from ..pipeline.execute import run_schedule
from ..pipeline.schedules import make_schedule
from ..tensor_parallel.vocab import vocab_parallel_cross_entropy
from ..xp import copy, namespace, storage
from ..zero import STAGES
from .config import CP_ATTENTION, PRECISIONS, SCHEDULES, TrainConfig, check_shapes, make_data  # noqa: F401 (re-exported)
from .experts import ExpertLog, expert_totals, split_experts
from .model import GPT, GPTConfig, build_stage  # noqa: F401 (GPTConfig re-exported)
from .precision import LossScaler, loss_in_master, nonfinite, policy
from .saving import owning
from .saving import save as save_checkpoint


class Units(Module):
    """Modules gathered as the DP engine's units (children named "s0.embed", "s4.h", ...)."""

    def __init__(self, modules: dict):
        super().__init__()
        for name, m in modules.items():
            setattr(self, name, m)


def engine_units(stages: dict, split_tied: bool):
    """(units, tied units, expert units): every child with parameters of every stage this rank
    holds, as DP units; with ``split_tied`` the module holding wte on the first or last stage goes apart, into
    its own engine. Its flat buffer then has the same layout on both stages, so the DP ring
    reduces the two copies' (equal) gradients in the same order, and they stay bitwise equal.
    A child holding mixture-of-experts layers is split further: its experts go to the expert
    units (never averaged over dp), everything else (the router too) stays a DP unit."""
    units, tied, experts = {}, {}, {}
    for s, st in stages.items():
        for name, child in st.children().items():
            if not child.num_params():  # the embedding's dropout: nothing to reduce or update
                continue
            is_tied = split_tied and ((s == 0 and name == "embed") or (st.last and name == "head"))
            if is_tied:
                tied[f"s{s}.{name}"] = child
            else:
                split_experts(child, f"s{s}.{name}", units, experts)
    return Units(units), (Units(tied) if tied else None), (Units(experts) if experts else None)


def arrays_in(obj):
    """Every array inside nested dicts, tuples and lists (a forward context)."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from arrays_in(v)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from arrays_in(v)
    elif hasattr(obj, "shape") and hasattr(obj, "dtype"):
        yield obj


def held_bytes(obj, exclude=()) -> int:
    """Bytes of the memory blocks the arrays inside ``obj`` live in, each block once (a view
    and its base count once); blocks whose key is in ``exclude`` (the parameters') not at all."""
    blocks = dict(storage(a) for a in arrays_in(obj))
    return sum(n for key, n in blocks.items() if key not in exclude)


class Trainer:
    """Everything one rank holds for training: its grid, stages, engine and data."""

    def __init__(self, comm, cfg: TrainConfig, dense=None):
        check_shapes(cfg, comm.size)
        self.comm, self.cfg = comm, cfg
        self.grid = g = Grid(comm, cfg.dp, cfg.pp, cfg.tp, cp=cfg.cp, order=cfg.order,
                             ranks_per_node=cfg.ranks_per_node or None)
        if cfg.ranks_per_node:  # every traced message learns whether it crossed between nodes
            comm.tracer.ranks_per_node = cfg.ranks_per_node
        d, p, t = g.coords
        self.schedule = make_schedule(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
        S = self.schedule.total_stages
        dense = GPT(cfg.model, cfg.seed) if dense is None else dense
        self.policy = pol = policy(cfg.precision)
        like = comm.empty((1,), cfg.dtype)  # the compute dtype, on this backend
        # the positions of every sequence this rank holds: all, or my cp rank's zigzag chunks
        self.positions = SeqLayout(cfg.model.seq_len, cfg.cp).positions(g.cp_rank) if cfg.cp > 1 else None
        self.ep = None  # the expert-parallel group: my dp group, under a name of its own for the trace
        if cfg.model.n_experts:
            self.ep = comm.split(axis_color(g.shape, g.position, "dp"), key=d, name=f"ep(p{p},t{t})")
        # dropout: one counter-based draw shared by every site; the masks depend on global indices only
        self.draw = Draw(cfg.dropout, cfg.seed) if cfg.dropout else None
        self.stages = {}
        for s in range(S):
            if self.schedule.stage_to_rank[s] == p:
                tied = self.stages[0].embed if 0 in self.stages else None
                self.stages[s] = build_stage(g.tp, dense, s, S, cfg.sequence_parallel, cfg.recompute, tied,
                                             cp=g.cp, cp_attention=cfg.cp_attention, ep=self.ep, draw=self.draw)
        for st in self.stages.values():
            st.to(like)
            st.compute = like.dtype if pol.mixed else None  # 16 bits: round what the stage hands on
        units, tied, experts = engine_units(self.stages, split_tied=cfg.pp > 1)
        engine = STAGES[cfg.zero] if cfg.zero else DDP
        # mixed: the 16-bit weights the stages hold, float32 master weights, Adam state and gradients
        kw = dict(lr=cfg.lr, mixed=cfg.dtype if pol.mixed else False, main_grad=True)
        if cfg.zero >= 2:  # the executor runs the micro-batches: one reduce-scatter after the flush
            kw["whole_step"] = True
        if cfg.zero == 3:  # gathered once per step (torchtitan under PP), or around every action (reshard)
            kw.update(reshard=cfg.reshard, prefetch=False)
        self.engines = [engine(g.dp_cp, units, **kw)] + ([engine(g.dp_cp, tied, **kw)] if tied else [])
        if experts is not None:  # held by this rank alone (and its TP partners, which compute the same)
            alone = comm.split(comm.rank, key=0, name=f"experts(r{comm.rank})")
            self.engines.append(engine(alone, experts, **kw))
        self.scaler = LossScaler(cfg.initial_scale, cfg.growth_interval) if pol.scaled else None
        self.skipped = []  # fp16: the steps every rank skipped (an inf or nan somewhere)
        self.scales = []  # fp16: the loss scale each step ran with
        self.experts = experts
        self.moe = ExpertLog(self.stages, cfg.microbatches)  # what the MoE layers report, per step
        self.first, self.last = 0 in self.stages, S - 1 in self.stages
        self.vocab_start = t * cfg.model.vocab // cfg.tp
        self.data = make_data(cfg)
        self.peak_activations = 0
        self.history = []
        self.grad_norms = []  # with cfg.clip: each step's global gradient norm, before clipping
        last = self.stages.get(S - 1)
        # the last stage's own copy of the tied embedding (pp > 1): its gradient equals the first stage's
        self.tied_copy = last.head if last is not None and "wte" in last.head.params and not self.first else None
        self.zero3 = [e for e in self.engines if e.stage == 3]
        for e in self.zero3:  # reshard: the most a stage's action holds gathered at once
            e.live = max(sum(e.flats[u].n_pad for u in self.stage_units(e, s)) for s in self.stages)
        self._ctxs = {}  # reshard: the executor's forward contexts (from after_action)
        self.note_params()

    def note_params(self):
        """The memory blocks of the weights bound now, which the activations count leaves out
        (contexts hold them). ZeRO-3 binds new gathered buffers every step (``reshard``: every
        action), and a freed one's address may hold an activation later: only the current count."""
        self._param_keys = {storage(a)[0] for st in self.stages.values() for _, a in st.named_parameters()
                            if a is not None}

    @staticmethod
    def stage_units(engine, s):
        """The units of ``engine`` belonging to pipeline stage s (named "s{s}.<child>")."""
        return [u for u in engine.units if u.startswith(f"s{s}.")]

    @contextlib.contextmanager
    def gathered(self):
        """ZeRO-3: every weight gathered for reading (a collective over each engine's group), freed
        after; the memory ledger's peaks are a step's, so reading leaves them as they were."""
        peaks = [dict(e.ledger.peak) for e in self.zero3]
        for e in self.zero3:
            for u in e.units:
                e.gather(u)
        try:
            yield
        finally:
            for e, peak in zip(self.zero3, peaks):
                for u in list(e.full_params):
                    e.free(u)
                e.ledger.peak = peak

    # ----------------------------------------------------------------- one step
    def loss(self, logits, labels):
        """The last stage's loss: the vocab-parallel cross-entropy over my TP group; in mixed
        precision on float32 logits, its gradient times the loss scale (fp16) in 16 bits."""
        def ce(z, y):
            return vocab_parallel_cross_entropy(self.grid.tp, z, y, self.vocab_start)

        return loss_in_master(ce, logits, labels, self.policy, self.scaler.scale if self.scaler else 1.0)

    def microbatches(self, step):
        """My DP replica's rows of the global batch, as m (inputs, labels) micro-batches; with
        cp > 1 only my positions of each row (labels: the next token of each of them)."""
        cfg, (d, _, _) = self.cfg, self.grid.coords
        rows = cfg.batch // cfg.dp
        b = cfg.microbatch_size(cfg.batch)
        ids = self.data.batch(step, cfg.batch, cfg.model.seq_len)[d * rows:(d + 1) * rows]  # (B/dp, T+1)
        x, y = ids[:, :-1], ids[:, 1:]  # (B/dp, T) each
        if self.positions is not None:
            x, y = x[:, self.positions], y[:, self.positions]  # (B/dp, T/cp): my chunks
        asarray = self.comm.asarray
        xs = [asarray(copy(x[i * b:(i + 1) * b])) for i in range(cfg.microbatches)]  # (b, T/cp) each
        ys = [asarray(copy(y[i * b:(i + 1) * b])) for i in range(cfg.microbatches)]
        return xs, ys

    def rows(self, i):
        """The global batch rows of my DP replica's micro-batch i: (b,)."""
        cfg, b = self.cfg, self.cfg.microbatch_size(self.cfg.batch)
        return self.grid.coords[0] * (cfg.batch // cfg.dp) + i * b + np.arange(b)

    def before(self, action):
        """Before every pipeline action: dropout draws the masks of the action's micro-batch (a
        forward that full recomputation runs inside B or I draws the ones its F drew). ZeRO-3
        with ``reshard``: the action's stage's weights gathered over dp x cp, and put back into
        the micro-batch's forward context in place of their placeholders."""
        if self.draw is not None:
            self.draw.at(rows=self.rows(action.microbatch))
        if self.cfg.reshard:
            key = (action.stage, action.microbatch)
            for e in self.zero3:
                for u in self.stage_units(e, action.stage):
                    e.gather(u)
                    if key in self._ctxs:
                        self._ctxs[key] = e.restore(u, self._ctxs[key])
            self.note_params()

    def reshard_after(self, action, held):
        """ZeRO-3 with ``reshard``, after every action: the stage's gathered weights freed, and
        replaced by placeholders in the micro-batch's context (else it would keep them alive)."""
        self._ctxs, key = held["ctx"], (action.stage, action.microbatch)
        for e in self.zero3:
            for u in self.stage_units(e, action.stage):
                if key in self._ctxs:
                    self._ctxs[key] = e.hide(u, self._ctxs[key])
                e.free(u)

    def activation_shape(self, stage, i):
        """What travels between stages: (b, T/cp, C), (b, T/cp/tp, C) sequence parallel."""
        cfg = self.cfg
        T = cfg.model.seq_len // cfg.cp // (cfg.tp if cfg.sequence_parallel else 1)
        return (cfg.microbatch_size(cfg.batch), T, cfg.model.d_model)

    def sample(self, action, held):
        """After every pipeline action: the activations held, and what the MoE layers of its stage
        logged (``ExpertLog.record``)."""
        if self.cfg.reshard:
            self.reshard_after(action, held)
        self.peak_activations = max(self.peak_activations, held_bytes(held, self._param_keys))
        self.moe.record(action)

    def sync_experts(self):
        """Divide the expert gradients by dp: each expert's owner received every replica's tokens
        through the dispatch, so its gradient is already the sum over the dp replicas' losses.
        Nothing is sent; averaging over the ep group would mix different experts."""
        if self.experts is not None:
            for _, g in self.experts.named_grads():
                g /= self.ep.size

    def sync_tied(self):
        """Sum the tied embedding's gradient over the first and last stage (the ``emb`` group)."""
        if self.grid.emb is None:
            return
        g = self.stages[0].embed.grads["wte"] if self.first else self.stages[max(self.stages)].head.grads["wte"]
        g[...] = all_reduce(self.grid.emb, g)

    def sync_dp(self):
        """Average every replicated gradient over the ``dp_cp`` group (dp x cp ranks), once per
        step, after the flush: DDP's ring all-reduce of each flat buffer, ZeRO-1's reduce-scatter
        (a rank keeps the average of its shard). The experts' engine has a group of one: nothing."""
        for e in self.engines:
            e.sync_grads()

    def counted_here(self, module, name) -> bool:
        """Whether this rank's piece of ``module``'s parameter ``name`` enters the global gradient
        norm: a piece split over tp (``module.sharded``) on every TP rank; a parameter whole on
        every TP rank (LayerNorms, row-parallel biases, position embeddings, routers, experts) on
        TP rank 0 only, its partners hold the same; the last stage's copy of the tied embedding
        never, the first stage's counts."""
        if module is self.tied_copy:
            return False
        return name in module.sharded or self.grid.coords[2] == 0

    def squares_here(self) -> float:
        """This rank's part of the gradient's sum of squares: each engine says which part of its
        averaged gradients this rank answers for (DDP: one replica of the dp x cp group, ZeRO-1/2/3:
        every rank its shard; the experts' engine: the owner), and ``counted_here`` which of those
        the tp and pp axes count."""
        return sum((float(namespace(g).sum(g * g)) for e in self.engines for module, name, g in e.grad_pieces()
                    if self.counted_here(module, name)), 0.0)  # a float64 even when this rank counts nothing

    def largest_here(self) -> float:
        """The largest |element| of the gradients this rank answers for (``squares_here``'s pieces;
        an element counted twice would not change a max, but the pieces are the same)."""
        return max((float(namespace(g).max(namespace(g).abs(g))) for e in self.engines
                    for module, name, g in e.grad_pieces() if self.counted_here(module, name)), default=0.0)

    def grad_norm(self) -> float:
        """The global norm of the model's gradient, every parameter counted once: the sum over
        every rank of ``squares_here``, one all-reduce; with ``clip_norm_type`` inf the max over
        every rank of ``largest_here``, one all-reduce (max)."""
        if self.cfg.clip_norm_type == math.inf:
            mine = self.comm.asarray(np.array([self.largest_here()], dtype=np.float64))
            return float(all_reduce(self.comm, mine, op="max")[0])
        mine = np.array([self.squares_here()], dtype=np.float64)
        total = all_reduce(self.comm, self.comm.asarray(mine))  # (1,): the sum over ranks
        return math.sqrt(float(total[0]))

    def scale_grads(self, scale: float):
        """Every gradient this rank steps with times ``scale`` (the same on every rank)."""
        for g in self.grads():
            g *= scale

    def grads(self):
        """Every gradient this rank steps with (its engines' float32 main_grad in mixed precision;
        ZeRO-2/3: the shards, the only gradients left after the reduce-scatter)."""
        return [g for e in self.engines for g in e.step_grads()]

    def found_inf(self) -> bool:
        """Whether any gradient of any rank is inf or nan: my flag, all-reduced (max) over the
        whole world with minipar's ring. A tp, pp or ep peer's overflow never reaches my own
        gradients, so a flag over my group alone would let some ranks step and others skip."""
        mine = np.array([1.0 if nonfinite(self.grads()) else 0.0])
        return float(all_reduce(self.comm, self.comm.asarray(mine), op="max")[0]) > 0

    def unscale(self) -> bool:
        """fp16: skip the step on every rank (and halve the scale) if ``found_inf``; else divide
        every gradient by the scale. Returns whether to step."""
        inf = self.found_inf()
        if not inf:
            self.scale_grads(1.0 / self.scaler.scale)  # exact: the scale is a power of 2
        self.scaler.update(inf)
        return not inf

    def clip_grads(self) -> float:
        """Clip by the global norm as ``torch.nn.utils.clip_grad_norm_(max_norm=cfg.clip)`` does in
        one process (``optim.clip_scale``); returns the norm before clipping."""
        norm = self.grad_norm()
        self.scale_grads(clip_scale(norm, self.cfg.clip))
        return norm

    def step(self, step: int):
        """One optimizer step on the global batch ``step``; returns this rank's loss (the mean over
        its micro-batches of the cross-entropy of its tokens) on the last stage, else None. With
        experts, ``self.moe`` holds what the MoE layers this rank holds logged (``ExpertLog``)."""
        xs, ys = self.microbatches(step)
        for e in self.engines:
            e.zero_grad()  # ZeRO-2/3: every unit's full gradient opened (ZeRO-3: every weight gathered)
        self.note_params()
        self.moe.reset()
        if self.draw is not None:
            self.draw.at(step=step)
        # pp: activations forward and gradients back between stages; tp, cp and ep inside them
        if self.scaler is not None:
            self.scales.append(self.scaler.scale)
        out = run_schedule(self.grid.pp, self.schedule, self.stages, xs, ys, loss=self.loss,
                           shape_of=self.activation_shape, dtype=self.cfg.dtype, after_action=self.sample,
                           before_action=self.before)
        self.sync_tied()  # emb: the tied embedding's gradient summed over the first and last stage
        self.sync_experts()  # nothing sent: an expert's gradient already holds every replica's tokens
        self.sync_dp()  # dp: the replicated gradients averaged (ZeRO-2/3: reduce-scattered) over the dp x cp ranks
        if self.scaler is not None and not self.unscale():  # all: an overflow anywhere, every rank skips
            self.skipped.append(step)  # (and has no norm for it)
            return out["loss"]
        if self.cfg.clip is not None:  # all: the global norm, each parameter counted once
            self.grad_norms.append(self.clip_grads())
        for e in self.engines:
            e.optimizer_step()  # Adam (ZeRO-1: on my shard, then the updated shards all-gathered over dp x cp)
        return out["loss"]

    # ----------------------------------------------------------------- reading the state
    def local_params(self) -> dict:
        """{stage parameter name: NumPy copy} of what this rank holds (TP shards)."""
        from ..xp import to_numpy

        with self.gathered():  # ZeRO-3: collective
            return {n: np.array(to_numpy(a)) for st in self.stages.values() for n, a in st.named_parameters()}

    def memory(self) -> dict:
        """Bytes this rank holds: parameters, gradients, optimizer state (peak, from the engine's
        ledger) and activations (peak between pipeline actions, counted from the arrays held)."""
        leds = [e.measured_memory() for e in self.engines]
        out = {k: int(sum(led[f"{k}_bytes"] for led in leds)) for k in ("params", "grads", "optimizer")}
        out["activations"] = int(self.peak_activations)
        out["total"] = sum(out.values())
        return out


def train(comm, cfg: TrainConfig, report=None, dense=None, trainer=None, start=0, save=None, save_every=0,
          trace_step=None):
    """Run steps ``start`` ... ``cfg.steps - 1``; returns (trainer, global losses, step times).

    The global loss is the mean over the dp x cp ranks of the last stage's loss, plus (with
    experts) the aux losses; it, the step time (the slowest rank's), every rank's peak bytes and
    the tokens per expert are collected with the engine's object transport after each step,
    outside the timed region. ``report(step, record)`` runs on world rank 0. ``save``: a
    directory; every ``save_every`` steps and after the last a checkpoint goes there, and world
    rank 0 holds its lock from before the first step to the end (a second run saving there fails
    at once, naming this one: ``saving.owning``). ``trace_step``: trace that step only
    (``comm.tracer``). ``trainer.history`` gets each step's tokens per expert ({MoE layer:
    {"kept", "routed"}}, empty without experts); with ``cfg.clip`` the record has "grad_norm",
    the step's global gradient norm before clipping (``trainer.grad_norms``).
    """
    with owning(save) if save and comm.rank == 0 else contextlib.nullcontext():
        tr = trainer or Trainer(comm, cfg, dense)
        losses, times = [], []
        for step in range(start, cfg.steps):
            comm.builtin.barrier()
            comm.tracer.enabled = step == trace_step
            t0 = time.perf_counter()
            loss = tr.step(step)
            dt = time.perf_counter() - t0
            comm.tracer.enabled = False
            everyone = comm.builtin.allgather_object((tr.grid.coords, loss, dt, tr.memory(), tr.moe.aux, tr.moe.counts))
            losses.append(global_loss(cfg, [(c, l, aux) for c, l, _, _, aux, _ in everyone]))
            times.append(max(x for _, _, x, *_ in everyone))
            experts = expert_totals([(c, counts) for c, *_, counts in everyone])
            tr.history.append(experts)
            if report is not None and comm.rank == 0:
                report(step, {"loss": losses[-1], "time": times[-1], "memory": [e[3] for e in everyone],
                              "experts": experts,
                              "grad_norm": tr.grad_norms[-1] if cfg.clip is not None and step not in tr.skipped else None,
                              "loss_scale": tr.scales[-1] if tr.scaler else None, "skipped": step in tr.skipped})
            if save and ((save_every and (step + 1) % save_every == 0) or step + 1 == cfg.steps):
                save_checkpoint(tr, save, step + 1)
    return tr, losses, times


def global_loss(cfg, parts) -> float:
    """The global batch's loss from every rank's (coords, loss, aux): the mean over the dp x cp
    ranks of the last stage (TP rank 0: its TP partners hold the same number), plus the aux
    losses of every stage's MoE layers, the same on all ranks of an ep group (mean over dp)."""
    ends = [l for (d, p, t), l, _ in parts if p == cfg.pp - 1 and t == 0]
    aux = sum(a for (d, p, t), _, a in parts if t == 0) / (cfg.dp * cfg.cp)
    return float(np.mean(ends)) + aux if aux else float(np.mean(ends))
