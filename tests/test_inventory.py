"""Inventory: topology derivation, fabric plan, and every bad-input case."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkctl.errors import InventoryError
from sparkctl.model.inventory import load_inventory, loads_inventory

RING = """\
nodes:
  - {name: a, host: 10.0.0.1}
  - {name: b, host: 10.0.0.2}
  - {name: c, host: 10.0.0.3}
  - {name: d, host: 10.0.0.4}
cables:
  - [a:p0, b:p1]
  - [b:p0, c:p1]
  - [c:p0, d:p1]
  - [d:p0, a:p1]
"""


def test_example_inventory_is_the_field_report_ring(repo: Path) -> None:
    inv = load_inventory(repo / "inventory.yaml")
    assert inv.topology == "ring"
    assert inv.ring_order == ("spark-a", "spark-b", "spark-c", "spark-d")
    assert inv.neighbours("spark-a") == ("spark-b", "spark-d")
    assert inv.mtu == 9000


def test_ring_order_follows_the_cables_not_the_file_order() -> None:
    text = RING.replace("  - [b:p0, c:p1]\n  - [c:p0, d:p1]\n", "  - [b:p0, d:p1]\n  - [d:p0, c:p1]\n").replace(
        "  - [d:p0, a:p1]", "  - [c:p0, a:p1]")
    inv = loads_inventory(text)
    assert inv.ring_order == ("a", "b", "d", "c")


def test_one_subnet_per_twin_per_cable_with_stable_host_numbers() -> None:
    inv = loads_inventory(RING)
    assert len(inv.links) == 8
    assert len({lk.subnet for lk in inv.links}) == 8
    for lk in inv.links:
        for ep in (lk.a, lk.b):
            # host number = the node's position in the file + 1, on every subnet
            assert ep.address.endswith("." + str("abcd".index(ep.node) + 1))
    twins = {(lk.a.netdev, lk.b.netdev) for lk in inv.links if lk.cable == 0}
    assert twins == {("enp1s0f0np0", "enp1s0f1np1"), ("enP2p1s0f0np0", "enP2p1s0f1np1")}


def test_ring_routes_reach_non_neighbours_through_a_neighbour() -> None:
    inv = loads_inventory(RING)
    a_routes = {r.dst: r for r in inv.routes_for("a")}
    # a is not on b-c (cable 1) nor c-d (cable 2): 4 subnets, each via the neighbour on it
    assert set(a_routes) == {"10.20.2.0/24", "10.20.3.0/24", "10.20.4.0/24", "10.20.5.0/24"}
    assert a_routes["10.20.2.0/24"].via == "10.20.0.2"  # b's address on a-b twin 0
    assert a_routes["10.20.3.0/24"].via == "10.20.1.2"  # same twin index: twin 1
    assert a_routes["10.20.4.0/24"].via == "10.20.6.4"  # d's address on d-a
    for r in inv.routes:  # the gateway is always directly attached on the route's device
        link = next(lk for lk in inv.node_links(r.node) if lk.end(r.node).netdev == r.dev)
        assert link.other(r.node).address == r.via


def test_pair_and_single_and_switch() -> None:
    pair = loads_inventory("nodes: [{name: a, host: h1}, {name: b, host: h2}]\ncables: [[a:p0, b:p0], [a:p1, b:p1]]\n")
    assert pair.topology == "pair" and len(pair.links) == 4 and pair.routes == ()
    single = loads_inventory("nodes: [{name: a, host: h1}]\n")
    assert single.topology == "single" and single.links == ()
    sw = loads_inventory("nodes: [{name: a, host: h1}, {name: b, host: h2}, {name: c, host: h3}]\n"
                         "cables: [[a:p0, switch], [b:p0, switch], [c:p0, switch]]\n")
    assert sw.topology == "switch"
    assert len({lk.subnet for lk in sw.links if lk.twin == 0}) == 1


def test_pool_is_configurable() -> None:
    inv = loads_inventory("cluster: {fabric_pool: 192.168.64.0/20}\n" + RING)
    assert inv.links[0].subnet == "192.168.64.0/24"


BAD = [
    ("self-cable", RING.replace("[a:p0, b:p1]", "[a:p0, a:p1]"), 7, "cables[0]", "to itself"),
    ("port twice", RING.replace("[b:p0, c:p1]", "[a:p0, c:p1]"), 8, "cables[1]", "used twice"),
    ("not one cycle",
     RING.replace("  - [b:p0, c:p1]\n  - [c:p0, d:p1]\n  - [d:p0, a:p1]\n",
                  "  - [c:p0, d:p1]\n  - [c:p1, d:p0]\n  - [a:p1, b:p0]\n"),
     None, None, "do not form one ring"),
    ("no cable", RING.replace("  - [b:p0, c:p1]\n  - [c:p0, d:p1]\n  - [d:p0, a:p1]\n", "  - [b:p0, c:p1]\n  - [c:p0, a:p1]\n"),
     5, "nodes[3].name", "has no cable"),
    ("duplicate name", RING.replace("{name: b,", "{name: a,"), 3, "nodes[1].name", "duplicate node name"),
    ("duplicate host", RING.replace("10.0.0.2", "10.0.0.1"), 3, "nodes[1].host", "duplicate node host"),
    ("unknown node", RING.replace("[c:p0, d:p1]", "[c:p0, e:p1]"), 9, "cables[2][1]", "unknown node"),
    ("bad port", RING.replace("[c:p0, d:p1]", "[c:p0, d:p2]"), 9, "cables[2][1]", "does not exist"),
    ("unknown key", RING.replace("nodes:", "nodez: []\nnodes:"), 1, "nodez", "unknown key"),
    ("bad pool", "cluster: {fabric_pool: 10.20.0.0/25}\n" + RING, 1, "cluster.fabric_pool", "at least two /24s"),
    ("shell in host", RING.replace("10.0.0.4", "'$(touch x)'"), 5, "nodes[3].host", "not allowed"),
]


@pytest.mark.parametrize("name,text,line,key,words", BAD, ids=[b[0] for b in BAD])
def test_bad_inventory_is_one_error_with_file_line_key(
    name: str, text: str, line: int | None, key: str | None, words: str, tmp_path: Path, sparkctl
) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as exc:
        load_inventory(path)
    assert words in exc.value.message
    if line is not None:
        assert exc.value.ref.line == line and exc.value.ref.key == key and exc.value.ref.file == str(path)
    r = sparkctl("inventory", "-i", str(path))
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:")
    assert "Traceback" not in r.err + r.out
    if exc.value.hint:
        assert "(hint: " in lines[0]


def test_cli_inventory_json_and_ring_picture(repo: Path, sparkctl) -> None:
    import json

    r = sparkctl("inventory", "-i", str(repo / "inventory.yaml"), "--json")
    assert r.code == 0
    data = json.loads(r.out)
    assert data["ring_order"] == ["spark-a", "spark-b", "spark-c", "spark-d"]
    assert len(data["routes"]) == 16
    r = sparkctl("inventory", "-i", str(repo / "inventory.yaml"))
    assert re.search(r"spark-a p0 -+ p1 spark-b", r.out)
