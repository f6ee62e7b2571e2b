"""Topology in the grid: Megatron's order string lays the axes on the ranks, ranks per node put
them on nodes, and each traced message knows whether it crossed between nodes; the bytes a
training step sends between nodes equal the formula for TP inside the nodes, TP across them and
PP across them (plain mpiexec, nodes emulated by the ranks-per-node count)."""
import pytest

from minipar import launch
from minipar.errors import UsageError
from minipar.grid import ORDER, parse_order, rank_grid
from minipar.lessons.train import make_config
from minipar.trace import Event, Tracer, link_bytes
from minipar.train.config import check_shapes


def test_the_order_string_lays_the_axes_fastest_first():
    assert ORDER == "tp-cp-pp-dp"
    assert rank_grid((2, 1, 2)).tolist() == [[[0, 1]], [[2, 3]]]  # tp partners neighbours: inside a node
    assert rank_grid((2, 1, 2), "dp-tp-cp-pp").tolist() == [[[0, 2]], [[1, 3]]]  # dp partners neighbours
    g = rank_grid((2, 2, 2, 2), "dp-tp-cp-pp")  # (dp, pp, cp, tp): dp +1, tp +2, cp +4, pp +8
    assert [int(g[1, 0, 0, 0]), int(g[0, 0, 0, 1]), int(g[0, 0, 1, 0]), int(g[0, 1, 0, 0])] == [1, 2, 4, 8]
    assert parse_order("tp-dp-pp") == ("tp", "cp", "dp", "pp")  # cp, absent, goes next to tp
    for bad in ("tp-dp", "tp-tp-pp-dp", "tp-cp-pp-xp", ""):
        with pytest.raises(ValueError, match="name each of tp, cp, pp, dp once"):
            parse_order(bad)


def test_train_refuses_an_order_or_a_node_size_that_does_not_fit():
    for kw, said in ((dict(ranks_per_node=3), "--ranks-per-node=3: must divide the 4 ranks"),
                     (dict(order="tp-pp"), "--order: order='tp-pp'")):
        with pytest.raises(UsageError, match=said):
            check_shapes(make_config(dp=2, tp=2, **kw), 4)
    check_shapes(make_config(dp=2, tp=2, ranks_per_node=2, order="dp-tp-cp-pp"), 4)


def test_a_message_is_inter_node_when_its_peer_is_on_another_node():
    t = Tracer(rank=1, enabled=True)
    t.record("send", "x", 0, 1, 8, 0)
    t.ranks_per_node = 2  # nodes {0, 1} and {2, 3}
    for peer in (0, 2, 3):
        t.record("send", "x", 0, 1, 8, peer)
    t.record("compute", "f", 0, 1)
    # rank 3 shares rank 1's local index but not its node: a link classed by local index says "intra"
    assert [e.link for e in t.events] == ["", "intra", "inter", "inter", ""]


def test_link_bytes_sums_sends_by_their_link():
    ev = [Event(0, "send", "tp", 0, 1, 10, 1, (), "intra"), Event(0, "sendrecv", "dp", 0, 1, 7, 2, (), "inter"),
          Event(0, "recv", "dp", 0, 1, 99, 2, (), "inter"), Event(1, "send", "dp", 0, 1, 5, 3, (), "inter"),
          Event(0, "send", "x", 0, 1, 3, 1)]  # no link known: not counted
    assert link_bytes(ev) == {"intra": 10, "inter": 12} and link_bytes(ev, 0) == {"intra": 10, "inter": 7}


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_bytes_between_nodes_equal_the_formula_for_each_placement():
    out = launch(4, "tests.ranks:placement_bytes", quiet=True).results
    for r, got in enumerate(out):
        for name, g in got.items():
            assert (g["inter"], g["intra"]) == (g["want_inter"], g["want_intra"]), (r, name, g)
        # the placements differ, so a grid that ignored the order (or the nodes) would fail one of them
        inside, across = got["tp inside"], got["tp across"]
        assert inside["inter"] < across["inter"] and inside["inter"] > 0 and got["pp across"]["inter"] > 0, got
        assert inside["inter"] + inside["intra"] == across["inter"] + across["intra"], got
