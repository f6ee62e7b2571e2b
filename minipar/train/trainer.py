"""One training step on a DP x PP x CP x TP grid, composed from the lessons before it.

    cfg = TrainConfig(GPTConfig(), dp=2, pp=2, tp=2, schedule="1f1b", microbatches=4, steps=5)  # config.py
    parallelize(cfg, world=8)                   # parallelize.py, pure: a UsageError before any rank starts
    trainer = Trainer(comm, cfg)                # on every rank: the plan's groups, stages and engines
    for step in range(cfg.steps):
        loss = trainer.step(step)               # the global batch's loss, on every rank

    losses, params = train_dense(cfg)           # reference.py: the same steps in one process, must be equal

What the run is made of (the grid's groups, the stages this rank holds, the DP/ZeRO engines and
their arguments, the precision's policy) is decided once, by the run's plan (``parallelize.py``);
the trainer runs the step. Below, "stage" is always a pipeline stage; the DP engines' ZeRO stage
is ``plan.zero``.

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
   ZeRO-3's weights are gathered once before the first micro-batch, or with ``reshard`` a pipeline
   stage's around each of its actions (``before``, ``reshard_after``). Experts are not averaged:
   each is held by one rank of the dp group, whose dispatch
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
   counted once (``clip_grads``, ``gradients.py``: a TP shard on its rank, a parameter whole on every TP rank on
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
import time

import numpy as np

from ..collectives import all_reduce
from ..context_parallel import SeqLayout
from ..nn.dropout import Draw
from ..optim import clip_scale
from ..pipeline.execute import run_schedule
from ..tensor_parallel.vocab import vocab_parallel_cross_entropy
from ..xp import copy, storage
from .accounting import held_bytes
from .config import CP_ATTENTION, PRECISIONS, SCHEDULES, TrainConfig, check_shapes, make_data  # noqa: F401 (re-exported)
from .experts import ExpertLog, expert_totals
from .gradients import found_inf, global_norm, largest, scale, sum_of_squares
from .model import GPT, GPTConfig  # noqa: F401 (GPTConfig re-exported)
from .parallelize import Units, engine_units, parallelize  # noqa: F401 (re-exported)
from .precision import LossScaler, loss_in_master
from .saving import owning
from .saving import save as save_checkpoint


class Trainer:
    """Everything one rank holds for training: its plan, place on the grid, stages, engines and data."""

    def __init__(self, comm, cfg: TrainConfig, dense=None):
        self.plan = plan = parallelize(cfg, comm.size)  # the run's decisions, made once (parallelize.py)
        self.comm, self.cfg = comm, cfg
        self.place = plan.place(comm)  # every group, my coordinate (dp, pp, cp, tp)
        self.grid, self.schedule, self.policy, self.ep = self.place.grid, plan.schedule, plan.precision, self.place.ep
        # the positions of every sequence this rank holds: all, or my cp rank's zigzag chunks
        self.positions = SeqLayout(cfg.model.seq_len, cfg.cp).positions(self.place.coord.cp) if cfg.cp > 1 else None
        # dropout: one counter-based draw shared by every site; the masks depend on global indices only
        self.draw = Draw(cfg.dropout, cfg.seed) if cfg.dropout else None
        self.stages = plan.build_stages(self.place, GPT(cfg.model, cfg.seed) if dense is None else dense, self.draw)
        self.engines, units = plan.build_engines(self.place, self.stages)  # lesson 04's, over dp x cp
        self.experts = units[2]  # the experts' units (None without experts): never averaged over dp
        self.unit_stage = {u: s for m in units if m is not None for u, s in m.stage_of.items()}  # unit -> pipeline stage
        self.scaler = LossScaler(cfg.initial_scale, cfg.growth_interval) if self.policy.scaled else None
        self.skipped = []  # fp16: the steps every rank skipped (an inf or nan somewhere)
        self.scales = []  # fp16: the loss scale each step ran with
        self.moe = ExpertLog(self.stages, cfg.microbatches)  # what the MoE layers report, per step
        S = self.schedule.total_stages
        self.first, self.last = 0 in self.stages, S - 1 in self.stages
        self.vocab_start = self.place.coord.tp * cfg.model.vocab // cfg.tp
        self.data = make_data(cfg)
        self.peak_activations = 0
        self.history = []
        self.grad_norms = []  # with cfg.clip: each step's global gradient norm, before clipping
        last = self.stages.get(S - 1)
        # the last stage's own copy of the tied embedding (pp > 1): its gradient equals the first stage's
        self.tied_copy = last.head if last is not None and "wte" in last.head.params and not self.first else None
        self.zero3 = self.engines if plan.zero == 3 else []  # ZeRO-3: the weights are gathered to be read
        self._ctxs = {}  # reshard: the executor's forward contexts (from after_action)
        self.note_params()

    def note_params(self):
        """The memory blocks of the weights bound now, which the activations count leaves out
        (contexts hold them). ZeRO-3 binds new gathered buffers every step (``reshard``: every
        action), and a freed one's address may hold an activation later: only the current count."""
        self._param_keys = {storage(a)[0] for st in self.stages.values() for _, a in st.named_parameters()
                            if a is not None}

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
        if self.plan.reshard:
            key = (action.stage, action.microbatch)
            for e in self.zero3:
                ctx = e.gather_group(action.stage, self._ctxs.get(key))
                if key in self._ctxs:
                    self._ctxs[key] = ctx
            self.note_params()

    def reshard_after(self, action, held):
        """ZeRO-3 with ``reshard``, after every action: the stage's gathered weights freed, and
        replaced by placeholders in the micro-batch's context (else it would keep them alive)."""
        self._ctxs, key = held["ctx"], (action.stage, action.microbatch)
        for e in self.zero3:
            ctx = e.free_group(action.stage, self._ctxs.get(key))
            if key in self._ctxs:
                self._ctxs[key] = ctx

    def activation_shape(self, stage, i):
        """What travels between stages: (b, T/cp, C), (b, T/cp/tp, C) sequence parallel."""
        cfg = self.cfg
        T = cfg.model.seq_len // cfg.cp // (cfg.tp if cfg.sequence_parallel else 1)
        return (cfg.microbatch_size(cfg.batch), T, cfg.model.d_model)

    def sample(self, action, held):
        """After every pipeline action: the activations held, and what the MoE layers of its stage
        logged (``ExpertLog.record``)."""
        if self.plan.reshard:
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

    def pieces(self) -> list:
        """The gradient pieces this rank brings to the global norm: what each engine says this rank
        answers for (``Engine.grad_pieces``), of which ``counted_here`` says what the tp and pp axes
        count."""
        return [g for e in self.engines for module, name, g in e.grad_pieces() if self.counted_here(module, name)]

    def squares_here(self) -> float:
        return sum_of_squares(self.pieces())

    def largest_here(self) -> float:
        return largest(self.pieces())

    def grad_norm(self) -> float:
        """The global norm of the model's gradient, every parameter counted once (``gradients.global_norm``:
        one all-reduce of every rank's ``pieces``; with ``clip_norm_type`` inf, of their max)."""
        return global_norm(self.comm, self.pieces(), self.cfg.clip_norm_type)

    def scale_grads(self, factor: float):
        """Every gradient this rank steps with times ``factor`` (the same on every rank)."""
        scale(self.grads(), factor)

    def grads(self):
        """Every gradient this rank steps with (its engines' float32 main_grad in mixed precision;
        ZeRO-2/3: the shards, the only gradients left after the reduce-scatter)."""
        return [g for e in self.engines for g in e.step_grads()]

    def found_inf(self) -> bool:
        """Whether any gradient of any rank of the world is inf or nan (``gradients.found_inf``)."""
        return found_inf(self.comm, self.grads())

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
