"""What a simulated node's init does at boot, and the node's `netplan`.

Runs INSIDE a node (its network and mount namespaces, entered by
:mod:`sparkctl_sim.clusterboot` after sshd is up, or through the ``netplan``
wrapper on the session PATH): ``python3 -m sparkctl_sim.clusterinit
boot [--docker] | dockerd | netplan apply|generate`` (``dockerd``: a Docker restart's rules).

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
   another (systemd.unit(5): After= orders start-up, it does not pull in); those
   ordered ``Before=network-pre.target`` or ``Before=docker.service`` start right
   after systemd-sysctl, ahead of 2. and 3.

``netplan``, ``networkctl`` and ``nmcli`` are :mod:`sparkctl_sim.netplansim`:
the real generator from Debian's netplan.io (``netplan generate --root-dir``)
over the node's files, its networkd and NetworkManager output applied with
``ip`` as those backends do, and ``netplan apply`` as netplan's apply.py does it
(NetworkManager's links bounced). Then the node's simulated
``/sys/class/infiniband`` GID tables follow the new addresses, as the mlx5
driver fills a RoCE v2 GID for each IPv4 address.
A link without carrier (its neighbour off) is brought up but not configured, as
systemd-networkd does; ``networkd-carrier`` is networkd's reaction when a carrier
comes or goes (:func:`sparkctl_sim.netplansim.networkd_carrier`).

SIMULATION ONLY.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


# The vendor's sysctl.d files a DGX OS image ships in /usr/lib/sysctl.d, as far as the sim
# applies them (their net.* keys). systemd's own 50-default.conf (systemd/systemd
# sysctl.d/50-default.conf, since v243, PR #13141; DGX OS 7 is Ubuntu 24.04, systemd 255)
# lets every group open ICMP datagram sockets. iputils ping asks for one first, root too
# (ping.c create_socket: SOCK_DGRAM, then SOCK_RAW on EACCES), and a datagram socket gets its
# own echo replies only. A new network namespace has "1 0" (nobody), so without this every
# ping on a node took a raw socket that receives every echo reply of the node: jumbo replies
# of pings running side by side overflowed each other's receive buffers (measured: 24 to 132
# of 240 concurrent 8972-byte pings on 16 nodes lost, none with the line).
VENDOR_SYSCTL_D = {"50-default.conf": "-net.ipv4.ping_group_range = 0 2147483647\n"}


def sysctl_boot(root: str = "/") -> dict[str, str]:
    """Apply the ``net.*`` keys of the sysctl.d files in file-name order (last one wins): the
    node's /etc/sysctl.d/*.conf and the vendor's (:data:`VENDOR_SYSCTL_D`), a file in /etc
    replacing the vendor's of the same name (sysctl.d(5))."""
    values: dict[str, str] = {}
    d = Path(root, "etc/sysctl.d")
    files = dict(VENDOR_SYSCTL_D)
    files.update({f.name: f.read_text(errors="replace") for f in (d.glob("*.conf") if d.is_dir() else [])})
    for name in sorted(files):
        for line in files[name].splitlines():
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


def netplan_apply() -> list[str]:
    """`netplan apply` as canonical/netplan's apply.py does it (sparkctl_sim.netplansim)."""
    from sparkctl_sim import netplansim

    return netplansim.cmd_netplan_apply()


# --------------------------------------------------------------------------- dockerd


def _ensure_jump(chain: str, target: str) -> None:
    """moby daemon/libnetwork/iptables/iptables.go EnsureJumpRule: delete the jump if it is
    there, then insert it at the top of the chain (so it is first after every start)."""
    if _run(["iptables", "-w", "-C", chain, "-j", target], check=False).returncode == 0:
        _run(["iptables", "-w", "-D", chain, "-j", target])
    _run(["iptables", "-w", "-I", chain, "-j", target])


def dockerd_start() -> None:
    """The filter-table rules dockerd installs at each start, with the real iptables.

    moby daemon/libnetwork/drivers/bridge/setup_ip_forwarding.go (setupIPv4Forwarding):
    dockerd writes net.ipv4.ip_forward=1 and sets the FORWARD policy to DROP only when it
    found forwarding off (``changed && wantFilterForwardDrop``); when systemd-sysctl turned
    it on first (every reboot of a relay with sparkctl's sysctl file) the policy stays
    ACCEPT, as here. Then (moby daemon/libnetwork/drivers/bridge/internal/iptabler/iptabler.go,
    daemon/libnetwork/firewall_linux.go setupUserChain) it creates DOCKER-FORWARD and
    DOCKER-USER when missing (NewChain: a chain that exists is kept, never flushed) and
    re-inserts the FORWARD jumps at the top, DOCKER-FORWARD first, then DOCKER-USER, so
    DOCKER-USER is always the first rule of FORWARD after a start or restart. The host's
    INPUT it leaves alone: it flushes and removes only its own chains (iptabler.go), and
    writes to filter INPUT only for a swarm overlay's encryption (drivers/overlay/encryption.go
    programInput), which a Spark's engines do not use.
    """
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    if fwd.read_text().strip() != "1":
        fwd.write_text("1\n")
        _run(["iptables", "-w", "-P", "FORWARD", "DROP"])
    for chain in ("DOCKER-FORWARD", "DOCKER", "DOCKER-USER"):
        if _run(["iptables", "-w", "-n", "-L", chain], check=False).returncode != 0:
            _run(["iptables", "-w", "-N", chain])
    _ensure_jump("FORWARD", "DOCKER-FORWARD")
    _ensure_jump("FORWARD", "DOCKER-USER")


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


def _before(unit_text: str) -> set[str]:
    out: set[str] = set()
    for line in unit_text.splitlines():
        key, sep, val = line.partition("=")
        if sep and key.strip() == "Before":
            out |= set(val.split())
    return out


# A unit ordered Before= one of these starts ahead of the network and dockerd (systemd.special(7):
# network-pre.target is "before any network interface is configured", a firewall's place).
EARLY = {"network-pre.target", DOCKER_UNIT}


def early_units(root: str = "/") -> list[str]:
    """The enabled units ordered Before=network-pre.target or docker.service."""
    wants = Path(root, WANTS.lstrip("/"))
    out = []
    for n in enabled_units(root):
        try:
            if _before((wants / n).read_text(errors="replace")) & EARLY:
                out.append(n)
        except OSError:
            continue
    return out


def boot(docker: bool) -> dict[str, object]:
    """systemd-sysctl, the early units, networkd (netplan), dockerd, then the other enabled units."""
    report: dict[str, object] = {}
    runtime_reset()
    netfilter_reset()
    report["sysctl"] = sysctl_boot()
    started = {}
    early = early_units()
    for unit in early:
        started[unit] = _run(["systemctl", "start", unit], check=False).returncode
    from sparkctl_sim import netplansim

    report["netplan"] = netplansim.boot() if any(Path(d).glob("*.yaml") for d in NETPLAN_DIRS
                                                   if Path(d).is_dir()) else []
    if docker:
        dockerd_start()
    for unit in enabled_units():
        if unit not in early:
            started[unit] = _run(["systemctl", "start", unit], check=False).returncode
    report["units"] = started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["boot"]:
        print(json.dumps(boot("--docker" in args)))
        return 0
    if args[:1] == ["dockerd"]:  # what dockerd does to the filter table at a (re)start
        dockerd_start()
        return 0
    if args[:1] == ["networkd-carrier"]:  # networkd's reaction to a carrier that came or went
        from sparkctl_sim import netplansim

        print(json.dumps(netplansim.networkd_carrier()))
        return 0
    if args[:1] == ["netplan"]:
        sub = args[1:2]
        if sub == ["apply"]:
            netplan_apply()
            return 0
        if sub == ["generate"] and len(args) == 2:  # into the node's own /run (sparkctl_sim.netplansim)
            from sparkctl_sim import netplansim

            return netplansim.cmd_netplan_generate()
        if sub == ["generate"] or sub == []:
            # the real generator, untouched (netplan generate --root-dir DIR ...)
            return subprocess.run([REAL_NETPLAN, *args[1:]], check=False).returncode
        print(f"netplan {' '.join(sub)}: not simulated (apply, generate)", file=sys.stderr)
        return 1
    if args[:1] in (["networkctl"], ["nmcli"]):
        from sparkctl_sim import netplansim

        return (netplansim.cmd_networkctl if args[0] == "networkctl" else netplansim.cmd_nmcli)(args[1:])
    print("usage: python3 -m sparkctl_sim.clusterinit boot [--docker] | dockerd | netplan apply|generate "
          "| networkctl ... | nmcli ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
