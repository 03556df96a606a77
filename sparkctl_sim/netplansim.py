"""A simulated node's netplan backends: systemd-networkd, NetworkManager, and `netplan apply`.

Runs INSIDE a node (through :mod:`sparkctl_sim.clusterinit`). The real generator
from Debian's netplan.io writes every backend's files (``netplan generate
--root-dir``): it merges all netplan files, concatenating the address lists of a
device defined in several (netplan doc/netplan-generate.md), and gives each
definition without a renderer of its own the last global ``renderer:`` read
(netplan src/parse.c: finish_iterator -> get_default_backend_for_type). What
this module simulates is what the backends do with those files:

* ``netplan generate`` (no ``--root-dir``): the generator's output goes to the
  node's own /run (``$SPARKCTL_SIM_RUN_DIR/netplan``), nothing is applied (the
  generator only writes files);
* ``networkctl reload``: systemd-networkd reads the generated ``.network`` files;
  ``networkctl reconfigure IF...``: applies what it read to those links only
  (networkctl(1)); addresses it did not configure stay (stricter than networkd,
  which may drop foreign ones: sparkctl flushes them itself);
  ``LinkLocalAddressing=ipv4`` (netplan ``link-local: [ipv4]``) gives the link
  an IPv4LL 169.254.x.y/16 address (systemd.network(5));
* NetworkManager, on a node set up with it (``sim up --network-manager``:
  :data:`NM_GLOBAL` and a ``90-NM-*.yaml`` for the management link, as a
  desktop install with netplan-everywhere leaves them): the netplan-generated
  ``netplan-*.nmconnection`` profiles (``method=manual`` addresses,
  ``link-local``, ``auto`` = the DHCP lease, the same address again) on devices
  it manages; ``nmcli device set IF managed no|yes`` for one device;
* ``netplan apply`` as canonical/netplan netplan_cli/cli/commands/apply.py does
  it: networkd links reconfigured; and when netplan NetworkManager profiles
  exist before or after generating, every interface they name is disconnected
  (``nmcli device disconnect``: its addresses go), NetworkManager is stopped,
  their addresses flushed, NetworkManager started again. The management link is
  among them, and the sim then KILLS every SSH session of the node (the TCP
  connections over it), the apply's own included: stricter than a real link
  bounce, which a session may outlive, never kinder. The apply goes on and the
  management address comes back, as NetworkManager's DHCP gives it again.

SIMULATION ONLY.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REAL_NETPLAN = "/usr/sbin/netplan"  # Debian's netplan.io: its generator is the judge
NETPLAN_DIRS = ("/lib/netplan", "/etc/netplan", "/run/netplan")  # netplan(5): later dirs win per file name
MGMT_IFNAME = "enP7s7"  # sparkctl_sim.clusterroot.MGMT_IFNAME (not imported: this runs inside the node)
# Ubuntu desktop's default netplan file (ubuntu-settings / the desktop installer): a global
# renderer and no definition; with netplan-everywhere NetworkManager keeps each connection
# as /etc/netplan/90-NM-<uuid>.yaml (netplan doc/netplan-everywhere.md).
NM_GLOBAL = "# Let NetworkManager manage all devices on this system\nnetwork:\n  version: 2\n  renderer: NetworkManager\n"


def nm_connection_yaml(uuid: str) -> str:
    """The management link's connection as NetworkManager writes it back to netplan (netplan-everywhere)."""
    return ("network:\n  version: 2\n  ethernets:\n"
            f"    NM-{uuid}:\n      renderer: NetworkManager\n      match:\n        name: \"{MGMT_IFNAME}\"\n"
            "      dhcp4: true\n      wakeonlan: true\n      networkmanager:\n"
            f"        uuid: \"{uuid}\"\n        name: \"Wired connection 1\"\n")


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def _run_dir() -> Path:
    d = os.environ.get("SPARKCTL_SIM_RUN_DIR")
    return Path(d) if d else Path(tempfile.gettempdir(), "sparkctl-sim-run")


def _state_path() -> Path | None:
    p = os.environ.get("SPARKCTL_SIM_STATE")
    return Path(p) if p else None


def nm_node() -> bool:
    """Whether NetworkManager runs on this node (set by `sim up --network-manager`)."""
    from sparkctl_sim import nodestate

    sp = _state_path()
    return bool(sp and nodestate.load(sp).get("network_manager"))


# --------------------------------------------------------------------------- generate


def generate(out: Path) -> Path:
    """The real generator over the node's netplan files; its /run tree ends in ``out`` (replaced)."""
    with tempfile.TemporaryDirectory(prefix="sparkctl-sim-netplan-") as tmp:
        scratch = Path(tmp)
        for d in NETPLAN_DIRS:
            src = Path(d)
            if src.is_dir():
                dest = scratch / d.lstrip("/")
                dest.mkdir(parents=True, exist_ok=True)
                for f in sorted(src.glob("*.yaml")):
                    shutil.copy2(f, dest / f.name)
        r = _run([REAL_NETPLAN, "generate", "--root-dir", str(scratch)], check=False)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)  # netplan's own message and exit code
            raise SystemExit(r.returncode or 1)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        if (scratch / "run").is_dir():
            shutil.copytree(scratch / "run", out, symlinks=True, dirs_exist_ok=True)
    return out


def generated() -> Path:
    return _run_dir() / "netplan"


def _ini(path: Path) -> list[tuple[str, str, str]]:
    rows, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, val = line.partition("=")
        rows.append((section, key.strip(), val.strip()))
    return rows


def _yes(val: str) -> bool:
    return val.lower() in ("yes", "true", "1", "on")


def network_files(run: Path) -> dict[str, dict[str, Any]]:
    """name -> {addresses, routes, mtu, ipv4ll} from the generated networkd files."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((run / "systemd/network").glob("*.network")):
        net: dict[str, Any] = {"addresses": [], "routes": [], "mtu": None, "ipv4ll": False,
                               "without_carrier": False, "ignore_carrier_loss": None}
        name, route = None, None
        for section, key, val in _ini(path):
            if section == "Match" and key == "Name":
                name = val
            elif section == "Network" and key == "Address":
                net["addresses"].append(val)
            elif section == "Network" and key == "LinkLocalAddressing":
                net["ipv4ll"] = val in ("ipv4", "yes", "fallback")
            elif section == "Network" and key == "ConfigureWithoutCarrier":
                net["without_carrier"] = _yes(val)
            elif section == "Network" and key == "IgnoreCarrierLoss":
                net["ignore_carrier_loss"] = _yes(val)
            elif section == "Link" and key == "MTUBytes":
                net["mtu"] = int(val)
            elif section == "Route":
                if key in ("Destination", "Gateway"):
                    if route is None or key in route:
                        route = {}
                        net["routes"].append(route)
                    route[key] = val
        link = path.with_suffix(".link")
        if link.exists():
            m = re.search(r"^MTUBytes=(\d+)", link.read_text(), re.MULTILINE)
            net["mtu"] = net["mtu"] or (int(m.group(1)) if m else None)
        if name:
            out[name] = net
    return out


def nm_profiles(run: Path) -> dict[str, dict[str, Any]]:
    """interface -> {method, addresses} of the netplan-generated NetworkManager profiles."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((run / "NetworkManager/system-connections").glob("netplan-*.nmconnection")):
        prof: dict[str, Any] = {"method": "auto", "addresses": []}
        iface = None
        for section, key, val in _ini(path):
            if section == "connection" and key == "interface-name":
                iface = val
            elif section == "ipv4" and key == "method":
                prof["method"] = val
            elif section == "ipv4" and re.fullmatch(r"address\d+", key):
                prof["addresses"].append(val.split(",")[0])
        if iface:
            out[iface] = prof
    return out


def udev_unmanaged(run: Path) -> set[str]:
    """Devices netplan puts on NetworkManager's deny-list (its networkd devices): run/udev/rules.d."""
    out = set()
    for path in (run / "udev/rules.d").glob("*netplan*.rules"):
        for m in re.finditer(r'ENV\{ID_NET_NAME\}=="([^"]+)", ENV\{NM_UNMANAGED\}="1"', path.read_text()):
            out.add(m.group(1))
    return out


# --------------------------------------------------------------------------- applying to links


def _exists(dev: str) -> bool:
    return Path("/sys/class/net", dev).exists()


def ipv4ll_address(dev: str) -> str:
    """A stable 169.254.x.y for ``dev`` (IPv4LL picks one from a seed of the link, RFC 3927 §2.1)."""
    seed = f"{os.environ.get('SPARKCTL_SIM_STATE', '')}:{dev}".encode()
    h = hashlib.sha256(seed).digest()
    return f"169.254.{1 + h[0] % 254}.{1 + h[1] % 254}"


def has_carrier(dev: str) -> bool:
    """The kernel's carrier flag of ``dev`` (a link that is down has none: the read fails)."""
    try:
        return Path("/sys/class/net", dev, "carrier").read_text().strip() == "1"
    except OSError:
        return False


def configures_now(dev: str, net: dict[str, Any]) -> bool:
    """Whether systemd-networkd configures ``dev`` (addresses, routes) at this moment.

    systemd.network(5), ConfigureWithoutCarrier=: "Allows networkd to configure a specific
    link even if it has no carrier. Defaults to false." A fabric port whose neighbour is off
    (or still booting) has no carrier: it gets no address, hence no RoCE v2 GID, until the
    other end comes up. netplan renders ConfigureWithoutCarrier=yes for ``ignore-carrier:
    true`` only (netplan src/networkd.c; `optional: true` renders RequiredForOnline=no).
    """
    return has_carrier(dev) or bool(net.get("without_carrier"))


def configure_networkd(dev: str, net: dict[str, Any]) -> bool:
    """networkd on ``dev``: MTU and up always; addresses and routes only with carrier. Whether it configured."""
    if not _exists(dev):
        return False
    if net["mtu"]:
        _run(["ip", "link", "set", "dev", dev, "mtu", str(net["mtu"])])
    _run(["ip", "link", "set", "dev", dev, "up"])
    if not configures_now(dev, net):
        return False  # configured once the neighbour's end has carrier (networkd_carrier)
    for addr in net["addresses"]:
        _run(["ip", "addr", "replace", addr, "dev", dev])
    if net["ipv4ll"]:
        _run(["ip", "addr", "replace", f"{ipv4ll_address(dev)}/16", "dev", dev])
    for rt in net["routes"]:
        if rt.get("Destination") and rt.get("Gateway"):
            _run(["ip", "route", "replace", rt["Destination"], "via", rt["Gateway"], "dev", dev])
    return True


def networkd_carrier() -> dict[str, list[str]]:
    """What systemd-networkd does when the carrier of a link it manages comes or goes.

    Carrier gained: the link is configured from its .network file. Carrier lost: networkd
    drops its static configuration unless IgnoreCarrierLoss= (systemd.network(5):
    "When false, systemd-networkd drops both the static and the dynamic configuration of the
    interface"; it defaults to ConfigureWithoutCarrier=, false by default). Called by the sim
    (sparkctl_sim.clusterlate) when a neighbour powers off or comes up.
    """
    report: dict[str, list[str]] = {"configured": [], "dropped": []}
    loaded = _run_dir() / "networkd-loaded.json"
    nets = json.loads(loaded.read_text()) if loaded.exists() else {}
    for dev, net in nets.items():
        if not _exists(dev):
            continue
        if configures_now(dev, net):
            configure_networkd(dev, net)
            report["configured"].append(dev)
        elif not (net["ignore_carrier_loss"] if net.get("ignore_carrier_loss") is not None
                  else net.get("without_carrier")):
            for addr in net["addresses"]:
                _run(["ip", "addr", "del", addr, "dev", dev], check=False)  # its routes go with it
            if net.get("ipv4ll"):
                _run(["ip", "addr", "del", f"{ipv4ll_address(dev)}/16", "dev", dev], check=False)
            report["dropped"].append(dev)
    refresh_gids()
    return report


def _lease_path() -> Path:
    return _run_dir() / "nm-dhcp-leases.json"


def configure_nm(dev: str, prof: dict[str, Any]) -> None:
    if not _exists(dev):
        return
    _run(["ip", "link", "set", "dev", dev, "up"])
    if prof["method"] == "manual":
        for addr in prof["addresses"]:
            _run(["ip", "addr", "replace", addr, "dev", dev])
    elif prof["method"] == "link-local":
        _run(["ip", "addr", "replace", f"{ipv4ll_address(dev)}/16", "dev", dev])
    elif prof["method"] == "auto":  # DHCP: the lease this link had (the sim's DHCP server is its spec)
        leases = json.loads(_lease_path().read_text()) if _lease_path().exists() else {}
        for a in leases.get(dev, {}).get("addresses", []):
            _run(["ip", "addr", "replace", a, "dev", dev])
        for r in leases.get(dev, {}).get("routes", []):
            _run(["ip", "route", "replace", *r.split()], check=False)


def remember_leases(devs: Sequence[str]) -> None:
    """The DHCP leases of NetworkManager's auto links: what it gets again after a restart."""
    leases = json.loads(_lease_path().read_text()) if _lease_path().exists() else {}
    for dev in devs:
        if not _exists(dev):
            continue
        info = json.loads(_run(["ip", "-j", "addr", "show", "dev", dev]).stdout or "[]")
        addrs = [f"{a['local']}/{a['prefixlen']}" for e in info for a in e.get("addr_info", [])
                 if a.get("family") == "inet"]
        routes = [ln.strip() for ln in _run(["ip", "-4", "route", "show", "dev", dev]).stdout.splitlines()
                  if ln.strip() and "proto kernel" not in ln]
        if addrs:
            leases[dev] = {"addresses": addrs, "routes": [f"{r} dev {dev}" for r in routes]}
    _lease_path().parent.mkdir(parents=True, exist_ok=True)
    _lease_path().write_text(json.dumps(leases))


def _nm_state() -> dict[str, Any]:
    p = _run_dir() / "nm-state.json"
    return json.loads(p.read_text()) if p.exists() else {"unmanaged": []}


def _nm_save(state: dict[str, Any]) -> None:
    p = _run_dir() / "nm-state.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(state))


def nm_start(run: Path) -> list[str]:
    """NetworkManager (re)starting: its profiles on the devices it manages."""
    deny = udev_unmanaged(run) | set(_nm_state()["unmanaged"])
    done = []
    for dev, prof in nm_profiles(run).items():
        if dev not in deny:
            configure_nm(dev, prof)
            done.append(dev)
    return done


# --------------------------------------------------------------------------- the sessions


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def kill_ssh_sessions() -> int:
    """SIGKILL every per-connection sshd of this node's sshd (every session comes over the
    management link). The listener is the topmost sshd above this process."""
    pid, listener = os.getpid(), 0
    while pid > 1:
        if _comm(pid).startswith("sshd"):
            listener = pid
        pid = _ppid(pid)
    if not listener:
        return 0
    killed = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and _ppid(int(d.name)) == listener:
            try:
                os.kill(int(d.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


# --------------------------------------------------------------------------- commands


def cmd_netplan_generate() -> int:
    generate(generated())
    return 0


def cmd_netplan_apply() -> list[str]:
    """canonical/netplan netplan_cli/cli/commands/apply.py, command_apply, in its order."""
    old = nm_profiles(generated()) if generated().exists() else {}
    run = generate(generated())
    new = nm_profiles(run)
    applied = []
    nets = network_files(run)
    (_run_dir() / "networkd-loaded.json").write_text(json.dumps(nets))  # networkctl reload
    for dev, net in nets.items():  # + reconfigure of networkd's links
        if configure_networkd(dev, net):
            applied.append(dev)
    if nm_node() and (old or new):  # restart_nm: netplan NM profiles before or after generating
        nm_ifaces = sorted(set(old) | set(new))
        remember_leases(nm_ifaces)
        for dev in nm_ifaces:  # nmcli device disconnect; then stop NM; flush; start NM
            if _exists(dev):
                _run(["ip", "-4", "addr", "flush", "dev", dev], check=False)
        if MGMT_IFNAME in nm_ifaces:
            kill_ssh_sessions()
        applied += nm_start(run)
    refresh_gids()
    return applied


def cmd_networkctl(args: list[str]) -> int:
    loaded = _run_dir() / "networkd-loaded.json"
    if args[:1] == ["reload"]:
        nets = network_files(generated()) if generated().exists() else {}
        loaded.parent.mkdir(parents=True, exist_ok=True)
        loaded.write_text(json.dumps(nets))
        return 0
    if args[:1] == ["reconfigure"] and args[1:]:
        nets = json.loads(loaded.read_text()) if loaded.exists() else {}
        for dev in args[1:]:
            if not _exists(dev):
                print(f"Failed to resolve interface \"{dev}\": No such device", file=sys.stderr)
                return 1
            if dev in nets:
                configure_networkd(dev, nets[dev])
        refresh_gids()
        return 0
    print(f"networkctl {' '.join(args)}: not simulated (reload, reconfigure IF...)", file=sys.stderr)
    return 1


def cmd_nmcli(args: list[str]) -> int:
    running = nm_node()
    if args[:4] == ["-t", "-f", "RUNNING", "general"] or args[:2] == ["general", "status"]:
        if not running:
            print("Error: NetworkManager is not running.", file=sys.stderr)
            return 8  # nmcli(1): exit status 8, NetworkManager is not running
        print("running")
        return 0
    if not running:
        print("Error: NetworkManager is not running.", file=sys.stderr)
        return 8
    if args[:2] == ["connection", "reload"]:
        return 0
    if args[:2] == ["device", "set"] and len(args) == 5 and args[3] == "managed" and args[4] in ("yes", "no"):
        dev, st = args[2], _nm_state()
        if not _exists(dev):
            print(f"Error: Device '{dev}' not found.", file=sys.stderr)
            return 10
        un = set(st["unmanaged"])
        un = un | {dev} if args[4] == "no" else un - {dev}
        _nm_save({**st, "unmanaged": sorted(un)})
        if args[4] == "yes":  # managed again: NetworkManager activates its profile on it
            prof = nm_profiles(generated()).get(dev) if generated().exists() else None
            if prof and dev not in udev_unmanaged(generated()):
                configure_nm(dev, prof)
                refresh_gids()
        return 0
    print(f"nmcli {' '.join(args)}: not simulated", file=sys.stderr)
    return 1


def boot() -> list[str]:
    """At boot: the generator, networkd on its links, NetworkManager on its own (runtime state gone)."""
    (_run_dir() / "nm-state.json").unlink(missing_ok=True)
    run = generate(generated())
    applied = []
    nets = network_files(run)
    (_run_dir() / "networkd-loaded.json").write_text(json.dumps(nets))  # networkd starts with these
    for dev, net in nets.items():
        if configure_networkd(dev, net):
            applied.append(dev)
    if nm_node():
        applied += [d for d in nm_start(run) if d != MGMT_IFNAME]
    refresh_gids()
    return applied


def refresh_gids() -> None:
    """The node's simulated /sys/class/infiniband follows its netdevs' IPv4 addresses."""
    state_path = os.environ.get("SPARKCTL_SIM_STATE")
    if not state_path or not Path("/sys/class/infiniband").is_dir():
        return
    from sparkctl_sim import nodestate
    from sparkctl_sim.shims.common import Netdev
    from sparkctl_sim.shims.ibdev import write_sysfs_infiniband

    netdevs = {}
    for e in json.loads(_run(["ip", "-j", "addr", "show"]).stdout or "[]"):
        ipv4 = tuple((a["local"], int(a.get("prefixlen", 32))) for a in e.get("addr_info", [])
                     if a.get("family") == "inet")
        netdevs[e["ifname"]] = Netdev(name=e["ifname"], operstate=str(e.get("operstate", "unknown")).lower(),
                                      mtu=int(e.get("mtu", 1500)), ipv4=ipv4)
    write_sysfs_infiniband("/sys", nodestate.load(Path(state_path)), netdevs)
