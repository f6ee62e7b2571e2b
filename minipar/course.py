"""The lessons of the course, one entry each: what a lesson runs, and where its parts are.

Everything that lists lessons reads this list: ``minipar lessons``, the tour, ``minipar check``
(which labs exist, their grader and reference solution), ``minipar figures``, the command line
(each lesson's verbs, from its ``cli`` module) and the tests. A lesson joins the course by adding
one ``Lesson(...)``; the optional parts (lab, notebook, figures) default to "none", and the module
names follow the usual layout unless given.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Lesson:
    key: str  # "01": the lesson's number, also its lab's (`minipar check 01`)
    name: str  # "collectives"
    title: str
    driver: str  # "module:function" the tour runs on ranks; returns check rows
    figures_modules: tuple[str, ...] = ()  # modules with make(outdir, quick=False, ...) -> [paths]
    lab: str | None = None  # the lab's folder: README.md, exercise.py, mutants/
    notebook: str | None = None  # notebooks/NN_topic.ipynb
    figures: tuple[str, ...] = ()  # the files figures_modules write into figures/
    packages: tuple[str, ...] = ()  # the library it teaches (default: minipar.<name>)
    run: str | None = None  # `minipar run VERB` (default: the name)
    grader: str | None = None  # the lab's tasks and checks (default: minipar.labs.labNN)
    solution: str | None = None  # minipar's answers under the exercise's names (default: ..._solution)
    cli: str | None = None  # the module with add_verbs(verbs), the lesson's verbs (default: minipar.cli.<name>)
    verbs: tuple[str, ...] = ()  # the verbs that module adds: "run collectives", "bench collectives", "schedule"
    drivers: tuple[str, ...] = ()  # its driver modules in minipar/lessons/ (default: minipar.lessons.<name>)
    backends: tuple[str, ...] = ("mpi", "torch")  # what its driver and lab run on; the first is the default

    def __post_init__(self):
        default = {"packages": (f"minipar.{self.name}",), "run": self.name, "cli": f"minipar.cli.{self.name}",
                   "drivers": (f"minipar.lessons.{self.name}",)}
        if self.lab:
            default["grader"] = f"minipar.labs.lab{self.key}"
            default["solution"] = f"minipar.labs.lab{self.key}_solution"
        for field, value in default.items():
            if not getattr(self, field):
                object.__setattr__(self, field, value)


    @property
    def runs(self) -> tuple[str, ...]:
        """The lesson names ``minipar run`` takes for this lesson, from its verbs: ("context_parallel", "experts")."""
        return tuple(v.split()[1] for v in self.verbs if v.startswith("run "))

LESSONS = [
    Lesson("01", "collectives", "Collectives from send/recv: broadcast, reduce, all-gather, reduce-scatter, all-reduce",
           "minipar.lessons.collectives:tour", ("minipar.figures.collectives", "minipar.figures.cluster"),
           "labs/01_collectives", "notebooks/01_collectives.ipynb",
           ("collectives_busbw.png", "collectives_ring_steps.png", "cluster_allreduce.png", "cluster_placement.png"),
           packages=("minipar.collectives", "minipar.cluster"), run="collectives",
           grader="minipar.labs.lab01", solution="minipar.labs.lab01_solution",
           verbs=("run collectives", "bench collectives", "cluster up", "cluster status", "cluster run",
                  "cluster down", "cluster traffic", "cluster bench", "cluster placement"),
           drivers=("minipar.lessons.collectives", "minipar.lessons.faults")),
    Lesson("02", "tensor_parallel", "Tensor parallelism: column/row splits, Megatron MLP and attention, 2D block product",
           "minipar.lessons.tensor_parallel:tour", ("minipar.figures.tp",),
           "labs/02_tensor_parallel", "notebooks/02_tensor_parallel.ipynb",
           ("tp_speedup.png", "tp_comm_fraction.png"),
           packages=("minipar.tensor_parallel",), run="tensor_parallel",
           grader="minipar.labs.lab02", solution="minipar.labs.lab02_solution",
           verbs=("run tensor_parallel", "bench tp")),
    Lesson("03", "pipeline", "Pipeline parallelism: naive, GPipe, 1F1B, interleaved, zero-bubble; bubbles measured",
           "minipar.lessons.pipeline:tour", ("minipar.figures.pipeline", "minipar.figures.pipeline_async"),
           "labs/03_pipeline", "notebooks/03_pipeline.ipynb",
           ("pipeline_schedules.png", "pipeline_measured_vs_simulated.png", "bubble_vs_microbatches.png",
            "pipeline_memory.png", "pipeline_async.png"),
           packages=("minipar.pipeline",), run="pipeline",
           grader="minipar.labs.lab03", solution="minipar.labs.lab03_solution",
           verbs=("schedule", "run pipeline"),
           drivers=("minipar.lessons.pipeline", "minipar.lessons.pipeline_async")),
    Lesson("04", "data_parallel", "Data parallelism and ZeRO: DP vs DDP, buckets and overlap, ZeRO-1/2/3",
           "minipar.lessons.data_parallel:tour", ("minipar.figures.zero", "minipar.figures.buffers"),
           "labs/04_zero", "notebooks/04_data_parallel_zero.ipynb",
           ("zero_memory.png", "zero_traffic.png", "ddp_overlap_timeline.png", "dp_vs_ddp.png",
            "buffers_per_rank.png", "zero3_prefetch_timeline.png"),
           packages=("minipar.data_parallel", "minipar.zero"), run="data_parallel",
           grader="minipar.labs.lab04", solution="minipar.labs.lab04_solution",
           verbs=("run data_parallel", "memory", "bench offload"),
           drivers=("minipar.lessons.data_parallel", "minipar.lessons.zero_infinity", "minipar.lessons.buffers")),
    Lesson("05", "train", "3D parallelism: a small GPT trained on every DP x PP x TP grid with one process's losses",
           "minipar.lessons.train:tour", ("minipar.figures.train", "minipar.figures.train_features"),
           "labs/05_3d", "notebooks/05_3d_parallelism.ipynb",
           ("train_loss_curves.png", "train_activation_memory.png", "train_3d_step_timeline.png",
            "train_tokens_per_s.png", "train_precision_curves.png", "train_clip_norms.png", "train_dropout_masks.png"),
           packages=("minipar.train",), run="train",
           grader="minipar.labs.lab05", solution="minipar.labs.lab05_solution",
           verbs=("train", "generate", "bench train", "bench gpu", "run train"),
           drivers=("minipar.lessons.train", "minipar.lessons.train_zero", "minipar.lessons.train_precision",
                    "minipar.lessons.train_matrix")),
    Lesson("06", "sequence_experts", "Long sequences and many experts: ring attention, Ulysses, MoE with all-to-all dispatch",
           "minipar.lessons.sequence_experts:tour", ("minipar.figures.sequence_experts",),
           "labs/06_sequence_experts", "notebooks/06_sequence_experts.ipynb",
           ("cp_ring_steps.png", "cp_balance.png", "moe_dispatch.png", "moe_tokens_per_expert.png"),
           packages=("minipar.context_parallel", "minipar.experts"), run="context_parallel",
           verbs=("run context_parallel", "run experts"),
           drivers=("minipar.lessons.sequence_experts", "minipar.lessons.context_parallel", "minipar.lessons.experts")),
    Lesson("07", "planning", "Which strategy when: minipar plan, its memory and time model, a link you can feel",
           "minipar.lessons.planning:tour", ("minipar.figures.plan", "minipar.figures.inference"),
           "labs/07_planning", "notebooks/07_which_strategy.ipynb",
           ("plan_heatmap.png", "plan_memory.png", "plan_here.png", "inference_latency.png", "inference_roofline.png"),
           packages=("minipar.plan",), run="planning",
           verbs=("plan", "run planning", "bench machine", "bench links", "bench plan", "bench published", "infer",
                  "bench inference")),
    Lesson("08", "auto_parallel", "Automatic parallelization: placements, redistribute, FlexFlow's simulator and MCMC search",
           "minipar.lessons.auto_parallel:tour", ("minipar.figures.auto_parallel",),
           "labs/08_auto_parallel", "notebooks/08_auto_parallel.ipynb",
           ("auto_parallel_strategy.png", "auto_parallel_sim_vs_measured.png"),
           packages=("minipar.autoparallel",), run="auto_parallel",
           verbs=("search", "run auto_parallel")),
    # A lesson of its own, not the last sections of 02 and 04: it needs torch (every lesson before it
    # runs on NumPy over MPI without torch installed), one model goes through both lessons' engines
    # (DDP, ZeRO-1/2, FSDP and the TP plan), and it ends where a learner goes next, torch's own
    # engines. Named "torch_engines" (not "torch", the package's name) as `minipar run torch_engines`
    # and `minipar bench torch` read: minipar's engines on torch modules. Torch only (``backends``):
    # there is no autograd to hook into on MPI; its lab is graded on torch tensors.
    Lesson("09", "torch_engines", "From minipar to PyTorch: DDP, a sharded optimizer, FSDP and a TP plan on any "
           "torch.nn.Module", "minipar.lessons.torch_engines:tour", ("minipar.figures.torch_engines",),
           "labs/09_torch", "notebooks/09_torch_engines.ipynb",
           ("torch_ddp_overlap.png", "torch_fsdp_memory.png"),
           packages=("minipar.torch",), backends=("torch",),
           verbs=("run torch_engines", "bench torch"),
           drivers=("minipar.lessons.torch_engines", "minipar.lessons.torch_ddp", "minipar.lessons.torch_fsdp",
                    "minipar.lessons.torch_tp")),
]


def lesson(key_or_name: str) -> Lesson:
    for ls in LESSONS:
        if key_or_name in (ls.key, ls.name, ls.key.lstrip("0")):
            return ls
    raise UsageError(f"no lesson {key_or_name!r}; choose one of "
                     f"{', '.join(f'{ls.key} ({ls.name})' for ls in LESSONS)}")


def labs() -> list[Lesson]:
    """The lessons that have a lab, in course order."""
    return [ls for ls in LESSONS if ls.lab]


def lab(key: str) -> Lesson:
    """The lesson whose lab is ``key`` ("01", "1" or the lesson's name); UsageError if none."""
    for ls in labs():
        if str(key) in (ls.key, ls.key.lstrip("0"), ls.name):
            return ls
    raise UsageError(f"no lab {key!r}: the labs are {', '.join(ls.key for ls in labs())} (see `minipar lessons`)")
