import os
import pathlib
import subprocess
import sys

import pytest

# ranks started by minipar.launch import rank-side test helpers as ``tests.ranks``
ROOT = str(pathlib.Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

# one BLAS thread per rank: ranks are oversubscribed on small machines
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def minipar(*args, timeout=300, cwd=None):
    """``python -m minipar ARGS`` in a subprocess (ranks find ``tests`` through the PYTHONPATH set
    above): the CompletedProcess, stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "minipar", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test leaves ``os.environ`` as it found it: a variable a test sets for its ranks reaches
    every later job of the session otherwise (a fuzzed ``--watchdog 10^12`` once did, before
    ``minipar.cli.main`` restored the environment itself: ``tests/test_cli_env.py``)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def has_cuda():
    if not has_torch():
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda():
            item.add_marker(skip_gpu)


# `pytest -q` (make test) shows only dots for many minutes: name each test file as it starts, so a
# long wait says where it is (``tests/test_zero.py ....``). Other verbosities name files already.
_files = {"config": None, "last": None}


def pytest_configure(config):
    _files["config"] = config


def pytest_runtest_logstart(nodeid, location):
    config = _files["config"]
    reporter = config and config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() >= 0 or location[0] == _files["last"]:
        return
    first, _files["last"] = _files["last"] is None, location[0]
    reporter.write(("" if first else "\n") + f"{location[0]} ")
