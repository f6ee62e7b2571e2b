"""The DP x PP x TP grid: sub-communicators follow arange(world).reshape(dp, pp, tp)."""
import numpy as np
import pytest

from minipar import launch
from minipar.launcher import LaunchError


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_grid_2x2x2():
    out = launch(8, "tests.ranks:grid_groups", quiet=True, dp=2, pp=2, tp=2)
    ranks = np.arange(8).reshape(2, 2, 2)
    for w, r in enumerate(out.results):
        d, p, t = r["coords"]
        assert ranks[d, p, t] == w
        assert r["tp"] == list(ranks[d, p, :]) and r["pp"] == list(ranks[d, :, t]) and r["dp"] == list(ranks[:, p, t])
        assert r["tp_sum"] == ranks[d, p, :].sum() and r["dp_sum"] == ranks[:, p, t].sum()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_grid_that_does_not_fit_is_a_clear_error():
    with pytest.raises(LaunchError) as info:
        launch(6, "tests.ranks:grid_groups", quiet=True, dp=2, pp=2, tp=2)
    assert "a grid of dp=2 x pp=2 x tp=2 needs 8 ranks, but the communicator has 6" in info.value.output
