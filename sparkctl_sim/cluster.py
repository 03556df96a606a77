"""The simulated DGX Spark cluster: namespaces, cables, sshd per node, faults.

Owns building, inspecting and tearing down a simulated cluster from a
:class:`~sparkctl_sim.spec.ClusterSpec` under one *sim root* directory, and the
fault and power events that change it. Root mode gives every node a network
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

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import importlib
import ipaddress
import json
import logging
import os
import pwd
import shlex
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl_sim import netns as nx
from sparkctl_sim import nodestate
from sparkctl_sim.netns import SimError
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode, SimRoute

__all__ = [
    "SimError", "SimStatus", "NodeStatus", "LinkStatus", "up", "down", "status", "load_spec",
    "ssh_argv", "link_down", "link_up", "set_mtu", "set_forwarding", "stale_link", "stop_sshd",
    "start_sshd", "unreachable", "reachable", "kill_engines", "warm_reboot", "power_cycle",
    "disk_full", "disk_ok",
    "set_state", "PRIVATE_DIRS", "MGMT_IFNAME",
]

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


def _spec_to_json(spec: ClusterSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def _spec_from_json(data: dict[str, Any]) -> ClusterSpec:
    rest = {k: v for k, v in data.items() if k not in ("nodes", "links", "routes")}
    return ClusterSpec(
        nodes=tuple(SimNode(**n) for n in data["nodes"]),
        links=tuple(SimLink(**lk) for lk in data["links"]),
        routes=tuple(SimRoute(**r) for r in data.get("routes", ())),
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
    for r in spec.routes:
        if r.node not in names or (r.node, r.dev) not in ends:
            raise SimError(f"route {r}: unknown node or device")


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
        meta = {"format": FORMAT, "mode": mode, "spec": _spec_to_json(spec),
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
            say(f"network: bridge {spec.bridge}, {len(spec.nodes)} namespaces, {len(spec.links)} cables")
            _converge_network(p, spec)
        if not rootless:
            for node in spec.nodes:
                _write_sysfs(p, node.name)
        _write_known_hosts(p, spec)
        for node in spec.nodes:
            if _ensure_sshd(p, spec, node, rootless):
                say(f"{node.name}: sshd started on {node.mgmt_ip}:{node.ssh_port}")
            with nodestate.edit(p.node(node.name).state) as st:
                st["faults"]["sshd_stopped"] = False
                st["faults"]["unreachable"] = False
        _wait_reachable(spec, [n.name for n in spec.nodes], ready_timeout_s)
        say("all nodes accept SSH")
    return status(root)


def _check_no_other_sim(p: SimPaths, spec: ClusterSpec) -> None:
    """Refuse namespaces or a bridge that a live sim under another root owns."""
    wanted = {netns_name(n.name) for n in spec.nodes}
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


def _ssh_user(rootless: bool) -> str:
    return "root" if not rootless else pwd.getpwuid(os.geteuid()).pw_name


def _operator_key(p: SimPaths) -> None:
    if p.key.exists() and p.pubkey.exists():
        return
    p.key.unlink(missing_ok=True)
    p.pubkey.unlink(missing_ok=True)
    nx.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", "sparkctl-sim-operator", "-f", str(p.key)])


def _node_links(spec: ClusterSpec, node: str) -> list[tuple[str, str, str, str]]:
    """(ifname, cidr, peer_node, peer_ifname) for every cable end on ``node``."""
    out = []
    for lk in spec.links:
        if lk.a_node == node:
            out.append((lk.a_ifname, lk.a_cidr, lk.b_node, lk.b_ifname))
        if lk.b_node == node:
            out.append((lk.b_ifname, lk.b_cidr, lk.a_node, lk.a_ifname))
    return out


def _prepare_node(p: SimPaths, spec: ClusterSpec, node: SimNode, rootless: bool) -> None:
    nd = p.node(node.name)
    # What the node's disk holds at first: the image's top dirs (an empty upper dir each),
    # the operator's model store; nothing of sparkctl's (the overlay hides the machine's).
    for d in (nd.dir, nd.run, nd.sysfs / "class" / "infiniband", nd.sysclass_stage,
              *(nd.private(t) for t in (*OVERLAY_DIRS, *BIND_DIRS)),
              *(nd.dir / "ovl-work" / _ovl_name(t) for t in OVERLAY_DIRS)):
        d.mkdir(parents=True, exist_ok=True)
    if rootless:  # no overlay: the prefix dir plays the image (its /etc/systemd/system etc.)
        for t in ("/etc/systemd/system", "/etc/netplan", "/etc/sysctl.d"):
            nd.private(t).mkdir(parents=True, exist_ok=True)
    if not nd.host_key.exists() or not nd.host_key.with_suffix(".pub").exists():
        nd.host_key.unlink(missing_ok=True)
        nd.host_key.with_suffix(".pub").unlink(missing_ok=True)
        nx.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", f"root@{node.name}",
                "-f", str(nd.host_key)])
    cabled = {ifname for ifname, *_ in _node_links(spec, node.name)}
    if not nd.state.exists():
        st = nodestate.default_state(node.name)
        st["kernel_release"] = node.kernel_release
        st["boot_time"] = time.time()
        nodestate.create(nd.state, st)
    with nodestate.edit(nd.state) as st:
        if st.get("boot_time") is None:
            st["boot_time"] = time.time()
        for ifname in cabled:
            st["links"].setdefault(ifname, {"speed_mbps": 200000, "stale": False, "cabled": True})
        for ifname, entry in st["links"].items():
            entry["cabled"] = ifname in cabled
    if not (nd.dir / "meminfo").exists() or not (nd.dir / "boot_id").exists():
        nodestate.save(nd.state, nodestate.load(nd.state))
    nd.home_rc.write_text(
        "# ~/.bashrc of a simulated Spark node (sparkctl sim): kept free of PATH edits so the\n"
        "# session PATH set by sshd's SetEnv (tool shims first) survives non-interactive shells.\n")
    if rootless:
        (p.root / "session.sh").write_text(SESSION_WRAPPER)
    nd.sshd_config.write_text(_sshd_config(p, node, rootless))


def _ovl_name(target: str) -> str:
    return target.strip("/").replace("/", "-")


def session_env(p: SimPaths, node: SimNode, rootless: bool = False) -> dict[str, str]:
    """The environment every SSH session on ``node`` gets (sshd SetEnv)."""
    nd = p.node(node.name)
    # The node's root as the inventory's `prefix:` has it: "/" in its own mount
    # namespace, its fs dir when rootless (sparkctl_sim.topology writes the same).
    prefix = str(nd.fs) if rootless else "/"
    return {
        "PATH": f"{p.bin}:{SESSION_BASE_PATH}",
        "SPARKCTL_SIM_STATE": str(nd.state),
        "SPARKCTL_SIM_RUN_DIR": str(nd.run),
        "SPARKCTL_SIM_UNIT_DIR": str(nd.private("/etc/systemd/system")) if rootless else "/etc/systemd/system",
        PREFIX_ENV: prefix,
        "SPARKCTL_SIM_NODE": node.name,
        "PYTHONPATH": str(p.pkgs),
    }


# Rootless mode has no mount namespace to hide the login user's ~/.bashrc, which
# bash sources even for `ssh host cmd` and which often prepends to PATH (pyenv,
# cargo). sshd runs this via ForceCommand: it restores the SetEnv PATH and runs
# the client's command in a bash that reads no startup files.
SESSION_WRAPPER = """#!/bin/sh
# sparkctl sim (rootless): keep the session PATH from sshd's SetEnv (shims first).
PATH="$SPARKCTL_SIM_PATH"
export PATH
shell=/bin/bash
[ -x "$shell" ] || shell=/bin/sh
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then
    exec "$shell" -i
fi
if [ "$shell" = /bin/bash ]; then
    exec "$shell" --norc --noprofile -c "$SSH_ORIGINAL_COMMAND"
fi
exec "$shell" -c "$SSH_ORIGINAL_COMMAND"
"""


def _sshd_config(p: SimPaths, node: SimNode, rootless: bool) -> str:
    nd = p.node(node.name)
    env = session_env(p, node, rootless)
    if rootless:
        env["SPARKCTL_SIM_PATH"] = env["PATH"]
    setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
    extra = [f"ForceCommand /bin/sh {p.root / 'session.sh'}"] if rootless else []
    return "\n".join([
        f"# sparkctl sim: sshd of simulated node {node.name} (SIMULATION ONLY)",
        f"Port {node.ssh_port}",
        # Root mode: the node's own namespace, so every address it holds, the fabric
        # ones included (a supervisor on the head reaches its peers over the fabric).
        f"ListenAddress {node.mgmt_ip if rootless else '0.0.0.0'}:{node.ssh_port}",
        f'HostKey "{nd.host_key}"',
        f'PidFile "{nd.pidfile}"',
        # The operator's key, and keys sparkctl authorizes on the node itself (the
        # switch supervisor's); the second file stands in for ~/.ssh/authorized_keys.
        f'AuthorizedKeysFile "{p.pubkey}" "{nd.private("/etc/sparkctl") / "authorized_keys"}"',
        "StrictModes no",  # keys live outside a home directory
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "MaxStartups 64:30:128",  # sparkctl fans out many sessions at once
        "MaxSessions 64",
        # a path, not internal-sftp: under ForceCommand (rootless) the wrapper execs it
        "Subsystem sftp /usr/lib/openssh/sftp-server",
        # sshd honours only the FIRST SetEnv line: every variable goes on this one.
        # SetEnv overrides sshd's default PATH (verified by tests/sim/test_cluster.py).
        f"SetEnv {setenv}",
        *extra,
        "",
    ])


def _install_tools(p: SimPaths, say: Progress) -> None:
    from sparkctl_sim.engine import install_engines
    from sparkctl_sim.procshims import install_procshims
    from sparkctl_sim.shims import install_shims

    p.bin.mkdir(parents=True, exist_ok=True)
    p.pkgs.mkdir(parents=True, exist_ok=True)
    install_shims(p.bin)
    install_engines(p.bin, p.pkgs)
    install_procshims(p.bin)
    # The node's python3 is this machine's interpreter (it has llama-cpp-python for
    # the tiny real engine); a real Spark has its own.
    py = p.bin / "python3"
    py.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    py.chmod(0o755)
    say("tools installed: GB10 shims, simulated engines, docker/systemctl shims, python3")


_MISSING = object()


def _hook(say: Progress, module: str, func: str, *args: Any, missing_ok: bool = False) -> Any:
    """Call an optional function of a sibling sim module; skip it if absent.

    Returns ``_MISSING`` when the module or function does not exist (logged
    unless ``missing_ok``), else what the function returned.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if exc.name not in (module, module.rsplit(".", 1)[0]):
            log.warning("optional hook %s.%s skipped: %s", module, func, exc)
        elif not missing_ok:
            log.info("optional hook %s.%s skipped: module not present", module, func)
        return _MISSING
    fn = getattr(mod, func, None)
    if fn is None:
        if not missing_ok:
            log.info("optional hook %s.%s skipped: no such function", module, func)
        return _MISSING
    say(f"hook {module}.{func}")
    return fn(*args)


def _write_sysfs(p: SimPaths, node: str) -> None:
    """Refresh the node's simulated /sys/class/infiniband from its live netdevs."""
    try:
        from sparkctl_sim.shims import Netdev  # noqa: PLC0415 - optional sibling module
    except ImportError:
        log.info("sysfs hook skipped: sparkctl_sim.shims not present")
        return
    ns = netns_name(node)
    if not nx.netns_exists(ns):
        return
    netdevs = {}
    for e in nx.links(ns):
        ipv4 = tuple((a["local"], int(a.get("prefixlen", 32))) for a in e.get("addr_info", [])
                     if a.get("family") == "inet")
        netdevs[e["ifname"]] = Netdev(name=e["ifname"], operstate=str(e.get("operstate", "unknown")).lower(),
                                      mtu=int(e.get("mtu", 1500)), ipv4=ipv4)
    nd = p.node(node)
    # nd.sysfs plays /sys: the hook writes class/infiniband/... beneath it.
    _hook(lambda m: None, "sparkctl_sim.shims", "write_sysfs_infiniband", nd.sysfs,
          nodestate.load(nd.state), netdevs)


def _ensure_host_dirs() -> None:
    """Create missing mount points for the bind-mounted dirs; remember which we made.

    The record is host-wide (not per root): any sim may have made them, and the
    last :func:`down` (no ``sparkctl-`` namespace left) removes them if empty.
    """
    for target in BIND_DIRS:
        if not Path(target).exists():
            LEDGER_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
            made = set(_read_json(HOST_DIRS_RECORD) or [])
            _write_json(HOST_DIRS_RECORD, sorted(made | {target}))
            Path(target).mkdir(parents=True, exist_ok=True)


def _remove_host_dirs() -> None:
    if any(ns.startswith(nx.NETNS_PREFIX) for ns in nx.netns_list()):
        return  # another sim still runs: its nodes bind-mount over these
    made = _read_json(HOST_DIRS_RECORD) if HOST_DIRS_RECORD.exists() else None
    left = []
    for d in sorted(made or [], reverse=True):
        if d not in PRIVATE_DIRS or not os.path.isdir(d) or os.path.ismount(d):
            continue
        # Mounts of just-killed node namespaces are released a moment after the
        # processes die; until then rmdir says EBUSY.
        for _ in range(40):
            try:
                os.rmdir(d)  # only if still empty
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.info("left host dir %s in place: %s", d, exc)
                    break
                time.sleep(0.05)
        else:
            left.append(d)
    if left:
        _write_json(HOST_DIRS_RECORD, left)
    else:
        HOST_DIRS_RECORD.unlink(missing_ok=True)


def _write_known_hosts(p: SimPaths, spec: ClusterSpec) -> None:
    lines = []
    for node in spec.nodes:
        pub = p.node(node.name).host_key.with_suffix(".pub").read_text().split()
        pats = [f"[{node.mgmt_ip}]:{node.ssh_port}", node.mgmt_ip]
        lines.append(f"{','.join(pats)} {pub[0]} {pub[1]}")
    p.known_hosts.write_text("\n".join(lines) + "\n")


# --- network (root mode) -------------------------------------------------------


def _converge_network(p: SimPaths, spec: ClusterSpec) -> None:
    _ensure_bridge(p, spec)
    for node in spec.nodes:
        _ensure_netns(p, node)
        _ensure_mgmt(p, spec, node, admin_up=True)
    for lk in spec.links:
        _ensure_cable(lk)
    for node in spec.nodes:
        _apply_node_net(p, spec, node)


def _ensure_bridge(p: SimPaths, spec: ClusterSpec) -> None:
    br = spec.bridge
    existing = nx.link_info(br)
    if existing is not None:
        detail = [e for e in nx.links(None, details=True) if e.get("ifname") == br]
        if not detail or detail[0].get("ifalias") != nx.LINK_ALIAS:
            raise SimError(f"host link {br!r} exists and was not created by the sim",
                           "pick another ClusterSpec.bridge name")
    else:
        _ledger_add(p, "bridge", br)
        nx.ip(None, "link", "add", br, "type", "bridge")
        nx.ip(None, "link", "set", br, "alias", nx.LINK_ALIAS)
    nx.ip(None, "addr", "replace", spec.mgmt_cidr, "dev", br)
    nx.ip(None, "link", "set", br, "up")


def _ensure_netns(p: SimPaths, node: SimNode) -> None:
    ns = netns_name(node.name)
    _ledger_add(p, "namespaces", ns)
    nx.netns_add(ns)


def _ensure_mgmt(p: SimPaths, spec: ClusterSpec, node: SimNode, *, admin_up: bool) -> None:
    ns, hv = netns_name(node.name), host_veth_name(node.name)
    inner, outer = nx.link_info(MGMT_IFNAME, ns), nx.link_info(hv)
    if inner is None or outer is None:
        if inner is not None:
            nx.ip(ns, "link", "delete", MGMT_IFNAME)
        if outer is not None:
            nx.host_link_delete(hv)
        _ledger_add(p, "host_veths", hv)
        nx.run(["ip", "link", "add", hv, "type", "veth", "peer", "name", MGMT_IFNAME, "netns", ns])
        nx.ip(None, "link", "set", hv, "alias", nx.LINK_ALIAS)
    prefix = ipaddress.ip_interface(spec.mgmt_cidr).network.prefixlen
    nx.ip(None, "link", "set", hv, "master", spec.bridge)
    nx.ip(ns, "addr", "replace", f"{node.mgmt_ip}/{prefix}", "dev", MGMT_IFNAME)
    nx.ip(ns, "link", "set", MGMT_IFNAME, "up")
    nx.ip(None, "link", "set", hv, "up" if admin_up else "down")
    mac = (nx.link_info(MGMT_IFNAME, ns) or {}).get("address")
    if mac:
        # A permanent neighbour entry: with the port down, SYNs are sent and lost
        # (SSH times out, as with a dead host) instead of failing fast on ARP.
        nx.ip(None, "neigh", "replace", node.mgmt_ip, "lladdr", mac, "dev", spec.bridge, "nud", "permanent")


def _ensure_cable(lk: SimLink) -> None:
    nsa, nsb = netns_name(lk.a_node), netns_name(lk.b_node)
    a, b = nx.link_info(lk.a_ifname, nsa), nx.link_info(lk.b_ifname, nsb)
    if a is not None and b is not None:
        return
    if a is not None:
        nx.ip(nsa, "link", "delete", lk.a_ifname)
    if b is not None:
        nx.ip(nsb, "link", "delete", lk.b_ifname)
    nx.run(["ip", "link", "add", lk.a_ifname, "netns", nsa, "type", "veth",
            "peer", "name", lk.b_ifname, "netns", nsb])


def _apply_node_net(p: SimPaths, spec: ClusterSpec, node: SimNode) -> None:
    """Bring the node's cable ends to the spec: MTU, address, up; routes; ip_forward."""
    ns = netns_name(node.name)
    mtus = {}
    for lk in spec.links:
        if lk.a_node == node.name:
            mtus[lk.a_ifname] = lk.mtu
        if lk.b_node == node.name:
            mtus[lk.b_ifname] = lk.mtu
    for ifname, cidr, _peer, _pif in _node_links(spec, node.name):
        nx.ip(ns, "link", "set", ifname, "mtu", str(mtus[ifname]))
        nx.ip(ns, "addr", "replace", cidr, "dev", ifname)
        nx.ip(ns, "link", "set", ifname, "up")
    for r in spec.routes:
        if r.node == node.name:
            nx.ip(ns, "route", "replace", r.dst_cidr, "via", r.via, "dev", r.dev)
    forward = _sysctl_d_forward(p, node.name)
    nx.ns_exec_write(ns, "/proc/sys/net/ipv4/ip_forward",
                     "1" if (node.ip_forward if forward is None else forward) else "0")


def _sysctl_d_forward(p: SimPaths, node: str) -> bool | None:
    """net.ipv4.ip_forward as the node's private /etc/sysctl.d would set it at boot."""
    value = None
    d = p.node(node).private("/etc/sysctl.d")
    for f in sorted(d.glob("*.conf")) if d.is_dir() else []:
        for line in f.read_text(errors="replace").splitlines():
            key, sep, val = line.partition("=")
            if sep and key.strip().lstrip("-").replace("/", ".") == "net.ipv4.ip_forward":
                value = val.strip() == "1"
    return value


# --- sshd ---------------------------------------------------------------------


def _sshd_pid(p: SimPaths, node: str) -> int | None:
    nd = p.node(node)
    pid = nx.read_pidfile(nd.pidfile)
    if pid is None or not nx.pid_alive(pid):
        return None
    if nx.pid_comm(pid) != "sshd" or str(nd.sshd_config) not in nx.pid_cmdline(pid):
        return None  # a reused pid
    return pid


def _boot_script(p: SimPaths, node: SimNode, user: str) -> str:
    """What runs inside the node's fresh mount+UTS namespace before sshd."""
    nd = p.node(node.name)
    q = shlex.quote
    lines = [
        "set -e",
        f"hostname {q(node.name)}",
        f"mount --bind {q(str(nd.dir / 'meminfo'))} /proc/meminfo",
        f"mount --bind {q(str(nd.dir / 'boot_id'))} /proc/sys/kernel/random/boot_id",
    ]
    for target in OVERLAY_DIRS:
        work = nd.dir / "ovl-work" / _ovl_name(target)
        lines.append(f"mount -t overlay sparkctl-node -o lowerdir={q(target)},upperdir={q(str(nd.private(target)))},"
                     f"workdir={q(str(work))} {q(target)}")
    for target in SPARKCTL_PATHS:
        # First boot only: the upper dir has neither the dir sparkctl made nor the whiteout
        # left by an earlier boot. rm inside an overlay only whiteouts: this machine keeps it.
        upper = q(str(nd.private(target)))
        lines.append(f'if [ -d {q(target)} ] && [ ! -e {upper} ] && [ ! -L {upper} ] && '
                     f'[ "$(findmnt -n -o FSTYPE --target {q(target)})" = overlay ]; then rm -rf {q(target)}; fi')
    for target in BIND_DIRS:
        lines.append(f"mount --bind {q(str(nd.private(target)))} {q(target)}")
    home_rc = Path(pwd.getpwnam(user).pw_dir) / ".bashrc"
    if home_rc.is_file():
        lines.append(f"mount --bind {q(str(nd.home_rc))} {q(str(home_rc))}")
    # sysfs refuses mkdir: put a tmpfs over /sys/class, bind the namespace's real
    # class dirs back into it, then add the node's simulated infiniband class.
    stage = q(str(nd.sysclass_stage))
    lines += [
        f"mount --bind /sys/class {stage}",
        "mount -t tmpfs -o mode=0755 sparkctl-sysclass /sys/class",
        f'for d in {stage}/*; do n="${{d##*/}}"; mkdir -p "/sys/class/$n"; mount --bind "$d" "/sys/class/$n"; done',
        f"umount {stage}",
        "mkdir -p /sys/class/infiniband",
        f"mount --bind {q(str(nd.sysfs / 'class' / 'infiniband'))} /sys/class/infiniband",
        f"exec {SSHD} -D -f {q(str(nd.sshd_config))} -E {q(str(nd.sshd_log))}",
    ]
    return "\n".join(lines)


def _ensure_sshd(p: SimPaths, spec: ClusterSpec, node: SimNode, rootless: bool) -> bool:
    """Start the node's sshd unless it already runs; True when started."""
    if _sshd_pid(p, node.name) is not None:
        return False
    nd = p.node(node.name)
    nd.pidfile.unlink(missing_ok=True)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    nx.run([SSHD, "-t", "-f", str(nd.sshd_config)])  # config errors surface here, not in a log
    if rootless:
        argv = [SSHD, "-D", "-f", str(nd.sshd_config), "-E", str(nd.sshd_log)]
    else:
        ns = netns_name(node.name)
        if not nx.netns_exists(ns):
            raise SimError(f"{node.name}: namespace {ns} is missing", "run `sparkctl sim up`")
        script = _boot_script(p, node, _ssh_user(False))
        argv = ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private",
                "sh", "-c", script]
    nx.spawn_detached(argv, nd.boot_log)
    deadline = time.monotonic() + SSHD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _sshd_pid(p, node.name) is not None:
            return True
        time.sleep(0.05)
    tail = nd.boot_log.read_text(errors="replace")[-400:] if nd.boot_log.exists() else ""
    tail += nd.sshd_log.read_text(errors="replace")[-400:] if nd.sshd_log.exists() else ""
    raise SimError(f"{node.name}: sshd did not start within {SSHD_START_TIMEOUT_S:.0f} s: {tail.strip()}",
                   f"see {nd.boot_log} and {nd.sshd_log}")


def _tcp_ok(ip_addr: str, port: int, timeout_s: float = TCP_PROBE_TIMEOUT_S) -> bool:
    try:
        with socket.create_connection((ip_addr, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _wait_reachable(spec: ClusterSpec, names: list[str], timeout_s: float) -> None:
    nodes = [n for n in spec.nodes if n.name in names]
    deadline = time.monotonic() + timeout_s
    pending = list(nodes)
    while pending:
        pending = [n for n in pending if not _tcp_ok(n.mgmt_ip, n.ssh_port, 0.5)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise SimError(f"sshd not reachable within {timeout_s:.0f} s on: "
                           + ", ".join(f"{n.name} ({n.mgmt_ip}:{n.ssh_port})" for n in pending),
                           "see nodes/NODE/sshd.log under the sim root")
        time.sleep(0.1)


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


# ---------------------------------------------------------------------------
# faults and power events


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
        for n in _with_peers(spec, [node]):
            _write_sysfs(p, n)


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
    for node in nodes:
        for _i, _c, peer, _pi in _node_links(spec, node):
            out.setdefault(peer)
    return list(out)


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


def _settle_engine_mem(st: dict[str, Any]) -> None:
    nodestate.settle(st)


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
            _settle_engine_mem(st)
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


def power_cycle(root: Path, nodes: list[str], *, ready_timeout_s: float = 20.0) -> None:
    """Power-cycle nodes: a warm reboot, and stale links heal.

    A stale link clears once both of its ends have been power-cycled since it
    went stale, in this call or in earlier ones.
    """
    _reboot(root, list(nodes), power=True, ready_timeout_s=ready_timeout_s)


def _reboot(root: Path, nodes: list[str], *, power: bool, ready_timeout_s: float) -> None:
    p, spec, rootless = _ctx(root)
    targets = [_find_node(spec, n) for n in dict.fromkeys(nodes)]
    with _root_lock(p):
        for n in targets:  # a full disk's data goes back to the node's own dir first
            if not rootless and _sshd_pid(p, n.name) is not None:
                _disk_ok_locked(p, n.name)
        for n in targets:  # every node goes down before any comes back
            nx.kill_pids(_node_pids(p, n.name, rootless), grace_s=0.5)
        healed: dict[str, list[str]] = {}
        if power:
            healed = _heal_stale(p, spec, {n.name for n in targets})
        for n in targets:
            with nodestate.edit(p.node(n.name).state) as st:
                st["boot_id"] = str(uuid.uuid4())
                st["boot_time"] = time.time()
                st["gpu"]["clock_lock_mhz"] = None
                st["engine_mem_gib"] = {}
                st["leaked_mem_gib"] = 0.0
                st["faults"]["wedged"] = False
                st["faults"]["sshd_stopped"] = False
                for ifname in healed.get(n.name, []):
                    st["links"][ifname]["stale"] = False
            if not rootless:
                _apply_node_net(p, spec, n)
                for node in _with_peers(spec, [n.name]):
                    _write_sysfs(p, node)
            _hook(lambda m: None, "sparkctl_sim.procshims", "on_boot", p.node(n.name).run, missing_ok=True)
        for n in targets:
            _ensure_sshd(p, spec, n, rootless)
        _wait_reachable(spec, [n.name for n in targets if not _faults(p, n.name).get("unreachable")],
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
        import yaml  # noqa: PLC0415 - optional; JSON covers most values
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
