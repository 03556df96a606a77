"""End-to-end on a SIMULATED switched cluster of fresh boxes: `fabric apply` prepares them, `check`
is green (the switch_subnet law pings the peers of each port group at the fabric MTU), `up` serves,
`fabric restore` gives the nodes back as they came.

Fresh: `sparkctl sim up --topology switch` without `--ready`: the twins cabled to the switch are
up at the kernel's default MTU with no address, nothing of sparkctl on the node (issue 22: switched
clusters were only tested pre-configured). Simulated: the switch (one Linux bridge per port group,
sparkctl_sim.switch), the TensorFold engine and the GB10 tools. Real: OpenSSH, the netplan files
sparkctl writes (applied by the simulated netplan), the don't-fragment pings across the bridges, HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.sim.helpers import WAIVE, Sim, make_sim, served, status

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tensorfold-tp2"
SETS = ("--set", "topology.layout=switch")  # the pair profile's engine and model, one TP2 replica behind a switch
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:zig-2026.10"  # profiles/tensorfold-tp2.yaml engine.image
NODES = ("spark-a", "spark-b")
TWINS = ("enp1s0f0np0", "enP2p1s0f0np0")  # the cage each node cables to the switch: its two twins
FILES = "cd /etc/netplan 2>/dev/null && for f in *.yaml; do [ -e \"$f\" ] && sha256sum \"$f\"; done; true"


@pytest.fixture(scope="module")
def fresh_switch(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    for sim in make_sim(tmp_path_factory.mktemp("freshswitch"), 2, ready=False, load_images=False,
                        up_args=("--topology", "switch")):
        # SIMULATION: the one image the profile runs, as if its operator had built it on each node
        r = sim.sparkctl("sim", "image", "load", "all", IMAGE, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        yield sim


def _addrs(sim: Sim, node: str) -> dict[str, list[str]]:
    """ifname -> its IPv4 addresses (``ip -br`` names a veth ``enp1s0f0np0@if4``)."""
    out = {}
    for ln in sim.ssh(node, "ip -4 -br addr show").stdout.splitlines():
        f = ln.split()
        out[f[0].split("@")[0]] = f[2:]
    return out


def test_simulated_fresh_switched_nodes_fabric_apply_check_up_restore(fresh_switch: Sim) -> None:
    sim, inv = fresh_switch, str(fresh_switch.inventory)
    before = {n: sim.ssh(n, FILES).stdout for n in NODES}
    for n in NODES:  # as the box comes: the switch ports up, no address on them
        out = _addrs(sim, n)
        assert not [t for t in TWINS if out.get(t)], out
    # before fabric apply the laws name what is missing, and nothing starts
    r = sim.sparkctl("-i", inv, "check", PROFILE, *SETS, "--json", "--bandwidth", "0", *WAIVE, timeout=300)
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]

    r = sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, *SETS, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for n in NODES:  # one address per twin, each on its port group's subnet
        out = _addrs(sim, n)
        assert all(len(out.get(t, [])) == 1 for t in TWINS), out
        assert out[TWINS[0]][0].startswith("10.40.0.") and out[TWINS[1]][0].startswith("10.40.1."), out

    # the clock cap is not locked on a fresh boot: --fix locks it (clock_cap's safe remedy)
    sim.sparkctl("-i", inv, "check", PROFILE, *SETS, "--fix", "--bandwidth", "0", *WAIVE, timeout=300)
    r = sim.sparkctl("-i", inv, "check", PROFILE, *SETS, "--json", "--bandwidth", "0", *WAIVE, timeout=300)
    vs = json.loads(r.stdout)["verdicts"]
    assert r.returncode == 0, [v for v in vs if v["status"] == "fail"]
    sw = [v for v in vs if v["law"] == "switch_subnet"]
    assert len(sw) == 4 and {v["status"] for v in sw} == {"ok"}, sw  # 2 nodes x 2 twins, one peer each

    r = sim.sparkctl("-i", inv, "up", PROFILE, *SETS, *WAIVE, "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert status(sim)["record"]["state"] == "serving"
    assert served(sim) == ["dsv41-flash"]
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)

    sim.sparkctl("-i", inv, "fabric", "restore", check=True, timeout=300)
    assert {n: sim.ssh(n, FILES).stdout for n in NODES} == before  # the nodes' netplan as they came
