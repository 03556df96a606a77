"""Faults and power events on a running simulated cluster.

Owns link down/up, MTU, forwarding, stale cables, sshd stop/start, an
unreachable management port, a full disk, killed engines, warm reboots and
power cycles, and direct edits of a node's state. Each function takes the sim
root, holds the root lock, and leaves the node as the real event would.

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
import uuid
from pathlib import Path
from typing import Any

from sparkctl_sim import netns as nx
from sparkctl_sim import nodestate
from sparkctl_sim.clusterboot import (
    _apply_node_net,
    _ensure_sshd,
    _hook,
    _sshd_pid,
    _wait_reachable,
    _write_sysfs,
    boot_init,
    carrier_of,
)
from sparkctl_sim.clusterroot import (
    MGMT_IFNAME,
    PRIVATE_DIRS,
    SimPaths,
    _ctx,
    _find_node,
    _need_root_mode,
    _node_links,
    _read_json,
    _root_lock,
    _write_json,
    host_veth_name,
    link_id,
    netns_name,
)
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode

log = logging.getLogger(__name__)


def _node_ifname(spec: ClusterSpec, node: str, ifname: str) -> None:
    known = [i for i, *_ in _node_links(spec, node)] + [MGMT_IFNAME]
    if ifname not in known:
        raise SimError(f"{node} has no simulated interface {ifname!r}", "interfaces: " + ", ".join(known))


def link_down(root: Path, node: str, ifname: str) -> None:
    """Set one of the node's interfaces administratively down (the peer loses carrier)."""
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "link_down")
    _find_node(spec, node)
    _node_ifname(spec, node, ifname)
    with _root_lock(p):
        nx.ip(netns_name(node), "link", "set", ifname, "down")
        _settle_operstate(spec, [node])
        for n in _with_peers(spec, [node]):
            _write_sysfs(p, n)


def link_up(root: Path, node: str, ifname: str) -> None:
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "link_up")
    _find_node(spec, node)
    _node_ifname(spec, node, ifname)
    with _root_lock(p):
        nx.ip(netns_name(node), "link", "set", ifname, "up")
        # The kernel dropped the static routes through the port when it went down;
        # netplan/networkd put them back when it comes up on a real node.
        for r in spec.routes:
            if r.node == node and r.dev == ifname:
                nx.ip(netns_name(node), "route", "replace", r.dst_cidr, "via", r.via, "dev", r.dev)
        _settle_operstate(spec, [node])
        for n in _with_peers(spec, [node]):
            _write_sysfs(p, n)


def switch_port_group(root: Path, node: str, ifname: str, group: str) -> str:
    """Miscable one of the node's twins on the simulated switch: its switch port joins ``group``'s bridge."""
    from sparkctl_sim import switch

    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "switch_port_group")
    _find_node(spec, node)
    with _root_lock(p):
        return switch.move_port(spec, node, ifname, group)


def set_mtu(root: Path, node: str, ifname: str, mtu: int) -> None:
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "set_mtu")
    _find_node(spec, node)
    _node_ifname(spec, node, ifname)
    with _root_lock(p):
        nx.ip(netns_name(node), "link", "set", ifname, "mtu", str(int(mtu)))
        _write_sysfs(p, node)


def set_forwarding(root: Path, node: str, enabled: bool) -> None:
    """Turn net.ipv4.ip_forward on or off in the node's namespace (until reboot)."""
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "ip_forward")
    _find_node(spec, node)
    nx.ns_exec_write(netns_name(node), "/proc/sys/net/ipv4/ip_forward", "1" if enabled else "0")


def _with_peers(spec: ClusterSpec, nodes: list[str]) -> list[str]:
    """The nodes and their cable peers (whose carrier follows theirs)."""
    out = dict.fromkeys(nodes)
    names = {n.name for n in spec.nodes}
    for node in nodes:
        for _i, _c, peer, _pi in _node_links(spec, node):
            if peer in names:  # a switch port's peer is the switch: no node's carrier follows it
                out.setdefault(peer)
    return list(out)


def _settle_operstate(spec: ClusterSpec, nodes: list[str], timeout_s: float = 5.0) -> None:
    """Wait until every port of the nodes and their peers shows, in ``operstate``, the carrier it has.

    The carrier bit (``LOWER_UP`` in ``ip link``) changes at once, but the kernel moves
    ``operstate`` later, from its linkwatch work (net/core/link_watch.c): an event it does
    not deem urgent (a veth whose peer, in another namespace, has the same ifindex) waits up
    to a second, more on a loaded machine. A real port's carrier follows its far end after a
    delay of its own. A fault returns once the link has settled, so that what is probed next
    is the fault and not the moment after it (CI saw a peer still ``up`` at the next probe).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        pending = []
        for n in _with_peers(spec, nodes):
            by_name = {e["ifname"]: e for e in nx.links(netns_name(n))}
            for ifname, *_ in _node_links(spec, n):
                e = by_name.get(ifname) or {}
                if (str(e.get("operstate", "")).lower() == "up") != carrier_of(e):
                    pending.append(f"{n}:{ifname}")
        if not pending or time.monotonic() > deadline:
            if pending:
                log.warning("operstate still unsettled after %.0f s: %s", timeout_s, ", ".join(pending))
            return
        time.sleep(0.05)


def _find_link(spec: ClusterSpec, node: str, ifname: str) -> SimLink:
    for lk in spec.links:
        if (lk.a_node, lk.a_ifname) == (node, ifname) or (lk.b_node, lk.b_ifname) == (node, ifname):
            return lk
    raise SimError(f"{node}:{ifname} is not cabled in the spec")


def stale_link(root: Path, node_a: str, ifname_a: str) -> None:
    """Put the cable twin at ``node_a:ifname_a`` in the stale state at both ends.

    Nominal speed is kept (ethtool still says 200G); only a power cycle of BOTH
    ends clears it (see :func:`power_cycle`).
    """
    p, spec, _rootless = _ctx(root)
    lk = _find_link(spec, node_a, ifname_a)
    with _root_lock(p):
        for node, ifname in ((lk.a_node, lk.a_ifname), (lk.b_node, lk.b_ifname)):
            with nodestate.edit(p.node(node).state) as st:
                st["links"].setdefault(ifname, {"speed_mbps": 200000, "cabled": True})["stale"] = True
        stale = _read_json(p.stale) or {}
        stale[link_id(lk)] = {"cycled": []}
        _write_json(p.stale, stale)
        if not _rootless:
            for node in (lk.a_node, lk.b_node):
                _write_sysfs(p, node)


def stop_sshd(root: Path, node: str) -> None:
    """Stop the node's sshd listener (new connections are refused; sessions stay)."""
    p, spec, _rootless = _ctx(root)
    _find_node(spec, node)
    with _root_lock(p):
        pid = _sshd_pid(p, node)
        if pid is not None:
            nx.kill_pids([pid], grace_s=2.0)
        with nodestate.edit(p.node(node).state) as st:
            st["faults"]["sshd_stopped"] = True


def start_sshd(root: Path, node: str, *, ready_timeout_s: float = 10.0) -> None:
    p, spec, rootless = _ctx(root)
    n = _find_node(spec, node)
    with _root_lock(p):
        _ensure_sshd(p, spec, n, rootless)
        with nodestate.edit(p.node(node).state) as st:
            st["faults"]["sshd_stopped"] = False
        if not _faults(p, node).get("unreachable"):
            _wait_reachable(spec, [node], ready_timeout_s)


def _faults(p: SimPaths, node: str) -> dict[str, Any]:
    return dict(nodestate.load(p.node(node).state).get("faults", {}))


def unreachable(root: Path, node: str) -> None:
    """Take the node's management port down: SSH to it times out (no refusal)."""
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "unreachable")
    _find_node(spec, node)
    with _root_lock(p):
        nx.ip(None, "link", "set", host_veth_name(node), "down")
        with nodestate.edit(p.node(node).state) as st:
            st["faults"]["unreachable"] = True


def reachable(root: Path, node: str) -> None:
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "reachable")
    _find_node(spec, node)
    with _root_lock(p):
        nx.ip(None, "link", "set", host_veth_name(node), "up")
        with nodestate.edit(p.node(node).state) as st:
            st["faults"]["unreachable"] = False


# A full disk on one of the node's private dirs (the head's /var/lib/sparkctl holds
# sparkctl's record and lock): a tmpfs just big enough for what the dir holds,
# mounted over it inside the node's mount namespace (entered through its sshd),
# then filled, data blocks and inodes, so every new write and mkdir gets ENOSPC.
DISK_FULL_FS = "sparkctl-diskfull"
DISK_FULL_SPARE_KIB = 64  # what the filler takes: nothing is left for a new file
DISK_FULL_SPARE_INODES = 32

_DISK_FULL_SCRIPT = """set -eu
t={target}; src={src}  # src: a staging name in the node's sim dir, outside its disk
if grep -q "^{fs} $t " /proc/self/mounts; then exit 0; fi  # already full
# A tmpfs needs a mount point: a dir sparkctl has not made yet is made here (on a real
# node the whole filesystem is full, so sparkctl's own mkdir would fail just the same).
mkdir -p "$t"
stage=$(mktemp -d "$src.XXXXXX"); cp -a "$t/." "$stage/"
kib=$(du -sk "$stage" | cut -f1); files=$(find "$stage" | wc -l)
mount -t tmpfs -o "size=$((kib + {spare_kib}))k,nr_inodes=$((files + {spare_inodes})),mode=0755" {fs} "$t"
cp -a "$stage/." "$t/"; rm -rf "$stage"
dd if=/dev/zero of="$t/.sim-disk-full" bs=4k 2>/dev/null || true
i=0; while (: > "$t/.sim-disk-full.$i") 2>/dev/null; do i=$((i + 1)); done
"""

# The data written while the disk was full goes back to the node's own dir, then
# the tmpfs goes (lazily: a process may still hold a file open on it).
_DISK_OK_SCRIPT = """set -eu
t={target}; src={src}
grep -q "^{fs} $t " /proc/self/mounts || exit 0
rm -f "$t/.sim-disk-full" "$t"/.sim-disk-full.*
stage=$(mktemp -d "$src.XXXXXX"); cp -a "$t/." "$stage/"
umount -l "$t"
# Back through the node's own view (an overlay's upper dir must not be written beneath it).
find "$t" -mindepth 1 -delete
cp -a "$stage/." "$t/"; rm -rf "$stage"
"""


def _disk_target(path: str) -> str:
    if path not in PRIVATE_DIRS:
        raise SimError(f"{path!r} is not one of the node's private dirs", "dirs: " + ", ".join(PRIVATE_DIRS))
    return path


def _in_node_mounts(p: SimPaths, node: str, script: str) -> None:
    pid = _sshd_pid(p, node)
    if pid is None:
        raise SimError(f"{node}: sshd is not running, so its mount namespace cannot be entered",
                       f"`sparkctl sim fault {node} sshd-start` first")
    nx.run(["nsenter", "-t", str(pid), "-m", "sh", "-c", script], timeout_s=60.0)


def disk_full(root: Path, node: str, path: str = "/var/lib/sparkctl") -> None:
    """Fill the disk under ``path`` on the node: new files and directories there get ENOSPC.

    What the dir holds stays readable. Cleared by :func:`disk_ok`, and by a
    reboot (unlike a real disk: the sim keeps the data and drops the fault).
    """
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "disk_full")
    _find_node(spec, node)
    target = _disk_target(path)
    q = shlex.quote
    with _root_lock(p):
        _in_node_mounts(p, node, _DISK_FULL_SCRIPT.format(
            target=q(target), src=q(str(p.node(node).dir / "disk-stage")), fs=DISK_FULL_FS,
            spare_kib=DISK_FULL_SPARE_KIB, spare_inodes=DISK_FULL_SPARE_INODES))
        with nodestate.edit(p.node(node).state) as st:
            st["faults"]["disk_full"] = target


def disk_ok(root: Path, node: str) -> None:
    """Clear :func:`disk_full`; what was written meanwhile stays on the node's disk."""
    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "disk_ok")
    _find_node(spec, node)
    with _root_lock(p):
        _disk_ok_locked(p, node)


def _disk_ok_locked(p: SimPaths, node: str) -> None:
    # The script checks the mount itself: a fault half-applied is cleared too.
    target = _faults(p, node).get("disk_full") or "/var/lib/sparkctl"
    q = shlex.quote
    _in_node_mounts(p, node, _DISK_OK_SCRIPT.format(target=q(target), src=q(str(p.node(node).dir / "disk-stage")),
                                                    fs=DISK_FULL_FS))
    with nodestate.edit(p.node(node).state) as st:
        st["faults"]["disk_full"] = False


def _node_pids(p: SimPaths, node: str, rootless: bool) -> set[int]:
    pids = set(nx.pids_under(p.root, node=node))
    if not rootless and nx.netns_exists(netns_name(node)):
        pids |= set(nx.ns_pids(netns_name(node)))
    return pids


def kill_engines(root: Path, node: str) -> list[int]:
    """SIGKILL every process of the node except sshd (listener and sessions).

    Memory the killed engines held moves to ``leaked_mem_gib`` on a leaky kernel
    (1031) or with the ``leak_on_death`` fault: not returned until a reboot.
    """
    p, spec, rootless = _ctx(root)
    _find_node(spec, node)
    with _root_lock(p):
        victims = {pid for pid in _node_pids(p, node, rootless) if nx.pid_comm(pid) != "sshd"}
        killed = nx.kill_pids(victims)
        with nodestate.edit(p.node(node).state) as st:
            nodestate.settle(st)
    return killed


def warm_reboot(root: Path, node: str, *, ready_timeout_s: float = 20.0) -> None:
    """Reboot one node: every process dies, sshd comes back, boot state resets.

    New boot_id and boot_time; clock lock, engine memory and leaked memory
    cleared; wedge fault cleared; cable ends back to the spec's MTU and up;
    ip_forward from the node's /etc/sysctl.d (else the spec). Stale links STAY
    stale: only a power cycle of both ends clears them. A management port taken
    down by :func:`unreachable` stays down (it is the switch side).
    """
    _reboot(root, [node], power=False, ready_timeout_s=ready_timeout_s)


def reboot(root: Path, nodes: list[str], *, ready_timeout_s: float = 20.0,
           late: dict[str, float] | None = None) -> None:
    """Warm-reboot several nodes at once (a whole ring): all go down, then all boot.

    ``late``: {node: simulated seconds}: those nodes stay off that much longer than the
    others (their cables dark meanwhile: sparkctl_sim.clusterlate), then boot.
    """
    _reboot(root, list(nodes), power=False, ready_timeout_s=ready_timeout_s, late=late)


def power_cycle(root: Path, nodes: list[str], *, ready_timeout_s: float = 20.0,
                late: dict[str, float] | None = None) -> None:
    """Power-cycle nodes: a warm reboot, and stale links heal.

    A stale link clears once both of its ends have been power-cycled since it
    went stale, in this call or in earlier ones. ``late`` as for :func:`reboot`.
    """
    _reboot(root, list(nodes), power=True, ready_timeout_s=ready_timeout_s, late=late)


def _reboot(root: Path, nodes: list[str], *, power: bool, ready_timeout_s: float,
            late: dict[str, float] | None = None) -> None:
    from sparkctl_sim import clusterlate

    p, spec, rootless = _ctx(root)
    targets = [_find_node(spec, n) for n in dict.fromkeys(nodes)]
    late = dict(late or {})
    if late:
        _need_root_mode(rootless, "a late boot")
        unknown = set(late) - {n.name for n in targets}
        if unknown:
            raise SimError(f"late boot of {', '.join(sorted(unknown))}: not among the nodes rebooted",
                           "name them in the node list too")
    with _root_lock(p):
        for n in targets:  # a full disk's data goes back to the node's own dir first
            if not rootless and _sshd_pid(p, n.name) is not None:
                _disk_ok_locked(p, n.name)
        for n in targets:  # every node goes down before any comes back
            nx.kill_pids(_node_pids(p, n.name, rootless), grace_s=0.5)
        healed: dict[str, list[str]] = {}
        if power:
            healed = _heal_stale(p, spec, {n.name for n in targets})
        for name in late:  # off for longer: no light on its cables
            clusterlate.cables_dark(spec, name)
        early = [n for n in targets if n.name not in late]
        for n in early:
            _power_on(p, spec, n, healed, rootless)
        if not rootless:
            # neighbours not rebooted: a port whose carrier came back (this node was powered
            # off) or went (a late node's cables are dark) is configured or dropped by networkd
            clusterlate.carrier_changed(p, spec, [q for q in clusterlate.peers(spec, [n.name for n in targets])
                                                  if _sshd_pid(p, q) is not None or not spec.fresh])
        _boot_userspace(p, spec, early, rootless, ready_timeout_s)
        for name, pause_s in clusterlate.order(late):
            clusterlate.wait(pause_s)
            n = _find_node(spec, name)
            _power_on(p, spec, n, healed, rootless)
            # its cables light up: the running neighbours' networkd configures their ports
            clusterlate.carrier_changed(p, spec, [peer for peer in clusterlate.peers(spec, [name])
                                                  if peer not in late or _sshd_pid(p, peer) is not None])
            _boot_userspace(p, spec, [n], rootless, ready_timeout_s)


def power_off(root: Path, nodes: list[str]) -> None:
    """Switch nodes off until :func:`power_cycle` or :func:`reboot` boots them.

    Every process dies, the management port goes dark (SSH times out, as to a box that is
    off), and so do the node's cables: its neighbours' fabric ports lose carrier and their
    networkd drops their addresses (sparkctl_sim.clusterlate).
    """
    from sparkctl_sim import clusterlate

    p, spec, rootless = _ctx(root)
    _need_root_mode(rootless, "power_off")
    targets = [_find_node(spec, n) for n in dict.fromkeys(nodes)]
    with _root_lock(p):
        for n in targets:
            if _sshd_pid(p, n.name) is not None:
                _disk_ok_locked(p, n.name)
            nx.kill_pids(_node_pids(p, n.name, rootless), grace_s=0.5)
            with nodestate.edit(p.node(n.name).state) as st:
                st["faults"]["powered_off"] = True
                st["faults"]["unreachable"] = True
            nx.ip(None, "link", "set", host_veth_name(n.name), "down")
            clusterlate.cables_dark(spec, n.name)
        clusterlate.carrier_changed(p, spec, clusterlate.peers(spec, [n.name for n in targets]))


def _power_on(p: SimPaths, spec: ClusterSpec, n: SimNode, healed: dict[str, list[str]], rootless: bool) -> None:
    """A node's boot up to its network: new boot id, state reset, cable ends up."""
    with nodestate.edit(p.node(n.name).state) as st:
        st["boot_id"] = str(uuid.uuid4())
        st["boot_time"] = time.time()
        st["gpu"]["clock_lock_mhz"] = None
        st["engine_mem_gib"] = {}
        st["leaked_mem_gib"] = 0.0
        st["faults"]["wedged"] = False
        st["faults"]["sshd_stopped"] = False
        # a box hung by an over-commit (sparkctl_sim.overcommit) answers again after a
        # reboot: its port was down because the box was, not the switch side
        relive = bool(st["faults"].pop("livelocked", False))
        relive = bool(st["faults"].pop("powered_off", False)) or relive  # sparkctl_sim.clusterfaults.power_off
        if relive:
            st["faults"]["unreachable"] = False
        for ifname in healed.get(n.name, []):
            st["links"][ifname]["stale"] = False
    if not rootless:
        if relive:
            nx.ip(None, "link", "set", host_veth_name(n.name), "up")
        _apply_node_net(p, spec, n)
        for node in _with_peers(spec, [n.name]):
            _write_sysfs(p, node)
    _hook(lambda m: None, "sparkctl_sim.procshims", "on_boot", p.node(n.name).run, missing_ok=True)


def _boot_userspace(p: SimPaths, spec: ClusterSpec, nodes: list[SimNode], rootless: bool,
                    ready_timeout_s: float) -> None:
    """sshd, then the node's init (sysctl.d, netplan, dockerd, enabled units); wait for sshd."""
    if not rootless and not spec.fresh:
        # every end of these nodes is up now: a port whose neighbour came up after it in the
        # loop above has carrier only now (sparkctl_sim.clusterboot.spec_carrier_sync)
        from sparkctl_sim.clusterboot import spec_carrier_sync

        for n in nodes:
            spec_carrier_sync(spec, n.name)
            _write_sysfs(p, n.name)
    for n in nodes:
        _ensure_sshd(p, spec, n, rootless)
    if not rootless:
        for n in nodes:
            boot_init(p, spec, n)
    _wait_reachable(spec, [n.name for n in nodes if not _faults(p, n.name).get("unreachable")],
                    ready_timeout_s)


def _heal_stale(p: SimPaths, spec: ClusterSpec, cycled: set[str]) -> dict[str, list[str]]:
    """Record which ends were power-cycled; return {node: [ifname]} whose link healed."""
    stale = _read_json(p.stale) or {}
    healed: dict[str, list[str]] = {}
    for lk in spec.links:
        entry = stale.get(link_id(lk))
        if entry is None:
            continue
        seen = set(entry.get("cycled", [])) | (cycled & {lk.a_node, lk.b_node})
        if {lk.a_node, lk.b_node} <= seen:
            del stale[link_id(lk)]
            healed.setdefault(lk.a_node, []).append(lk.a_ifname)
            healed.setdefault(lk.b_node, []).append(lk.b_ifname)
        else:
            entry["cycled"] = sorted(seen)
    _write_json(p.stale, stale)
    # The ends on nodes NOT in this call also heal, in their own state files.
    for node, ifnames in healed.items():
        if node not in cycled:
            with nodestate.edit(p.node(node).state) as st:
                for ifname in ifnames:
                    st["links"][ifname]["stale"] = False
    return healed


def _parse_value(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return yaml.safe_load(value) if value.strip() else ""


def set_state(root: Path, node: str, key: str, value: Any, *, allow_new: bool = False) -> Any:
    """Set a dotted key in the node's state (``gpu.clock_lock_mhz``, ``page_size``...).

    A string value is parsed as a JSON/YAML scalar or list (``null``, ``65536``,
    ``[]``, ``6.17.0-1031-nvidia``). Unknown keys are errors unless ``allow_new``.
    Returns the value stored.
    """
    p, spec, _rootless = _ctx(root)
    _find_node(spec, node)
    parsed = _parse_value(value)
    parts = key.split(".")
    with _root_lock(p), nodestate.edit(p.node(node).state) as st:
        cur: Any = st
        for i, part in enumerate(parts[:-1]):
            if not isinstance(cur, dict) or part not in cur:
                raise SimError(f"{node}: no state key {'.'.join(parts[:i + 1])!r}",
                               "keys: " + ", ".join(sorted(cur)) if isinstance(cur, dict) else "")
            cur = cur[part]
        if not isinstance(cur, dict) or (parts[-1] not in cur and not allow_new):
            raise SimError(f"{node}: no state key {key!r}",
                           ("keys here: " + ", ".join(sorted(cur))) if isinstance(cur, dict) else "")
        cur[parts[-1]] = parsed
    if not _rootless:
        _write_sysfs(p, node)  # GID tables and port rates follow the state
    return parsed
