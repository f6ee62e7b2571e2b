"""The hierarchical all-reduce on ordinary mpiexec, nodes emulated by a ranks-per-node count
(no cluster needed): the sums against the builtin, and the bytes sent between "nodes" against
the exact message list; each of its two planted bugs fails one of those checks."""
import pytest

from minipar import launch
from minipar.cluster.traffic import crossing_bytes, messages
from minipar.costmodel import two_level_allreduce_time


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_hierarchical_all_reduce_and_its_planted_bugs():
    p = 6  # nodes of 1, 2 and 3 ranks (6, 3 and 2 nodes), lengths shorter than, and not divisible by, R
    out = launch(p, "tests.ranks:hierarchical_and_mutants", quiet=True)
    for r, got in enumerate(out.results):
        for R, res in got["ok"].items():
            assert res["max_error"] < 1e-12, (r, R, res)
            assert res["cross"] == res["want_cross"] > 0, (r, R, res)  # between nodes: exactly the shard's ring
            assert res["intra"] == [r // R * R + i for i in range(R)]
            assert res["inter"] == list(range(r % R, p, R))
        bad = got["full_buffer"]  # the right sums, more bytes across nodes: caught by the bytes
        assert bad["max_error"] < 1e-12 and bad["cross"] > bad["want_cross"], bad
        bad = got["wrong_peers"]  # shard l of one node added to shard l+1 of another: caught by the sums
        assert bad["max_error"] > 1e-3, bad


def test_the_formula_and_the_message_list_agree_on_the_uplink_bytes():
    """Two derivations of the slow link's bytes: the cost formula's beta term (2(N-1)/N n for the
    hierarchical, 2(p-1)/p n for the flat ring) and the exact message list."""
    beta = 1e-9
    for nodes, per_node in ((2, 2), (3, 2), (4, 4), (2, 1)):
        n = 4 * 240 * nodes * per_node  # bytes, every chunk whole
        for alg in ("ring", "hierarchical"):
            t = two_level_allreduce_time(alg, n, nodes, per_node, intra=(0.0, 0.0), inter=(0.0, beta))
            per_node_bytes = crossing_bytes(alg, n // 4, 4, nodes, per_node)
            assert len(set(per_node_bytes)) == 1
            assert t == pytest.approx(per_node_bytes[0] * beta), (alg, nodes, per_node)
    assert two_level_allreduce_time("hierarchical", 1 << 20, 2, 2, (0, 1e-10), (0, 1e-8)) < \
        two_level_allreduce_time("ring", 1 << 20, 2, 2, (0, 1e-10), (0, 1e-8))
    assert all(s // 2 == d // 2 or abs(s - d) == 2 for s, d, _ in messages("hierarchical", 64, 2, 2))  # peers share a local index
