"""End-to-end on the SIMULATED ring: `sparkctl inventory discover` finds the cabling the hand-written inventory has.

The simulated nodes' fabric ports are veth pairs in real network namespaces: their MACs,
IPv6 link-local addresses, carrier_changes and neighbour tables are the kernel's, and
nothing pre-populates a neighbour (the probe's ff02::1 ping does, as on a real box).
Discovery is given the four hosts by address, in a shuffled order, and must find the
ring (up to rotation and direction) and write an inventory `check` accepts; given them
head first, the written inventory must be the hand-written one's cabling, address for
address. A port taken down and two cables crossed are each named, and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import RING, WAIVE, Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


@pytest.fixture(scope="module")
def sim_ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    """The pre-configured ring without engine images: discovery and `check`'s comparison need none."""
    yield from make_sim(tmp_path_factory.mktemp("discring"), 4, load_images=False)

P0 = ("enp1s0f0np0", "enP2p1s0f0np0")


def discover(sim, hosts: list[str], *args: str):  # type: ignore[no-untyped-def]
    inv = load_inventory(sim.inventory)
    node = inv.nodes[0]
    return sim.sparkctl("inventory", "discover", *hosts, "--user", node.ssh_user, "--identity", str(node.ssh_identity),
                        "--known-hosts", str(node.known_hosts), "--no-sudo", *args, timeout=120)


def hosts_of(sim, order: tuple[str, ...]) -> list[str]:  # type: ignore[no-untyped-def]
    inv = load_inventory(sim.inventory)
    return [inv.node(n).host for n in order]


def same_cycle(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = len(a)
    rots = [tuple(b[(i + k) % n] for k in range(n)) for i in range(n)]
    return a in rots or tuple(reversed(a)) in rots


def test_simulated_discover_finds_the_hand_written_ring_from_any_order(sim_ring, tmp_path) -> None:
    hand = load_inventory(sim_ring.inventory)
    shuffled = ("spark-c", "spark-a", "spark-d", "spark-b")
    r = discover(sim_ring, hosts_of(sim_ring, shuffled), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    found = json.loads(r.stdout)
    assert found["topology"] == "ring" and found["ok"] and not found["problems"], found
    assert found["order"][0] == "spark-c" and same_cycle(tuple(found["order"]), hand.ring_order), found["order"]
    for name in shuffled:  # per-node progress, on stderr
        assert f"{name}" in r.stderr
    # head first: the very cabling, and the very addresses, of the hand-written inventory
    out = tmp_path / "found.yaml"
    r = discover(sim_ring, hosts_of(sim_ring, RING), "--output", str(out), "--name", "sim-ring")
    assert r.returncode == 0, r.stdout + r.stderr
    inv = load_inventory(out)
    assert inv.ring_order == hand.ring_order and inv.cables == hand.cables
    assert [(lk.subnet, lk.a.node, lk.a.netdev, lk.a.address, lk.b.node, lk.b.address) for lk in inv.links] == \
        [(lk.subnet, lk.a.node, lk.a.netdev, lk.a.address, lk.b.node, lk.b.address) for lk in hand.links]
    # never overwrite without --force
    again = discover(sim_ring, hosts_of(sim_ring, RING), "--output", str(out))
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    # the written inventory is one sparkctl runs on: `inventory` loads it, and `check` judges the ring
    # on it exactly as on the hand-written one (the fabric law, which probes every address, passes)
    assert sim_ring.sparkctl("-i", str(out), "inventory", "--json", check=True).returncode == 0
    judged = {}
    for inv_file in (out, sim_ring.inventory):
        c = sim_ring.sparkctl("-i", str(inv_file), "check", "ds41f-tp4-ring", "--json", *WAIVE, timeout=240)
        assert c.stdout, c.stderr
        judged[inv_file] = {(v["law"], v["node"], v["status"]) for v in json.loads(c.stdout)["verdicts"]}
    assert judged[out] == judged[sim_ring.inventory]
    assert {("fabric", n, "ok") for n in RING} <= judged[out], sorted(judged[out])


def test_simulated_discover_names_a_port_taken_down_and_writes_nothing(sim_ring, tmp_path) -> None:
    for nd in P0:
        sim_ring.sparkctl("sim", "fault", "spark-a", "link-down", "--iface", nd, check=True)
    try:
        out = tmp_path / "never.yaml"
        r = discover(sim_ring, hosts_of(sim_ring, RING), "--output", str(out))
        assert r.returncode == 4, r.stdout + r.stderr
        assert "problem not one ring of 4: spark-a has 1 cable(s) to the others (p1 to spark-d:p0)" in r.stderr, r.stderr
        assert "no inventory written" in r.stderr and not out.exists()
    finally:
        for nd in P0:
            sim_ring.sparkctl("sim", "fault", "spark-a", "link-up", "--iface", nd, check=True)


def test_simulated_discover_names_two_crossed_cables(sim_ring, tmp_path) -> None:
    # spark-a:p0 ran to spark-b:p1, spark-c:p0 to spark-d:p1; crossed, a faces d twice and c faces b twice
    def cross() -> None:
        for nd, far in zip(P0, ("enp1s0f0np0", "enP2p1s0f0np0")):
            sim_ring.sparkctl("sim", "fault", "spark-a", "cross", "--iface", nd, "--to", f"spark-c:{far}", check=True)

    cross()
    try:
        r = discover(sim_ring, hosts_of(sim_ring, RING), "--json")
        assert r.returncode == 4, r.stdout + r.stderr
        found = json.loads(r.stdout)
        assert found["ok"] is False and found["inventory"] is None
        assert sorted(found["problems"]) == sorted(
            f"not one ring of 4: {n} has 2 cable(s) to the others ({a} to {b}, {c} to {d})"
            for n, a, b, c, d in (("spark-a", "p0", "spark-d:p1", "p1", "spark-d:p0"),
                                  ("spark-b", "p0", "spark-c:p1", "p1", "spark-c:p0"),
                                  ("spark-c", "p0", "spark-b:p1", "p1", "spark-b:p0"),
                                  ("spark-d", "p0", "spark-a:p1", "p1", "spark-a:p0"))), found["problems"]
    finally:
        cross()  # crossing the same two ends again restores them
    r = discover(sim_ring, hosts_of(sim_ring, RING), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["topology"] == "ring", r.stdout + r.stderr


def test_simulated_discover_names_a_box_cabled_to_itself(sim_ring) -> None:
    # spark-a:p0 ran to spark-b:p1, spark-b:p0 to spark-c:p1; crossed, spark-b's p0 runs to its own p1
    def cross() -> None:
        for nd in P0:
            sim_ring.sparkctl("sim", "fault", "spark-a", "cross", "--iface", nd, "--to", f"spark-b:{nd}", check=True)

    cross()
    try:
        r = discover(sim_ring, hosts_of(sim_ring, RING), "--json")
        assert r.returncode == 4, r.stdout + r.stderr
        problems = json.loads(r.stdout)["problems"]
        for nd, other in zip(P0, ("enp1s0f1np1", "enP2p1s0f1np1")):
            assert f"spark-b:p0 ({nd}) is cabled to its own box (spark-b:p1)" in problems, problems
            assert f"spark-b:p1 ({other}) is cabled to its own box (spark-b:p0)" in problems, problems
    finally:
        cross()
