"""End-to-end on the SIMULATED 4-node ring: sim up/down through the CLI, real
ssh to each node, and `sparkctl check` catching each fault with the right law.

Simulated: the GB10 tools and their state. Real: OpenSSH, namespaces, veth
cables with the Spark's interface names, routes and forwarding, the transport,
the probe scripts and the laws.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


def verdicts(sim, *args: str) -> tuple[int, list[dict]]:
    r = sim.sparkctl("-i", str(sim.inventory), "check", "ds41f-tp4-ring", "--json", *args)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)["verdicts"]


def failing(vs: list[dict]) -> set[tuple[str, str]]:
    return {(v["law"], v["node"]) for v in vs if v["status"] == "fail"}


def test_simulated_nodes_answer_ssh_with_their_own_hostname_and_cx7_addresses(sim_ring) -> None:
    inv = load_inventory(sim_ring.inventory)
    for node in inv.names:
        r = sim_ring.ssh(node, "hostname; ip -br -4 addr; ibdev2netdev")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == node
        for ep in inv.endpoints(node):
            assert any(line.split()[0].split("@")[0] == ep.netdev and f"{ep.address}/24" in line for line in lines), (node, ep)
        assert f"{inv.endpoints(node)[0].rdma} port 1 ==> {inv.endpoints(node)[0].netdev} (Up)" in r.stdout


def test_simulated_ring_reaches_the_node_across_only_through_the_relay(sim_ring) -> None:
    inv = load_inventory(sim_ring.inventory)
    c_addr = inv.primary_address("spark-c")
    r = sim_ring.ssh("spark-a", f"ip route get {c_addr}; ping -c1 -W2 {c_addr}")
    assert r.returncode == 0 and " via " in r.stdout, r.stdout + r.stderr
    for relay in ("spark-b", "spark-d"):
        assert sim_ring.ssh(relay, "sysctl -w net.ipv4.ip_forward=0").returncode == 0
    try:
        assert sim_ring.ssh("spark-a", f"ping -c1 -W1 {c_addr}").returncode != 0
        code, vs = verdicts(sim_ring, *WAIVE, "--bandwidth", "0")
        assert ("fabric", "spark-a") in failing(vs) and code == 4
        assert any("ip_forward" in v["fix"] for v in vs if v["law"] == "fabric" and v["status"] == "fail")
    finally:
        for relay in ("spark-b", "spark-d"):
            sim_ring.ssh(relay, "sysctl -w net.ipv4.ip_forward=1")


def test_check_on_a_healthy_simulated_ring_fails_only_page_size_then_passes_waived_and_fixed(sim_ring) -> None:
    code, vs = verdicts(sim_ring)
    assert code == 4
    assert {law for law, _ in failing(vs)} == {"page_size", "clock_cap"}  # 4 KiB nodes; no lock applied yet
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert code == 0, failing(vs)
    assert {v["status"] for v in vs if v["law"] == "page_size"} == {"waived"}


FAULTS = [
    ("kernel 1031", ["sim", "set", "spark-b", "kernel_release=6.17.0-1031-nvidia"], "kernel_pin", "spark-b", "known bad",
     ["sim", "set", "spark-b", "kernel_release=6.17.0-1029-nvidia"]),
    ("meta-packages not held", ["sim", "set", "spark-c", "held_packages=[]"], "kernel_pin", "spark-c", "apt-mark hold",
     ["sim", "set", "spark-c", "held_packages=[linux-nvidia-hwe-24.04, linux-image-nvidia-hwe-24.04]"]),
    ("clock lock lost after a reboot", ["sim", "reboot", "spark-d"], "clock_cap", "spark-d", "does not survive a reboot",
     None),
    ("memory held after an engine died", ["sim", "set", "spark-a", "leaked_mem_gib=80"], "memory_guard", "spark-a",
     "reboot spark-a", ["sim", "reboot", "spark-a"]),
    ("fabric link down", ["sim", "fault", "spark-b", "link-down", "--iface", "enP2p1s0f0np0"], "fabric", "spark-b",
     "spark-b:enP2p1s0f0np0 <-> spark-c:enP2p1s0f1np1", ["sim", "fault", "spark-b", "link-up", "--iface", "enP2p1s0f0np0"]),
    ("MTU 1500 on one end", ["sim", "fault", "spark-c", "mtu", "--iface", "enp1s0f0np0", "--mtu", "1500"], "fabric",
     "spark-c", "MTU 9000", ["sim", "fault", "spark-c", "mtu", "--iface", "enp1s0f0np0", "--mtu", "9000"]),
]


@pytest.mark.parametrize("name,inject,law,node,words,heal", FAULTS, ids=[f[0] for f in FAULTS])
def test_simulated_fault_is_caught_by_the_right_law(sim_ring, name, inject, law, node, words, heal) -> None:
    sim_ring.sparkctl(*inject, check=True)
    try:
        code, vs = verdicts(sim_ring, *WAIVE, "--bandwidth", "0")
        assert code == 4
        mine = [v for v in vs if v["law"] == law and v["node"] == node and v["status"] == "fail"]
        assert mine, (name, failing(vs))
        assert any(words in v["fix"] + v["observed"] + v["subject"] for v in mine), mine
        assert node in " ".join(v["fix"] for v in mine)
    finally:
        if heal:
            sim_ring.sparkctl(*heal, check=True)
        sim_ring.sparkctl("-i", str(sim_ring.inventory), "check", "ds41f-tp4-ring", *WAIVE, "--fix", "--bandwidth", "0")


def test_stale_link_needs_a_power_cycle_of_both_ends_not_a_warm_reboot(sim_ring) -> None:
    sim_ring.sparkctl("sim", "fault", "spark-b", "stale-link", "--iface", "enp1s0f0np0", check=True)
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert {("ac_cycle", "spark-b"), ("ac_cycle", "spark-c")} <= failing(vs)
    sim_ring.sparkctl("sim", "reboot", "spark-b", "spark-c", check=True)
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    stale = [v for v in vs if v["law"] == "ac_cycle" and v["status"] == "fail"]
    assert stale and all("warm reboot did not clear it" in v["observed"] for v in stale)
    sim_ring.sparkctl("sim", "power-cycle", "spark-b", check=True)  # one end only: still stale
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert ("ac_cycle", "spark-b") in failing(vs)
    sim_ring.sparkctl("sim", "power-cycle", "spark-c", check=True)
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert code == 0, failing(vs)


def test_pending_hw_change_fails_until_every_node_has_booted(sim_ring) -> None:
    r = sim_ring.sparkctl("-i", str(sim_ring.inventory), "hw-change", "--note", "moved the B-C cable",
                          "--node", "spark-b", "--node", "spark-c", check=True)
    assert "unplug them from AC" in r.stdout
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert failing(vs) == {("ac_cycle", "spark-b"), ("ac_cycle", "spark-c")}
    assert all("unplug them from AC for at least 60 seconds" in v["fix"] for v in vs if v["status"] == "fail")
    sim_ring.sparkctl("sim", "power-cycle", "spark-b", "spark-c", check=True)
    code, vs = verdicts(sim_ring, *WAIVE, "--fix")
    assert code == 0, failing(vs)


def test_unknown_host_key_is_refused_with_its_fingerprint(sim_ring, tmp_path) -> None:
    text = sim_ring.inventory.read_text().replace(str(sim_ring.root / "known_hosts"), str(tmp_path / "empty_known"))
    inv = tmp_path / "inv.yaml"
    inv.write_text(text)
    r = sim_ring.sparkctl("-i", str(inv), "check", "ds41f-tp4-ring", "--json", *WAIVE)
    assert r.returncode == 4
    fp = subprocess.run(["ssh-keygen", "-lf", str(sim_ring.root / "nodes/spark-a/ssh_host_ed25519_key.pub"),
                         "-E", "sha256"], capture_output=True, text=True).stdout.split()[1]
    reach = [v for v in json.loads(r.stdout)["verdicts"] if v["law"] == "reach" and v["node"] == "spark-a"]
    assert reach and fp in reach[0]["observed"] and "sparkctl trust spark-a" in reach[0]["observed"] + reach[0]["fix"]
    r = sim_ring.sparkctl("-i", str(inv), "trust", "spark-a", "--fingerprint", fp)
    assert r.returncode == 0 and fp in r.stdout
    assert (tmp_path / "empty_known").read_text().count("ssh-ed25519") == 1


def test_unreachable_node_is_reported_within_the_connect_timeout_others_still_judged(sim_ring) -> None:
    import time

    sim_ring.sparkctl("sim", "fault", "spark-d", "unreachable", check=True)
    try:
        t0 = time.monotonic()
        r = sim_ring.sparkctl("-i", str(sim_ring.inventory), "check", "ds41f-tp4-ring", "--json", *WAIVE,
                              "--connect-timeout", "2", "--bandwidth", "0")
        elapsed = time.monotonic() - t0
        vs = json.loads(r.stdout)["verdicts"]
        assert r.returncode == 4 and ("reach", "spark-d") in failing(vs)
        assert {v["node"] for v in vs if v["law"] == "kernel_pin"} == {"spark-a", "spark-b", "spark-c"}
        assert elapsed < 20, elapsed  # generous: the point is no hang on the dead node
    finally:
        sim_ring.sparkctl("sim", "fault", "spark-d", "reachable", check=True)
