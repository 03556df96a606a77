"""The simulated cluster's root directory and its shared vocabulary.

Owns the sim root's layout (:class:`SimPaths`, :class:`NodePaths`), the names
of host objects (namespaces, host veths, cable ids), the persisted metadata
(``sim.json``, the host-side ledger), the root lock, spec validation, and the
status result types. Every other ``sparkctl_sim.cluster*`` module builds on it.

SIMULATION ONLY.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl_sim import netns as nx
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode, SimRoute, SimSwitchPort

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

MGMT_IFNAME = "enP7s7"  # the Spark's onboard management NIC
# Real paths that sparkctl renders into on a node; each node has its own (disk_full targets).
PRIVATE_DIRS = ("/etc/sparkctl", "/opt/sparkctl", "/var/lib/sparkctl", "/var/log/sparkctl",
                "/etc/systemd/system", "/etc/netplan", "/etc/sysctl.d", "/srv/models")
# Root mode: the machine's own dirs, seen by a node through an overlay whose upper dir is
# the node's (nd.fs/<dir>). A node starts as the image does: /var/log is there,
# /var/log/sparkctl is not, until sparkctl (or a unit's LogsDirectory=) makes it.
OVERLAY_DIRS = ("/etc", "/opt", "/var/lib", "/var/log")
# sparkctl's own paths: never on a DGX OS image. A node hides them at its first boot when
# this machine has them (an older sim made them, or sparkctl runs here), so a node never
# starts with them unless sparkctl created them on that node.
SPARKCTL_PATHS = ("/etc/sparkctl", "/opt/sparkctl", "/var/lib/sparkctl", "/var/log/sparkctl")
# Files of packages this machine has and a fresh DGX OS node has not (Debian's earlyoom:
# the Makefile installs it here for the tests' real-tool checks): hidden at a node's first
# boot like SPARKCTL_PATHS; the node's own (simulated) apt-get puts them back.
HOST_PACKAGE_FILES = ("/etc/default/earlyoom", "/etc/init.d/earlyoom",
                      "/etc/systemd/system/multi-user.target.wants/earlyoom.service")
# The operator's model store (written from this machine by `sim up` and the weights tests):
# a plain bind mount, which stays coherent with writes from outside (an overlay does not).
BIND_DIRS = ("/srv/models",)
PREFIX_ENV = "SPARKCTL_SIM_PREFIX"  # the node's root for the process shims (procshims.PREFIX_ENV)
SESSION_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SSHD = "/usr/sbin/sshd"
LEDGER_DIR = Path("/run/sparkctl-sim")  # survives a deleted sim root; cleared by a host reboot
HOST_DIRS_RECORD = LEDGER_DIR / "host-dirs.json"  # mount points the sim created on the host
SSHD_START_TIMEOUT_S = 10.0
TCP_PROBE_TIMEOUT_S = 1.0
FORMAT = 1

ROOTLESS_LIMITATIONS = (
    "hostname: every node reports the host's hostname (no UTS namespace)",
    "/proc/meminfo and /proc/sys/kernel/random/boot_id are the host's (no mount namespace); "
    "read the simulated values from SPARKCTL_SIM_STATE",
    "/sys/class/infiniband and /sys/class/net are the host's (no sysfs view)",
    "rendered files under /etc/sparkctl, /etc/systemd/system, /etc/netplan, ... are not private per node",
    "fabric links are not simulated: no veth cables, so link_down/link_up/set_mtu/unreachable "
    "are unavailable and every fabric address is reachable directly over lo",
    "relay routing and ip_forward are not simulated (127/8 routes via lo)",
    "sessions run through a ForceCommand wrapper: commands run in `bash --norc --noprofile` "
    "(the login user's ~/.bashrc is skipped so the shims stay first on PATH)",
)



# ---------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class LinkStatus:
    ifname: str
    peer: str  # "node:ifname" at the other end of the cable
    cidr: str
    exists: bool
    admin_up: bool
    oper_up: bool  # carrier: both ends admin up
    mtu: int | None
    stale: bool


@dataclass(frozen=True)
class NodeStatus:
    name: str
    mgmt_ip: str
    ssh_port: int
    netns: str | None  # None in rootless mode
    netns_exists: bool
    sshd_pid: int | None
    sshd_alive: bool
    ssh_reachable: bool  # TCP connect within 1 s
    mgmt_up: bool | None  # the host-side management port; None in rootless mode
    boot_id: str | None
    state_path: Path
    links: tuple[LinkStatus, ...]


@dataclass(frozen=True)
class SimStatus:
    root: Path
    mode: str  # "root", "rootless", or "absent" when nothing is set up
    ssh_user: str
    ssh_key: Path
    known_hosts: Path
    nodes: tuple[NodeStatus, ...]
    limitations: tuple[str, ...]

    @property
    def all_reachable(self) -> bool:
        return bool(self.nodes) and all(n.ssh_reachable for n in self.nodes)

    def node(self, name: str) -> NodeStatus:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


# ---------------------------------------------------------------------------
# paths


@dataclass(frozen=True)
class NodePaths:
    dir: Path

    state = property(lambda self: self.dir / "state.json")
    host_key = property(lambda self: self.dir / "ssh_host_ed25519_key")
    sshd_config = property(lambda self: self.dir / "sshd_config")
    pidfile = property(lambda self: self.dir / "sshd.pid")
    sshd_log = property(lambda self: self.dir / "sshd.log")
    boot_log = property(lambda self: self.dir / "boot.log")
    fs = property(lambda self: self.dir / "fs")
    home_rc = property(lambda self: self.dir / "fs" / "home.bashrc")
    sysfs = property(lambda self: self.dir / "sysfs")
    run = property(lambda self: self.dir / "run")
    sysclass_stage = property(lambda self: self.dir / ".sysclass")
    cgroup = property(lambda self: self.dir / "cgroup")  # a cgroup2 mount inside the node
    procs = property(lambda self: self.dir / "procs")  # -> its cgroup.procs (sparkctl_sim.netns.node_cgroup)

    def private(self, target: str) -> Path:
        return self.fs / target.lstrip("/")


@dataclass(frozen=True)
class SimPaths:
    root: Path

    bin = property(lambda self: self.root / "bin")
    pkgs = property(lambda self: self.root / "pkgs")
    key = property(lambda self: self.root / "id_ed25519")
    pubkey = property(lambda self: self.root / "id_ed25519.pub")
    known_hosts = property(lambda self: self.root / "known_hosts")
    meta = property(lambda self: self.root / "sim.json")
    stale = property(lambda self: self.root / "stale.json")
    lock = property(lambda self: self.root / ".lock")

    def node(self, name: str) -> NodePaths:
        return NodePaths(self.root / "nodes" / name)

    @property
    def ledger(self) -> Path:
        return LEDGER_DIR / (hashlib.sha256(str(self.root).encode()).hexdigest()[:16] + ".json")


def _norm(root: Path | str) -> Path:
    return Path(os.path.realpath(os.fspath(root)))


def netns_name(node: str) -> str:
    return nx.NETNS_PREFIX + node


def host_veth_name(node: str) -> str:
    return nx.HOST_VETH_PREFIX + hashlib.sha1(node.encode()).hexdigest()[:10]


def link_id(link: SimLink) -> str:
    return f"{link.a_node}:{link.a_ifname}={link.b_node}:{link.b_ifname}"


# ---------------------------------------------------------------------------
# persisted metadata


def _spec_from_json(data: dict[str, Any]) -> ClusterSpec:
    rest = {k: v for k, v in data.items() if k not in ("nodes", "links", "routes", "switch_ports")}
    return ClusterSpec(
        nodes=tuple(SimNode(**n) for n in data["nodes"]),
        links=tuple(SimLink(**lk) for lk in data["links"]),
        routes=tuple(SimRoute(**r) for r in data.get("routes", ())),
        switch_ports=tuple(SimSwitchPort(**sp) for sp in data.get("switch_ports", ())),
        **rest,
    )


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise SimError(f"{path}: not valid JSON ({exc})", "sparkctl sim down, then up again") from exc


def _load_meta(p: SimPaths) -> dict[str, Any] | None:
    return _read_json(p.meta)


def _require_meta(p: SimPaths) -> dict[str, Any]:
    meta = _load_meta(p)
    if meta is None:
        raise SimError(f"no simulated cluster at {p.root}", "run `sparkctl sim up` first")
    return meta


def load_spec(root: Path | str) -> ClusterSpec:
    """The spec last applied by :func:`up` under ``root``."""
    return _spec_from_json(_require_meta(SimPaths(_norm(root)))["spec"])


def _ledger_add(p: SimPaths, key: str, value: str) -> None:
    """Record a host object before creating it, so a crash can never orphan it."""
    LEDGER_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = _read_json(p.ledger) or {"root": str(p.root)}
    items = data.setdefault(key, [])
    if value not in items:
        items.append(value)
        _write_json(p.ledger, data)


@contextlib.contextmanager
def _root_lock(p: SimPaths) -> Iterator[None]:
    p.root.mkdir(parents=True, exist_ok=True)
    with open(p.lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _say(progress: Progress | None) -> Progress:
    def say(msg: str) -> None:
        log.info("%s", msg)
        if progress is not None:
            progress(msg)
    return say


# ---------------------------------------------------------------------------
# validation


def _validate(spec: ClusterSpec, root: Path, rootless: bool) -> None:
    bad = set(str(root)) & set(" \t\n\"'\\")
    if bad:
        raise SimError(f"sim root {root} contains characters sshd_config cannot carry: {sorted(bad)!r}",
                       "use a path without whitespace, quotes or backslashes")
    names = [n.name for n in spec.nodes]
    if not names:
        raise SimError("the cluster spec has no nodes")
    if len(set(names)) != len(names):
        raise SimError(f"duplicate node names in spec: {names}")
    if not rootless:
        mgmt = ipaddress.ip_interface(spec.mgmt_cidr)
        if len(spec.bridge) > nx.IFNAMSIZ:
            raise SimError(f"bridge name {spec.bridge!r} longer than {nx.IFNAMSIZ} characters")
    ips = set()
    for n in spec.nodes:
        if not n.name or "/" in n.name or n.name.startswith("."):
            raise SimError(f"node name {n.name!r} cannot name a directory")
        addr = ipaddress.ip_address(n.mgmt_ip)
        if n.mgmt_ip in ips:
            raise SimError(f"node {n.name}: management address {n.mgmt_ip} used twice")
        ips.add(n.mgmt_ip)
        if rootless:
            if not addr.is_loopback:
                raise SimError(f"node {n.name}: rootless mode needs a 127/8 mgmt_ip, got {n.mgmt_ip}")
            if os.geteuid() != 0 and n.ssh_port < 1024:
                raise SimError(f"node {n.name}: rootless sshd cannot listen on port {n.ssh_port}",
                               "use an ssh_port of 1024 or more")
        elif addr not in mgmt.network or addr == mgmt.ip:
            raise SimError(f"node {n.name}: mgmt_ip {n.mgmt_ip} not a free address in {spec.mgmt_cidr}")
    ends: set[tuple[str, str]] = set()
    for lk in spec.links:
        for node, ifname, cidr in ((lk.a_node, lk.a_ifname, lk.a_cidr), (lk.b_node, lk.b_ifname, lk.b_cidr)):
            if node not in names:
                raise SimError(f"link {link_id(lk)}: unknown node {node!r}")
            if len(ifname) > nx.IFNAMSIZ or ifname in (MGMT_IFNAME, "lo"):
                raise SimError(f"link {link_id(lk)}: bad interface name {ifname!r}")
            if (node, ifname) in ends:
                raise SimError(f"link {link_id(lk)}: {node}:{ifname} is cabled twice")
            ends.add((node, ifname))
            ipaddress.ip_interface(cidr)
    for sp in spec.switch_ports:
        if sp.node not in names:
            raise SimError(f"switch port {sp.node}:{sp.ifname}: unknown node {sp.node!r}")
        if len(sp.ifname) > nx.IFNAMSIZ or sp.ifname in (MGMT_IFNAME, "lo") or (sp.node, sp.ifname) in ends:
            raise SimError(f"switch port {sp.node}:{sp.ifname}: bad or twice-cabled interface")
        ends.add((sp.node, sp.ifname))
        ipaddress.ip_interface(sp.cidr)
    if spec.switch_ports and rootless:
        raise SimError("a switched cluster needs namespaces and bridges: not simulated in rootless mode",
                       "run the sim as root (sudo)")
    for r in spec.routes:
        if r.node not in names or (r.node, r.dev) not in ends:
            raise SimError(f"route {r}: unknown node or device")




# ---------------------------------------------------------------------------
# context of an operation on an existing sim


def _ctx(root: Path) -> tuple[SimPaths, ClusterSpec, bool]:
    p = SimPaths(_norm(root))
    meta = _require_meta(p)
    return p, _spec_from_json(meta["spec"]), meta["mode"] == "rootless"


def _find_node(spec: ClusterSpec, name: str) -> SimNode:
    for n in spec.nodes:
        if n.name == name:
            return n
    raise SimError(f"unknown node {name!r}", "nodes: " + ", ".join(n.name for n in spec.nodes))


def _need_root_mode(rootless: bool, what: str) -> None:
    if rootless:
        raise SimError(f"{what} is not simulated in rootless mode",
                       "run the sim as root (sudo) for network faults")



SWITCH_PEER = "switch"  # the peer of a switch port in _node_links: not a node (no carrier follows it)


def _node_links(spec: ClusterSpec, node: str) -> list[tuple[str, str, str, str]]:
    """(ifname, cidr, peer_node, peer_ifname) for every cable end on ``node``; a switch port's
    peer is :data:`SWITCH_PEER` and its port group."""
    out = [(sp.ifname, sp.cidr, SWITCH_PEER, sp.group) for sp in spec.switch_ports if sp.node == node]
    for lk in spec.links:
        if lk.a_node == node:
            out.append((lk.a_ifname, lk.a_cidr, lk.b_node, lk.b_ifname))
        if lk.b_node == node:
            out.append((lk.b_ifname, lk.b_cidr, lk.a_node, lk.a_ifname))
    return out

