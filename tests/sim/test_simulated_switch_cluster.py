"""End-to-end on a SIMULATED switched cluster of 8 nodes: `check`, `up` of two TP4 replicas, `status`,
`down`, and a miscabled twin named by the switch_subnet law.

Simulated: the switch (a namespace with one Linux bridge per port group, sparkctl_sim.switch), the
TensorFold engine and the GB10 tools. Real: OpenSSH on every node, the veth ports named as on a Spark,
the don't-fragment pings across the bridges, the rendered env files and units, the TCP rendezvous of
each replica over its subnet, HTTP.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.sim.helpers import WAIVE, Sim, make_sim, served, status

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tensorfold-tp4x2-switch"  # replica 0 on spark-a..d, replica 1 on spark-e..h


IMAGE = "ghcr.io/tensorfold/tensorfold-spark:4x-2026.10"  # profiles/tensorfold-tp4-ring.yaml engine.image


@pytest.fixture(scope="module")
def switch8(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    # SIMULATION: only the one image the profile runs, as if its operator had built it on each node
    # (every bundled image on eight nodes doubles the module's setup)
    for sim in make_sim(tmp_path_factory.mktemp("simswitch"), 8, load_images=False, up_args=("--topology", "switch")):
        r = sim.sparkctl("sim", "image", "load", "all", IMAGE, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        yield sim


def check(sim: Sim) -> tuple[int, list[dict]]:
    r = sim.sparkctl("-i", str(sim.inventory), "check", PROFILE, "--json", "--bandwidth", "0", *WAIVE)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)["verdicts"]


def test_simulated_switch_check_up_two_tp4_replicas_status_down(switch8: Sim) -> None:
    # the profile's GPU clock cap is not locked on fresh boots: --fix locks it (clock_cap's safe remedy)
    r = switch8.sparkctl("-i", str(switch8.inventory), "check", PROFILE, "--fix", "--bandwidth", "0", *WAIVE)
    assert "clock" in r.stdout + r.stderr
    code, vs = check(switch8)
    assert code == 0, [v for v in vs if v["status"] == "fail"]
    sw = [v for v in vs if v["law"] == "switch_subnet"]
    assert len(sw) == 16 and {v["status"] for v in sw} == {"ok"}  # 8 nodes x 2 twins, its replica and ring neighbours
    assert {v["status"] for v in vs if v["law"] == "nccl_version"} == {"skip"}  # ring only
    inv = str(switch8.inventory)
    r = switch8.sparkctl("-i", inv, "up", PROFILE, *WAIVE, "--json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    st = status(switch8)
    assert st["record"]["state"] == "serving" and st["record"]["profile"] == PROFILE, st["record"]
    assert [(n["node"], n["rank"], n["alive"]) for n in st["nodes"]] == [
        (f"spark-{c}", k % 4, True) for k, c in enumerate("abcdefgh")], st["nodes"]
    for head in ("spark-a", "spark-e"):  # each replica's head serves, its ranks met over the switch
        assert served(switch8, head=head) == ["dsv41-flash-tensorfold"]
    env = switch8.ssh("spark-g", "cat /etc/sparkctl/engine.env").stdout
    assert "MASTER_ADDR=10.40.0.5" in env and "NCCL_IB_HCA==rocep1s0f0,roceP2p1s0f0" in env
    r = switch8.sparkctl("-i", inv, "down", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert status(switch8)["record"]["state"] == "stopped"


def test_simulated_miscabled_twin_fails_switch_subnet_naming_its_node(switch8: Sim) -> None:
    fault = ("sim", "fault", "spark-f", "switch-port", "--iface", "enP2p1s0f0np0")
    switch8.sparkctl(*fault, "--group", "p0.0", check=True)  # twin 1 in twin 0's bridge
    try:
        code, vs = check(switch8)
    finally:
        switch8.sparkctl(*fault, "--group", "p0.1", check=True)
    bad = [v for v in vs if v["status"] == "fail"]
    assert code == 4 and {(v["law"], v["node"]) for v in bad} == {("switch_subnet", "spark-f")}, bad
    assert "answers none of its 3 peers" in bad[0]["observed"]  # spark-e, g, h: its replica and "enP2p1s0f0np0" in bad[0]["fix"]
    # the node sees nothing wrong: link up, MTU, address (the fabric law) all fine on spark-f
    assert {v["status"] for v in vs if v["law"] == "fabric" and v["node"] == "spark-f"} == {"ok"}
    code, _ = check(switch8)  # the cable back in its own group: the law passes again
    assert code == 0


def _discover(sim: Sim, *args: str) -> "subprocess.CompletedProcess[str]":
    from sparkctl.model.inventory import load_inventory

    inv = load_inventory(sim.inventory)
    node = inv.nodes[0]
    hosts = [f"{n.name}={n.host}" for n in inv.nodes]
    return sim.sparkctl("inventory", "discover", *hosts, "--user", node.ssh_user, "--identity", str(node.ssh_identity),
                        "--known-hosts", str(node.known_hosts), "--no-sudo", *args, timeout=180)


def test_simulated_discover_writes_the_switched_inventory_and_names_a_miscabled_node(switch8: Sim, tmp_path) -> None:
    from sparkctl.model.inventory import load_inventory

    want = load_inventory(switch8.inventory)
    out = tmp_path / "found.yaml"
    r = _discover(switch8, "--output", str(out), "--fabric-pool", want.fabric_pool)
    assert r.returncode == 0, r.stdout + r.stderr
    got = load_inventory(out)
    assert got.topology == "switch" and got.names == want.names

    def ends(inv):  # type: ignore[no-untyped-def]
        return sorted((e.node, e.netdev, e.address, lk.subnet) for lk in inv.links for e in (lk.a, lk.b)
                      if e.node != "switch")

    assert ends(got) == ends(want)  # the same ports, the same port-group subnets, the same addresses
    fault = ("sim", "fault", "spark-f", "switch-port", "--iface", "enP2p1s0f0np0")
    switch8.sparkctl(*fault, "--group", "p0.0", check=True)  # twin 1 in twin 0's bridge
    try:
        r = _discover(switch8, "--json")
    finally:
        switch8.sparkctl(*fault, "--group", "p0.1", check=True)
    assert r.returncode == 4, r.stdout + r.stderr
    found = json.loads(r.stdout)
    assert found["problems"] and all("spark-f" in p for p in found["problems"]), found["problems"]
