"""Skips the technique by calling minipar's own code from functions written in the exercise: the
vocabulary-parallel loss of minipar.tensor_parallel, and the lab's answers (the solution module
under another name, which a rule on the graded functions' names misses) for the tied sum and the
step and the global norm. The right values and the right traffic; the trace records who made every message.

EXPECT 5.2: was made by minipar's own code, minipar/tensor_parallel/vocab.py:
EXPECT 5.2: called at tests/labs/skips/05_minipar_reference.py:21: write vocab_parallel_cross_entropy's messages yourself
EXPECT 5.3: was made by minipar's own code, minipar/labs/lab05_solution.py:
EXPECT 5.3: write sync_tied's messages yourself
EXPECT 5.4: was made by minipar's own code, minipar/labs/lab05_solution.py:
EXPECT 5.4: write train_step's messages yourself
EXPECT 5.6: was made by minipar's own code, minipar/labs/lab05_solution.py:
EXPECT 5.6: write global_grad_norm's messages yourself
"""
from minipar.labs import lab05_solution as answers
from minipar.tensor_parallel import vocab


def vocab_parallel_cross_entropy(comm, logits, labels):
    lo, hi = vocab.vocab_range(logits.shape[-1], comm)
    return vocab.vocab_parallel_cross_entropy(comm, logits[..., lo:hi], labels, lo)


def sync_tied(pp, grad):
    return answers.sync_tied(pp, grad)


def train_step(grid, pipeline, grads, tied):
    answers.train_step(grid, pipeline, grads, tied)


def global_grad_norm(grid, grads):
    return answers.global_grad_norm(grid, grads)
