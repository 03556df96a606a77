"""``sparkctl inventory discover``: reach each host, read what its fabric ports see, find the cabling.

One read-only probe per host (``sparkctl.facts.discovery``: sysfs, ethtool, ip, and a
2 s ping of ff02::1 on each up port to fill the neighbour table), all hosts at once over
the same SSH transport as every other command; the pure core
(``sparkctl.model.cabling.find_topology``) turns the answers into a pair, a ring, a switch
or a list of problems. Nothing here changes a host (no plan: there is nothing to execute).

Owns: the HOST arguments (``[NAME=][USER@]HOST[:PORT]``), the transport's nodes for hosts
that are not in an inventory yet, the progress per host. Must not print or exit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sparkctl.errors import ConfigError, TransportError
from sparkctl.facts.batch import remote_command
from sparkctl.facts.discovery import PING_DEADLINE_S, node_name, parse_probe, probe_script
from sparkctl.model.cabling import Finding, HostSeen, SshSettings, find_topology
from sparkctl.model.inventory import Node
from sparkctl.model.schema import HOST_RE, NAME_RE, SSH_USER_RE, default_ports

Progress = Callable[[str, str, str], None]


@dataclass(frozen=True)
class HostArg:
    name: str | None
    user: str | None
    host: str
    port: int | None

    @property
    def label(self) -> str:
        return self.name or self.host


_ARG = re.compile(r"(?:(?P<name>[^=@]+)=)?(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:@\[\]]+|[0-9a-fA-F:]+)"
                  r"(?::(?P<port>[0-9]+))?")


def parse_host_arg(text: str) -> HostArg:
    """``[NAME=][USER@]HOST[:PORT]`` (an IPv6 literal in brackets when a port follows)."""
    m = _ARG.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"host {text!r} is not [NAME=][USER@]HOST[:PORT]", hint="e.g. spark-a=192.168.1.101")
    name, user, host, port = m.group("name"), m.group("user"), m.group("host").strip("[]"), m.group("port")
    if name is not None and not re.fullmatch(NAME_RE, name):
        raise ConfigError(f"node name {name!r} in {text!r} is not a valid name",
                          hint="letters, digits, '.', '_', '-'; starts with a letter or digit")
    if user is not None and not re.fullmatch(SSH_USER_RE, user):
        raise ConfigError(f"ssh user {user!r} in {text!r} is not a login name")
    if not re.fullmatch(HOST_RE, host):
        raise ConfigError(f"host {host!r} in {text!r} is not a host name or address")
    p = int(port) if port else None
    if p is not None and not 1 <= p <= 65535:
        raise ConfigError(f"port {p} in {text!r} is out of range")
    return HostArg(name, user, host, p)


@dataclass(frozen=True)
class Discovery:
    finding: Finding
    hosts: tuple[HostSeen, ...]
    unreadable: dict[str, list[str]] = field(default_factory=dict)  # host -> what could not be read

    def to_dict(self) -> dict[str, object]:
        return {
            **self.finding.to_dict(),
            "hosts": [{"name": h.name, "host": h.host, "ports": [
                {"netdev": s.netdev, "rdma": s.rdma, "mac": s.mac, "operstate": s.operstate, "mtu": s.mtu,
                 "speed_mbps": s.speed_mbps, "carrier_changes": list(s.carrier_changes),
                 "link_local": list(s.own), "answered": list(s.answered), "neighbours": dict(s.neighbours)}
                for s in h.netdevs.values()]} for h in self.hosts],
            "unreadable": self.unreadable,
        }


def _node(arg: HostArg, index: int, ssh: SshSettings) -> Node:
    return Node(name=arg.label, index=index, host=arg.host, ssh_user=arg.user or ssh.user,
                ssh_port=arg.port or ssh.port, ssh_identity=ssh.identity, sudo=False, known_hosts=ssh.known_hosts,
                prefix="/", sysfs_root="/sys", proc_root="/proc", mgmt_iface="enP7s7", ports=default_ports())


def discover(args: Sequence[str], ssh: SshSettings, make_transport: Callable[[Sequence[Node]], object],
             progress: Progress) -> Discovery:
    """Probe every host at once; the finding, or :class:`TransportError` naming the hosts that did not answer."""
    hosts = [parse_host_arg(a) for a in args]
    labels = [h.label for h in hosts]
    if len(set(labels)) != len(labels):
        raise ConfigError("a host is named twice", hint="give each host once")
    nodes = [_node(h, i, ssh) for i, h in enumerate(hosts)]
    script = remote_command(probe_script())
    for n in nodes:
        progress(n.name, "probe", f"{n.ssh_user}@{n.host}:{n.ssh_port}: reading its fabric ports, pinging "
                 f"ff02::1 on each up port for {PING_DEADLINE_S} s (read-only)")
    transport = make_transport(nodes)
    with transport as t:  # type: ignore[attr-defined]
        fan = t.run_all({n.name: script for n in nodes}, timeout_s=PING_DEADLINE_S + 30)
    failed = []
    seen: list[HostSeen] = []
    unreadable: dict[str, list[str]] = {}
    for n, arg in zip(nodes, hosts):
        r = fan[n.name]
        if r.error is not None or r.exit_code != 0:
            progress(n.name, "failed", r.last_line)
            failed.append(f"{n.name}: {r.last_line}")
            continue
        hostname, netdevs, bad = parse_probe(r.stdout)
        name = arg.name or (node_name(hostname) if hostname else None)
        if name is None or not re.fullmatch(NAME_RE, name):
            raise ConfigError(f"{n.name}: its hostname {hostname!r} is no node name",
                              hint=f"name it on the command line: NAME={arg.host}")
        if bad:
            unreadable[name] = bad
        up = [nd for nd, s in netdevs.items() if s.up]
        progress(n.name, "read", f"{name}: {len(netdevs)} fabric netdevs, {len(up)} up"
                 + (f"; unreadable: {'; '.join(bad)}" if bad else ""))
        seen.append(HostSeen(name=name, host=arg.host, netdevs=netdevs, probe_s=float(PING_DEADLINE_S)))
    if failed:
        raise TransportError(f"{len(failed)} of {len(nodes)} host(s) did not answer: {'; '.join(failed)}",
                             hint="check the address, --user, --identity and --known-hosts (`sparkctl trust`)")
    return Discovery(find_topology(seen), tuple(seen), unreadable)
