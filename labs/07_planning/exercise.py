"""Lab 07: which strategy when. Six pieces of a planner, written by you, graded against minipar's.

Fill in each function below, then run it and grade it:

    mpiexec -n 4 python -m mpi4py minipar-labs/07_planning/exercise.py     # yours beside the planner's, one measurement
    torchrun --standalone --nproc-per-node 4 minipar-labs/07_planning/exercise.py   # the same, torch
    minipar check 07                                               # grade every task
    minipar check 07 --task 7.3                                    # grade one task

Units: bytes and seconds. The planner itself (``minipar.plan``) is the grader's reference: a
function here that calls into it is refused, whatever it returns. Task 7.4 is handed the one
piece of it you may use, ``predict``.
"""
import minipar


def activation_bytes(s, b, h, a, t=1, sp=False, recompute="none"):
    """Bytes one transformer block keeps for its backward, per micro-batch, on one rank.

    Megatron's GPT block (Korthikanti et al. 2022, section 4): 16-bit activations (2 bytes per
    element), dropout masks (1 byte per element), MLP width 4h. s: sequence length, b: micro-batch
    (sequences), h: hidden size, a: attention heads, t: tensor-parallel ranks, sp: sequence
    parallelism (only with t > 1), recompute: "none", "selective" or "full".

    Without parallelism a block keeps sbh (34 + 5as/h) bytes (the README lists every term).
    Tensor parallelism splits all of it over t ranks except 10 sbh (the LayerNorm inputs, the
    QKV and fc1 inputs, the two dropout masks after attention and MLP); sequence parallelism
    splits those 10 sbh too. Selective recomputation drops the 5as^2b bytes of the attention
    scores (softmax output, its mask, the dropout output); full recomputation keeps only the
    block's input (2sbh, split by t with sequence parallelism).
    activation_bytes(4, 1, 12, 2) -> 4*1*12 * (34 + 5*2*4/12) = 1792.0
    """
    # TODO(lab7.1): the bytes of the block, then what t, sp and recompute leave on one rank
    raise NotImplementedError("lab 7.1")


def peak_inflight(actions):
    """The most activations each pipeline rank holds at once: a list of one int per rank.

    actions[r]: what rank r runs, in order: (stage, kind, microbatch) tuples, kind "F"
    (forward), "B" (backward), or, when the backward is split, "I" (input gradient) then "W"
    (weight gradient). An F stores its stage's activations of that micro-batch; B frees them, and
    with a split backward W does (it still needs the stage's saved inputs after I). With v chunks
    per rank a rank runs several stages: a micro-batch held in two of its stages counts twice.
    Count from the actions: 1F1B's min(p - r, m) holds for 1F1B only.
    [[(0,"F",0), (0,"F",1), (0,"B",0), (0,"B",1)]] (GPipe, p=1, m=2) -> [2].
    """
    # TODO(lab7.2): walk each rank's actions, keep the set of (stage, microbatch) held
    raise NotImplementedError("lab 7.2")


def dp_all_reduce_time(nbytes, n, per_node, intra, inter):
    """Seconds of data parallelism's gradient all-reduce of ``nbytes`` over ``n`` ranks on a
    two-level network: ``per_node`` of the ranks share a node (n <= per_node: one node; else n is a
    multiple of per_node). ``intra``, ``inter``: (alpha, beta) of the link inside a node and of the
    link between nodes, a message of m bytes costing alpha + m * beta.

    The all-reduce to time is the hierarchical one NCCL and the planner run, k = min(n, per_node)
    ranks per node: a reduce-scatter inside each node (after it each rank holds 1/k of its node's
    sum), an all-reduce across the nodes among the n/k ranks that hold the same 1/k, and an
    all-gather inside each node, one phase after the other, each on its own link. Every phase is
    minipar's ring: over q ranks a reduce-scatter, or an all-gather, of m bytes runs q - 1 steps,
    in each of which every rank sends one message of m/q bytes (all at once: a step costs one
    message); a ring all-reduce is a reduce-scatter followed by an all-gather.
    """
    # TODO(lab7.3): the time of each phase on its link
    raise NotImplementedError("lab 7.3")


def choose_config(job, predict):
    """The fastest configuration that fits, for a job on a cluster: a dict with the keys tp, pp,
    dp, microbatch, recompute.

    job: dict(gpus, gpus_per_node, layers, heads, ffn, batch, capacity_bytes): the cluster,
    the model's layers, attention heads and MLP width, the global batch (sequences per step), and
    the memory of one GPU. predict(tp, pp, dp, microbatch, recompute) -> an Estimate with
    ``memory_bytes`` (per GPU, on the busiest pipeline rank) and ``step_s`` (seconds per step):
    the planner's model (1F1B, sequence parallelism with tp > 1, no ZeRO).
    A configuration is valid when tp * pp * dp == gpus; tp divides the heads and ffn and
    stays within one node (tp <= gpus_per_node); pp divides the layers; dp * microbatch divides
    the batch; recompute is "none", "selective" or "full". predict raises ValueError on an invalid one.
    """
    # TODO(lab7.4): every valid configuration through predict; keep the fastest that fits
    raise NotImplementedError("lab 7.4")


def decode_time(weight_bytes, layers, hidden, t, batch, bandwidth, peak_flops, alpha, beta, dtype_bytes=2):
    """Seconds of one decode step (each of ``batch`` sequences gets its next token) at tensor
    parallelism t, every weight split over the t ranks, no KV cache.

    weight_bytes: the model's weights (dtype_bytes each); layers, hidden: its blocks and width;
    bandwidth: bytes/s one rank reads from its own memory; peak_flops: FLOP/s one rank computes;
    alpha, beta: the link between ranks, a message of m bytes costing alpha + m * beta.

    A decode step reads every weight once and does 2 FLOPs per weight and sequence (a
    multiply-add). It takes the longer of its reading and its computing (they overlap: the
    roofline). After each layer's attention and after its MLP the t ranks' partial outputs, a
    (batch x hidden) activation of dtype_bytes each, are summed by minipar's ring all-reduce (as
    in 7.3: a reduce-scatter then an all-gather, each t - 1 steps of one message of 1/t of it per
    rank). Nothing overlaps these all-reduces.
    decode_time(8e8, 8, 1024, 1, 1, 5e9, 1.5e10, 1e-5, 2e-10, 8) -> 0.16 (8e8 bytes at 5 GB/s)
    """
    # TODO(lab7.5): the roofline of one rank's share of the weights, then the all-reduces
    raise NotImplementedError("lab 7.5")


def model_params(layers, hidden, heads, kv_heads, ffn, vocab, mlp="gelu", norm="layernorm", bias=True, tied=True):
    """Parameters of a decoder-only transformer: ``layers`` blocks, the token embedding (vocab x
    hidden), the output layer (the embedding itself when ``tied``, else a vocab x hidden matrix of
    its own) and a final norm. Rotary positions: no position parameters.

    A block: a norm, attention (Q and the output projection hidden x heads d, K and V hidden x
    kv_heads d, d = hidden / heads: grouped-query attention when kv_heads < heads), a norm, the
    MLP ("gelu": hidden x ffn then ffn x hidden; "swiglu": gate and up hidden x ffn, down ffn x
    hidden). norm: "layernorm" (weight and bias) or "rmsnorm" (weight only). bias: every Linear
    has one (its output width) or none does.
    model_params(1, 8, 2, 2, 32, 10) -> 1 x (4 x 64 + 4 x 8 + 2 x 256 + 32 + 8 + 2 x 16) + 80 + 16 = 968
    """
    # TODO(lab7.6): one block's matrices, vectors and norms; then the embedding, output layer, final norm
    raise NotImplementedError("lab 7.6")


if __name__ == "__main__":
    from minipar.labs.lab07_choose import demo
    comm = minipar.init("auto")  # MPI under mpiexec, torch.distributed under torchrun
    demo(comm, activation_bytes, peak_inflight, dp_all_reduce_time, choose_config)
