"""Where a node is reached: ssh_config merged with the inventory, ProxyJump chains included.

This module owns the resolution of one inventory node into an :class:`Endpoint`
(address, port, user, identities, the name its host key is filed under, and the
chain of jump hosts in front of it). ``~/.ssh/config`` (or the file given)
supplies HostName, User, Port, IdentityFile, IdentitiesOnly, HostKeyAlias and
ProxyJump, as OpenSSH reads them (ssh_config(5)); the inventory's ssh_user,
ssh_port and ssh_identity win over it. A ``ProxyJump a,b`` chain is resolved
hop by hop, the first hop possibly behind its own ProxyJump, as ssh(1) does.

sparkctl resolves this itself and hands fabric a ready endpoint (fabric's own
lookup would apply ssh_config a second time, to the HostKeyAlias, and it
ignores the inventory). ProxyCommand is refused: only ProxyJump is supported.

What it must not do: open connections, print, or exit. Pure but for reading
the ssh_config file.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path

from paramiko.config import SSHConfig
from paramiko.ssh_exception import SSHException

from sparkctl.errors import Ref, TransportError
from sparkctl.model.inventory import Node
from sparkctl.transport.hostkeys import known_hosts_name

_JUMP_RE = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?$")
_MAX_JUMP_DEPTH = 4  # a longer nesting is almost surely a loop in ssh_config


@dataclass(frozen=True)
class Endpoint:
    """Where and how to log in, after ssh_config and the inventory were merged."""

    label: str  # "node a" / "jump host j (for node a)"
    host: str  # address to connect to (HostName)
    port: int
    user: str
    identities: tuple[str, ...]
    identities_only: bool
    hostkey_host: str  # the name looked up in known_hosts (HostKeyAlias or host)
    jump: Endpoint | None = None
    is_jump: bool = False

    @property
    def hostkey_name(self) -> str:
        return known_hosts_name(self.hostkey_host, self.port)

    @property
    def key(self) -> str:
        via = f" via {self.jump.key}" if self.jump else ""
        return f"{self.user}@{self.host}:{self.port}{via}"

    @property
    def where(self) -> str:
        """``host:port`` (and the first jump), for error messages."""
        return f"{self.host}:{self.port}" + (f" via {self.jump.host}:{self.jump.port}" if self.jump else "")


def read_ssh_config(path: str | os.PathLike[str] | None) -> SSHConfig:
    """The ssh_config at ``path`` (default ``~/.ssh/config``); empty when there is none."""
    cfg_path = Path(path).expanduser() if path else Path("~/.ssh/config").expanduser()
    try:
        return SSHConfig.from_path(str(cfg_path)) if cfg_path.is_file() else SSHConfig()
    except (SSHException, OSError, ValueError) as exc:
        raise TransportError(f"cannot read ssh config: {exc}", Ref(file=str(cfg_path))) from None


def resolve_endpoint(config: SSHConfig, node: Node) -> Endpoint:
    """Where ``node`` is reached."""
    cfg = dict(config.lookup(node.host))
    if str(cfg.get("proxycommand", "none")).lower() != "none" and "proxyjump" not in cfg:
        raise TransportError(
            f"ssh_config sets ProxyCommand for {node.host}; sparkctl supports ProxyJump only",
            Ref(node=node.name), hint="replace ProxyCommand with ProxyJump in ~/.ssh/config",
        )
    identities = (node.ssh_identity,) if node.ssh_identity else tuple(cfg.get("identityfile", ()))
    host = str(cfg.get("hostname", node.host))
    return Endpoint(
        label=f"node {node.name}", host=host, port=node.ssh_port, user=node.ssh_user,
        identities=tuple(str(Path(p).expanduser()) for p in identities),
        identities_only=str(cfg.get("identitiesonly", "no")).lower() == "yes",
        hostkey_host=str(cfg.get("hostkeyalias", host)),
        jump=_jump_chain(config, str(cfg.get("proxyjump", "none")), f"node {node.name}"),
    )


def _jump_chain(config: SSHConfig, spec: str, target: str, depth: int = 0) -> Endpoint | None:
    if spec.lower() == "none" or not spec.strip():
        return None
    if depth > _MAX_JUMP_DEPTH:
        raise TransportError(f"ProxyJump chain for {target} is too long (a loop in ssh_config?)")
    hops = [h.strip() for h in spec.split(",") if h.strip()]
    jump: Endpoint | None = None
    for i, hop in enumerate(hops):
        m = _JUMP_RE.match(hop)
        if not m:
            raise TransportError(f"cannot read ProxyJump {hop!r} for {target}", hint="write [user@]host[:port]")
        alias = m["host"].strip("[]")
        cfg = dict(config.lookup(alias))
        host = str(cfg.get("hostname", alias))
        if i == 0:  # the first hop may itself sit behind a jump host
            jump = _jump_chain(config, str(cfg.get("proxyjump", "none")), f"jump host {alias}", depth + 1)
        jump = Endpoint(
            label=f"jump host {alias} (for {target})", host=host,
            port=int(m["port"] or cfg.get("port", 22)),
            user=m["user"] or str(cfg.get("user") or getpass.getuser()),
            identities=tuple(str(Path(p).expanduser()) for p in cfg.get("identityfile", ())),
            identities_only=str(cfg.get("identitiesonly", "no")).lower() == "yes",
            hostkey_host=str(cfg.get("hostkeyalias", host)), jump=jump, is_jump=True,
        )
    return jump


__all__ = ["Endpoint", "read_ssh_config", "resolve_endpoint"]
