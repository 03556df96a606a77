"""What a simulated node's init does at boot, and the node's `netplan`.

Runs INSIDE a node (its network and mount namespaces, entered by
:mod:`sparkctl_sim.clusterboot` after sshd is up, or through the ``netplan``
wrapper on the session PATH): ``python3 -m sparkctl_sim.clusterinit
boot [--docker] | netplan apply|generate``.

At boot, in the order a DGX OS (Ubuntu, systemd) brings a box up:

1. ``systemd-sysctl``: the ``net.*`` keys of the node's ``/etc/sysctl.d/*.conf``
   (only ``net.*``: every other key is this machine's kernel, shared by all
   nodes; a real node applies them all, see sysctl.d(5));
2. ``systemd-networkd`` from netplan: the node's ``/etc/netplan/*.yaml`` through
   the real generator (below);
3. ``docker.service``: dockerd installs its iptables rules with the real
   ``iptables`` in the node's own netns (below);
4. every unit enabled into ``multi-user.target.wants`` (``systemctl enable``),
   started with the node's ``systemctl``, ordered by their ``After=`` on one
   another (systemd.unit(5): After= orders start-up, it does not pull in).

``netplan apply`` copies the node's netplan files into a scratch root, runs the
real generator from Debian's netplan.io (``netplan generate --root-dir``), reads
the systemd-networkd ``.network`` files it wrote and applies their MTU,
addresses and routes with ``ip``. Addresses it did not configure stay (stricter
than networkd, which may drop foreign addresses; sparkctl flushes them itself).
Then the node's simulated ``/sys/class/infiniband`` GID tables follow the new
addresses, as the mlx5 driver fills a RoCE v2 GID for each IPv4 address.
A link without carrier (its neighbour off) is brought up but not configured, as
systemd-networkd does; ``networkd-carrier`` is networkd's reaction when a carrier
comes or goes (:func:`networkd_carrier`).

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REAL_NETPLAN = "/usr/sbin/netplan"  # Debian's netplan.io: its generator is the judge
NETPLAN_DIRS = ("/lib/netplan", "/etc/netplan", "/run/netplan")  # netplan(5): later dirs win per file name
WANTS = "/etc/systemd/system/multi-user.target.wants"
# docker.service on a DGX OS image is enabled; the sim's "dockerd" is the rules below.
DOCKER_UNIT = "docker.service"


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


# --------------------------------------------------------------------------- sysctl


def sysctl_boot(root: str = "/") -> dict[str, str]:
    """Apply the ``net.*`` keys of /etc/sysctl.d/*.conf in file-name order (last one wins)."""
    values: dict[str, str] = {}
    d = Path(root, "etc/sysctl.d")
    for f in sorted(d.glob("*.conf")) if d.is_dir() else []:
        for line in f.read_text(errors="replace").splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            key, sep, val = line.partition("=")
            key = key.strip().lstrip("-").replace("/", ".")
            if sep and key.startswith("net."):
                values[key] = val.strip()
    for key, val in values.items():
        path = Path("/proc/sys", *key.split("."))
        if path.exists():
            path.write_text(val + "\n")
    return values


# --------------------------------------------------------------------------- netplan


def _generate(scratch: Path) -> list[Path]:
    for d in NETPLAN_DIRS:
        src = Path(d)
        if src.is_dir():
            dest = scratch / d.lstrip("/")
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(src.glob("*.yaml")):
                shutil.copy2(f, dest / f.name)
    r = _run([REAL_NETPLAN, "generate", "--root-dir", str(scratch)], check=False)
    if r.returncode != 0:
        # netplan's own message (e.g. "Error in network definition: ...") and exit code
        sys.stderr.write(r.stderr)
        raise SystemExit(r.returncode or 1)
    return sorted((scratch / "run/systemd/network").glob("*.network"))


def _network_file(path: Path) -> dict[str, object]:
    # networkd files repeat [Route] and Address=: split the sections by hand.
    out: dict[str, object] = {"name": None, "addresses": [], "routes": [], "mtu": None}
    section = ""
    route: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if section == "Route" and route:
                out["routes"].append(route)  # type: ignore[attr-defined]
            section, route = line.strip("[]"), {}
            continue
        key, _, val = line.partition("=")
        if section == "Match" and key == "Name":
            out["name"] = val
        elif section == "Network" and key == "Address":
            out["addresses"].append(val)  # type: ignore[attr-defined]
        elif section == "Route":
            route[key] = val
    if section == "Route" and route:
        out["routes"].append(route)  # type: ignore[attr-defined]
    link = path.with_suffix(".link")
    if link.exists():
        m = re.search(r"^MTUBytes=(\d+)", link.read_text(), re.MULTILINE)
        out["mtu"] = int(m.group(1)) if m else None
    m = re.search(r"^MTUBytes=(\d+)", path.read_text(), re.MULTILINE)
    if m:
        out["mtu"] = int(m.group(1))
    return out


def netplan_apply() -> list[str]:
    """Parse the node's netplan files with the real generator and apply the result."""
    applied = []
    with tempfile.TemporaryDirectory(prefix="sparkctl-sim-netplan-") as tmp:
        for f in _generate(Path(tmp)):
            net = _network_file(f)
            dev = net["name"]
            if not dev or not Path("/sys/class/net", str(dev)).exists():
                continue
            if net["mtu"]:
                _run(["ip", "link", "set", "dev", str(dev), "mtu", str(net["mtu"])])
            _run(["ip", "link", "set", "dev", str(dev), "up"])
            if not configures_now(f, str(dev)):
                continue  # networkd configures it once the neighbour's end has carrier (networkd_carrier)
            _configure_link(net)
            applied.append(str(dev))
    refresh_gids()
    return applied


def _configure_link(net: dict[str, object]) -> None:
    dev = str(net["name"])
    for addr in net["addresses"]:  # type: ignore[attr-defined]
        _run(["ip", "addr", "replace", addr, "dev", dev])
    for rt in net["routes"]:  # type: ignore[attr-defined]
        if rt.get("Destination") and rt.get("Gateway"):
            _run(["ip", "route", "replace", rt["Destination"], "via", rt["Gateway"], "dev", dev])


# --------------------------------------------------------------------------- carrier


def has_carrier(dev: str) -> bool:
    """The kernel's carrier flag of ``dev`` (a link that is down has none: the read fails)."""
    try:
        return Path("/sys/class/net", dev, "carrier").read_text().strip() == "1"
    except OSError:
        return False


def _network_flag(path: Path, key: str) -> bool:
    m = re.search(rf"^{key}=(\S+)", path.read_text(), re.MULTILINE)
    return bool(m) and m.group(1).lower() in ("yes", "true", "1", "on")  # type: ignore[union-attr]


def configures_now(network_file: Path, dev: str) -> bool:
    """Whether systemd-networkd configures ``dev`` (addresses, routes) at this moment.

    systemd.network(5), ConfigureWithoutCarrier=: "Allows networkd to configure a specific
    link even if it has no carrier. Defaults to false." A fabric port whose neighbour is off
    (or still booting) has no carrier: it gets no address, hence no RoCE v2 GID, until the
    other end comes up. netplan renders ConfigureWithoutCarrier=yes for ``ignore-carrier:
    true`` only (netplan src/networkd.c; `optional: true` renders RequiredForOnline=no).
    """
    return has_carrier(dev) or _network_flag(network_file, "ConfigureWithoutCarrier")


def networkd_carrier() -> dict[str, list[str]]:
    """What systemd-networkd does when the carrier of a configured link comes or goes.

    Carrier gained: the link is configured from its .network file. Carrier lost: networkd
    drops its static configuration unless IgnoreCarrierLoss= (systemd.network(5):
    "When false, systemd-networkd drops both the static and the dynamic configuration of the
    interface"; it defaults to ConfigureWithoutCarrier=, false by default). Called by the sim
    (sparkctl_sim.clusterlate) when a neighbour powers off or comes up.
    """
    report: dict[str, list[str]] = {"configured": [], "dropped": []}
    if not any(Path(d).glob("*.yaml") for d in NETPLAN_DIRS if Path(d).is_dir()):
        return report
    with tempfile.TemporaryDirectory(prefix="sparkctl-sim-networkd-") as tmp:
        for f in _generate(Path(tmp)):
            net = _network_file(f)
            dev = str(net["name"] or "")
            if not dev or not Path("/sys/class/net", dev).exists():
                continue
            if configures_now(f, dev):
                _configure_link(net)
                report["configured"].append(dev)
            elif not _network_flag(f, "IgnoreCarrierLoss"):
                for addr in net["addresses"]:  # type: ignore[attr-defined]
                    _run(["ip", "addr", "del", addr, "dev", dev], check=False)  # its routes go with it
                report["dropped"].append(dev)
    refresh_gids()
    return report


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


# --------------------------------------------------------------------------- dockerd


def dockerd_start() -> None:
    """The filter-table rules dockerd installs when it starts, with the real iptables.

    moby: libnetwork/drivers/bridge/setup_ip_forwarding.go sets net.ipv4.ip_forward=1
    and the FORWARD policy to DROP when forwarding was off and the daemon turned it on
    (integration/network/bridge/iptablesdoc/generated/new-daemon.md: "setupIPForwarding
    sets the POLICY to DROP if the sysctl net.ipv4.ip_forward was not set to '1'");
    libnetwork/iptables: FORWARD jumps to DOCKER-USER first, then DOCKER-FORWARD, and
    dockerd never touches rules in DOCKER-USER (the operator's chain). The sim is
    stricter in one way: it sets DROP whenever it finds forwarding off at its start.
    """
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    if fwd.read_text().strip() != "1":
        fwd.write_text("1\n")
        _run(["iptables", "-P", "FORWARD", "DROP"])
    for chain in ("DOCKER-USER", "DOCKER-FORWARD", "DOCKER"):
        if _run(["iptables", "-n", "-L", chain], check=False).returncode != 0:
            _run(["iptables", "-N", chain])
    for pos, target in ((1, "DOCKER-USER"), (2, "DOCKER-FORWARD")):
        if _run(["iptables", "-C", "FORWARD", "-j", target], check=False).returncode != 0:
            _run(["iptables", "-I", "FORWARD", str(pos), "-j", target])


def netfilter_reset() -> None:
    """A booting kernel starts with empty tables (the sim's netns outlives its reboots)."""
    for args in (["-F"], ["-X"], ["-P", "FORWARD", "ACCEPT"]):
        _run(["iptables", *args], check=False)


# --------------------------------------------------------------------------- units


def _after(unit_text: str) -> set[str]:
    out: set[str] = set()
    for line in unit_text.splitlines():
        key, sep, val = line.partition("=")
        if sep and key.strip() == "After":
            out |= set(val.split())
    return out


def enabled_units(root: str = "/") -> list[str]:
    """Units enabled into multi-user.target, ordered by After= among themselves."""
    wants = Path(root, WANTS.lstrip("/"))
    names = sorted(p.name for p in wants.iterdir()) if wants.is_dir() else []
    after = {}
    for n in names:
        try:
            after[n] = _after((wants / n).read_text(errors="replace"))
        except OSError:
            after[n] = set()
    ordered: list[str] = []
    pending = list(names)
    while pending:
        ready = [n for n in pending if not (after[n] & set(pending) - {n})]
        ready = ready or pending[:1]  # an ordering cycle: systemd breaks it too (and logs it)
        for n in ready:
            ordered.append(n)
            pending.remove(n)
    return ordered


def runtime_reset() -> None:
    """systemd's runtime records go: /run is a tmpfs, empty at every boot (file-hierarchy(7)).

    The node's systemctl keeps them under $SPARKCTL_SIM_RUN_DIR/systemd (unit state JSON and
    the loaded snapshots); journals stay, as a persistent journal does.
    """
    run_dir = os.environ.get("SPARKCTL_SIM_RUN_DIR")
    if not run_dir:
        return
    d = Path(run_dir, "systemd")
    for f in [*d.glob("*.json"), *d.glob("loaded/*")]:
        f.unlink(missing_ok=True)


def boot(docker: bool) -> dict[str, object]:
    report: dict[str, object] = {}
    runtime_reset()
    netfilter_reset()
    report["sysctl"] = sysctl_boot()
    report["netplan"] = netplan_apply() if any(Path(d).glob("*.yaml") for d in NETPLAN_DIRS
                                                 if Path(d).is_dir()) else []
    if docker:
        dockerd_start()
    started = {}
    for unit in enabled_units():
        r = _run(["systemctl", "start", unit], check=False)
        started[unit] = r.returncode
    report["units"] = started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["boot"]:
        print(json.dumps(boot("--docker" in args)))
        return 0
    if args[:1] == ["networkd-carrier"]:
        print(json.dumps(networkd_carrier()))
        return 0
    if args[:1] == ["netplan"]:
        sub = args[1:2]
        if sub == ["apply"]:
            netplan_apply()
            return 0
        if sub == ["generate"] or sub == []:
            # the real generator, untouched (netplan generate --root-dir DIR ...)
            return subprocess.run([REAL_NETPLAN, *args[1:]], check=False).returncode
        print(f"netplan {' '.join(sub)}: not simulated (apply, generate)", file=sys.stderr)
        return 1
    print("usage: python3 -m sparkctl_sim.clusterinit boot [--docker] | netplan apply|generate", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
