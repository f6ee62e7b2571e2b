"""What each rank runs under :func:`minipar.launch` (``python -m mpi4py -m minipar._worker SPEC OUT``).

Reads the pickled spec, creates the communicator, calls ``target(comm, **kwargs)``, gathers
every rank's return value (and merged trace) on rank 0, which writes them to OUT. A rank that
raises ends the job through the exception hook ``minipar.init`` installs.
"""
from __future__ import annotations

import importlib
import pickle
import sys


def resolve(name: str):
    module, _, func = name.partition(":")
    obj = importlib.import_module(module)
    for part in func.split("."):
        obj = getattr(obj, part)
    return obj


def main(spec_path: str, result_path: str):
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    from minipar.comm import init
    from minipar.trace import merge

    comm = init(spec["backend"], device=spec["device"], watchdog=spec["watchdog"],
                        trace=spec["trace"])
    # an exception from here on reaches the hook minipar.init installed: one line for a
    # UsageError, the traceback once for anything else, then the whole job ends
    result = resolve(spec["target"])(comm, **spec["kwargs"])
    comm.watchdog.finished = True
    events = merge(comm) if spec["trace"] else []
    results = comm.builtin.gather_object(result, 0)
    if comm.rank == 0:
        with open(result_path, "wb") as f:
            pickle.dump({"results": results, "trace": events}, f)
    comm.builtin.barrier()
    from minipar.comm import finalize

    finalize()


if __name__ == "__main__":
    main(*sys.argv[1:3])
