"""End-to-end on the SIMULATED ring: nodes that never saw sparkctl serve after `up`.

A fresh simulated node has what a DGX OS image has (/etc, /opt, /var/lib, /var/log)
and nothing of sparkctl's (issue #12): `up` must create every path it needs, and
the engine unit its log and state directories (LogsDirectory=/StateDirectory=), or
the simulated systemctl fails it with 209/STDOUT as systemd would.
"""

from __future__ import annotations

import json

import pytest

from tests.sim.helpers import RING, WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

SPARKCTL_PATHS = "/etc/sparkctl /opt/sparkctl /var/lib/sparkctl /var/log/sparkctl"


def present(sim, node: str, paths: str) -> list[str]:
    r = sim.ssh(node, f"for d in {paths}; do [ -e $d ] && echo $d; done; true")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_simulated_nodes_with_no_sparkctl_dirs_serve_after_up(sim_ring) -> None:
    for n in RING:
        assert present(sim_ring, n, SPARKCTL_PATHS) == [], n
    inv = str(sim_ring.inventory)
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(sim_ring.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    assert [(n["node"], n["alive"]) for n in st["nodes"]] == [(n, True) for n in RING]
    for n in RING:
        # the unit's LogsDirectory= made the directory; the engine's output is in its log
        assert sim_ring.ssh(n, "test -s /var/log/sparkctl/engine.log && echo ok").stdout.strip() == "ok", n
        show = sim_ring.ssh(n, "systemctl show -p ActiveState,ExecMainStatus sparkctl-engine").stdout
        assert "ActiveState=active" in show, (n, show)
    assert sim_ring.sparkctl("-i", inv, "down").returncode == 0
