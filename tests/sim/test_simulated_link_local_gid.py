"""End-to-end on the SIMULATED ring: a port with an extra IPv4 link-local GID still gets the fabric GID.

Every twin of every node is given a 169.254.x.y RoCE GID pair ahead of its fabric
address (as netplan's ``link-local: [ipv4]`` can leave it: issue #12), so the
first RoCE v2 IPv4 GID is index 3 and the fabric one index 5. The rendered
launch script must export NCCL_IB_GID_INDEX=5, and the simulated engine (which
fails on a link-local or empty GID, as NCCL's QPs do) logs the GID each device
uses: it must be the node's fabric address on that device.
"""

from __future__ import annotations

import re

import pytest

from tests.sim.helpers import RING, WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

TWINS = ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")
GID_LINE = re.compile(r"NET/IB: (\S+):1 GID index (\d+) type RoCE v2 GID \S+ IPv4 (\S+)")


def test_extra_link_local_gid_does_not_win_over_the_fabric_gid(sim_ring) -> None:
    from sparkctl.model.inventory import load_inventory

    for k, node in enumerate(RING):
        sets = [f"links.{nd}.link_local_ipv4=169.254.{10 + k}.{1 + j}" for j, nd in enumerate(TWINS)]
        sim_ring.sparkctl("sim", "set", node, *sets, check=True)
    gids = sim_ring.ssh("spark-a", "show_gids rocep1s0f0").stdout
    rows = {r.split("\t")[2]: r.split("\t")[4].strip() for r in gids.splitlines()[2:-1]}
    assert rows["3"] == "169.254.10.1" and rows["5"].startswith("10."), gids  # the trap is armed

    inv = str(sim_ring.inventory)
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    fabric = {(e.node, e.rdma): e.address for lk in load_inventory(sim_ring.inventory).links for e in (lk.a, lk.b)}
    for node in RING:
        log = sim_ring.ssh(node, "cat /var/log/sparkctl/engine.log").stdout
        assert "sparkctl: NCCL_IB_GID_INDEX=5 for" in log, (node, log[-2000:])
        assert "NCCL_IB_GID_INDEX set by environment to 5." in log, node
        used = GID_LINE.findall(log)
        mine = {dev: addr for (n, dev), addr in fabric.items() if n == node}
        assert used and {dev: ip for dev, _i, ip in used} == mine, (node, used, mine)
        assert "169.254." not in "".join(ip for _d, _i, ip in used)
    assert sim_ring.sparkctl("-i", inv, "down").returncode == 0
