"""A training run's plan: its ``TrainConfig`` resolved once, and read by everyone who needs it.

    plan = parallelize(cfg, world=8)   # pure: the shapes checked (UsageError), the same object per config
    plan.precision                     # the Policy: compute and master dtypes, mixed, scaled (fp16 alone)
    plan.zero, plan.engine             # the ZeRO stage and its engine class (minipar.zero.STAGES)
    plan.schedule                      # the pipeline schedule, and which rank holds each stage
    place = plan.place(comm)           # on every rank: the grid, every group, my full coordinate
    stages = plan.build_stages(place, dense)          # my pipeline stages: lesson 02's TP layers ...
    engines, units = plan.build_engines(place, stages)  # ... and lesson 04's DP/ZeRO engines over them

torchtitan's ``parallelize`` is the model: one function turns a job's configuration into the
parallelized model and its parts, and nothing downstream decides again how the run is split. Here
the decisions are made in this module, once:

    precision   the one ``Policy`` of ``cfg.precision`` (``minipar.mixed_precision``), handed to the
                engines, the stages, the loss and the reference; only fp16 scales its loss
    ZeRO        ``cfg.zero`` picks the engine from the one map, ``minipar.zero.STAGES`` (0: DDP, one
                bucket per unit, the bitwise baseline of lesson 04 and of this trainer alike), with
                the arguments of a pipelined step (``minipar.zero.engine_args``): stages 2 and 3 keep
                every full gradient open until the flush; stage 3 gathers every unit once per step,
                or with ``reshard`` one pipeline stage around each of its actions
    groups      the grid's tp, cp, pp, dp, dp x cp and emb groups, the expert-parallel group (my dp
                group, under a name of its own) and the experts' engine's group of one rank
                (``Place``), with the full coordinate (dp, pp, cp, tp)
    units       which module each DP engine owns, and which pipeline stage each unit belongs to
                (``Units.stage_of``: data, never parsed back out of a unit's name)

The command line calls ``parallelize`` before any rank starts, every rank calls it again (the
same object: a plan is cached per configuration), and the accounting, the checkpoints and the
one-process reference read it too.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple

from ..grid import Grid, axis_color
from ..mixed_precision import Policy, policy
from ..nn import Module
from ..pipeline.schedules import Schedule, make_schedule
from ..zero import STAGES, engine_args
from .config import TrainConfig, check_shapes
from .experts import split_experts
from .model import build_stage


class Coord(NamedTuple):
    """A rank's full coordinate on the grid (``Grid.coords`` keeps (dp, pp, tp) for code written
    for three axes; the cp rank is ``Grid.cp_rank``)."""

    dp: int
    pp: int
    cp: int
    tp: int


@dataclass
class Place:
    """Where this rank sits: the grid (its tp, cp, pp, dp, dp_cp and emb groups), the expert-parallel
    group ``ep`` (my dp group; None without experts), the experts' engine's group ``alone`` (this
    rank by itself: its TP partners compute the same experts; None without experts), my full
    coordinate and the pipeline stages I hold."""

    grid: Grid
    coord: Coord
    ep: object
    alone: object
    stages: tuple


class Units(Module):
    """Modules gathered as one DP engine's units (children named "s0.embed", "s4.h", ...);
    ``stage_of``: the pipeline stage each unit belongs to."""

    def __init__(self, modules: dict, stage_of: dict):
        super().__init__()
        for name, m in modules.items():
            setattr(self, name, m)
        self.stage_of = {name: stage_of[name] for name in modules}


def engine_units(stages: dict, split_tied: bool):
    """(units, tied units, expert units): every child with parameters of every stage this rank
    holds, as DP units; with ``split_tied`` the module holding wte on the first or last stage goes
    apart, into its own engine. Its flat buffer then has the same layout on both stages, so the DP
    ring reduces the two copies' (equal) gradients in the same order, and they stay bitwise equal.
    A child holding mixture-of-experts layers is split further: its experts go to the expert units
    (never averaged over dp), everything else (the router too) stays a DP unit."""
    units, tied, experts, stage_of = {}, {}, {}, {}
    for s, st in stages.items():
        for name, child in st.children().items():
            if not child.num_params():  # the embedding's dropout: nothing to reduce or update
                continue
            is_tied = split_tied and ((s == 0 and name == "embed") or (st.last and name == "head"))
            if is_tied:
                tied[f"s{s}.{name}"] = child
            else:
                split_experts(child, f"s{s}.{name}", units, experts)
            stage_of.update({u: s for u in (*units, *tied, *experts) if u not in stage_of})
    return (Units(units, stage_of), Units(tied, stage_of) if tied else None,
            Units(experts, stage_of) if experts else None)


@dataclass(frozen=True, eq=False)
class Plan:
    """What a ``TrainConfig`` resolves to; the same on every rank and before any rank starts."""

    cfg: TrainConfig

    @cached_property
    def precision(self) -> Policy:
        return policy(self.cfg.precision)

    @property
    def zero(self) -> int:
        """The ZeRO stage of the DP engines (0: DDP): a ZeRO stage, never a pipeline stage."""
        return self.cfg.zero

    @property
    def engine(self) -> type:
        return STAGES[self.zero]

    @property
    def reshard(self) -> bool:
        """ZeRO-3 gathers one pipeline stage's weights around each of its actions (not once per step)."""
        return self.cfg.reshard

    @cached_property
    def schedule(self) -> Schedule:
        cfg = self.cfg
        return make_schedule(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)

    def stages_on(self, p: int) -> tuple:
        """The pipeline stages pipeline rank ``p`` holds."""
        s = self.schedule
        return tuple(k for k in range(s.total_stages) if s.stage_to_rank[k] == p)

    def engine_kwargs(self, stage_of=None) -> dict:
        """The arguments of every DP engine of the run: Adam's lr, the precision (main_grad: every
        micro-batch's gradient added into float32 in mixed precision), and the ZeRO stage's for a
        step the pipeline executor runs (``minipar.zero.engine_args``; ``stage_of``: each unit's
        pipeline stage, the groups ZeRO-3 reshards by)."""
        return dict(lr=self.cfg.lr, precision=self.precision, main_grad=True,
                    **engine_args(self.zero, pipelined=True, reshard=self.reshard, groups=stage_of))

    # ------------------------------------------------------------------ on the ranks
    def place(self, comm) -> Place:
        """This rank's grid and groups (collective: every rank of ``comm`` calls it, in this order)."""
        cfg = self.cfg
        g = Grid(comm, cfg.dp, cfg.pp, cfg.tp, cp=cfg.cp, order=cfg.order, ranks_per_node=cfg.ranks_per_node or None)
        if cfg.ranks_per_node:  # every traced message learns whether it crossed between nodes
            comm.tracer.ranks_per_node = cfg.ranks_per_node
        d, p, t = g.coords
        ep = alone = None
        if cfg.model.n_experts:
            ep = comm.split(axis_color(g.shape, g.position, "dp"), key=d, name=f"ep(p{p},t{t})")
            alone = comm.split(comm.rank, key=0, name=f"experts(r{comm.rank})")
        return Place(g, Coord(d, p, g.cp_rank, t), ep, alone, self.stages_on(p))

    def build_stages(self, place: Place, dense, draw=None) -> dict:
        """{pipeline stage: GPT stage} of the stages this rank holds: its slices of ``dense`` on the
        tp group (cp attention over cp, experts over ep), moved to the compute dtype on this
        backend; in mixed precision each rounds what it hands on to 16 bits."""
        cfg, g = self.cfg, place.grid
        S = self.schedule.total_stages
        like = g.world.empty((1,), cfg.dtype)  # the compute dtype, on this backend
        stages = {}
        for s in place.stages:
            tied = stages[0].embed if 0 in stages else None
            stages[s] = build_stage(g.tp, dense, s, S, cfg.sequence_parallel, cfg.recompute, tied,
                                    cp=g.cp, cp_attention=cfg.cp_attention, ep=place.ep, draw=draw)
        for st in stages.values():
            st.to(like)
            st.compute = like.dtype if self.precision.mixed else None
        return stages

    def build_engines(self, place: Place, stages: dict):
        """(engines, (units, tied, experts)): the DP engine over the dp x cp group of my units, the
        tied embedding's own one (pp > 1) and the experts' over the group of one rank."""
        units, tied, experts = engine_units(stages, split_tied=self.cfg.pp > 1)

        def engine(group, model):
            return self.engine(group, model, **self.engine_kwargs(model.stage_of))

        engines = [engine(place.grid.dp_cp, units)] + ([engine(place.grid.dp_cp, tied)] if tied else [])
        if experts is not None:  # held by this rank alone (and its TP partners, which compute the same)
            engines.append(engine(place.alone, experts))
        return engines, (units, tied, experts)


@lru_cache(maxsize=64)
def parallelize(cfg: TrainConfig, world: int | None = None) -> Plan:
    """The plan of ``cfg``: its shapes checked (a UsageError naming the first dimension that does
    not fit; with ``world``, also that the grid needs exactly that many ranks), once per
    configuration and world; the same ``Plan`` for every caller with an equal configuration."""
    check_shapes(cfg, world)
    return _plan(cfg)


@lru_cache(maxsize=64)
def _plan(cfg: TrainConfig) -> Plan:
    return Plan(cfg)
