"""E2E on the SIMULATED ring: after a reboot the relays forward fabric to fabric only, and
no node's own fabric address answers the management LAN.

After a reboot systemd-sysctl has turned forwarding on before dockerd starts, so dockerd
leaves the FORWARD policy at ACCEPT (moby setup_ip_forwarding.go; the simulated boot in
sparkctl_sim.clusterinit does the same with the real iptables in each node's netns). A
host on the management LAN (here: this machine's own namespace, on the sim's bridge)
that routes a fabric address through a relay's management address must still not reach
it, and the ring must still serve; a Docker restart must not change that. Nor may it
reach the head's engine, bound to the head's own fabric address (serve.bind: fabric), by
routing that address through the head's management address: Linux delivers a packet
for any local address on any interface (the weak host model, ip-sysctl.rst), so only
the unit's INPUT chain stands in the way.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import RING, WAIVE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "fabric-bound"  # ds41f-tp4-ring, the head's endpoint on its own fabric address
HEAD = "spark-a"
ENGINE_PORT = 8000
RELAY, TARGET = "spark-b", "spark-c"
CONNECT_S = 3.0  # a bound on the negative answer only: a dropped SYN never answers


@contextmanager
def _lan_route(dst: str, via: str) -> Iterator[None]:
    """This machine (on the management bridge) routes ``dst`` through ``via``."""
    subprocess.run(["ip", "route", "replace", f"{dst}/32", "via", via], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "route", "del", f"{dst}/32"], check=False)


def _reaches(addr: str, port: int) -> bool:
    """A TCP answer of any kind (accepted or refused) means the packet got there and back."""
    try:
        with socket.create_connection((addr, port), timeout=CONNECT_S):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _dropped(sim, node: str = RELAY, chain: str = "SPARKCTL-FABRIC") -> int:
    """Packets a node's fabric chain dropped so far."""
    out = sim.ssh(node, f"iptables -w -L {chain} -v -x -n").stdout
    return sum(int(line.split()[0]) for line in out.splitlines() if " DROP " in f" {line} ")


def _root(tmp: Path) -> Path:
    (tmp / "profiles").mkdir(parents=True, exist_ok=True)
    (tmp / "profiles" / f"{PROFILE}.yaml").write_text(
        "description: ds41f on the ring, its endpoint on the head's fabric address\n"
        "extends: ds41f-tp4-ring\nserve:\n  bind: fabric\n")
    return tmp


def _serves(sim, addr: str) -> bool:
    r = sim.ssh(HEAD, f"curl -s -m 3 http://{addr}:{ENGINE_PORT}/v1/models")
    return r.returncode == 0 and "deepseek-v4.1-flash" in r.stdout


def test_simulated_ring_reboot_relays_forward_fabric_to_fabric_only(fresh_ring, tmp_path) -> None:
    sim = fresh_ring
    base = ("--root", str(_root(tmp_path / "root")), "-i", str(fresh_ring.inventory))
    inv = load_inventory(fresh_ring.inventory)
    link = inv.link_between(RELAY, TARGET)
    assert link is not None
    target, port, relay_mgmt = link.end(TARGET).address, inv.node(TARGET).ssh_port, inv.node(RELAY).host

    sim.sparkctl(*base, "fabric", "apply", PROFILE, check=True, timeout=900)
    sim.sparkctl(*base, "up", PROFILE, "--persist", *WAIVE, check=True, timeout=300)
    st = json.loads(sim.sparkctl(*base, "status", "--json", check=True, timeout=120).stdout)
    head_fabric, head_mgmt = st["record"]["listen"][HEAD], inv.node(HEAD).host
    assert head_fabric != head_mgmt and head_fabric.startswith("10.20."), st["record"]["listen"]
    sim.sparkctl("sim", "reboot", *RING, check=True, timeout=300)

    # as on a real relay after a reboot: forwarding was on before dockerd, the policy stayed ACCEPT
    fwd = sim.ssh(RELAY, "sysctl -n net.ipv4.ip_forward; iptables -w -S FORWARD").stdout.splitlines()
    assert fwd[0] == "1" and "-P FORWARD ACCEPT" in fwd, fwd
    assert fwd.index("-A FORWARD -j DOCKER-USER") == 2, fwd  # dockerd's jump first (after the policy lines)
    assert "-A DOCKER-USER -j SPARKCTL-FABRIC" in sim.ssh(RELAY, "iptables -w -S DOCKER-USER").stdout
    assert wait_until(lambda: _serves(sim, head_fabric), 240.0, 1.0), "the persisted ring did not serve after the reboot"

    # the head's own fabric address, routed through the head's management address: local delivery (INPUT)
    unit_in = "iptables -w -S INPUT"
    assert "-A INPUT -j SPARKCTL-FABRIC-IN" in sim.ssh(HEAD, unit_in).stdout  # installed again at boot
    with _lan_route(head_fabric, head_mgmt):
        before = _dropped(sim, HEAD, "SPARKCTL-FABRIC-IN")
        assert not _reaches(head_fabric, ENGINE_PORT), f"the LAN reached the engine on {head_fabric} via {HEAD}"
        assert _dropped(sim, HEAD, "SPARKCTL-FABRIC-IN") > before  # dropped by the head's INPUT chain

        # the control: without the unit's rules the weak host answers on the fabric address (the hole)
        sim.ssh(HEAD, "systemctl stop sparkctl-fabric-forward.service", timeout=60)
        assert _reaches(head_fabric, ENGINE_PORT), "the probe cannot tell: the engine is not reachable unguarded"
        sim.ssh(HEAD, "systemctl start sparkctl-fabric-forward.service", timeout=60)
        assert not _reaches(head_fabric, ENGINE_PORT)
        for n in RING:  # a Docker restart leaves INPUT chains it did not create alone
            r = sim.ssh(n, "python3 -m sparkctl_sim.clusterinit dockerd", timeout=60)
            assert r.returncode == 0, r.stderr
        assert not _reaches(head_fabric, ENGINE_PORT)

    with _lan_route(target, relay_mgmt):
        before = _dropped(sim)
        assert not _reaches(target, port), f"the LAN reached {target} through {RELAY}"
        assert _dropped(sim) > before  # dropped by the relay's rules, not lost elsewhere

        # the control: without the unit's rules the same route does reach the fabric (the hole)
        sim.ssh(RELAY, "systemctl stop sparkctl-fabric-forward.service", timeout=60)
        assert _reaches(target, port), "the probe cannot tell: the LAN does not reach the fabric even unguarded"
        sim.ssh(RELAY, "systemctl start sparkctl-fabric-forward.service", timeout=60)
        assert not _reaches(target, port)

        # a Docker restart: dockerd re-inserts its jumps at the top of FORWARD and keeps DOCKER-USER
        for n in RING:
            r = sim.ssh(n, "python3 -m sparkctl_sim.clusterinit dockerd", timeout=60)
            assert r.returncode == 0, r.stderr
        assert not _reaches(target, port)
    # the fabric still relays for the non-neighbours: check's relay probes and the serving ring
    sim.sparkctl(*base, "check", PROFILE, *WAIVE, check=True, timeout=300)
    assert _serves(sim, head_fabric)

    sim.sparkctl(*base, "down", check=True, timeout=300)
    sim.sparkctl(*base, "fabric", "restore", check=True, timeout=300)
    for n in RING:
        rules = sim.ssh(n, "iptables -w -S").stdout
        assert "SPARKCTL-FABRIC" not in rules and "-s 10.20.0.0/16" not in rules, (n, rules)
