"""Bringing simulated nodes up: their directories, network, tools and sshd.

Owns what a node is made of when it boots: its private dirs and state file,
the sshd config and the boot script run inside ``unshare --mount --uts``
(overlays, /proc views, sysfs), the tool shims, the host bridge, namespaces,
management veths and veth cables, and waiting until every sshd answers.
:mod:`sparkctl_sim.cluster` calls it for ``up``, :mod:`sparkctl_sim.clusterfaults`
for reboots.

SIMULATION ONLY.
"""

from __future__ import annotations

import errno
import importlib
import ipaddress
import json
import logging
import os
import pwd
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sparkctl_sim import netns as nx
from sparkctl_sim import nodestate
from sparkctl_sim.clusterroot import (
    BIND_DIRS,
    HOST_DIRS_RECORD,
    HOST_PACKAGE_FILES,
    LEDGER_DIR,
    MGMT_IFNAME,
    OVERLAY_DIRS,
    PREFIX_ENV,
    PRIVATE_DIRS,
    SESSION_BASE_PATH,
    SPARKCTL_PATHS,
    SSHD,
    SSHD_START_TIMEOUT_S,
    TCP_PROBE_TIMEOUT_S,
    Progress,
    SimPaths,
    _ledger_add,
    _node_links,
    _read_json,
    _write_json,
    host_veth_name,
    netns_name,
)
from sparkctl_sim.netns import SimError
from sparkctl_sim.shims.ibdev import netdev_mac
from sparkctl_sim.shims.rendered import ensure_views
from sparkctl_sim.spec import ClusterSpec, SimLink, SimNode

log = logging.getLogger(__name__)

FRESH_MTU = 1500  # a netdev's MTU until something configures it (the kernel's Ethernet default)


def _ssh_user(rootless: bool) -> str:
    return "root" if not rootless else pwd.getpwuid(os.geteuid()).pw_name


def _operator_key(p: SimPaths) -> None:
    if p.key.exists() and p.pubkey.exists():
        return
    p.key.unlink(missing_ok=True)
    p.pubkey.unlink(missing_ok=True)
    nx.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", "sparkctl-sim-operator", "-f", str(p.key)])




def _prepare_node(p: SimPaths, spec: ClusterSpec, node: SimNode, rootless: bool) -> None:
    nd = p.node(node.name)
    # What the node's disk holds at first: the image's top dirs (an empty upper dir each),
    # the operator's model store; nothing of sparkctl's (the overlay hides the machine's).
    for d in (nd.dir, nd.run, nd.sysfs / "class" / "infiniband", nd.sysclass_stage, nd.cgroup,
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
        st["network_manager"] = spec.network_manager
        if spec.fresh and spec.dpkg_lock_s > 0:  # a fresh box's first boot: unattended-upgrades runs
            from sparkctl_sim import debpkg

            debpkg.hold_lock_at_first_boot(st, spec.dpkg_lock_s, spec.speedup, st["boot_time"])
        nodestate.create(nd.state, st)
        ensure_views(nd.state)  # the first check's tools answer from their views (sparkctl_sim.shims.rendered)
        # the node's disk as the operator left it before sparkctl came: the playbook's file,
        # NetworkManager's files (written once, at the node's first boot)
        from sparkctl_sim import playbook

        playbook.lay_out(nd.private("/etc/netplan"), spec.playbook, [n.name for n in spec.nodes].index(node.name),
                         spec.network_manager, node.name, cabled)
    with nodestate.edit(nd.state) as st:
        if st.get("boot_time") is None:
            st["boot_time"] = time.time()
        for ifname in cabled:
            st["links"].setdefault(ifname, {"speed_mbps": 200000, "stale": False, "cabled": True})
        for ifname, entry in st["links"].items():
            entry["cabled"] = ifname in cabled
    if not spec.fresh:  # pre-configured: as `fabric apply` leaves it, earlyoom installed and enabled
        from sparkctl_sim import debpkg

        units = nd.private("/etc/systemd/system")
        debpkg.preinstall(str(nd.state), str(nd.fs), str(units), str(units) if rootless else "/etc/systemd/system")
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
    # netplan: the real generator, applied with ip; networkctl, nmcli: its backends (sparkctl_sim.netplansim)
    # (-S: no site; the package's own root on PYTHONPATH instead, as the other shims do)
    root = shlex.quote(str(Path(__file__).resolve().parents[1]))
    for tool in ("netplan", "networkctl", "nmcli"):
        w = p.bin / tool
        w.write_text(f"#!/bin/sh\nPYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
                     f"exec {shlex.quote(sys.executable)} -S -m sparkctl_sim.clusterinit {tool} \"$@\"\n")
        w.chmod(0o755)
    py = p.bin / "python3"
    py.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    py.chmod(0o755)
    say("tools installed: GB10 shims, simulated engines, docker/systemctl/netplan shims, python3")


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
        from sparkctl_sim.shims import Netdev
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
    from sparkctl_sim import switch

    switch.ensure(p, spec)  # a switched cluster's bridges and ports (none on a ring or a pair)
    for node in spec.nodes:
        _apply_node_net(p, spec, node)
    if not spec.fresh:  # a port has carrier once BOTH ends are up: every end is up only now
        for node in spec.nodes:
            spec_carrier_sync(spec, node.name)


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
    # Each end has its NIC's one MAC (shims.ibdev.netdev_mac), whose EUI-64 is both its RoCE
    # link-local GID (ib_core roce_gid_mgmt.c) and its IPv6 link-local address (RFC 4291 app. A).
    nx.run(["ip", "link", "add", lk.a_ifname, "netns", nsa, "address", netdev_mac(lk.a_node, lk.a_ifname),
            "type", "veth", "peer", "name", lk.b_ifname, "netns", nsb, "address", netdev_mac(lk.b_node, lk.b_ifname)])


def _apply_node_net(p: SimPaths, spec: ClusterSpec, node: SimNode) -> None:
    """Bring the node's cable ends to the spec (pre-configured) or to the box (fresh).

    Pre-configured: MTU, address, up; routes; ip_forward. Fresh: every cable end up
    at the kernel's default MTU with no address and no route (the node's netplan, if
    any, is applied by its init: :func:`boot_init`); ip_forward from /etc/sysctl.d.
    """
    ns = netns_name(node.name)
    mtus = {}
    for lk in spec.links:
        if lk.a_node == node.name:
            mtus[lk.a_ifname] = lk.mtu
        if lk.b_node == node.name:
            mtus[lk.b_ifname] = lk.mtu
    mtus.update({sp.ifname: sp.mtu for sp in spec.switch_ports if sp.node == node.name})
    for ifname, cidr, _peer, _pif in _node_links(spec, node.name):
        if spec.fresh:
            nx.ip(ns, "addr", "flush", "dev", ifname)  # the netns outlives a simulated reboot
            nx.ip(ns, "link", "set", ifname, "mtu", str(FRESH_MTU))
        else:
            nx.ip(ns, "link", "set", ifname, "mtu", str(mtus[ifname]))
        nx.ip(ns, "link", "set", ifname, "up")
    if not spec.fresh:
        spec_carrier_sync(spec, node.name)
    forward = _sysctl_d_forward(p, node.name)
    default = node.ip_forward and not spec.fresh
    nx.ns_exec_write(ns, "/proc/sys/net/ipv4/ip_forward",
                     "1" if (default if forward is None else forward) else "0")


def has_carrier(node: str, ifname: str) -> bool:
    """The carrier of one of the node's veth ends: only while both ends are up (a neighbour
    that is off or still booting leaves NO-CARRIER, as an unlit QSFP cable does)."""
    return carrier_of(nx.link_info(ifname, netns_name(node)) or {})


def carrier_of(link: dict[str, Any]) -> bool:
    """Carrier from one ``ip -j link`` entry: ``LOWER_UP``, the carrier bit itself, which the
    kernel sets at once. ``NO-CARRIER`` is iproute2's name for UP without RUNNING, and RUNNING,
    like ``operstate``, follows later from linkwatch (net/core/dev.c ``dev_get_flags``)."""
    flags = link.get("flags") or []
    return "UP" in flags and "LOWER_UP" in flags


def spec_carrier_sync(spec: ClusterSpec, node: str) -> None:
    """A pre-configured node's fabric addresses and routes, as systemd-networkd keeps them.

    Only a port with carrier is configured (systemd.network(5), ConfigureWithoutCarrier=,
    false by default), and one that lost it drops its address (IgnoreCarrierLoss=, which
    defaults to ConfigureWithoutCarrier=): its GIDs come and go with the neighbour's end.
    """
    ns = netns_name(node)
    lit = set()
    for ifname, cidr, _peer, _pif in _node_links(spec, node):
        if has_carrier(node, ifname):
            nx.ip(ns, "addr", "replace", cidr, "dev", ifname)
            lit.add(ifname)
        else:
            nx.ip(ns, "addr", "del", cidr, "dev", ifname, check=False)  # its routes go with it
    for r in spec.routes:
        if r.node == node and r.dev in lit:
            nx.ip(ns, "route", "replace", r.dst_cidr, "via", r.via, "dev", r.dev)


def clusterinit_argv(p: SimPaths, node: SimNode, sshd_pid: int, *command: str) -> list[str]:
    """``python -m sparkctl_sim.clusterinit COMMAND`` as the node runs it: in its sshd's mount, network
    and UTS namespaces, with the session environment, in the node's cgroup (what it starts is the node's)."""
    env = session_env(p, node, False)
    return nx.in_cgroup(nx.node_cgroup(netns_name(node.name)), [
        "nsenter", "-t", str(sshd_pid), "-m", "-n", "-u", "env", "-i",
        *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "sparkctl_sim.clusterinit", *command])


def boot_init(p: SimPaths, spec: ClusterSpec, node: SimNode) -> dict[str, Any]:
    """Run the node's init (sparkctl_sim.clusterinit boot) inside its namespaces.

    Entered through its sshd's mount namespace, with the session environment, so
    it sees the node's own /etc and runs the node's systemctl.
    """
    pid = _sshd_pid(p, node.name)
    if pid is None:
        raise SimError(f"{node.name}: sshd is not running: its init cannot run", "run `sparkctl sim up`")
    out = nx.run(clusterinit_argv(p, node, pid, "boot", *(["--docker"] if spec.fresh else [])), timeout_s=120.0)
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {}


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


def _boot_script(p: SimPaths, node: SimNode, user: str, cgroup: bool = False) -> str:
    """What runs inside the node's fresh mount+UTS namespace before sshd; ``cgroup``: the node's
    processes are in a cgroup of their own (nx.node_cgroup), which its ps reads through ``procs``."""
    nd = p.node(node.name)
    q = shlex.quote
    lines = [
        "set -e",
        f"hostname {q(node.name)}",
        # `ip netns exec` mounted a new sysfs, without this machine's cgroup mounts under it
        *([f"mount -t cgroup2 sparkctl-node {q(str(nd.cgroup))} || :"] if cgroup else []),
        f"mount --bind {q(str(nd.dir / 'meminfo'))} /proc/meminfo",
        f"mount --bind {q(str(nd.dir / 'boot_id'))} /proc/sys/kernel/random/boot_id",
        # the node's drop_caches writes reach its simulated page cache (nodestate.absorb_drop_caches)
        f": >> {q(str(nd.dir / 'drop_caches'))}",
        f"mount --bind {q(str(nd.dir / 'drop_caches'))} /proc/sys/vm/drop_caches",
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
    for target in HOST_PACKAGE_FILES:
        upper = q(str(nd.private(target)))
        lines.append(f"if {{ [ -e {q(target)} ] || [ -L {q(target)} ]; }} && [ ! -e {upper} ] && [ ! -L {upper} ]; "
                     f"then rm -f {q(target)}; fi")
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
        cgroup = nx.node_cgroup(ns)
        nd.procs.unlink(missing_ok=True)
        if cgroup is not None:
            nd.procs.symlink_to(f"{nd.cgroup.name}{cgroup[1]}/cgroup.procs")  # as the node's own mount shows it
        script = _boot_script(p, node, _ssh_user(False), cgroup is not None)
        argv = nx.in_cgroup(cgroup, ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation",
                                     "private", "sh", "-c", script])
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


