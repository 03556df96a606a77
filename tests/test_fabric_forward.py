"""The ring relay's forwarding rules (plan/fabricplan.py), judged by the real iptables.

The unit's start and stop shell run in a scratch network namespace with the real
iptables (root only); a packet's fate is read with the real kernel in the e2e test
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


def test_the_unit_is_on_relays_only_before_network_and_docker() -> None:
    ff = fabricplan.render_fabric(INV, Roots.make(env={}))
    for n in INV.nodes:
        unit = [f for f in ff.files[n.name] if f.path.endswith("sparkctl-fabric-forward.service")]
        assert bool(unit) == bool(INV.routes_for(n.name))
        if not unit:
            continue
        assert "Before=network-pre.target docker.service shutdown.target" in unit[0].text
        assert "DefaultDependencies=no" in unit[0].text


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
    assert first.count("-j SPARKCTL-FABRIC") == 1 and first.count("-A FORWARD -j DOCKER-USER") == 1
    chain = [ln for ln in first.splitlines() if ln.startswith("-A SPARKCTL-FABRIC")]
    assert len(chain) == len(fabricplan.forward_rules(INV.fabric_pool, _ports("spark-b")))
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
