"""Skips the technique by calling minipar's own answers: the lab's solution module, imported under
another name (a rule on the names of the graded functions misses it) and called from functions
written in the exercise. The right values, one ring collective each. On one rank nothing is sent,
and the grader sees the call run minipar's answer; on more ranks the trace would also show
minipar's code making every message.

EXPECT 4.1: average_gradients ran minipar's own minipar.labs.lab04_solution.average_gradients (called at tests/labs/skips/04_minipar_reference.py:17: return answers.average_gradients(comm, grads)): write average_gradients yourself
EXPECT 4.2: bucketed_average ran minipar's own minipar.labs.lab04_solution.bucketed_average
EXPECT 4.3: zero1_update ran minipar's own minipar.labs.lab04_solution.zero1_update
EXPECT 4.4: zero2_grad_shard ran minipar's own minipar.labs.lab04_solution.zero2_grad_shard
EXPECT 4.5: zero3_forward ran minipar's own minipar.labs.lab04_solution.zero3_forward
"""
from minipar.labs import lab04_solution as answers


def average_gradients(comm, grads):
    return answers.average_gradients(comm, grads)


def bucketed_average(comm, grads, bucket_bytes):
    return answers.bucketed_average(comm, grads, bucket_bytes)


def zero1_update(comm, param, avg_grad, m, v, step, lr):
    return answers.zero1_update(comm, param, avg_grad, m, v, step, lr)


def zero2_grad_shard(comm, grad):
    return answers.zero2_grad_shard(comm, grad)


def zero3_forward(comm, shards, shapes, x, layer):
    return answers.zero3_forward(comm, shards, shapes, x, layer)
