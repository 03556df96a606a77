"""E2E on the SIMULATED pair, nodes as NVIDIA's "Connect two Sparks" playbook leaves them.

Each option of the playbook (sparkctl_sim.playbook, cited there) leaves
/etc/netplan/40-cx7.yaml on the CX-7 ports; netplan merges it with sparkctl's
file (two addresses, two GIDs on a port). `fabric apply` takes it into the fabric
backup, `check` is green, `up` serves, `fabric restore` gives the file back byte
for byte. The static option runs on nodes whose management link is under
NetworkManager (a desktop install): there `netplan apply` bounces the management
link and kills the SSH sessions over it (sparkctl_sim.netplansim, after netplan's
apply.py), and `fabric apply` must complete in the session that runs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.sim.helpers import WAIVE, Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tensorfold-tp2"
NODES = ("spark-a", "spark-b")
FILES = "cd /etc/netplan && for f in *.yaml; do stat -c '%n %a' \"$f\"; sha256sum \"$f\"; done"
PLAYBOOK = "/etc/netplan/40-cx7.yaml"


@pytest.fixture  # one cluster at a time: each is down before the next comes up
def pair_link_local(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("pbll"), 2, ready=False, up_args=("--playbook", "link-local"))


@pytest.fixture  # one cluster at a time: each is down before the next comes up
def pair_static_nm(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("pbnm"), 2, ready=False,
                         up_args=("--playbook", "static", "--network-manager"))


def _files(sim: Sim) -> dict[str, str]:
    out = {}
    for n in NODES:
        r = sim.ssh(n, FILES)
        assert r.returncode == 0, r.stderr
        out[n] = r.stdout
    return out


def _apply_check_up_restore(sim: Sim, extra: str) -> None:
    inv = str(sim.inventory)
    before = _files(sim)
    assert all("40-cx7.yaml 600" in t for t in before.values()), before
    assert extra in sim.ssh("spark-a", "ip -4 -br addr").stdout  # the playbook's address is on the port

    dry = json.loads(sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, "--dry-run", "--json", check=True).stdout)
    aside = next(s for s in dry["steps"] if s["id"] == "netplan-aside")  # the file's fate, in the printed plan
    assert aside["nodes"] == list(NODES) and all(f"{n}: {PLAYBOOK}" in aside["summary"] for n in NODES), aside
    assert all(f"moved aside: {PLAYBOOK}" in aside["commands"][n] for n in NODES)
    assert _files(sim) == before  # a dry run changes nothing

    sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, check=True, timeout=300)
    for n in NODES:
        assert sim.ssh(n, f"test -e {PLAYBOOK}").returncode == 1  # taken aside
        assert extra not in sim.ssh(n, "ip -4 -br addr").stdout
    sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, check=True, timeout=300)  # again: nothing left to move
    sim.sparkctl("-i", inv, "check", PROFILE, *WAIVE, check=True, timeout=300)
    sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=400)
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)

    sim.sparkctl("-i", inv, "fabric", "restore", check=True, timeout=300)
    assert _files(sim) == before  # the playbook's file, byte for byte, mode 0600


def test_simulated_playbook_link_local_pair_apply_check_up_restore(pair_link_local: Sim) -> None:
    _apply_check_up_restore(pair_link_local, "169.254.")


def test_simulated_playbook_static_on_network_manager_pair(pair_static_nm: Sim) -> None:
    sim = pair_static_nm
    # the witness is strict: `netplan apply` over SSH on this node cuts the session running it
    r = sim.ssh("spark-b", "netplan apply; echo survived", timeout=60)
    assert "survived" not in r.stdout and r.returncode == 255, (r.returncode, r.stdout, r.stderr)
    assert sim.ssh("spark-b", "echo back").stdout.strip() == "back"  # ... and the node comes back

    _apply_check_up_restore(sim, "192.168.100.")
    # the session that ran fabric apply survived: the printed verdict came from it
    inv = str(sim.inventory)
    r = sim.sparkctl("-i", inv, "fabric", "apply", PROFILE, check=True, timeout=300)
    assert "fabric applied on spark-a, spark-b" in r.stdout
    sim.sparkctl("-i", inv, "fabric", "restore", check=True, timeout=300)
