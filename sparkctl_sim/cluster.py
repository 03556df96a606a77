"""The simulated DGX Spark cluster: namespaces, cables, sshd per node, faults.

Owns building, inspecting and tearing down a simulated cluster from a
:class:`~sparkctl_sim.spec.ClusterSpec` under one *sim root* directory
(:func:`up`, :func:`status`, :func:`down`), and is the one public face of the
package's cluster modules: :mod:`sparkctl_sim.clusterroot` (paths, metadata,
validation, result types), :mod:`sparkctl_sim.clusterboot` (a node's dirs,
network, tools and sshd) and :mod:`sparkctl_sim.clusterfaults` (fault and
power events), whose functions are re-exported here. Root mode gives every node a network
namespace (``sparkctl-<node>``), a management veth ``enP7s7`` on a host bridge,
veth "cables" with the real Spark netdev names, static routes, and an OpenSSH
sshd running inside ``unshare --mount --uts`` so its sessions see the node's
hostname, its own ``/proc/meminfo`` and ``boot_id`` and private copies of the
directories sparkctl renders into. Rootless mode runs one unprivileged sshd per
node on a 127/8 address and says plainly what it cannot simulate.

Must not: print (progress goes to the ``progress`` callback and ``logging``),
exit, touch ``~/.ssh``, or touch namespaces, links or processes it did not
create. The GB10 tool shims, engines and process shims are other modules,
reached only through optional hooks (:func:`_hook`).

Root directory layout::

    ROOT/
      sim.json               mode, the applied spec, host dirs we created
      id_ed25519[.pub]       the operator's client key (sim only)
      known_hosts            every node's host key, for StrictHostKeyChecking=yes
      stale.json             stale links and which ends were power-cycled since
      session.sh             rootless only: ForceCommand wrapper that keeps PATH
      bin/                   tool/engine/process shims (first on the session PATH)
      pkgs/                  PYTHONPATH of sessions
      nodes/NODE/
        state.json meminfo boot_id    sparkctl_sim.nodestate (the node's /proc views)
        ssh_host_ed25519_key[.pub] sshd_config sshd.pid sshd.log boot.log
        fs/etc fs/opt fs/var/lib fs/var/log   the node's changes: overlay upper dirs over
                              the machine's own dirs (root mode), so only what a real
                              image has, or what sparkctl made, is there
        fs/srv/models         the operator's model store, bind-mounted over /srv/models
        ovl-work/             the overlays' work dirs
        fs/home.bashrc        bind-mounted over the login user's ~/.bashrc (root mode)
        sysfs/class/infiniband  bind-mounted over /sys/class/infiniband (root mode)
        run/                  SPARKCTL_SIM_RUN_DIR for the process shims

SIMULATION ONLY.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sparkctl_sim import netns as nx
from sparkctl_sim import nodestate
from sparkctl_sim.clusterboot import (
    _converge_network,
    _ensure_host_dirs,
    _ensure_sshd,
    _install_tools,
    _operator_key,
    _prepare_node,
    _remove_host_dirs,
    _ssh_user,
    _sshd_pid,
    _tcp_ok,
    _wait_reachable,
    _write_known_hosts,
    _write_sysfs,
    boot_init,
)
from sparkctl_sim.clusterfaults import (
    disk_full,
    disk_ok,
    kill_engines,
    link_down,
    link_up,
    power_cycle,
    power_off,
    reachable,
    reboot,
    set_forwarding,
    set_mtu,
    set_state,
    stale_link,
    start_sshd,
    stop_sshd,
    unreachable,
    warm_reboot,
)
from sparkctl_sim.clusterroot import (
    FORMAT,
    LEDGER_DIR,
    MGMT_IFNAME,
    PRIVATE_DIRS,
    ROOTLESS_LIMITATIONS,
    LinkStatus,
    NodeStatus,
    Progress,
    SimPaths,
    SimStatus,
    _find_node,
    _ledger_add,
    _load_meta,
    _node_links,
    _norm,
    _read_json,
    _require_meta,
    _root_lock,
    _say,
    _spec_from_json,
    _validate,
    _write_json,
    host_veth_name,
    link_id,
    load_spec,
    netns_name,
)
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec, SimNode

__all__ = [
    "LEDGER_DIR",
    "MGMT_IFNAME",
    "PRIVATE_DIRS",
    "LinkStatus",
    "NodeStatus",
    "SimError",
    "SimPaths",
    "SimStatus",
    "disk_full",
    "disk_ok",
    "down",
    "host_veth_name",
    "kill_engines",
    "link_down",
    "link_id",
    "link_up",
    "load_spec",
    "netns_name",
    "power_cycle",
    "power_off",
    "reachable",
    "reboot",
    "set_forwarding",
    "set_mtu",
    "set_state",
    "ssh_argv",
    "stale_link",
    "start_sshd",
    "status",
    "stop_sshd",
    "unreachable",
    "up",
    "warm_reboot",
]


# ---------------------------------------------------------------------------
# up


def up(spec: ClusterSpec, root: Path, *, progress: Progress | None = None,
       ready_timeout_s: float = 20.0) -> SimStatus:
    """Build (or converge) the simulated cluster under ``root``; safe to run again."""
    root = _norm(root)
    p = SimPaths(root)
    say = _say(progress)
    rootless = spec.rootless or os.geteuid() != 0
    mode = "rootless" if rootless else "root"
    _validate(spec, root, rootless)
    with _root_lock(p):
        prev = _load_meta(p)
        if prev is not None and prev.get("mode") != mode:
            raise SimError(f"{root} already holds a {prev.get('mode')} cluster, this spec asks for {mode}",
                           "run `sparkctl sim down` first")
        meta = {"format": FORMAT, "mode": mode, "spec": dataclasses.asdict(spec),
                "ssh_user": _ssh_user(rootless)}
        _write_json(p.meta, meta)  # first, so down() can find everything after a crash mid-up
        if not rootless:
            _check_no_other_sim(p, spec)
            _ledger_add(p, "root", str(root))
        say(f"sim root {root} ({mode} mode)")
        _operator_key(p)
        for node in spec.nodes:
            _prepare_node(p, spec, node, rootless)
        _install_tools(p, say)
        if not rootless:
            _ensure_host_dirs()
            say(f"network: bridge {spec.bridge}, {len(spec.nodes)} namespaces, {len(spec.links)} cables"
                + (f", a switch of {len(spec.switch_ports)} ports" if spec.switch_ports else ""))
            _converge_network(p, spec)
        if not rootless:
            for node in spec.nodes:
                _write_sysfs(p, node.name)
        _write_known_hosts(p, spec)
        booted: list[SimNode] = []  # a node whose sshd already ran has booted: converge, do not reboot it
        for node in spec.nodes:
            if _ensure_sshd(p, spec, node, rootless):
                booted.append(node)
                say(f"{node.name}: sshd started on {node.mgmt_ip}:{node.ssh_port}")
            with nodestate.edit(p.node(node.name).state) as st:
                st["faults"]["sshd_stopped"] = False
                st["faults"]["unreachable"] = False
        _wait_reachable(spec, [n.name for n in spec.nodes], ready_timeout_s)
        say("all nodes accept SSH")
        if not rootless:
            for node in booted:
                boot_init(p, spec, node)
            if booted:
                how = ("fresh (no fabric addresses, Docker's FORWARD DROP)" if spec.fresh
                       else "pre-configured (fabric addresses, routes, forwarding)")
                say(", ".join(n.name for n in booted) + " booted " + how)
    return status(root)


def _check_no_other_sim(p: SimPaths, spec: ClusterSpec) -> None:
    """Refuse namespaces or a bridge that a live sim under another root owns."""
    wanted = {netns_name(n.name) for n in spec.nodes}
    if spec.switch_ports:
        from sparkctl_sim.switch import SWITCH_NS

        wanted.add(SWITCH_NS)
    live = set(nx.netns_list())
    for ledger in sorted(LEDGER_DIR.glob("*.json")) if LEDGER_DIR.is_dir() else []:
        if ledger == p.ledger:
            continue
        try:
            other = json.loads(ledger.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(other, dict):
            continue  # host-dirs.json
        clash = sorted(wanted & set(other.get("namespaces", [])) & live)
        if not clash and spec.bridge in other.get("bridge", []) and nx.link_info(spec.bridge):
            clash = [spec.bridge]
        if clash:
            raise SimError(f"{', '.join(clash)} belong to the simulated cluster at {other.get('root')}",
                           f"run `sparkctl sim down` on {other.get('root')} first, or use other node names")



# ---------------------------------------------------------------------------
# status


def status(root: Path) -> SimStatus:
    """What runs now: per node namespace, sshd, SSH reachability, boot id, links."""
    p = SimPaths(_norm(root))
    meta = _load_meta(p)
    if meta is None:
        return SimStatus(p.root, "absent", "", p.key, p.known_hosts, (), ())
    spec = _spec_from_json(meta["spec"])
    rootless = meta["mode"] == "rootless"
    with ThreadPoolExecutor(max_workers=min(16, len(spec.nodes))) as pool:
        nodes = tuple(pool.map(lambda n: _node_status(p, spec, n, rootless), spec.nodes))
    return SimStatus(p.root, meta["mode"], meta.get("ssh_user", ""), p.key, p.known_hosts, nodes,
                     ROOTLESS_LIMITATIONS if rootless else ())


def _node_status(p: SimPaths, spec: ClusterSpec, node: SimNode, rootless: bool) -> NodeStatus:
    nd = p.node(node.name)
    try:
        st: dict[str, Any] | None = nodestate.load(nd.state)
    except (OSError, json.JSONDecodeError):
        st = None
    pid = _sshd_pid(p, node.name)
    ns = None if rootless else netns_name(node.name)
    ns_ok = ns is not None and nx.netns_exists(ns)
    seen = {e["ifname"]: e for e in nx.links(ns)} if ns_ok else {}
    links = []
    for ifname, cidr, peer, pif in _node_links(spec, node.name):
        e = seen.get(ifname)
        stale = bool(st and st.get("links", {}).get(ifname, {}).get("stale"))
        links.append(LinkStatus(
            ifname=ifname, peer=f"{peer}:{pif}", cidr=cidr, exists=e is not None,
            admin_up=bool(e and "UP" in e.get("flags", [])),
            oper_up=bool(e and e.get("operstate") == "UP"),
            mtu=e.get("mtu") if e else None, stale=stale))
    mgmt_up = None
    if not rootless:
        hv = nx.link_info(host_veth_name(node.name))
        mgmt_up = bool(hv and "UP" in hv.get("flags", []))
    return NodeStatus(
        name=node.name, mgmt_ip=node.mgmt_ip, ssh_port=node.ssh_port, netns=ns, netns_exists=ns_ok,
        sshd_pid=pid, sshd_alive=pid is not None,
        ssh_reachable=_tcp_ok(node.mgmt_ip, node.ssh_port),
        mgmt_up=mgmt_up, boot_id=st.get("boot_id") if st else None, state_path=nd.state,
        links=tuple(links))


def ssh_argv(root: Path, node: str, *, connect_timeout_s: int = 5) -> list[str]:
    """An ``ssh`` command line (without the remote command) for one simulated node.

    Uses only the sim's key and known_hosts (``-F /dev/null`` ignores ~/.ssh/config).
    """
    p = SimPaths(_norm(root))
    meta = _require_meta(p)
    spec = _spec_from_json(meta["spec"])
    n = _find_node(spec, node)
    return ["ssh", "-F", "/dev/null", "-i", str(p.key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={p.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={connect_timeout_s}", "-p", str(n.ssh_port),
            f"{meta['ssh_user']}@{n.mgmt_ip}"]


# ---------------------------------------------------------------------------
# down


def down(root: Path) -> None:
    """Remove every trace of the sim under ``root``; also after a crash.

    Finds what to remove from ``ROOT/sim.json``, from the host-side ledger in
    /run/sparkctl-sim (which survives a deleted root), and, when neither exists,
    from the ``sparkctl-`` namespace prefix and the ``sparkctl-sim`` link alias.
    """
    root = _norm(root)
    p = SimPaths(root)
    if root.exists() and not _looks_like_sim_root(root):
        # checked first: processes are found by paths under root, so a wrong root
        # must not get as far as killing anything
        raise SimError(f"refusing to tear down {root}: it does not look like a sim root",
                       "pass the directory given to `sparkctl sim up`")
    meta = _read_json(p.meta) if p.meta.exists() else None
    ledger = _read_ledger(p)
    spec = _spec_from_json(meta["spec"]) if meta else None

    namespaces: set[str] = set((ledger or {}).get("namespaces", []))
    host_links: set[str] = set((ledger or {}).get("host_veths", []))
    bridges: set[str] = set((ledger or {}).get("bridge", []))
    if spec is not None and meta and meta.get("mode") == "root":
        namespaces |= {netns_name(n.name) for n in spec.nodes}
        host_links |= {host_veth_name(n.name) for n in spec.nodes}
        bridges.add(spec.bridge)
    crash_scan = meta is None and ledger is None
    if crash_scan and os.geteuid() == 0:
        # Nothing recorded: sweep by prefix and alias, sparing what a live sim
        # under another root has in its ledger.
        claimed = _claimed_by_other_sims(p)
        namespaces |= {ns for ns in nx.netns_list() if ns.startswith(nx.NETNS_PREFIX)} - claimed
        for e in nx.owned_host_links():
            if e["ifname"] not in claimed:
                kind = (e.get("linkinfo") or {}).get("info_kind")
                (bridges if kind == "bridge" else host_links).add(e["ifname"])
    namespaces = {ns for ns in namespaces if ns.startswith(nx.NETNS_PREFIX)}

    # Processes first: the namespaces' members, then anything pointing into root.
    for _ in range(5):
        pids: set[int] = set()
        for ns in namespaces:
            if nx.netns_exists(ns):
                pids |= set(nx.ns_pids(ns))
        pids |= set(nx.pids_under(root))
        if not pids:
            break
        nx.kill_pids(pids)
    for ns in sorted(namespaces):
        nx.netns_delete(ns)
        nx.cgroup_remove(ns)
    for name in sorted(host_links) + sorted(bridges):
        nx.host_link_delete(name)
    if os.geteuid() == 0:
        _remove_host_dirs()
    if root.exists():
        shutil.rmtree(root)
    if ledger is not None:
        p.ledger.unlink(missing_ok=True)


def _claimed_by_other_sims(p: SimPaths) -> set[str]:
    """Namespaces and host links that ledgers of other sim roots list."""
    claimed: set[str] = set()
    for ledger in sorted(LEDGER_DIR.glob("*.json")) if LEDGER_DIR.is_dir() else []:
        if ledger == p.ledger:
            continue
        try:
            other = json.loads(ledger.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(other, dict):
            for key in ("namespaces", "host_veths", "bridge"):
                claimed |= set(other.get(key, []))
    return claimed


def _read_ledger(p: SimPaths) -> dict[str, Any] | None:
    """The host-side ledger of a root-mode sim (unreadable, hence absent, when not root)."""
    try:
        data = _read_json(p.ledger)
    except PermissionError:
        return None
    return data if isinstance(data, dict) else None


def _looks_like_sim_root(root: Path) -> bool:
    if root == Path("/") or root == Path.home() or not root.is_dir():
        return False
    names = {c.name for c in root.iterdir()}
    # empty (a crash right after mkdir), or holding what up() writes first
    return not names or names <= {".lock"} or "sim.json" in names or {"nodes", "id_ed25519"} <= names

