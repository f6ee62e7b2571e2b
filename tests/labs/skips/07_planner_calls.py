"""Skips the technique: the planner answers instead of the learner. minipar's own answer imported
as the graded function (7.1); the pipeline's in-flight counter (7.2), the planner's hierarchical
all-reduce (7.3) and the planner's search (7.4) called inside functions that look written.

EXPECT 7.1: activation_bytes is minipar's own minipar.labs.lab07_solution.activation_bytes, imported into the exercise
EXPECT 7.2: peak_inflight called minipar.pipeline.schedules.inflight_profile: minipar's own answer (the grader's reference) is not a tool
EXPECT 7.3: dp_all_reduce_time called minipar.lessons.planning.hierarchical_time: minipar's own answer
EXPECT 7.4: choose_config called minipar.plan.models.
EXPECT 7.4: minipar.plan.search.search
EXPECT 7.6: model_params called minipar.plan.models.
"""
from minipar.labs.lab07_solution import activation_bytes  # noqa: F401  the answer to 7.1, imported
from minipar.lessons import planning
from minipar.pipeline import schedules


def peak_inflight(actions):
    return [max(schedules.inflight_profile(ops)) for ops in actions]


def dp_all_reduce_time(nbytes, n, per_node, intra, inter):
    return planning.hierarchical_time(nbytes, n, per_node, intra, inter)


def choose_config(job, predict):
    """Find the model and the GPU the job describes, and let the planner's search choose."""
    from minipar import plan

    spec = next(m for m in plan.MODELS.values() if (m.layers, m.heads, m.f) == (job["layers"], job["heads"], job["ffn"]))
    name = "a100-40gb" if job["capacity_bytes"] < 50e9 else "a100-80gb"
    prob = plan.Problem(plan.model(spec.name), job["gpus"], job["gpus_per_node"], plan.preset(name), job["batch"])
    best = plan.search(prob, dict(cp=1, zero=0, schedule="1f1b", chunks=1), top=1).best
    return dict(tp=best.tp, pp=best.pp, dp=best.dp, microbatch=best.microbatch_size(prob.batch), recompute=best.recompute)


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    """The planner's ModelSpec counts them."""
    from minipar.plan.models import ModelSpec

    return ModelSpec(layers, hidden, heads, 1, vocab, ffn=ffn, kv_heads=kv_heads, mlp=mlp, norm=norm, bias=bias,
                     qkv_bias=bias, tied=tied, positions="rope").params()
