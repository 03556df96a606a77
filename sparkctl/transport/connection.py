"""SSH to the nodes on fabric: one ``fabric.Connection`` per node, reused, and :class:`SSHTransport`.

This module owns every SSH connection sparkctl makes. Underneath is fabric:
each endpoint (node or jump host) is a :class:`NodeConnection`, a
``fabric.Connection`` whose ``gateway`` is the Connection of the jump host in
front of it (fabric's own ProxyJump chaining, fabric/connection.py
``open_gateway``). What sparkctl adds to fabric's Connection is small and named:

1. the host-key policy (:mod:`sparkctl.transport.hostkeys`): fabric's
   Connection installs paramiko's auto-adding policy in its constructor; it is
   replaced at once by :class:`~sparkctl.transport.hostkeys.RejectUnknown`,
   and only the node's known_hosts files are loaded;
2. the dial: a TCP connect that honours the connect timeout over every
   address, and a ``direct-tcpip`` channel through the jump host that honours
   it too (fabric opens that channel without a timeout; paramiko then waits up
   to an hour, paramiko/transport.py ``open_channel``); the key is looked up
   under the HostKeyAlias while the real address is dialled;
3. the connect timeout applied to the banner, the key exchange, the login and
   the session open (fabric's ``connect_timeout`` is ``int()``-ed, so 0.5 s
   would become "no timeout"); failures become ``CommandResult`` errors with a
   category word (``unreachable:``, ``timeout:``, ``auth:``, ``ssh:``).

Commands run on a session channel of that Connection (see session.py for why
not through ``Connection.run``), wrapped as ``[sudo -n --] timeout ... sh -c CMD``.
The fan-out is :meth:`BaseTransport.run_all`, over these Connections.

What it must not do: decide what to run, parse output, print, or exit.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fabric
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from sparkctl.errors import Ref, TransportError
from sparkctl.model.inventory import Node
from sparkctl.transport.base import (
    BaseTransport,
    Cancel,
    TransportSettings,
    sudo_error,
    sudo_needs_password,
    unknown_node,
    wire_command,
)
from sparkctl.transport.endpoints import Endpoint, read_ssh_config, resolve_endpoint
from sparkctl.transport.hostkeys import (
    HostKeyError,
    KnownHosts,
    RejectUnknown,
    UnknownHostKey,
    changed_key_error,
    default_known_hosts,
    fingerprint_sha256,
    known_hosts_paths,
    load_known_hosts,
    record_host_key,
    revoked_key_error,
    unknown_key_error,
)
from sparkctl.transport.results import CommandResult
from sparkctl.transport.session import run_on_channel

log = logging.getLogger("sparkctl.transport")

_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}


class ConnectFailed(Exception):
    """An expected failure to connect; becomes a CommandResult error (its text starts with the category)."""


def open_tcp(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection within ``timeout_s`` (each address tried with what is left), with Nagle's
    algorithm off: SSH's small messages go out at once. With it on, a channel open sent behind
    another unacknowledged small packet waited for the node's delayed ACK, about 40 ms on Linux
    (tcp(7), TCP_NODELAY and TCP_QUICKACK), at every command and twice in every login: 41 ms
    per command against 0.3 ms, measured with paramiko against the simulated nodes' sshd.
    OpenSSH's own client and sshd do the same once a session starts (packet.c,
    ssh_packet_set_interactive calls set_nodelay whatever the session), paramiko does not."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(left)
        try:
            sock.connect(addr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    if isinstance(last, ConnectionRefusedError):
        raise NoValidConnectionsError({(host, port): last})
    if last is None or isinstance(last, TimeoutError):
        raise TimeoutError(f"connect to {host}:{port} timed out")
    raise last


class NodeConnection(fabric.Connection):  # type: ignore[misc]  # fabric ships no type hints
    """fabric's Connection to one endpoint, with sparkctl's host-key policy, dial and timeouts.

    ``open()`` is safe from many threads (one connection is opened, the others
    wait for it) and reopens a connection that died. ``on_open`` is called once
    per connection really opened (for :attr:`SSHTransport.connections_opened`).
    """

    transport: paramiko.Transport | None  # fabric's: None until open() (and after drop())

    # invoke's Context stores attributes it does not know in its config
    # (invoke/config.py DataProxy.__setattr__), which deep-copies them; ours
    # are set with its documented workaround, ``_set``.
    known: KnownHosts
    endpoint: Endpoint
    node_name: str
    connect_timeout_s: float

    def __init__(
        self, ep: Endpoint, node: str, known_hosts: Iterable[Path], connect_timeout_s: float, *,
        gateway: NodeConnection | None = None, on_open: Callable[[NodeConnection], None] | None = None,
    ) -> None:
        ct = connect_timeout_s
        connect_kwargs: dict[str, Any] = {
            "look_for_keys": not ep.identities, "allow_agent": not ep.identities_only,
            "timeout": ct, "banner_timeout": ct, "auth_timeout": ct, "channel_timeout": ct,
        }
        if ep.identities:
            connect_kwargs["key_filename"] = list(ep.identities)
        # lazy: no ~/.fabric.yaml, /etc/fabric.yaml or ssh_config read by fabric; endpoints.py resolved them
        super().__init__(
            ep.hostkey_host, user=ep.user, port=ep.port, config=fabric.Config(lazy=True),
            gateway=gateway if gateway is not None else False, connect_kwargs=connect_kwargs,
        )
        self.client.set_missing_host_key_policy(RejectUnknown())  # replaces fabric's auto-adding default
        self._set(
            known=load_known_hosts(known_hosts, into=self.client.get_host_keys()), endpoint=ep, node_name=node,
            connect_timeout_s=ct, _on_open=on_open, _open_lock=threading.Lock(),
        )

    # -- the dial: how the TCP stream (or the jump's channel) is made -----
    def dial(self) -> Any:
        """A socket to the endpoint's real address: TCP, or a direct-tcpip channel through the gateway."""
        ep, ct = self.endpoint, self.connect_timeout_s
        if not self.gateway:
            return open_tcp(ep.host, ep.port, ct)
        jump: NodeConnection = self.gateway
        assert ep.jump is not None
        try:
            jump.open()
        except ConnectFailed as exc:  # say which hop failed, keep the category word first
            kind, _, rest = str(exc).partition(": ")
            raise ConnectFailed(f"{kind}: {ep.jump.label}: {rest}") from None
        try:
            assert jump.transport is not None  # open() succeeded
            return jump.transport.open_channel("direct-tcpip", (ep.host, ep.port), ("127.0.0.1", 0), timeout=ct)
        except paramiko.ChannelException as exc:
            raise ConnectFailed(f"unreachable: {ep.jump.label} could not reach {ep.host}:{ep.port} ({exc.text})") from None
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            jump.drop()
            raise ConnectFailed(f"unreachable: through {ep.jump.label}: {exc or type(exc).__name__}") from None

    def open_gateway(self) -> Any:  # fabric calls this from open() when a gateway is set
        return self.dial()

    def open(self) -> None:
        """Connect unless connected: the key verified, the login done. Raises ConnectFailed or HostKeyError."""
        with self._open_lock:
            if self.is_connected:
                return
            if self.transport is not None:  # it died (node rebooted, sshd restarted): start afresh
                self.drop()
            began = time.monotonic()
            try:
                if not self.gateway:
                    self.connect_kwargs["sock"] = self.dial()
                super().open()  # fabric: gateway.open_gateway() when set, then SSHClient.connect
            except BaseException as exc:  # noqa: BLE001 - closed, then mapped or re-raised as is
                self.client.close()
                self.transport = None
                self.connect_kwargs.pop("sock", None)
                raise self._failure(exc, began) from None
            self.connect_kwargs.pop("sock", None)
            assert self.transport is not None  # connect() succeeded
            key = self.transport.get_remote_server_key()
            if key.asbytes() in self.known.revoked:
                self.drop()
                raise revoked_key_error(self.node_name, self.endpoint.label, self.endpoint.hostkey_name, key)
            log.debug("connected to %s (%s)", self.endpoint.label, self.endpoint.key)
            if self._on_open is not None:
                self._on_open(self)

    def drop(self) -> None:
        """Close the SSH connection (also one that died without fabric noticing)."""
        try:
            self.client.close()
        except Exception:
            log.debug("closing %s failed", self.endpoint.label, exc_info=True)
        self.transport = None

    def close(self) -> None:
        self.drop()

    def open_session(self) -> paramiko.Channel:
        """A new session channel on the open connection (call :meth:`open` first), within the connect timeout."""
        if self.transport is None:
            raise paramiko.SSHException("not connected")
        return self.transport.open_session(timeout=self.connect_timeout_s)

    # -- what a failure to connect means -----------------------------------
    def _failure(self, exc: BaseException, began: float) -> BaseException:
        ep, ct, where = self.endpoint, self.connect_timeout_s, self.endpoint.where
        if isinstance(exc, UnknownHostKey):
            hint = None if not ep.is_jump else (
                f"check the fingerprint, then record it by connecting once with `ssh -p {ep.port} {ep.user}@{ep.host}`"
            )
            return unknown_key_error(self.node_name, ep.label, ep.hostkey_name, exc.key, self.known, trust_hint=hint)
        if isinstance(exc, paramiko.BadHostKeyException):
            return changed_key_error(self.node_name, ep.label, ep.hostkey_name, exc.key, exc.expected_key, self.known)
        if isinstance(exc, (ConnectFailed, HostKeyError)) or not isinstance(exc, Exception):
            return exc
        if isinstance(exc, paramiko.AuthenticationException):
            return ConnectFailed(self._auth_error(str(exc)))
        if isinstance(exc, NoValidConnectionsError):
            return ConnectFailed(f"unreachable: connection refused by {where} (is sshd running?)")
        if isinstance(exc, socket.gaierror):
            return ConnectFailed(f"unreachable: cannot resolve {ep.host} ({exc.strerror})")
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return ConnectFailed(f"unreachable: no answer from {where} within {ct:g} s (connect timeout)")
        if isinstance(exc, paramiko.SSHException):
            text = str(exc)
            if "no authentication methods" in text.lower():
                return ConnectFailed(self._auth_error(text))
            # paramiko's start_client() gives up silently when its timeout
            # wins the race against the banner timeout; the next call then
            # says "No existing session" (paramiko/transport.py start_client).
            slow = time.monotonic() - began >= 0.9 * ct
            if slow or any(w in text.lower() for w in ("banner", "timeout", "timed out", "no existing session")):
                return ConnectFailed(f"timeout: {where} accepted the connection but did not speak SSH within {ct:g} s")
            return ConnectFailed(f"ssh: {where}: {text}")
        if isinstance(exc, (OSError, EOFError)):
            what = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else type(exc).__name__
            kind = "unreachable" if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS else "ssh"
            return ConnectFailed(f"{kind}: {where}: {what}")
        return exc

    def _auth_error(self, text: str) -> str:
        ep = self.endpoint
        keys = ", ".join(ep.identities) or "ssh-agent and ~/.ssh/id_* keys"
        return (
            f"auth: {ep.user}@{ep.where} refused the login with {keys} ({text}); "
            "check ssh_user and ssh_identity in the inventory"
        )


class SSHTransport(BaseTransport):
    """Runs commands over SSH: one fabric Connection per node, opened lazily, shared between threads, reused.

    A connection that died is reopened once. Host keys come from the node's
    known_hosts file (or ``known_hosts_override``), else ``~/.ssh/known_hosts``,
    plus ``/etc/ssh/ssh_known_hosts``; unknown or changed keys raise
    :class:`HostKeyError` from :meth:`run` (a ``hostkey:`` error result in
    :meth:`run_all`). :attr:`connections_opened` counts the connections opened
    per node, :attr:`jumps_opened` the ones to jump hosts.
    """

    def __init__(
        self, inventory_nodes: Iterable[Node], settings: TransportSettings | None = None, *,
        known_hosts_override: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(settings)
        self._nodes_by_name = {n.name: n for n in inventory_nodes}
        self._kh_override = Path(known_hosts_override).expanduser() if known_hosts_override else None
        self._ssh_config = read_ssh_config(ssh_config)
        self._endpoints: dict[str, Endpoint] = {}
        self._lock = threading.Lock()
        self._conns: dict[str, NodeConnection] = {}
        self.connections_opened: dict[str, int] = {}
        self.jumps_opened: dict[str, int] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes_by_name)

    def node(self, name: str) -> Node:
        try:
            return self._nodes_by_name[name]
        except KeyError:
            raise unknown_node(name, self._nodes_by_name) from None

    def endpoint(self, name: str) -> Endpoint:
        """Where ``name`` is reached: ssh_config merged with the inventory (computed once)."""
        with self._lock:
            ep = self._endpoints.get(name)
        if ep is None:
            ep = resolve_endpoint(self._ssh_config, self.node(name))
            with self._lock:
                self._endpoints[name] = ep
        return ep

    def _cache_key(self, ep: Endpoint, node: Node) -> str:
        # A connection was verified against one set of known_hosts files: never
        # hand it to a node that trusts different keys (two inventory nodes may
        # well share an address, e.g. in tests or behind NAT).
        if not ep.is_jump:
            return f"node {node.name}"
        files = ",".join(str(p) for p in known_hosts_paths(node, self._kh_override, for_jump=True))
        return f"jump {ep.key} [{files}]"

    def connection(self, ep: Endpoint, node: Node) -> NodeConnection:
        """The one Connection for this endpoint (created on first use; not opened here)."""
        key = self._cache_key(ep, node)
        with self._lock:
            conn = self._conns.get(key)
        if conn is not None:
            return conn
        gateway = self.connection(ep.jump, node) if ep.jump else None

        def opened(c: NodeConnection) -> None:
            with self._lock:
                count, name = (self.jumps_opened, ep.key) if ep.is_jump else (self.connections_opened, node.name)
                count[name] = count.get(name, 0) + 1

        new = NodeConnection(
            ep, node.name, known_hosts_paths(node, self._kh_override, for_jump=ep.is_jump),
            self.settings.connect_timeout_s, gateway=gateway, on_open=opened,
        )
        with self._lock:
            return self._conns.setdefault(key, new)

    def fetch_host_key(self, name: str) -> tuple[str, str, str]:
        """The key the node offers right now: (key type, SHA256 fingerprint, base64 blob). No login."""
        ep = self.endpoint(name)
        conn = self.connection(ep, self.node(name))
        ct = self.settings.connect_timeout_s
        try:
            t = paramiko.Transport(conn.dial())
        except ConnectFailed as exc:
            raise TransportError(str(exc), Ref(node=name)) from None
        except NoValidConnectionsError:
            raise TransportError(f"unreachable: connection refused by {ep.where}", Ref(node=name)) from None
        except OSError as exc:
            raise TransportError(f"unreachable: {ep.host}:{ep.port}: {exc}", Ref(node=name)) from None
        try:
            t.banner_timeout = ct
            t.start_client(timeout=ct)
            key = t.get_remote_server_key()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(
                f"could not read the host key of {ep.host}:{ep.port}: {exc or type(exc).__name__}", Ref(node=name)
            ) from None
        finally:
            t.close()
        return key.get_name(), fingerprint_sha256(key.asbytes()), key.get_base64()

    def verified_host_key(self, name: str) -> tuple[str, str, str]:
        """The key of this transport's own session to ``name``, which the refusing policy checked
        against the node's known_hosts when it opened (:meth:`fetch_host_key` checks nothing: it
        is for `hostkey`/`trust`, before a key is known). For what sparkctl vouches for to
        another node (node-to-node ssh)."""
        conn = self.connection(self.endpoint(name), self.node(name))
        try:
            conn.open()
        except ConnectFailed as exc:
            raise TransportError(str(exc), Ref(node=name)) from None
        except HostKeyError as exc:
            exc.ref = Ref(node=name)
            raise
        transport = conn.client.get_transport()
        if transport is None:
            raise TransportError("no SSH session to read the verified host key from", Ref(node=name))
        key = transport.get_remote_server_key()
        return key.get_name(), fingerprint_sha256(key.asbytes()), key.get_base64()

    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: Cancel | None,
    ) -> CommandResult:
        n = self.node(node)
        start = time.monotonic()
        try:
            ep = self.endpoint(node)
        except TransportError as exc:
            return CommandResult(node, label, -1, "", "", 0.0, f"ssh: {exc.one_line()}")
        use_sudo = sudo and n.sudo and ep.user != "root"
        wire = wire_command(cmd, sudo=use_sudo, timeout_s=timeout_s)
        log.debug("ssh %s: %s", node, label)  # never the stdin
        conn = self.connection(ep, n)
        for attempt in (1, 2):
            try:
                conn.open()
            except ConnectFailed as exc:
                return CommandResult(node, label, -1, "", "", time.monotonic() - start, str(exc))
            except HostKeyError as exc:
                exc.ref = Ref(node=node)  # the node's key, whatever the command
                raise
            try:
                chan = conn.open_session()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                conn.drop()  # the cached connection went stale (node rebooted?)
                if attempt == 2:
                    return CommandResult(
                        node, label, -1, "", "", time.monotonic() - start, f"ssh: could not open a session: {exc}"
                    )
                continue
            break
        code, out, err, why = run_on_channel(chan, wire, stdin, timeout_s, cancel)
        duration = time.monotonic() - start
        if why is not None:
            return CommandResult(node, label, -1, out, err, duration, why)
        if use_sudo and code != 0 and sudo_needs_password(err):
            return CommandResult(node, label, -1, out, err, duration, sudo_error(node))
        log.debug("ssh %s: %s -> %s in %.3f s", node, label, code, duration)
        return CommandResult(node, label, code, out, err, duration, None)

    def close(self) -> None:
        with self._lock:
            conns = list(self._conns.items())
            self._conns.clear()
        # targets first, then the jump hosts their channels run through
        for _key, conn in sorted(conns, key=lambda kv: (kv[0].startswith("jump"), -kv[0].count(" via "))):
            conn.drop()


# --------------------------------------------------------------------------- trust


def fetch_host_key(
    node: Node, settings: TransportSettings | None = None, *, ssh_config: str | os.PathLike[str] | None = None,
    known_hosts_override: str | os.PathLike[str] | None = None,
) -> tuple[str, str, str]:
    """The host key ``node`` offers now: (key type, ``SHA256:...`` fingerprint, base64 key). No login."""
    with SSHTransport([node], settings, ssh_config=ssh_config, known_hosts_override=known_hosts_override) as t:
        return t.fetch_host_key(node.name)


def trust(
    node: Node, known_hosts_path: str | os.PathLike[str] | None = None, *,
    expected_fingerprint: str | None = None, settings: TransportSettings | None = None,
    ssh_config: str | os.PathLike[str] | None = None,
) -> tuple[str, str, str]:
    """Record the node's current host key in ``known_hosts_path``, on purpose.

    Pass ``expected_fingerprint`` (the one the operator checked) to make sure
    the key recorded is the key that was checked. Appends one OpenSSH
    known_hosts line (``[host]:port`` off port 22); creates the file 0600 and
    its directory 0700. Does nothing if the same key is already recorded;
    refuses if a different key of that type is. Returns what it recorded.
    """
    path = Path(known_hosts_path).expanduser() if known_hosts_path else default_known_hosts(node)
    with SSHTransport([node], settings, ssh_config=ssh_config, known_hosts_override=path) as t:
        ep = t.endpoint(node.name)
        ktype, fp, b64 = t.fetch_host_key(node.name)
    if expected_fingerprint is not None and expected_fingerprint != fp:
        raise TransportError(
            f"node {node.name} offers {ktype} {fp}, not the checked {expected_fingerprint}; nothing recorded",
            Ref(node=node.name), hint="check the fingerprint on the node's console again",
        )
    if record_host_key(node, path, ep.hostkey_name, ktype, b64):
        log.info("trusted %s key %s for node %s in %s", ktype, fp, node.name, path)
    return ktype, fp, b64


__all__ = ["ConnectFailed", "NodeConnection", "SSHTransport", "fetch_host_key", "open_tcp", "trust"]
