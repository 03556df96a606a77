"""The fabric preparation plans: ``fabric apply`` and ``fabric restore``. Pure.

``fabric apply`` takes a node as it comes out of the box to one whose fabric
the laws accept: keep what it replaces (the node's netplan files, its sysctl
file and values) under :data:`~sparkctl.model.paths.FABRIC_BACKUP` the first
time, take foreign netplan files that configure fabric ports into that backup
(or refuse, naming them: :func:`refuse_foreign`), push the rendered netplan
file and the fabric filter unit (INPUT; on a ring's relays also DOCKER-USER, and
the sysctl file; with a profile, its clock-cap unit), flush stale addresses on the fabric ports,
``netplan generate`` and ``networkctl reconfigure`` of the fabric ports only
(never ``netplan apply``: see :func:`_reconfigure`), apply the sysctl file now
(``sysctl -p``; systemd-sysctl applies it at boot), enable the units, and wait
until each cabled port has exactly one RoCE v2 IPv4 GID, its own address.
``fabric restore`` puts the kept state back. Both are plans of ``run`` and
``put`` steps, printed by ``sparkctl plan fabric`` and run by the executor.
"""

from __future__ import annotations

import hashlib
import ipaddress
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from sparkctl import __version__
from sparkctl.errors import ConfigError
from sparkctl.model import watchdog
from sparkctl.model.inventory import Inventory
from sparkctl.model.netplanfile import NetplanFile, foreign, split_ports
from sparkctl.model.paths import (
    EARLYOOM_DEFAULT,
    FABRIC_BACKUP,
    FORWARD_UNIT,
    NETPLAN,
    NETPLAN_DIR,
    SYSCTL,
    SYSCTL_DIR,
    under,
)
from sparkctl.model.resources import Roots
from sparkctl.model.schema import LawsSpec
from sparkctl.plan import exporterplan
from sparkctl.plan.imageplan import revoke_steps
from sparkctl.plan.render import RenderedFile, Rendering, template_env
from sparkctl.plan.steps import FileRef, Plan, Step

GID_WAIT_S = 30  # mlx5 fills a RoCE v2 GID within a second of the address; 30 s is a dead port
APPLY_TIMEOUT_S = 120
# apt-get on a fresh box: install, and when that fails update and install again; each of the
# three may wait up to watchdog.DPKG_LOCK_TIMEOUT_S for the dpkg lock; then a slow mirror
APT_TIMEOUT_S = 3 * watchdog.DPKG_LOCK_TIMEOUT_S + 300
q = shlex.quote


@dataclass(frozen=True)
class FabricFiles:
    """What ``fabric apply`` pushes: node -> files; which units it enables on each node."""

    files: Mapping[str, tuple[RenderedFile, ...]]
    units: Mapping[str, tuple[str, ...]]  # unit names to `systemctl enable`

    def blobs(self) -> dict[str, bytes]:
        return {f.sha256: f.text.encode() for fs in self.files.values() for f in fs}


@dataclass(frozen=True)
class _NodeRef:
    node: str


def _relay(inv: Inventory, node: str) -> bool:
    return inv.topology == "ring" and bool(inv.routes_for(node))


# sparkctl's own chain for what a relay may forward, jumped to from the top of DOCKER-USER.
FORWARD_CHAIN = "SPARKCTL-FABRIC"
# sparkctl's own chain for what reaches a cabled node's fabric addresses, jumped to from the top of INPUT.
INPUT_CHAIN = "SPARKCTL-FABRIC-IN"


def _docker_user_rule(pool: str) -> str:
    """The pool->pool accept that sparkctl put straight into DOCKER-USER before FORWARD_CHAIN (removed)."""
    return f"-s {q(pool)} -d {q(pool)} -j ACCEPT"


def forward_rules(pool: str, ports: tuple[str, ...]) -> tuple[str, ...]:
    """The rules of FORWARD_CHAIN: fabric to fabric only, whatever FORWARD policy dockerd chose.

    dockerd sets the FORWARD policy to DROP only when it turned forwarding on itself (moby
    daemon/libnetwork/drivers/bridge/setup_ip_forwarding.go); after a reboot systemd-sysctl
    has done it first and the policy stays ACCEPT. So the relay accepts pool->pool between
    its fabric ports and drops anything else into or out of them (the management LAN, a
    docker bridge); traffic that touches no fabric port returns to DOCKER-USER untouched,
    so Docker's own bridge rules decide it as before."""
    rules = [f"-A {FORWARD_CHAIN} -i {i} -o {o} -s {pool} -d {pool} -j ACCEPT" for i in ports for o in ports]
    rules += [f"-A {FORWARD_CHAIN} -i {i} -j DROP" for i in ports]
    rules += [f"-A {FORWARD_CHAIN} -o {o} -j DROP" for o in ports]
    return tuple(rules)


def input_rules(pool: str, ports: tuple[str, ...]) -> tuple[str, ...]:
    """The rules of INPUT_CHAIN: the fabric pool is delivered locally from the fabric ports and lo only.

    Linux is a weak host: it accepts a packet for any local address on any interface
    (ip-sysctl.rst; no per-address setting refuses it), so a host on the management LAN that
    routes a node's own fabric address through the node's management address reaches an
    engine bound to that fabric address (serve.bind: fabric), relay or not. That is local
    delivery (INPUT), which FORWARD_CHAIN never sees. Anything else returns to INPUT as before."""
    rules = [f"-A {INPUT_CHAIN} -i {i} -j RETURN" for i in ("lo", *ports)]
    rules.append(f"-A {INPUT_CHAIN} -d {pool} -j DROP")
    return tuple(rules)


def _forward_sh(pool: str, ports: tuple[str, ...], relay: bool = True) -> tuple[str, str]:
    """(start, stop) shell of the fabric filter unit, with the real iptables.

    Every cabled node gets INPUT_CHAIN (jumped to from the top of INPUT); a relay also
    FORWARD_CHAIN (from the top of DOCKER-USER). The chains are replaced in one
    iptables-restore commit (``--noflush`` keeps every other chain; declaring a chain
    flushes it), so a re-apply never opens a gap. dockerd never touches an INPUT chain it
    did not create: it flushes and removes only its own chains (moby
    daemon/libnetwork/drivers/bridge/internal/iptabler/iptabler.go), and the host's filter
    INPUT only for a swarm overlay's encryption rule (drivers/overlay/encryption.go
    programInput, its own rule inserted or deleted). DOCKER-USER is created when dockerd
    has not started yet (it keeps a chain it finds, and never flushes it: moby
    daemon/libnetwork/firewall_linux.go setupUserChain), and so is the FORWARD jump to it
    (dockerd's EnsureJumpRule deletes and re-inserts it at the top at every start:
    daemon/libnetwork/iptables/iptables.go), so the rules hold from before dockerd's first
    start and through each of its restarts. A node that is no longer a relay loses
    FORWARD_CHAIN."""
    ipt = "iptables -w"
    chains = [f":{INPUT_CHAIN} - [0:0]", *input_rules(pool, ports)]
    if relay:
        chains = [f":{FORWARD_CHAIN} - [0:0]", *forward_rules(pool, ports), *chains]
    restore = " ".join(q(line) for line in ("*filter", *chains, "COMMIT"))
    start = ["set -e",
             f"printf '%s\\n' {restore} | iptables-restore -w --noflush",
             f"{ipt} -C INPUT -j {INPUT_CHAIN} 2>/dev/null || {ipt} -I INPUT 1 -j {INPUT_CHAIN}"]
    if relay:
        start += [
            f"{ipt} -N DOCKER-USER 2>/dev/null || true",
            f"{ipt} -C DOCKER-USER -j {FORWARD_CHAIN} 2>/dev/null || {ipt} -I DOCKER-USER 1 -j {FORWARD_CHAIN}",
            f"{ipt} -C FORWARD -j DOCKER-USER 2>/dev/null || {ipt} -I FORWARD 1 -j DOCKER-USER",
            f"while {ipt} -D DOCKER-USER {_docker_user_rule(pool)} 2>/dev/null; do :; done"]
    else:
        start.append(_forward_chain_stop_sh(pool))
    return "; ".join(start), _forward_stop_sh(pool)


def _forward_chain_stop_sh(pool: str) -> str:
    """Remove FORWARD_CHAIN and its jump (and an older sparkctl's DOCKER-USER rule); Docker's own stay."""
    ipt = "iptables -w"
    return (f"while {ipt} -D DOCKER-USER -j {FORWARD_CHAIN} 2>/dev/null; do :; done; "
            f"{{ {ipt} -F {FORWARD_CHAIN} && {ipt} -X {FORWARD_CHAIN}; }} 2>/dev/null || true; "
            f"while {ipt} -D DOCKER-USER {_docker_user_rule(pool)} 2>/dev/null; do :; done; true")


def _forward_stop_sh(pool: str) -> str:
    """Remove both chains and their jumps (and an older sparkctl's DOCKER-USER rule); Docker's own stay.
    Safe under ``set -e`` (the restore script) when there is nothing left to remove."""
    ipt = "iptables -w"
    return (f"while {ipt} -D INPUT -j {INPUT_CHAIN} 2>/dev/null; do :; done; "
            f"{{ {ipt} -F {INPUT_CHAIN} && {ipt} -X {INPUT_CHAIN}; }} 2>/dev/null || true; "
            + _forward_chain_stop_sh(pool))


def render_fabric(inv: Inventory, roots: Roots, profile_rendering: Rendering | None = None) -> FabricFiles:
    """The fabric files of every cabled node, from the inventory; the clock unit from a profile's rendering."""
    env = template_env(roots)
    files: dict[str, tuple[RenderedFile, ...]] = {}
    units: dict[str, tuple[str, ...]] = {}
    pool = inv.fabric_pool
    for n in inv.nodes:
        links = inv.node_links(n.name)
        if not links:
            continue
        relay = _relay(inv, n.name)
        accept_sh, remove_sh = _forward_sh(pool, tuple(ep.netdev for ep in inv.endpoints(n.name)), relay)
        ctx = dict(version=__version__, r=_NodeRef(n.name), node=n.name, inv=inv, links=links,
                   routes=inv.routes_for(n.name), mtu=inv.mtu, pool=pool, chain=FORWARD_CHAIN,
                   in_chain=INPUT_CHAIN, relay=relay, accept_sh=accept_sh, remove_sh=remove_sh)
        # every cabled node: its fabric addresses from its fabric ports only; a relay also forwards
        want = [(NETPLAN, "fabric-netplan.yaml.j2", 0o600),
                *([(SYSCTL, "sysctl-forward.conf.j2", 0o644)] if relay else []),
                (FORWARD_UNIT, "sparkctl-fabric-forward.service.j2", 0o644)]
        node_units: list[str] = [posixpath.basename(FORWARD_UNIT)]
        out = []
        for path, tmpl, mode in want:
            full = under(n.prefix, path)
            out.append(RenderedFile(full, env.get_template(tmpl).render(**ctx), mode, "fabric"))
        if profile_rendering is not None:
            for f in profile_rendering.files.get(n.name, {}).values():
                if f.role == "clock":
                    out.append(f)
                    node_units.append(posixpath.basename(f.path))
        files[n.name] = tuple(out)
        units[n.name] = tuple(node_units)
    return FabricFiles(files, units)


def _gid(address: str) -> str:
    packed = ipaddress.IPv4Address(address).packed
    return "0000:0000:0000:0000:0000:ffff:" + f"{packed[0]:02x}{packed[1]:02x}:{packed[2]:02x}{packed[3]:02x}"


def _gid_wait(inv: Inventory, node: str) -> str:
    """Wait until each cabled port has exactly one RoCE v2 IPv4 GID, and it is its own address."""
    n = inv.node(node)
    lines = [f"end=$(( $(date +%s) + {GID_WAIT_S} ))", "while :; do", "  bad="]
    for ep in inv.endpoints(node):
        port = f"{n.sysfs_root}/class/infiniband/{ep.rdma}/ports/1"
        lines += [
            f"  p={q(port)}; c=0; own=0",
            '  for g in "$p"/gids/*; do n=${g##*/}',
            '    t=$(cat "$p/gid_attrs/types/$n" 2>/dev/null); v=$(cat "$g" 2>/dev/null)',
            '    case "$v" in 0000:0000:0000:0000:0000:ffff:*) ;; *) continue ;; esac',
            '    [ "$t" = "RoCE v2" ] || continue',
            f'    c=$((c + 1)); [ "$v" = {q(_gid(ep.address))} ] && own=1',
            "  done",
            f'  [ "$c" = 1 ] && [ "$own" = 1 ] || bad="$bad {ep.rdma}({ep.netdev}):$c"',
        ]
    lines += ['  [ -z "$bad" ] && exit 0',
              '  if [ "$(date +%s)" -ge "$end" ]; then echo "ports without exactly one RoCE v2 IPv4 GID '
              f'of their own address after {GID_WAIT_S} s:$bad" >&2; exit 1; fi',
              "  sleep 0.5", "done"]
    return "\n".join(lines)


def _backup(inv: Inventory, node: str) -> str:
    """Keep the node's netplan dir, sysctl file and values the first time only (re-apply keeps the original)."""
    n = inv.node(node)
    b = q(under(n.prefix, FABRIC_BACKUP))
    nd, sd = q(under(n.prefix, NETPLAN_DIR)), q(under(n.prefix, SYSCTL_DIR))
    eo = q(under(n.prefix, EARLYOOM_DEFAULT))
    keys = ["net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter",
            *(f"net.ipv4.conf.{ep.netdev}.rp_filter" for ep in inv.endpoints(node))]
    sysctl_file = posixpath.basename(SYSCTL)
    return "\n".join([
        f"b={b}; [ -e \"$b/complete\" ] && {{ echo kept; exit 0; }}",
        'rm -rf "$b"; mkdir -p "$b/netplan" "$b/sysctl.d"; chmod 700 "$b"',
        f'[ -d {nd} ] && cp -a {nd}/. "$b/netplan/"; [ -d {nd} ] || : > "$b/no-netplan-dir"',
        f'[ -e {sd}/{sysctl_file} ] && cp -a {sd}/{sysctl_file} "$b/sysctl.d/"',
        f'sysctl -e {" ".join(keys)} > "$b/sysctl.values" 2>/dev/null || true',
        f'[ -e {eo} ] && cp -a {eo} "$b/earlyoom.default"',
        f'for u in {" ".join(posixpath.basename(p) for p in (FORWARD_UNIT,))} sparkctl-clock-cap.service '
        f'{watchdog.UNIT}; do',
        '  printf "%s %s\\n" "$u" "$(systemctl is-enabled "$u" 2>/dev/null || true)"; done > "$b/units"',
        ': > "$b/complete"; echo saved',
    ])


# --------------------------------------------------------------------------- foreign netplan files
#
# netplan merges every file of /etc/netplan, concatenating a device's address lists across
# files (netplan doc/netplan-generate.md). NVIDIA's "Connect two Sparks" playbook leaves
# /etc/netplan/40-cx7.yaml on the CX-7 ports (link-local: [ipv4], or static
# 192.168.100.x/24 and 192.168.101.x/24): left in place, a fabric port carries a second IPv4
# address and RoCE v2 GID beside sparkctl's. A file that configures fabric ports only is
# taken into the fabric backup (moved aside; `fabric restore` puts it back byte for byte):
# nothing but the fabric depends on it. A file that also configures another interface (the
# management link) is refused: moving it would cut that link at the next boot, and editing
# it would leave a file that is no longer the operator's.


@dataclass(frozen=True)
class ForeignNetplan:
    """A netplan file of a node, other than sparkctl's, that configures fabric ports."""

    node: str
    file: NetplanFile
    ports: tuple[str, ...]  # the CX-7 netdevs it configures
    others: tuple[str, ...]  # every other interface it configures

    @property
    def taken(self) -> bool:
        return not self.others and not self.file.error


def _cx7_netdevs(inv: Inventory, node: str) -> tuple[str, ...]:
    return tuple(nd for port in inv.node(node).ports.values() for nd in port.netdevs)


def foreign_netplan(inv: Inventory, netplan: Mapping[str, tuple[NetplanFile, ...]]) -> tuple[ForeignNetplan, ...]:
    """Every foreign netplan file of a cabled node that configures one of its CX-7 ports (or that
    sparkctl could not read, so cannot say it does not)."""
    out = []
    for node, files in netplan.items():
        if not inv.node_links(node):
            continue
        cx7 = _cx7_netdevs(inv, node)
        for f in foreign(files):
            ports, others = split_ports(f, cx7)
            if ports or f.error:
                out.append(ForeignNetplan(node, f, ports, others))
    return tuple(out)


def refuse_foreign(found: tuple[ForeignNetplan, ...]) -> None:
    """Raise, naming each file, when a foreign netplan file cannot be taken into the backup."""
    bad = [f for f in found if not f.taken]
    if not bad:
        return
    lines = []
    for f in bad:
        what = (f"cannot be read ({f.file.error})" if f.file.error else
                f"configures fabric port{'s' if len(f.ports) > 1 else ''} {', '.join(f.ports)} and also "
                f"{', '.join(f.others)}")
        lines.append(f"{f.node}: {f.file.path} {what}")
    raise ConfigError(
        "fabric apply: a netplan file configures the fabric ports beside sparkctl's, and sparkctl will not move "
        "it (netplan merges every file's addresses: the port would carry two addresses and two GIDs):\n  "
        + "\n  ".join(lines),
        hint="move the CX-7 ports' part of that file into a file of its own (sparkctl then keeps it in the fabric "
             "backup and `fabric restore` puts it back), or delete those ports from it; then run `fabric apply` "
             "again. A file that configures fabric ports only is taken aside without asking.")


def _take_aside(inv: Inventory, node: str, found: tuple[ForeignNetplan, ...]) -> str:
    """Move each foreign file into the backup's copy of the netplan dir, refusing one that changed since read."""
    n = inv.node(node)
    b = q(under(n.prefix, FABRIC_BACKUP))
    lines = ["set -e", f"b={b}"]
    for f in found:
        path, kept = q(under(n.prefix, f.file.path)), f'"$b/netplan/"{q(f.file.name)}'
        lines += [
            f"if [ -e {path} ]; then",
            f'  echo {q(f.file.sha256 + "  " + under(n.prefix, f.file.path))} | sha256sum -c --status || '
            f'{{ echo {q(f"{f.file.path} changed since sparkctl read it: run fabric apply again")} >&2; exit 1; }}',
            f"  cmp -s {path} {kept} || cp -a {path} {kept}",
            # restore then rebuilds the dir from $b/netplan even when the first apply found none
            '  rm -f "$b/no-netplan-dir"',
            f"  rm -f {path}; echo {q('moved aside: ' + f.file.path)}",
            "fi",
        ]
    return "\n".join(lines)


def _nm_ports(netdevs: tuple[str, ...], managed: bool) -> list[str]:
    """Where NetworkManager runs (DGX OS is a desktop image), hand the ports to networkd or back.

    `nmcli device set IF managed no|yes` changes that one device only (nmcli(1)); netplan's own
    NetworkManager config keeps them unmanaged after a reboot (it lists networkd's devices as
    unmanaged-devices for NetworkManager). Handing them back, NetworkManager first re-reads its
    connection files (`nmcli connection reload`: loads what changed, activates nothing else)."""
    if not netdevs:
        return []
    word = "yes" if managed else "no"
    sets = "; ".join(f"nmcli device set {q(nd)} managed {word} || true" for nd in netdevs)
    first = "nmcli connection reload || true; " if managed else ""
    return [f'if command -v nmcli >/dev/null 2>&1 && [ "$(nmcli -t -f RUNNING general 2>/dev/null)" = running ]; '
            f"then {first}{sets}; fi"]


def _reconfigure(netdevs: tuple[str, ...]) -> list[str]:
    """Apply the netplan files to the fabric ports only, never `netplan apply`.

    `netplan apply` disconnects every interface named by a netplan-generated NetworkManager
    profile and stops and restarts NetworkManager whenever such profiles exist
    (canonical/netplan netplan_cli/cli/commands/apply.py, command_apply): on DGX OS the
    management link the session runs on is one of them. `netplan generate` only writes the
    backends' files; `networkctl reload` + `networkctl reconfigure PORTS` (what apply.py itself
    runs for networkd) touch the named links alone. A session lost half-way leaves the
    management link as it was, and running `fabric apply` again redoes every line."""
    ports = " ".join(q(nd) for nd in netdevs)
    return ["netplan generate",
            "networkctl reload || { systemctl start systemd-networkd.service && networkctl reload; }",
            f"networkctl reconfigure {ports}"]


def _apply(inv: Inventory, node: str, units: tuple[str, ...],
           aside: tuple[ForeignNetplan, ...] = ()) -> str:
    n = inv.node(node)
    lines = ["set -e"]
    ports = tuple(ep.netdev for ep in inv.endpoints(node))
    lines += _nm_ports(ports, managed=False)
    # stale addresses (an earlier plan, a hand-made one, a file just taken aside) go first
    for nd in ports:
        lines.append(f"ip -4 addr flush dev {q(nd)}")
    # an uncabled port a file taken aside configured keeps no address of it either (when it exists)
    for nd in dict.fromkeys(p for f in aside for p in f.ports if p not in ports):
        sysfs = q(posixpath.join(n.sysfs_root, "class/net", nd))
        lines.append(f"if [ -e {sysfs} ]; then ip -4 addr flush dev {q(nd)}; fi")
    lines += _reconfigure(ports)
    if _relay(inv, node):
        lines.append(f"sysctl -q -p {q(under(n.prefix, SYSCTL))}")
    if units:
        lines.append("systemctl daemon-reload")
        names = " ".join(q(u) for u in units)
        # restart, not enable --now: an active oneshot is not run again by a start (systemctl(1))
        lines.append(f"systemctl enable {names}")
        lines.append(f"systemctl restart {names}")
    return "\n".join(lines)


def _fan(inv: Inventory, cmds: Mapping[str, str]) -> dict[str, bool]:
    return {n: inv.node(n).sudo for n in cmds}


def _watchdog(inv: Inventory, node: str, laws: LawsSpec) -> str:
    """Install, keep the package's own file in the backup when the first apply found none
    (so `fabric restore` puts Debian's back), then configure."""
    n = inv.node(node)
    b, eo = q(under(n.prefix, FABRIC_BACKUP)), q(under(n.prefix, EARLYOOM_DEFAULT))
    keep = (f'b={b}; if [ -e "$b/complete" ] && [ ! -e "$b/earlyoom.default" ] && [ -e {eo} ]; then '
            f'cp -a {eo} "$b/earlyoom.default"; fi')
    return "\n".join([watchdog.install_command(), keep, watchdog.configure_command(laws, n.prefix)])


def plan_fabric_apply(inv: Inventory, fabric: FabricFiles, profile: str | None = None,
                      laws: LawsSpec | None = None,
                      netplan: Mapping[str, tuple[NetplanFile, ...]] | None = None,
                      exporters: exporterplan.ExporterFiles | None = None) -> Plan:
    """Every node gets the memory watchdog (law memory_watchdog, from the profile's limits or the
    defaults); the cabled ones their fabric. ``netplan``: each node's netplan files as read
    (:mod:`sparkctl.facts.netplanfiles`); a foreign file on the fabric ports is taken into the
    backup, or the plan is refused (:func:`refuse_foreign`)."""
    order = [x.name for x in inv.nodes]
    nodes = tuple(sorted(fabric.files, key=order.index))
    every = tuple(order)
    found = foreign_netplan(inv, netplan or {})
    refuse_foreign(found)
    aside_of = {n: tuple(f for f in found if f.node == n) for n in nodes}
    aside = {n: _take_aside(inv, n, fs) for n, fs in aside_of.items() if fs}
    backup = {n: _backup(inv, n) for n in every}
    put = {n: tuple(FileRef(f.path, f.mode, f.sha256) for f in fabric.files[n]) for n in nodes}
    apply = {n: _apply(inv, n, fabric.units.get(n, ()), aside_of.get(n, ())) for n in nodes}
    wait = {n: _gid_wait(inv, n) for n in nodes}
    guard = {n: _watchdog(inv, n, laws or LawsSpec()) for n in every}
    relays = [n for n in nodes if _relay(inv, n)]
    steps = [
        Step("backup", "backup", "run", every, "keep the netplan files, sysctl file and values, earlyoom's "
             "file it replaces (first apply only)", changes=f"{FABRIC_BACKUP} written", commands=backup,
             sudo=_fan(inv, backup), timeout_s=30)]
    if aside:
        which = "; ".join(f"{f.node}: {f.file.path} ({', '.join(f.ports)})" for fs in aside_of.values() for f in fs)
        steps.append(Step("netplan-aside", "backup", "run", tuple(aside), "take the netplan files that configure "
                          f"fabric ports into the fabric backup (`fabric restore` puts them back): {which}",
                          changes="foreign netplan files moved into " + FABRIC_BACKUP, commands=aside,
                          sudo=_fan(inv, aside), timeout_s=30))
    if nodes:
        steps += [
            Step("push", "push", "put", nodes, "push the rendered fabric files", changes="netplan file and "
                 "fabric filter unit (INPUT; DOCKER-USER on relays)"
                 + (", sysctl file on " + ", ".join(relays) if relays else ""), files=put,
                 sudo={n: inv.node(n).sudo for n in nodes}),
            Step("apply", "apply", "run", nodes, "flush stale fabric addresses, netplan generate, networkctl "
                 "reconfigure the fabric ports only (never netplan apply), sysctl -p, enable units",
                 changes="fabric addresses, routes, forwarding, rp_filter, INPUT and DOCKER-USER rules, enabled units",
                 commands=apply, sudo=_fan(inv, apply), timeout_s=APPLY_TIMEOUT_S),
            Step("gids", "verify", "run", nodes, "wait for exactly one RoCE v2 IPv4 GID per cabled port",
                 commands=wait, sudo=_fan(inv, wait), timeout_s=GID_WAIT_S + 15)]
    steps.append(Step("watchdog", "watchdog", "run", every, "install earlyoom if missing (apt-get, waiting up to "
                      f"{watchdog.DPKG_LOCK_TIMEOUT_S} s for the dpkg lock), write "
                      f"{EARLYOOM_DEFAULT} from laws.min_free_gib, enable and (re)start it (law memory_watchdog)",
                      changes="earlyoom installed, configured, enabled", commands=guard, sudo=_fan(inv, guard),
                      timeout_s=APT_TIMEOUT_S))
    if exporters is not None:  # every node's exporter, after the fabric (the head's page asks its peers)
        steps += exporterplan.exporter_steps(inv, exporters)
    return Plan("fabric apply", profile, tuple(steps),
                note="" if nodes else "no cabled node: only the memory watchdog to prepare")


def _restore(inv: Inventory, node: str) -> str:
    n = inv.node(node)
    b = q(under(n.prefix, FABRIC_BACKUP))
    nd, sd = q(under(n.prefix, NETPLAN_DIR)), q(under(n.prefix, SYSCTL_DIR))
    ours = " ".join(q(under(n.prefix, p)) for p in (NETPLAN, SYSCTL, FORWARD_UNIT))
    eo = q(under(n.prefix, EARLYOOM_DEFAULT))
    lines = [
        "set -e",
        # the exporter goes first: `fabric apply` installed it on every node, backup or not
        exporterplan.remove_command(n.prefix),
        f'b={b}; [ -e "$b/complete" ] || {{ echo "no fabric backup on this node ($b): nothing to restore" >&2; exit 3; }}',
        f"systemctl disable --now {q(posixpath.basename(FORWARD_UNIT))} >/dev/null 2>&1 || true",
        # the unit's ExecStop does it too; a unit already gone (or never started) must not leave the rules
        _forward_stop_sh(inv.fabric_pool),
        'while read -r u s; do [ "$s" = enabled ] || systemctl disable "$u" >/dev/null 2>&1 || true; done < "$b/units"',
        f"rm -f {ours}",
        "systemctl daemon-reload",
        f'if [ -e "$b/no-netplan-dir" ]; then rm -rf {nd}; else mkdir -p {nd}; find {nd} -mindepth 1 -delete; '
        f'cp -a "$b/netplan/." {nd}/; fi',
        f'cp -a "$b/sysctl.d/." {sd}/ 2>/dev/null || true',
        # earlyoom: its file as it was; stopped when it was not enabled before (the package stays)
        f'if [ -e "$b/earlyoom.default" ]; then cp -a "$b/earlyoom.default" {eo}; fi',
        f'if grep -qx "{watchdog.UNIT} enabled" "$b/units"; then systemctl try-restart {watchdog.UNIT} || true; '
        f'else systemctl disable --now {watchdog.UNIT} >/dev/null 2>&1 || true; fi',
    ]
    for ep in inv.endpoints(node):
        lines.append(f"ip -4 addr flush dev {q(ep.netdev)}")
    ports = tuple(ep.netdev for ep in inv.endpoints(node))
    if ports:  # the fabric ports only, as `fabric apply` did (see _reconfigure): never `netplan apply`
        lines += _reconfigure(ports)
        lines += _nm_ports(ports, managed=True)
    lines += [
        'while IFS= read -r kv; do [ -n "$kv" ] && sysctl -q -w "$(printf %s "$kv" | tr -d " ")" || true; '
        'done < "$b/sysctl.values"',
        'rm -rf "$b"; echo restored',
    ]
    return "\n".join(lines)


def plan_fabric_restore(inv: Inventory) -> Plan:
    nodes = tuple(n.name for n in inv.nodes)
    cmds = {n: _restore(inv, n) for n in nodes}
    return Plan("fabric restore", None, (
        # sparkctl's node-to-node keys (image sync's, the supervisor's) reach the nodes over the fabric: they go
        # with it, first, so that a node with nothing else to restore loses them too
        *revoke_steps(inv),
        Step("restore", "restore", "run", nodes, "remove the exporter; put back the netplan files, sysctl file and "
             "values, earlyoom's file, units",
             changes="fabric files, addresses, forwarding, INPUT and DOCKER-USER rules, enabled units, earlyoom's arguments",
             commands=cmds, sudo=_fan(inv, cmds), timeout_s=APPLY_TIMEOUT_S),
    ))


def digest(fabric: FabricFiles) -> str:
    h = hashlib.sha256()
    for n in sorted(fabric.files):
        for f in fabric.files[n]:
            h.update(f"{n}\0{f.path}\0{f.sha256}\0".encode())
    return h.hexdigest()[:16]
