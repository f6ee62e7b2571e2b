"""Lesson 05: a small GPT trained end to end on every DP x PP x TP grid (x CP, with experts over DP).

    minipar train -n 8 --dp 2 --pp 2 --tp 2 --steps 200            # a progress line per step
    minipar train -n 8 --dp 2 --pp 2 --tp 2 --steps 5 --compare    # + the one-process run
    minipar generate --checkpoint ckpt/ -n 2 --tp 2 --prompt "4193>"

    model.py      the GPT (dense reference) and one pipeline stage of it on a TP group
    data.py       the sorting task, tokenized by character; batches as a function of the step
    config.py     TrainConfig (a ``minipar.layout.Layout``: the grid dp x pp x cp x tp, schedule,
                  ...; plus model, data; its defaults are minipar train's) and check_shapes
    parallelize.py  the run's plan, resolved once: the precision's policy, the ZeRO stage's engine,
                  the schedule, every group with the full coordinate; the stages and engines it builds
    trainer.py    the step composing TP layers, CP attention, experts, the pipeline executor and
                  the DP/ZeRO engine, and the loop (``train``)
    gradients.py  after the flush: the global norm (every parameter once), the clip, fp16's unscaling
    run.py        what every rank of ``minipar train`` runs: the loop, a progress line per step
    reference.py  the one-process reference every grid must reproduce: the same steps, dense (train_dense)
    experts.py    the mixture-of-experts bookkeeping: expert units, what the MoE layers report
    precision.py  mixed precision: which dtype computes and which keeps, fp16's dynamic loss scale,
                  the tolerances per precision
    checkpoint.py sharded checkpoints that reshard onto any grid: reading, checking, resuming
    saving.py     writing one: the folder's lock, a checksum per shard, renames a kill survives
    generate.py   greedy decoding with a KV cache on a TP group
    accounting.py activation memory and bytes per step: the formulas the runs must equal
    mutants.py    the planted bugs the checks must catch
    torch_oracle.py  the same GPT in torch autograd (the oracle of the tests)
    (the verbs: ``minipar.cli.train``; ``minipar bench train``: ``minipar.bench.train``)

docs/train.md derives every formula; docs/benchmarks_train.md has the measurements.
"""
