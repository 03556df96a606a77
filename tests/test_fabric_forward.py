"""The fabric filter unit's rules (plan/fabricplan.py), judged by the real iptables.

Every cabled node's INPUT chain (its fabric addresses from its fabric ports and lo only)
and a ring relay's forwarding chain. The unit's start and stop shell run in a scratch
network namespace with the real iptables (root only); the INPUT chain's verdict on real
packets from scratch peers here, the whole ring's in the e2e test
tests/sim/test_simulated_ring_forward_isolation.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.model.resources import Roots
from sparkctl.plan import fabricplan

REPO = Path(__file__).resolve().parent.parent
INV = load_inventory(REPO / "inventory.yaml")


def _ports(node: str) -> tuple[str, ...]:
    return tuple(ep.netdev for ep in INV.endpoints(node))


def test_rules_accept_the_pool_between_fabric_ports_and_drop_the_rest_of_them() -> None:
    ports = _ports("spark-b")
    rules = fabricplan.forward_rules(INV.fabric_pool, ports)
    accepts = [r for r in rules if r.endswith("-j ACCEPT")]
    assert len(accepts) == len(ports) ** 2 and all("-s 10.20.0.0/16 -d 10.20.0.0/16" in r for r in accepts)
    drops = [r for r in rules if r.endswith("-j DROP")]
    assert drops == [f"-A SPARKCTL-FABRIC -i {p} -j DROP" for p in ports] + \
        [f"-A SPARKCTL-FABRIC -o {p} -j DROP" for p in ports]
    assert rules.index(drops[0]) > max(rules.index(a) for a in accepts)  # accepts first
    assert not [r for r in rules if "enP7s7" in r]  # the management port is never named: Docker's bridges untouched


def test_input_rules_let_the_pool_in_from_fabric_ports_and_lo_only() -> None:
    ports = _ports("spark-b")
    rules = fabricplan.input_rules(INV.fabric_pool, ports)
    assert rules == (*(f"-A SPARKCTL-FABRIC-IN -i {i} -j RETURN" for i in ("lo", *ports)),
                     "-A SPARKCTL-FABRIC-IN -d 10.20.0.0/16 -j DROP")


def _unit(ff: fabricplan.FabricFiles, node: str) -> str | None:
    unit = [f for f in ff.files.get(node, ()) if f.path.endswith("sparkctl-fabric-forward.service")]
    return unit[0].text if unit else None


def test_the_unit_is_on_every_cabled_node_before_network_and_docker_forwarding_on_relays_only() -> None:
    ff = fabricplan.render_fabric(INV, Roots.make(env={}))
    for n in INV.nodes:
        text = _unit(ff, n.name)
        assert (text is not None) == bool(INV.node_links(n.name))
        if text is None:
            continue
        assert "Before=network-pre.target docker.service shutdown.target" in text
        assert "DefaultDependencies=no" in text
        assert "-I INPUT 1 -j SPARKCTL-FABRIC-IN" in text
        assert ("-I DOCKER-USER 1 -j SPARKCTL-FABRIC;" in text) == bool(INV.routes_for(n.name))
        assert "sparkctl-fabric-forward.service" in ff.units[n.name]


def test_a_pair_gets_the_input_chain_and_no_forwarding() -> None:
    pair = load_inventory(REPO / "tests" / "fixtures" / "inv-pair.yaml")
    ff = fabricplan.render_fabric(pair, Roots.make(env={}))
    for n in pair.nodes:
        text = _unit(ff, n.name)
        assert text is not None and "-I INPUT 1 -j SPARKCTL-FABRIC-IN" in text, n.name
        assert "-I DOCKER-USER" not in text and ":SPARKCTL-FABRIC -" not in text  # not a relay
        assert not [f for f in ff.files[n.name] if f.path.endswith("60-sparkctl-forward.conf")]


@pytest.fixture
def scratch_netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("ip") is None:
        pytest.skip("needs root, ip and iptables (a scratch network namespace)")
    name = f"sparkctl-fwdtest-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _sh(ns: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", script], capture_output=True, text=True, timeout=60)


def test_real_iptables_start_is_idempotent_survives_dockerd_and_stop_removes(scratch_netns: str) -> None:
    start, stop = fabricplan._forward_sh(INV.fabric_pool, _ports("spark-b"))
    ns = scratch_netns
    # an older sparkctl's DOCKER-USER rule, and dockerd already started with its DROP policy
    old = fabricplan._docker_user_rule(INV.fabric_pool)
    assert _sh(ns, f"iptables -N DOCKER-USER; iptables -I FORWARD -j DOCKER-USER; iptables -P FORWARD DROP; "
                   f"iptables -A DOCKER-USER {old}").returncode == 0
    r = _sh(ns, start)
    assert r.returncode == 0, r.stderr
    first = _sh(ns, "iptables -S").stdout
    assert "-A DOCKER-USER -j SPARKCTL-FABRIC" in first and old not in first
    assert first.count("-j SPARKCTL-FABRIC\n") == 1 and first.count("-A FORWARD -j DOCKER-USER") == 1
    assert first.count("-A INPUT -j SPARKCTL-FABRIC-IN\n") == 1
    chain = [ln for ln in first.splitlines() if ln.startswith("-A SPARKCTL-FABRIC ")]
    assert len(chain) == len(fabricplan.forward_rules(INV.fabric_pool, _ports("spark-b")))
    chain_in = [ln for ln in first.splitlines() if ln.startswith("-A SPARKCTL-FABRIC-IN ")]
    assert len(chain_in) == len(fabricplan.input_rules(INV.fabric_pool, _ports("spark-b")))
    assert _sh(ns, start).returncode == 0 and _sh(ns, "iptables -S").stdout == first  # re-apply: the same

    # a Docker restart (moby EnsureJumpRule: delete the jump, insert it at the top; DOCKER-USER kept)
    assert _sh(ns, "iptables -D FORWARD -j DOCKER-USER; iptables -I FORWARD -j DOCKER-USER").returncode == 0
    assert "-A DOCKER-USER -j SPARKCTL-FABRIC" in _sh(ns, "iptables -S").stdout

    assert _sh(ns, stop).returncode == 0
    left = _sh(ns, "iptables -S").stdout
    assert "SPARKCTL-FABRIC" not in left and "-N DOCKER-USER" in left and "-P FORWARD DROP" in left
    assert _sh(ns, f"set -e; {stop}").returncode == 0  # nothing to remove: still fine, in restore's set -e too


def test_real_iptables_start_before_dockerd(scratch_netns: str) -> None:
    """Early at boot (before docker.service): the unit makes DOCKER-USER and the jump; dockerd's
    start keeps the chain and leaves one jump at the top."""
    start, _ = fabricplan._forward_sh(INV.fabric_pool, _ports("spark-b"))
    ns = scratch_netns
    assert _sh(ns, start).returncode == 0
    assert _sh(ns, "iptables -C FORWARD -j DOCKER-USER && iptables -D FORWARD -j DOCKER-USER && "
                   "iptables -I FORWARD -j DOCKER-USER").returncode == 0
    rules = _sh(ns, "iptables -S").stdout
    assert rules.count("-A FORWARD -j DOCKER-USER") == 1 and "-A DOCKER-USER -j SPARKCTL-FABRIC" in rules


@pytest.fixture
def scratch_node() -> Iterator[tuple[str, str, str]]:
    """A node netns with a fabric port (veth to a fabric peer netns) and a management link
    (veth to a LAN host netns that routes the node's fabric address via its management address)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("ip") is None \
            or shutil.which("ping") is None:
        pytest.skip("needs root, ip, iptables and ping (scratch network namespaces)")
    tag = os.getpid()
    node, lan, peer = (f"sparkctl-in{k}-{tag}" for k in ("node", "lan", "peer"))
    port = _ports("spark-b")[0]
    setup = [
        *(["ip", "netns", "add", ns] for ns in (node, lan, peer)),
        ["ip", "-n", node, "link", "add", port, "type", "veth", "peer", "name", "fab0", "netns", peer],
        ["ip", "-n", node, "link", "add", "mgmt0", "type", "veth", "peer", "name", "lan0", "netns", lan],
        ["ip", "-n", node, "addr", "add", f"{FABRIC_IP}/24", "dev", port],
        ["ip", "-n", node, "addr", "add", "192.168.77.1/24", "dev", "mgmt0"],
        ["ip", "-n", peer, "addr", "add", "10.20.1.2/24", "dev", "fab0"],
        ["ip", "-n", lan, "addr", "add", "192.168.77.2/24", "dev", "lan0"],
        *(["ip", "-n", ns, "link", "set", dev, "up"] for ns, dev in
          ((node, "lo"), (node, port), (node, "mgmt0"), (peer, "lo"), (peer, "fab0"), (lan, "lo"), (lan, "lan0"))),
        # the LAN host routes the node's fabric address through the node's management address
        ["ip", "-n", lan, "route", "add", f"{FABRIC_IP}/32", "via", "192.168.77.1"],
    ]
    try:
        for argv in setup:
            subprocess.run(argv, check=True, capture_output=True)
        yield node, lan, peer
    finally:
        for ns in (node, lan, peer):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


FABRIC_IP = "10.20.1.1"


def _answers(ns: str, addr: str) -> bool:
    """One echo request; a drop is the absence of an answer (-W bounds the wait, asserts nothing on time)."""
    return _sh(ns, f"ping -n -c 1 -W 2 {addr}").returncode == 0


def _in_drops(ns: str) -> int:
    out = _sh(ns, "iptables -w -L SPARKCTL-FABRIC-IN -v -x -n").stdout
    return sum(int(line.split()[0]) for line in out.splitlines() if " DROP " in f" {line} ")


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "pair-node"])
def test_real_packets_reach_the_fabric_address_from_fabric_ports_and_lo_only(
        scratch_node: tuple[str, str, str], relay: bool) -> None:
    node, lan, peer = scratch_node
    start, stop = fabricplan._forward_sh(INV.fabric_pool, _ports("spark-b"), relay)
    # the control first: Linux (the weak host) answers for the fabric address on the management link
    assert _answers(lan, FABRIC_IP), "the probe cannot tell: the LAN does not reach the fabric address unguarded"
    r = _sh(node, start)
    assert r.returncode == 0, r.stderr
    assert not _answers(lan, FABRIC_IP), "the LAN reached the fabric address through the management link"
    assert _in_drops(node) == 1  # dropped by the INPUT chain, not lost elsewhere
    assert _answers(peer, FABRIC_IP)  # from a fabric port
    assert _answers(node, FABRIC_IP)  # from the node itself (lo)
    assert _answers(lan, "192.168.77.1")  # the management address is not the chain's business
    assert _sh(node, start).returncode == 0 and not _answers(lan, FABRIC_IP)  # re-apply: still closed
    assert _sh(node, "iptables -S INPUT").stdout.count("-j SPARKCTL-FABRIC-IN") == 1
    forwarding = "-N SPARKCTL-FABRIC\n" in _sh(node, "iptables -S").stdout
    assert forwarding == relay
    assert _sh(node, stop).returncode == 0
    assert "SPARKCTL-FABRIC" not in _sh(node, "iptables -S").stdout
    assert _answers(lan, FABRIC_IP)  # removed: back as it was
