"""Lesson 05's notebook and figure runs (``minipar.figures.train:figure_runs``): the
ZeRO-with-a-pipeline table the notebook prints (``minipar.memory.zero_with_pipeline``). (The runs
themselves are checked where they run: every row of the notebook, and of ``minipar figures --only
05``, must be ok.)"""
import pytest

from minipar.memory import zero_bytes, zero_with_pipeline


@pytest.mark.parametrize("psi, dp, pp, tp, m", [(175e9, 8, 16, 8, 192), (408_192, 2, 2, 2, 4), (1e6, 3, 1, 1, 1)])
def test_zero_with_a_pipeline_costs(psi, dp, pp, tp, m):
    """Model state: the ZeRO formula on this rank's psi / (pp tp) parameters. DP traffic, in units
    of one reduce-scatter of the gradients ((dp-1)/dp of them, 2 bytes each): 2 for DDP and ZeRO-1,
    m + 1 for ZeRO-2 (a reduce-scatter per micro-batch, one all-gather), 3m for ZeRO-3 (two
    all-gathers and a reduce-scatter per micro-batch)."""
    rows = zero_with_pipeline(psi, dp, pp, tp, m)
    share = psi / (pp * tp)
    unit = (dp - 1) / dp * share * 2
    assert [r["stage"] for r in rows] == [0, 1, 2, 3]
    for r, times, calls in zip(rows, (2, 2, m + 1, 3 * m), (1, 2, m + 1, 3 * m)):
        assert r["memory"] == zero_bytes(share, dp, r["stage"])["total_bytes"]
        assert r["dp_traffic"] == pytest.approx(times * unit, rel=1e-15)
        assert r["collectives_per_step"] == calls
    if m > 1:  # the argument: past ZeRO-1, each stage saves less memory for much more traffic
        assert rows[2]["dp_traffic"] > rows[1]["dp_traffic"] and rows[3]["dp_traffic"] > rows[2]["dp_traffic"]
