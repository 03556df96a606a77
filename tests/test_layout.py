"""sparkctl.model.layout: a profile bound to an inventory gives each node its rank, replica and fabric."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.errors import ProfileError
from sparkctl.model.inventory import load_inventory
from sparkctl.model.layout import bind
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots

REPO = Path(__file__).resolve().parent.parent
ROOTS = Roots.make(env={})
RING = load_inventory(REPO / "inventory.yaml")
PAIR = load_inventory(REPO / "tests/fixtures/inv-pair.yaml")
SINGLE = load_inventory(REPO / "tests/fixtures/inv-single.yaml")


def test_a_ring_profile_ranks_the_whole_ring_in_cable_order_from_the_head() -> None:
    lay = bind(resolve("ds41f-tp4-ring", ROOTS), RING)
    assert lay.layout == "ring" and len(lay.replicas) == 1
    assert [(r.node, r.rank, r.world_size) for r in lay.ranks] == [
        ("spark-a", 0, 4), ("spark-b", 1, 4), ("spark-c", 2, 4), ("spark-d", 3, 4)]
    head = lay.rank_of("spark-a")
    assert head.is_head and [r.node for r in lay.heads()] == ["spark-a"]
    # every rank meets at the head's fabric address, never its management host
    assert {r.master_addr for r in lay.ranks} == {head.host_ip} and head.host_ip != RING.node("spark-a").host
    for r in lay.ranks:
        assert r.host_ip in {ep.address for ep in RING.endpoints(r.node)}
        # both cables of a ring node, every RoCE twin of them; NCCL's sockets on twin 0 only
        assert len(r.socket_ifnames) == 2 and len(r.hca) == 4
        assert dict(r.netdev_for_hca).keys() == set(r.hca)


def test_start_order_decides_which_group_starts_first_and_stop_reverses_it() -> None:
    lay = bind(resolve("ds41f-tp4-ring", ROOTS), RING)
    assert lay.start_order == "workers-first"
    assert [[r.node for r in g] for g in lay.start_sequence()] == [["spark-b", "spark-c", "spark-d"], ["spark-a"]]
    assert lay.stop_sequence() == tuple(reversed(lay.start_sequence()))
    first = bind(resolve("ds41f-tp4-ring", ROOTS, ["topology.start_order=head-first"]), RING)
    assert [[r.node for r in g] for g in first.start_sequence()] == [["spark-a"], ["spark-b", "spark-c", "spark-d"]]


def test_a_pair_uses_its_one_cable_and_a_single_box_its_own_address() -> None:
    pair = bind(resolve("tensorfold-tp2", ROOTS), PAIR)
    assert [(r.node, r.rank, r.world_size) for r in pair.ranks] == [("spark-a", 0, 2), ("spark-b", 1, 2)]
    link = PAIR.link_between("spark-a", "spark-b")
    assert link is not None and pair.rank_of("spark-b").master_addr == pair.rank_of("spark-a").host_ip
    one = bind(resolve("llamacpp-1box", ROOTS), SINGLE)
    (rank,) = one.ranks
    assert rank.world_size == 1 and rank.hca == () and rank.host_ip == (SINGLE.primary_address(rank.node) or "127.0.0.1")


def test_a_pair_on_two_neighbours_of_the_ring_binds() -> None:
    lay = bind(resolve("tensorfold-tp2", ROOTS, ["topology.nodes=[spark-b, spark-c]"]), RING)
    assert [r.node for r in lay.ranks] == ["spark-b", "spark-c"]


@pytest.mark.parametrize("profile, sets, inv, key, words", [
    ("tensorfold-tp2", ["topology.nodes=[spark-a, spark-c]"], RING, "topology.nodes", "not joined by a cable"),
    ("tensorfold-tp2", ["topology.nodes=[spark-a, spark-x]"], RING, "topology.nodes", "not in the inventory"),
    ("tensorfold-tp2", ["topology.nodes=[spark-a, spark-a]"], RING, "topology.nodes", "listed twice"),
    ("tensorfold-tp2", ["topology.nodes=[spark-a, spark-b, spark-c]"], RING, "topology.tp_size", "needs 2 nodes"),
    ("ds41f-tp4-ring", [], PAIR, "topology.tp_size", "needs 4 nodes"),
])
def test_a_layout_the_cables_cannot_carry_is_a_profile_error_naming_the_key(
        profile: str, sets: list[str], inv: object, key: str, words: str) -> None:
    with pytest.raises(ProfileError, match=words) as e:
        bind(resolve(profile, ROOTS, sets), inv)  # type: ignore[arg-type]
    assert e.value.ref is not None and e.value.ref.key is not None and key in e.value.ref.key
