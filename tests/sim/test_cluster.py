"""End-to-end tests of the simulated cluster: real namespaces, veths, sshd and ssh.

The 4-node ring is built by hand here (not from an inventory) so these tests
pin the namespace machinery alone. Every cluster is torn down by a finalizer,
also when a test fails.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl_sim import cluster, nodestate
from sparkctl_sim import netns as nx
from sparkctl_sim.cluster import SimError
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode, SimRoute
from tests.sim.helpers import free_port

HAVE_TOOLS = all(shutil.which(t) for t in ("ssh", "ssh-keygen", "ip", "unshare", "setsid", "ping")) and Path(
    "/usr/sbin/sshd").exists()
IS_ROOT = os.geteuid() == 0

needs_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="needs openssh-server, iproute2, iputils-ping")

NAMES = ("spark-a", "spark-b", "spark-c", "spark-d")
P0 = ("enp1s0f0np0", "enP2p1s0f0np0")  # twin 0, twin 1 of port 0
P1 = ("enp1s0f1np1", "enP2p1s0f1np1")


def _addr(cable: int, twin: int, node: int) -> str:
    return f"10.20.{2 * cable + twin}.{node + 1}"


def ring_spec() -> ClusterSpec:
    """A.p0-B.p1, B.p0-C.p1, C.p0-D.p1, D.p0-A.p1; both twins; relays for non-neighbours."""
    nodes = tuple(SimNode(name, f"10.201.0.{11 + i}", 22, ip_forward=True) for i, name in enumerate(NAMES))
    links, routes = [], []
    for k in range(4):
        nxt = (k + 1) % 4
        for t in range(2):
            links.append(SimLink(NAMES[k], P0[t], f"{_addr(k, t, k)}/24",
                                 NAMES[nxt], P1[t], f"{_addr(k, t, nxt)}/24", mtu=9000))
    for x in range(4):
        nxt, prev = (x + 1) % 4, (x - 1) % 4
        for t in range(2):
            # the cable beyond the next neighbour: via the next neighbour, out of p0
            routes.append(SimRoute(NAMES[x], f"10.20.{2 * nxt + t}.0/24", _addr(x, t, nxt), P0[t]))
            # the cable beyond the previous neighbour: via the previous one, out of p1
            routes.append(SimRoute(NAMES[x], f"10.20.{2 * ((x + 2) % 4) + t}.0/24", _addr(prev, t, prev), P1[t]))
    return ClusterSpec(nodes=nodes, links=tuple(links), routes=tuple(routes))


def ssh(root: Path, node: str, command: str, *, check: bool = True, timeout: float = 20) -> str:
    argv = cluster.ssh_argv(root, node)
    # the test insists on the sim's own trust: real ssh, the sim key, strict host keys
    assert "StrictHostKeyChecking=yes" in argv and f"UserKnownHostsFile={root}/known_hosts" in argv
    cp = subprocess.run(argv + [command], capture_output=True, text=True, timeout=timeout)
    if check:
        assert cp.returncode == 0, f"{node}: {command!r} -> {cp.returncode}: {cp.stderr}"
    return cp.stdout


def processes_mentioning(path: Path) -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmd:
                found.append(f"{p.name}: {cmd}")
    return found


def assert_no_traces(root: Path, namespaces: list[str]) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in namespaces:
        assert ns not in listed
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    for ns in namespaces:
        assert cluster.host_veth_name(ns.removeprefix("sparkctl-")) not in links
    assert processes_mentioning(root) == []
    assert not root.exists()


@pytest.fixture(scope="module")
def host_sim_lock() -> Iterator[None]:
    """Serialise this module's root-mode sims across concurrent pytest runs.

    Namespace names (sparkctl-<node>), the bridges and 10.201.0.0/24 are
    host-wide, so two runs of these tests at once would collide. Taken once per
    module (flock is per open file: a second open in this process would block).
    """
    if not (IS_ROOT and HAVE_TOOLS):
        pytest.skip("needs root and openssh-server/iproute2/iputils-ping")
    cluster.LEDGER_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(cluster.LEDGER_DIR / "e2e-tests.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory, host_sim_lock: None) -> Iterator[tuple[Path, ClusterSpec]]:
    root = tmp_path_factory.mktemp("ring") / "sim"
    spec = ring_spec()
    try:
        cluster.up(spec, root)
        yield root, spec
    finally:
        cluster.down(root)


# --- the ring -----------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.needs_root
def test_each_node_has_its_hostname_addresses_and_mtu(ring: tuple[Path, ClusterSpec]) -> None:
    root, spec = ring
    for i, name in enumerate(NAMES):
        out = ssh(root, name, "hostname; ip -br addr; for i in /sys/class/net/en*; do "
                              "echo mtu ${i##*/} $(cat $i/mtu); done")
        lines = out.splitlines()
        assert lines[0] == name
        addrs = {ln.split()[0].split("@")[0]: ln.split()[2:] for ln in lines[1:] if not ln.startswith("mtu")}
        mtus = {ln.split()[1]: int(ln.split()[2]) for ln in lines if ln.startswith("mtu")}
        prev = (i - 1) % 4
        for t in range(2):
            assert f"{_addr(i, t, i)}/24" in addrs[P0[t]]  # p0 sits on cable i
            assert f"{_addr(prev, t, i)}/24" in addrs[P1[t]]  # p1 sits on cable i-1
            assert mtus[P0[t]] == 9000 and mtus[P1[t]] == 9000
        assert f"10.201.0.{11 + i}/24" in addrs["enP7s7"]


@pytest.mark.e2e
@pytest.mark.needs_root
def test_sessions_get_shims_first_on_path_and_sim_env(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    out = ssh(root, "spark-b", 'echo "$PATH"; echo "$SPARKCTL_SIM_STATE"; echo "$SPARKCTL_SIM_RUN_DIR"; '
                               'echo "$SPARKCTL_SIM_UNIT_DIR"; echo "$PYTHONPATH"; echo "$SPARKCTL_SIM_NODE"')
    path, state, run_dir, unit_dir, pypath, node = out.splitlines()
    assert path.split(":")[0] == str(root / "bin")  # SetEnv overrides sshd's default PATH
    assert state == str(root / "nodes/spark-b/state.json")
    assert run_dir == str(root / "nodes/spark-b/run")
    assert (unit_dir, pypath, node) == ("/etc/systemd/system", str(root / "pkgs"), "spark-b")
    if (root / "bin/nvidia-smi").exists():  # once the shims helper's installer is present
        assert ssh(root, "spark-b", "command -v nvidia-smi").strip() == str(root / "bin/nvidia-smi")
    _scp_roundtrip(root, "spark-b", "/var/lib/copied")  # sftp works (fabric's put/get)
    assert (root / "nodes/spark-b/fs/var/lib/copied").read_text() == "payload\n"  # the node's own disk


def _scp_roundtrip(root: Path, node: str, remote: str) -> None:
    src = root.parent / "payload.txt"
    src.write_text("payload\n")
    argv = cluster.ssh_argv(root, node)
    opts, target = argv[1:-1], argv[-1]
    opts = ["-P" if o == "-p" else o for o in opts]
    cp = subprocess.run(["scp", *opts, str(src), f"{target}:{remote}"], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.e2e
@pytest.mark.needs_root
def test_node_sees_simulated_proc_and_private_dirs(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    # A fresh node is the image: /var/log is there, nothing of sparkctl's (issue #12), even
    # where this machine has those dirs.
    fresh = ssh(root, "spark-c", "for d in /etc /opt /var/lib /var/log /etc/systemd/system /srv/models "
                                 "/etc/sparkctl /opt/sparkctl /var/lib/sparkctl /var/log/sparkctl; do "
                                 "[ -e $d ] && echo $d; done; true")
    assert fresh.split() == ["/etc", "/opt", "/var/lib", "/var/log", "/etc/systemd/system", "/srv/models"]
    out = ssh(root, "spark-c", "head -1 /proc/meminfo; cat /proc/sys/kernel/random/boot_id; "
                               "mkdir /etc/sparkctl && echo hello > /etc/sparkctl/probe; "
                               "ls /sys/class/infiniband >/dev/null && echo ib")
    first, boot_id, ib = out.splitlines()
    assert first.split() == ["MemTotal:", "127600816", "kB"]
    assert boot_id == nodestate.load(root / "nodes/spark-c/state.json")["boot_id"]
    assert ib == "ib"
    assert (root / "nodes/spark-c/fs/etc/sparkctl/probe").read_text() == "hello\n"
    assert not Path("/etc/sparkctl/probe").exists()  # private to the node
    assert ssh(root, "spark-d", "ls -d /etc/sparkctl", check=False) == ""  # private to spark-c


def _rows(block: str) -> dict[int, str]:
    return {int(ln.split(None, 1)[0]): ln.split(None, 1)[1] for ln in block.strip().splitlines()[1:]}


@pytest.mark.e2e
@pytest.mark.needs_root
def test_a_nodes_ps_lists_its_own_processes_from_its_cgroup_as_the_namespace_scan_does(
        ring: tuple[Path, ClusterSpec]) -> None:
    """SIMULATED: the nodes share this machine's PID namespace. ``ps -eo pid,args`` (how sparkctl
    asks) reads the node's cgroup where this machine lets the sim make one, and lists exactly the
    processes the scan of the node's network namespace finds (``ps -e -o``): its sshd, its session,
    what its boot started (earlyoom, through nsenter), none of another node's."""
    root, _ = ring
    sep = r"printf '\043\043\043\n'"  # "###", which the session's own command line does not hold
    out = ssh(root, "spark-a", f"sleep 30 & s=$!; ps -eo pid,args; {sep}; ps -e -o pid,args; {sep}; echo $s; "
                               'c="${SPARKCTL_SIM_STATE%/*}/procs"; grep -qx "$$" "$c" 2>/dev/null && echo joined; kill $s')
    fast, scan, tail = out.split("###\n")
    sleeper, *joined = tail.split()
    own = "ps -q " if joined else "ps -eo pid,args"  # the scan where this machine gave the node no cgroup
    fast_rows, scan_rows = _rows(fast), _rows(scan)
    assert any(own in args for args in fast_rows.values()), fast  # the cgroup's path where there is one
    assert int(sleeper) in fast_rows and int(sleeper) in scan_rows
    ps_rows = {pid for rows in (fast_rows, scan_rows) for pid, args in rows.items() if "ps -" in args}
    assert set(fast_rows) - ps_rows == set(scan_rows) - ps_rows, (fast, scan)
    other = int((root / "nodes/spark-b/sshd.pid").read_text())
    assert other not in fast_rows and os.getpid() not in fast_rows


@pytest.mark.e2e
@pytest.mark.needs_root
def test_ping_has_datagram_sockets_as_on_dgx_os_so_jumbo_pings_side_by_side_all_get_answers(
        ring: tuple[Path, ClusterSpec]) -> None:
    """systemd's 50-default.conf lets every group open ICMP datagram sockets (clusterinit
    VENDOR_SYSCTL_D): each ping gets its own reply. With a new namespace's "1 0", ping falls
    back to a raw socket that receives every reply of the node, and 48 jumbo pings at once
    overflowed each other's receive buffers (some lost on every try here)."""
    root, _ = ring
    assert ssh(root, "spark-a", "cat /proc/sys/net/ipv4/ping_group_range").split() == ["0", "2147483647"]
    peer = _addr(0, 0, 1)  # spark-b's end of cable 0, twin 0
    lost = ssh(root, "spark-a", f"for i in $(seq 48); do ( ping -M do -s 8972 -c 1 -W 2 -I {P0[0]} {peer} "
                                ">/dev/null 2>&1 || echo lost ) & done; wait", timeout=30)
    assert lost.split().count("lost") == 0


@pytest.mark.e2e
@pytest.mark.needs_root
def test_non_neighbours_only_through_the_relay(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    c_on_bc, c_on_cd = _addr(1, 0, 2), _addr(2, 1, 2)  # C on the B-C cable, C on the C-D twin 1
    route = ssh(root, "spark-a", f"ip route get {c_on_bc}; ip route get {c_on_cd}")
    assert f"via {_addr(0, 0, 1)} dev {P0[0]}" in route  # through B
    assert f"via {_addr(3, 1, 3)} dev {P1[1]}" in route  # through D
    ssh(root, "spark-a", f"ping -c1 -W2 {c_on_bc} && ping -c1 -W2 {c_on_cd}")
    try:
        for relay in ("spark-b", "spark-d"):
            cluster.set_forwarding(root, relay, False)
        out = ssh(root, "spark-a", f"ping -c1 -W1 {c_on_bc}; ping -c1 -W1 {c_on_cd}; echo done", check=False)
        assert " 0% packet loss" not in out and "100% packet loss" in out
        ssh(root, "spark-a", f"ping -c1 -W2 {_addr(0, 0, 1)}")  # neighbours stay reachable
    finally:
        for relay in ("spark-b", "spark-d"):
            cluster.set_forwarding(root, relay, True)
    ssh(root, "spark-a", f"ping -c1 -W2 {c_on_bc}")


@pytest.mark.e2e
@pytest.mark.needs_root
def test_link_and_reachability_faults(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    cluster.link_down(root, "spark-a", P0[0])
    st = cluster.status(root)
    assert not st.node("spark-a").links[0].admin_up
    b_end = [lk for lk in st.node("spark-b").links if lk.ifname == P1[0]][0]
    assert b_end.admin_up and not b_end.oper_up  # the peer lost carrier
    cluster.link_up(root, "spark-a", P0[0])
    cluster.set_mtu(root, "spark-a", P0[1], 1500)
    assert ssh(root, "spark-a", f"cat /sys/class/net/{P0[1]}/mtu").strip() == "1500"
    cluster.set_mtu(root, "spark-a", P0[1], 9000)
    with pytest.raises(SimError):
        cluster.link_down(root, "spark-a", "eth7")

    cluster.unreachable(root, "spark-d")
    with pytest.raises((TimeoutError, socket.timeout)):  # a dead host: no refusal, no reply
        socket.create_connection(("10.201.0.14", 22), timeout=1.0).close()
    assert not cluster.status(root).node("spark-d").ssh_reachable
    cluster.reachable(root, "spark-d")
    ssh(root, "spark-d", "true")

    cluster.stop_sshd(root, "spark-c")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("10.201.0.13", 22), timeout=1.0).close()
    assert nodestate.load(root / "nodes/spark-c/state.json")["faults"]["sshd_stopped"]
    cluster.start_sshd(root, "spark-c")
    assert ssh(root, "spark-c", "hostname").strip() == "spark-c"  # new sshd, same namespaces


@pytest.mark.e2e
@pytest.mark.needs_root
@pytest.mark.parametrize("kernel,leaked", [("6.17.0-1031-nvidia", 40.0), ("6.17.0-1029-nvidia", 0.0)])
def test_kill_engines_leaks_their_memory_on_the_leaky_kernel_only(ring: tuple[Path, ClusterSpec], kernel: str,
                                                                  leaked: float) -> None:
    root, _ = ring
    pid = int(ssh(root, "spark-b", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!").strip())
    state = root / "nodes/spark-b/state.json"
    with nodestate.edit(state) as st:
        st["engine_mem_gib"][str(pid)] = 40.0
        st["kernel_release"] = kernel
        st["leaked_mem_gib"] = 0.0
    killed = cluster.kill_engines(root, "spark-b")
    assert pid in killed
    st = nodestate.load(state)
    assert st["engine_mem_gib"] == {} and st["leaked_mem_gib"] == leaked
    assert ssh(root, "spark-b", "hostname").strip() == "spark-b"  # sshd survived
    with nodestate.edit(state) as st:
        st["kernel_release"], st["leaked_mem_gib"] = "6.17.0-1029-nvidia", 0.0


@pytest.mark.e2e
@pytest.mark.needs_root
def test_reboots_and_stale_links(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    a_state, b_state = root / "nodes/spark-a/state.json", root / "nodes/spark-b/state.json"
    cluster.set_state(root, "spark-a", "gpu.clock_lock_mhz", "[2418, 2418]")
    cluster.stale_link(root, "spark-a", P0[0])
    assert nodestate.load(a_state)["links"][P0[0]]["stale"]
    assert nodestate.load(b_state)["links"][P1[0]]["stale"]
    before = ssh(root, "spark-a", "cat /proc/sys/kernel/random/boot_id").strip()

    cluster.warm_reboot(root, "spark-a")
    after_warm = ssh(root, "spark-a", "cat /proc/sys/kernel/random/boot_id; hostname").split()
    assert after_warm[0] != before and after_warm[1] == "spark-a"
    st = nodestate.load(a_state)
    assert st["gpu"]["clock_lock_mhz"] is None and st["leaked_mem_gib"] == 0.0
    assert st["links"][P0[0]]["stale"]  # a warm reboot does not heal a stale link

    cluster.power_cycle(root, ["spark-a"])
    after_cycle = ssh(root, "spark-a", "cat /proc/sys/kernel/random/boot_id").strip()
    assert after_cycle not in (before, after_warm[0])
    assert nodestate.load(a_state)["links"][P0[0]]["stale"]  # only one end cycled so far

    cluster.power_cycle(root, ["spark-b"])  # the other end, in a later call
    assert not nodestate.load(a_state)["links"][P0[0]]["stale"]
    assert not nodestate.load(b_state)["links"][P1[0]]["stale"]

    cluster.stale_link(root, "spark-c", P0[1])
    cluster.power_cycle(root, ["spark-c", "spark-d"])  # both ends in one call
    assert not nodestate.load(root / "nodes/spark-d/state.json")["links"][P1[1]]["stale"]
    ssh(root, "spark-a", f"ping -c1 -W2 {_addr(1, 0, 2)}")  # fabric and relays back after reboots


@pytest.mark.e2e
@pytest.mark.needs_root
def test_set_state_parses_values(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    assert cluster.set_state(root, "spark-d", "kernel_release", "6.17.0-1031-nvidia") == "6.17.0-1031-nvidia"
    assert cluster.set_state(root, "spark-d", "page_size", "65536") == 65536
    assert cluster.set_state(root, "spark-d", "held_packages", "[]") == []
    assert cluster.set_state(root, "spark-d", "gpu.clock_lock_mhz", "null") is None
    st = nodestate.load(root / "nodes/spark-d/state.json")
    assert (st["kernel_release"], st["page_size"], st["held_packages"]) == ("6.17.0-1031-nvidia", 65536, [])
    with pytest.raises(SimError):
        cluster.set_state(root, "spark-d", "gpu.no_such_key", "1")
    with pytest.raises(SimError):
        cluster.set_state(root, "spark-z", "page_size", "4096")


@pytest.mark.e2e
@pytest.mark.needs_root
def test_up_twice_converges_without_restarting(ring: tuple[Path, ClusterSpec]) -> None:
    root, spec = ring
    first = cluster.status(root)
    ns = f"sparkctl-{NAMES[0]}"
    mark = ["-m", "comment", "--comment", "sparkctl-test-marker", "-j", "RETURN"]
    # state the node's running kernel holds (its boot resets netfilter): a second `up` must keep it
    subprocess.run(["ip", "netns", "exec", ns, "iptables", "-A", "FORWARD", *mark], check=True)
    second = cluster.up(spec, root)
    assert subprocess.run(["ip", "netns", "exec", ns, "iptables", "-C", "FORWARD", *mark]).returncode == 0
    assert second.all_reachable
    assert [n.sshd_pid for n in second.nodes] == [n.sshd_pid for n in first.nodes]
    assert [n.boot_id for n in second.nodes] == [n.boot_id for n in first.nodes]
    assert all(lk.oper_up and lk.mtu == 9000 for n in second.nodes for lk in n.links)


@pytest.mark.e2e
@pytest.mark.needs_root
def test_down_leaves_nothing(ring: tuple[Path, ClusterSpec]) -> None:
    root, _ = ring
    cluster.down(root)
    assert_no_traces(root, [f"sparkctl-{n}" for n in NAMES])
    cgroups = nx._cgroup2()
    assert cgroups is None or not (cgroups[0] / nx.CGROUP_DIR).exists()  # the nodes' cgroups too
    assert "sparkbr0" not in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert cluster.status(root).mode == "absent"
    cluster.down(root)  # and again: nothing left to do is fine


# --- crash recovery and rootless mode ------------------------------------------


def _pair_spec() -> ClusterSpec:
    nodes = (SimNode("crash-x", "10.202.0.11", 22), SimNode("crash-y", "10.202.0.12", 22))
    links = (SimLink("crash-x", P0[0], "10.21.0.1/24", "crash-y", P1[0], "10.21.0.2/24"),)
    return ClusterSpec(nodes=nodes, links=links, mgmt_cidr="10.202.0.1/24", bridge="sparkbr9")


@pytest.mark.e2e
@pytest.mark.needs_root
@pytest.mark.skipif(not (IS_ROOT and HAVE_TOOLS), reason="needs root and openssh-server")
@pytest.mark.parametrize("lose_ledger", [False, True], ids=["root-deleted", "root-and-ledger-deleted"])
def test_down_after_crash(tmp_path: Path, lose_ledger: bool, host_sim_lock: None) -> None:
    _crash_and_recover(tmp_path / "sim", ["sparkctl-crash-x", "sparkctl-crash-y"], lose_ledger)


def _crash_and_recover(root: Path, namespaces: list[str], lose_ledger: bool) -> None:
    try:
        cluster.up(_pair_spec(), root)
        ledger = cluster.SimPaths(root).ledger
        assert ledger.exists()
        if lose_ledger:
            foreign = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                   text=True).stdout.split() if ns.startswith("sparkctl-")
                       and ns not in namespaces]
            if foreign:
                pytest.skip(f"another sim is running ({foreign}); a prefix scan would remove it")
            ledger.unlink()
        pid = cluster.status(root).node("crash-x").sshd_pid
        # The crash: the root is gone, namespaces and sshd remain. sshd re-execs per
        # connection and reopens its -E log, so a probe can recreate a file mid-rmtree.
        for _ in range(50):
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                break
            time.sleep(0.1)
        assert pid is not None and Path(f"/proc/{pid}").exists()
        cluster.down(root)
        assert_no_traces(root, namespaces)
        assert "sparkbr9" not in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
        assert not ledger.exists()
    finally:
        cluster.down(root)


@pytest.mark.e2e
@needs_tools
def test_rootless_mode(tmp_path: Path) -> None:
    root = tmp_path / "sim"
    nodes = tuple(SimNode(f"loop-{i}", f"127.0.0.{21 + i}", free_port(f"127.0.0.{21 + i}")) for i in range(2))
    spec = ClusterSpec(nodes=nodes, links=(SimLink("loop-0", P0[0], "127.0.1.1/8", "loop-1", P1[0],
                                                   "127.0.1.2/8"),), rootless=True)
    try:
        st = cluster.up(spec, root)
        assert st.mode == "rootless" and st.all_reachable
        assert any("hostname" in lim for lim in st.limitations)
        assert any("relay" in lim for lim in st.limitations)
        for node in nodes:
            out = ssh(root, node.name, 'echo "$SPARKCTL_SIM_NODE"; echo "$PATH"')
            name, path = out.splitlines()
            assert name == node.name and path.split(":")[0] == str(root / "bin")
        _scp_roundtrip(root, "loop-1", str(tmp_path / "copied"))
        assert (tmp_path / "copied").read_text() == "payload\n"
        with pytest.raises(SimError):
            cluster.link_down(root, "loop-0", P0[0])
        cluster.warm_reboot(root, "loop-1")
        assert ssh(root, "loop-1", "echo ok").strip() == "ok"
        cluster.down(root)
        assert processes_mentioning(root) == [] and not root.exists()
    finally:
        cluster.down(root)  # idempotent: a no-op after the down above


def test_ring_spec_routes_cover_every_non_neighbour_subnet() -> None:
    """Pure check of the hand-built spec: 4 routes per node, never to a local subnet."""
    spec = ring_spec()
    for i, name in enumerate(NAMES):
        mine = [r for r in spec.routes if r.node == name]
        local = {lk.a_cidr.rsplit(".", 1)[0] for lk in spec.links if name in (lk.a_node, lk.b_node)}
        assert len(mine) == 4
        assert all(r.dst_cidr.rsplit(".", 1)[0] not in local for r in mine)
    assert json.dumps(dataclasses.asdict(spec))  # the spec round-trips through sim.json
    assert cluster._spec_from_json(json.loads(json.dumps(dataclasses.asdict(spec)))) == spec


def test_down_refuses_a_directory_that_is_not_a_sim_root(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me\n")
    with pytest.raises(SimError):
        cluster.down(tmp_path)
    assert (tmp_path / "precious.txt").exists()
