"""E2E on the SIMULATED ring, from fresh nodes: fabric apply, check, up, Docker's FORWARD DROP, reboot, restore.

Nodes come up as they come out of the box (`sparkctl sim up`, no --ready): no
fabric address, forwarding off, Docker's iptables rules in place.
"""

from __future__ import annotations

import pytest

from tests.sim.helpers import RING, WAIVE

pytestmark = pytest.mark.e2e

PROFILE = "ds41f-tp4-ring"
RULE = "-j SPARKCTL-FABRIC"  # the relay's own chain, from DOCKER-USER (fabricplan.forward_rules)
SNAPSHOT = ("find /etc/netplan /etc/sysctl.d -type f 2>/dev/null | sort | xargs -r sha256sum; "
            "sysctl net.ipv4.ip_forward net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter; "
            "ls /etc/systemd/system/multi-user.target.wants 2>/dev/null")


def _snapshot(sim) -> dict[str, str]:
    out = {}
    for n in RING:
        r = sim.ssh(n, SNAPSHOT)
        assert r.returncode == 0, r.stderr
        out[n] = r.stdout
    return out


def test_fresh_ring_needs_fabric_apply_then_serves_and_restores(fresh_ring) -> None:
    sim, inv = fresh_ring, str(fresh_ring.inventory)
    before = _snapshot(sim)
    assert "ip_forward = 1" in before["spark-b"]  # dockerd turned it on ...
    fwd = sim.ssh("spark-b", "iptables -S FORWARD")
    assert "-P FORWARD DROP" in fwd.stdout and "-j DOCKER-USER" in fwd.stdout  # ... and set DROP (moby)
    assert "10.20." not in sim.ssh("spark-a", "ip -4 -br addr").stdout  # no fabric address

    r = sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, timeout=300)
    assert r.returncode != 0
    msg = r.stdout + r.stderr
    assert "phase check" in msg and "sparkctl fabric apply" in msg, msg

    dry = sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, "--dry-run", check=True)
    assert "networkctl reconfigure" in dry.stdout and "60-sparkctl-fabric.yaml" in dry.stdout
    assert _snapshot(sim) == before  # a dry run changes nothing

    sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, check=True, timeout=300)
    assert RULE in sim.ssh("spark-b", "iptables -S DOCKER-USER").stdout
    assert sim.ssh("spark-a", "systemctl is-enabled sparkctl-clock-cap.service").stdout.strip() == "enabled"

    # Docker's FORWARD DROP with sparkctl's chain unhooked: the node across cannot be reached, check says why.
    for n in RING:
        sim.ssh(n, f"iptables -D DOCKER-USER {RULE}")
    r = sim.sparkctl("-i", inv, "check", PROFILE, *WAIVE, timeout=300)
    assert r.returncode != 0
    assert "unreachable" in r.stdout and "DOCKER-USER" in r.stdout, r.stdout

    sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, check=True, timeout=300)  # idempotent: puts it back
    sim.sparkctl("-i", inv, "check", PROFILE, *WAIVE, check=True, timeout=300)
    sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=300)
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)

    # A ring reboot: netplan, forwarding, the DOCKER-USER rule and the clock cap come back at boot.
    sim.sparkctl("sim", "reboot", *RING, check=True, timeout=300)
    assert RULE in sim.ssh("spark-c", "iptables -S DOCKER-USER").stdout
    cap = sim.ssh("spark-a", "cat /var/lib/sparkctl/clock-lock; cat /proc/sys/kernel/random/boot_id")
    lock, boot = cap.stdout.split("\n")[:2]
    assert lock.split()[0] == boot.strip(), cap.stdout  # recorded by the clock unit in THIS boot
    sim.sparkctl("-i", inv, "check", PROFILE, *WAIVE, check=True, timeout=300)

    sim.sparkctl("-i", inv, "fabric", "restore", check=True, timeout=300)
    assert _snapshot(sim) == before  # netplan and sysctl state file by file, sysctl values, enabled units
    assert RULE not in sim.ssh("spark-b", "iptables -S DOCKER-USER").stdout
    r = sim.sparkctl("-i", inv, "fabric", "restore", timeout=300)
    assert r.returncode != 0 and "nothing to restore" in r.stdout + r.stderr
