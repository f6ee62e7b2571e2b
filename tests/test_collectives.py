"""Every from-scratch collective against the engine's own, on real ranks, both backends."""
import pytest

from minipar import launch
from minipar.collectives import ALGORITHMS

from .conftest import has_torch

COLLECTIVES = {f"all_reduce:{a}" for a in (*ALGORITHMS, "hierarchical")} | {"reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "all_to_all_v",
                                                                        "gather", "scatter", "reduce_scatter:counts"}


def check_records(results, n):
    recs = [r for rank in results for r in rank]
    assert {r["collective"] for r in recs} == COLLECTIVES
    assert {r["dtype"] for r in recs} == {"float64", "float32", "int64"}
    bad = [r for r in recs if not r["ok"]]
    assert not bad, f"{len(bad)} failing cases on {n} ranks, e.g. {bad[:3]}"


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.quick), 4, 5, 8])
def test_collectives_mpi(n):
    out = launch(n, "minipar.lessons.collectives:verify", quiet=True)
    assert len(out.results) == n
    check_records(out.results, n)


@pytest.mark.torch
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.quick), 3, 4])
def test_collectives_torch_gloo(n):
    if not has_torch():
        pytest.skip("torch not installed")
    out = launch(n, "minipar.lessons.collectives:verify", backend="torch", quiet=True,
                 lengths=(1, 3, 8, 13, 100))
    check_records(out.results, n)


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_a_watchdog_of_any_length_still_lets_torch_meet():
    """A watchdog of 10^12 s (in effect: none) made torch's engine timeout overflow its int64
    nanoseconds, and every rendezvous then "timed out" at once; the engine's timeout is capped."""
    if not has_torch():
        pytest.skip("torch not installed")
    out = launch(2, "minipar.lessons.collectives:verify", backend="torch", quiet=True, watchdog=1e12, lengths=(3,))
    check_records(out.results, 2)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_collectives_torch_cuda():
    out = launch(2, "minipar.lessons.collectives:verify", backend="torch", device="cuda", quiet=True,
                 lengths=(1, 3, 8, 13, 100, 4096))
    check_records(out.results, 2)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_verify_catches_a_planted_bug():
    out = launch(3, "tests.ranks:broken_ring", quiet=True)
    bad = {r["collective"] for rank in out.results for r in rank if not r["ok"]}
    assert "all_reduce:ring" in bad and "all_gather" in bad
    assert "all_reduce:tree" not in bad  # the tree does not use the ring: it must still pass


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_sub_communicators(backend):
    if backend == "torch" and not has_torch():
        pytest.skip("torch not installed")
    out = launch(5, "tests.ranks:split_collectives", backend=backend, quiet=True)
    assert [r["sub_size"] for r in out.results] == [3, 2, 3, 2, 3]
    assert out.results[0]["world_ranks"] == [0, 2, 4] and out.results[1]["world_ranks"] == [1, 3]
    assert max(r["max_error"] for r in out.results) <= 1e-12


@pytest.mark.mpi
@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_request_test_asks_the_engine(backend):
    if backend == "torch" and not has_torch():
        pytest.skip("torch not installed")
    out = launch(2, "tests.ranks:test_then_wait", backend=backend, quiet=True)
    # gloo's p2p work reports completion only inside wait() (see torch_backend): late stays False
    late = backend == "mpi"
    assert out.results[1] == {"early": False, "late": late, "buf": [0.0, 1.0, 2.0], "again": True}
    assert out.results[0] == {"sent": True}


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_all_gather_with_zero_row_pieces():
    """A rank whose piece has no rows still knows the row width (from the shape, not size // rows)."""
    assert all(launch(3, "tests.ranks:uneven_all_gather", quiet=True).results)


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_torch_split_where_groups_keep_the_world_order():
    """Before torch 2.13, new_group sorts its ranks: a split in the world's order still works there,
    and one in another order is refused in one line rather than silently renumbered."""
    pytest.importorskip("torch")
    for same, refused in launch(2, "tests.ranks:split_in_world_order_only", backend="torch", quiet=True).results:
        assert same
        assert "unlike the world's" in refused and "torch >= 2.13" in refused


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_torch_split_that_leaves_ranks_out_keeps_the_next_groups_working():
    """A split where some ranks join no group (color None), then a grid's groups on every rank:
    torch names a new group by how many groups its process holds, so the ranks left out must
    make one too, or the next group's ranks wait for each other under different names."""
    pytest.importorskip("torch")
    out = launch(4, "tests.ranks:split_some_then_grid", backend="torch", quiet=True, watchdog=30).results
    assert out == [(3.0, 2.0, 1.0), (None, 4.0, 1.0), (None, 2.0, 5.0), (3.0, 4.0, 5.0)]
