"""E2E on the SIMULATED ring: after a reboot the relays forward fabric to fabric only.

After a reboot systemd-sysctl has turned forwarding on before dockerd starts, so dockerd
leaves the FORWARD policy at ACCEPT (moby setup_ip_forwarding.go; the simulated boot in
sparkctl_sim.clusterinit does the same with the real iptables in each node's netns). A
host on the management LAN (here: this machine's own namespace, on the sim's bridge)
that routes a fabric address through a relay's management address must still not reach
it, and the ring must still serve; a Docker restart must not change that.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "ds41f-tp4-ring"
WAIVE = ("--waive", "page_size", "--reason", "stock 4 KiB kernel")
NODES = ("spark-a", "spark-b", "spark-c", "spark-d")
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


def _dropped(sim) -> int:
    """Packets the relay's fabric chain dropped so far."""
    out = sim.ssh(RELAY, "iptables -w -L SPARKCTL-FABRIC -v -x -n").stdout
    return sum(int(line.split()[0]) for line in out.splitlines() if " DROP " in f" {line} ")


def _serves(sim) -> bool:
    r = sim.ssh("spark-a", "curl -s -m 3 http://127.0.0.1:8000/v1/models")
    return r.returncode == 0 and "deepseek-v4.1-flash" in r.stdout


def test_simulated_ring_reboot_relays_forward_fabric_to_fabric_only(fresh_ring) -> None:
    sim, inv_path = fresh_ring, str(fresh_ring.inventory)
    inv = load_inventory(fresh_ring.inventory)
    link = inv.link_between(RELAY, TARGET)
    assert link is not None
    target, port, relay_mgmt = link.end(TARGET).address, inv.node(TARGET).ssh_port, inv.node(RELAY).host

    sim.sparkctl("-i", inv_path, "fabric", "apply", PROFILE, check=True, timeout=900)
    sim.sparkctl("-i", inv_path, "up", PROFILE, "--persist", *WAIVE, check=True, timeout=300)
    sim.sparkctl("sim", "reboot", *NODES, check=True, timeout=300)

    # as on a real relay after a reboot: forwarding was on before dockerd, the policy stayed ACCEPT
    fwd = sim.ssh(RELAY, "sysctl -n net.ipv4.ip_forward; iptables -w -S FORWARD").stdout.splitlines()
    assert fwd[0] == "1" and "-P FORWARD ACCEPT" in fwd, fwd
    assert fwd.index("-A FORWARD -j DOCKER-USER") == 2, fwd  # dockerd's jump first (after the policy lines)
    assert "-A DOCKER-USER -j SPARKCTL-FABRIC" in sim.ssh(RELAY, "iptables -w -S DOCKER-USER").stdout
    assert wait_until(lambda: _serves(sim), 240.0, 1.0), "the persisted ring did not serve after the reboot"

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
        for n in NODES:
            r = sim.ssh(n, "python3 -m sparkctl_sim.clusterinit dockerd", timeout=60)
            assert r.returncode == 0, r.stderr
        assert not _reaches(target, port)
    # the fabric still relays for the non-neighbours: check's relay probes and the serving ring
    sim.sparkctl("-i", inv_path, "check", PROFILE, *WAIVE, check=True, timeout=300)
    assert _serves(sim)

    sim.sparkctl("-i", inv_path, "down", check=True, timeout=300)
    sim.sparkctl("-i", inv_path, "fabric", "restore", check=True, timeout=300)
    for n in NODES:
        rules = sim.ssh(n, "iptables -w -S").stdout
        assert "SPARKCTL-FABRIC" not in rules and "-s 10.20.0.0/16" not in rules, (n, rules)
