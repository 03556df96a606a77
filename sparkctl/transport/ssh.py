"""Running commands on nodes: SSH (paramiko), local (subprocess) and a fake for tests.

This module owns every connection sparkctl makes to a node, and it is the only
module that imports paramiko. It owns:

* :class:`CommandResult`, the outcome of one command as data. A command that ran
  and failed has its exit code; a command that could not run at all (node
  unreachable, timed out, login refused, sudo wanting a password, overall
  deadline passed) has ``exit_code == -1`` and ``error`` set. Those are values,
  not exceptions, so a fan-out over four nodes never loses three answers
  because the fourth did not reply.
* Host-key trust. An unknown or changed host key is a surprise, not a value:
  :meth:`Transport.run` raises :class:`HostKeyError` (a ``TransportError``)
  naming the node and the key's fingerprint. Keys are never added
  automatically; :func:`trust` records one on purpose.
* Three timeouts kept apart (:class:`TransportSettings`): connecting, one
  command, and the whole fan-out.

What it must not do: decide what to run, parse output, print, or exit.
Commands reach the remote side as ``sh -c <one quoted word>``; no login shell
or ``.bashrc`` is relied upon. Callers quote their own values (pass a list to
have it joined with :func:`shlex.join`). The stdin of :meth:`Transport.put`
(file contents, possibly secrets) is never logged.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import getpass
import hashlib
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import paramiko
from paramiko.hostkeys import HostKeyEntry
from paramiko.ssh_exception import NoValidConnectionsError

from sparkctl.errors import Ref, SparkctlError, TransportError
from sparkctl.model.inventory import Node

log = logging.getLogger("sparkctl.transport.ssh")

Command = str | Sequence[str]

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")

# Extra time the remote `timeout` wrapper allows beyond our own command
# timeout: we close the channel first; the wrapper makes sure the remote
# process tree dies even though sshd leaves no-pty children running when a
# channel closes.
_REMOTE_KILL_GRACE_S = 0.5
# How long we keep reading output after the exit status arrived, for when a
# background child keeps the remote stdout open.
_DRAIN_S = 0.5
_SUDO_PASSWORD_RE = re.compile(r"sudo: (a password is required|a terminal is required)")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class CommandResult:
    """What one command on one node did.

    ``error`` is set (and ``exit_code`` is -1) when the command could not run
    or did not finish; it starts with a category word: ``unreachable:``,
    ``timeout:``, ``auth:``, ``sudo:``, ``ssh:``, ``hostkey:``, ``deadline:``,
    ``cancelled:``.
    """

    node: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def describe(self) -> str:
        """One line for messages: what failed and why (never the stdin)."""
        if self.error:
            return f"node {self.node}: {self.command!r}: {self.error}"
        tail = self.stderr.strip().splitlines()[-1:] or self.stdout.strip().splitlines()[-1:]
        why = f": {tail[0]}" if tail else ""
        return f"node {self.node}: {self.command!r} exited {self.exit_code}{why}"


@dataclass(frozen=True)
class TransportSettings:
    """The three timeouts, kept apart on purpose.

    ``connect_timeout_s`` bounds the TCP connect, the SSH banner, the key
    exchange and the login, each. ``command_timeout_s`` bounds one command once
    it started (default for ``timeout_s=None``). ``deadline_s`` bounds a whole
    :meth:`Transport.run_all` fan-out.
    """

    connect_timeout_s: float = 5.0
    command_timeout_s: float = 60.0
    deadline_s: float = 120.0


class HostKeyError(TransportError):
    """A node's host key is not (or no longer) the one we recorded."""

    def __init__(
        self, message: str, ref: Ref | None, hint: str | None, *, node: str, host: str, key_type: str,
        fingerprint: str, key_b64: str, changed: bool, expected_fingerprint: str | None = None,
    ) -> None:
        super().__init__(message, ref, hint)
        self.node = node
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.key_b64 = key_b64
        self.changed = changed
        self.expected_fingerprint = expected_fingerprint


def command_line(command: Command) -> str:
    """The shell text for a command: a str as-is (the caller quoted it), a list joined."""
    if isinstance(command, str):
        return command
    return shlex.join(list(command))


def reply(
    stdout: str = "", *, exit_code: int = 0, stderr: str = "", error: str | None = None, duration_s: float = 0.0
) -> CommandResult:
    """A scripted result for :class:`FakeTransport` (node and command are filled in on use)."""
    return CommandResult("", "", -1 if error else exit_code, stdout, stderr, duration_s, error)


def fingerprint_sha256(key_blob: bytes) -> str:
    """OpenSSH's fingerprint of a public key blob: ``SHA256:`` + unpadded base64."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The host field OpenSSH writes in known_hosts: ``host``, or ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def default_known_hosts(node: Node) -> Path:
    """The file that holds (and :func:`trust` writes) this node's host key."""
    return Path(node.known_hosts).expanduser() if node.known_hosts else Path("~/.ssh/known_hosts").expanduser()


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class Transport(Protocol):
    """How the rest of sparkctl runs commands. Swap in :class:`FakeTransport` in tests."""

    @property
    def nodes(self) -> tuple[str, ...]: ...

    def run(
        self, node: str, command: Command, *, sudo: bool = False, timeout_s: float | None = None,
        stdin: str | bytes | None = None,
    ) -> CommandResult: ...

    def run_all(
        self, commands: Mapping[str, Command], *, sudo: bool = False, timeout_s: float | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, CommandResult]: ...

    def put(self, node: str, remote_path: str, data: bytes, mode: int, *, sudo: bool = False) -> CommandResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Transport: ...

    def __exit__(self, *exc: object) -> None: ...


# The remote half of put(): every value arrives as a positional parameter, so
# nothing the caller passes is ever parsed as shell. The temporary file lives in
# the destination directory so the final mv is a rename(2) on one filesystem.
_PUT_SCRIPT = r"""set -eu
dst=$1 mode=$2
case $dst in */*) dir=${dst%/*} ;; *) dir=. ;; esac
[ -n "$dir" ] || dir=/
base=${dst##*/}
mkdir -p -- "$dir"
tmp=$(mktemp "$dir/.sparkctl-put.XXXXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod "$mode" "$tmp"
mv -f -- "$tmp" "$dir/$base"
trap - EXIT
"""


def put_command(remote_path: str, mode: int) -> list[str]:
    """The argv that atomically writes stdin to ``remote_path`` with ``mode``."""
    if not remote_path or remote_path.endswith("/"):
        raise ValueError(f"put needs a file path, got {remote_path!r}")
    if "\0" in remote_path or "\n" in remote_path:
        raise ValueError(f"put refuses a path with NUL or newline: {remote_path!r}")
    return ["sh", "-c", _PUT_SCRIPT, "sparkctl-put", remote_path, f"{mode & 0o7777:04o}"]


def put_label(remote_path: str) -> str:
    """How a put appears in results, logs and FakeTransport scripts."""
    return f"put {remote_path}"


class _BaseTransport:
    """Fan-out, put and context management shared by every transport."""

    settings: TransportSettings

    def __init__(self, settings: TransportSettings | None) -> None:
        self.settings = settings or TransportSettings()

    @property
    def nodes(self) -> tuple[str, ...]:
        raise NotImplementedError

    # Subclasses implement this; `cancel` is set when a fan-out's deadline passed.
    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: threading.Event | None,
    ) -> CommandResult:
        raise NotImplementedError

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            raise _unknown_node(node, self.nodes)

    def _timeout(self, timeout_s: float | None) -> float:
        return self.settings.command_timeout_s if timeout_s is None else timeout_s

    def run(
        self, node: str, command: Command, *, sudo: bool = False, timeout_s: float | None = None,
        stdin: str | bytes | None = None,
    ) -> CommandResult:
        cmd = command_line(command)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return self._run(node, cmd, label=cmd, sudo=sudo, timeout_s=self._timeout(timeout_s), stdin=data, cancel=None)

    def put(self, node: str, remote_path: str, data: bytes, mode: int, *, sudo: bool = False) -> CommandResult:
        cmd = shlex.join(put_command(remote_path, mode))
        return self._run(
            node, cmd, label=put_label(remote_path), sudo=sudo, timeout_s=self.settings.command_timeout_s,
            stdin=bytes(data), cancel=None,
        )

    def run_all(
        self, commands: Mapping[str, Command], *, sudo: bool = False, timeout_s: float | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, CommandResult]:
        """Run one command per node in parallel and wait for all of them.

        Nodes that have not answered when the deadline passes get an error
        result (``deadline: ...``) and their remote commands are cancelled.
        A node that fails, even with an exception such as :class:`HostKeyError`,
        gets an error result; the others keep theirs. Only bugs (exceptions
        that are not a :class:`SparkctlError`, such as FakeTransport refusing
        an unscripted command) propagate, once the fan-out is over. Asking for
        a node the transport does not know is a bug too, raised before
        anything runs.
        """
        if not commands:
            return {}
        for node in commands:
            self._check_node(node)
        deadline = self.settings.deadline_s if deadline_s is None else deadline_s
        timeout = self._timeout(timeout_s)
        cmds = {node: command_line(c) for node, c in commands.items()}
        cancel = threading.Event()
        start = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=len(cmds), thread_name_prefix="sparkctl-run")
        try:
            futures = {
                node: pool.submit(
                    self._run, node, cmd, label=cmd, sudo=sudo, timeout_s=timeout, stdin=None, cancel=cancel
                )
                for node, cmd in cmds.items()
            }
            done, _ = wait_futures(futures.values(), timeout=deadline)
        finally:
            cancel.set()  # stragglers close their channels / kill their processes
            pool.shutdown(wait=False, cancel_futures=True)
        elapsed = time.monotonic() - start
        results: dict[str, CommandResult] = {}
        bug: BaseException | None = None
        for node, fut in futures.items():
            if fut not in done:
                results[node] = CommandResult(
                    node, cmds[node], -1, "", "", elapsed,
                    f"deadline: no result within the {deadline:g} s deadline of this step",
                )
                continue
            exc = fut.exception()
            if exc is None:
                results[node] = fut.result()
            elif isinstance(exc, SparkctlError):
                kind = "hostkey" if isinstance(exc, HostKeyError) else "ssh"
                results[node] = CommandResult(node, cmds[node], -1, "", "", elapsed, f"{kind}: {exc.one_line()}")
            elif bug is None:
                bug = exc
        if bug is not None:
            raise bug
        return results

    def close(self) -> None:
        pass

    def __enter__(self) -> _BaseTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unknown_node(node: str, known: Iterable[str]) -> TransportError:
    return TransportError(
        f"no node {node!r} in this transport", Ref(node=node), hint=f"known nodes: {', '.join(known) or '(none)'}"
    )


def _decode(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")


def _sudo_needs_password(stderr: str) -> bool:
    return bool(_SUDO_PASSWORD_RE.search(stderr))


def _sudo_error(node: str) -> str:
    return (
        f"sudo: sudo needs a password on {node}: allow passwordless sudo for these commands "
        "(a sudoers NOPASSWD rule for the ssh user) or set sudo: false for this node "
        "and log in as a user that has the rights"
    )


# --------------------------------------------------------------------------- local


class LocalTransport(_BaseTransport):
    """Runs commands on this machine with ``sh -c``; same interface and timeouts as SSH.

    Every name in ``nodes`` is this machine (useful for a single local node and
    for tests that want several "nodes").
    """

    def __init__(
        self, nodes: Iterable[str] = ("local",), settings: TransportSettings | None = None, *, sudo: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(settings)
        self._nodes = tuple(nodes)
        self._sudo = sudo
        self._env = dict(env) if env is not None else None

    @property
    def nodes(self) -> tuple[str, ...]:
        return self._nodes

    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: threading.Event | None,
    ) -> CommandResult:
        self._check_node(node)
        argv = ["sh", "-c", cmd]
        use_sudo = sudo and self._sudo and os.geteuid() != 0
        if use_sudo:
            argv = ["sudo", "-n", "--", *argv]
        log.debug("local %s: %s", node, label)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills the whole tree
            env=self._env,
        )
        out: bytes = b""
        err: bytes = b""
        why: str | None = None
        first = True
        while True:
            remaining = timeout_s - (time.monotonic() - start) if timeout_s > 0 else 0.05
            if timeout_s > 0 and remaining <= 0:
                why = f"timeout: command did not finish within {timeout_s:g} s (killed)"
                break
            if cancel is not None and cancel.is_set():
                why = "cancelled: the step's deadline passed (killed)"
                break
            try:
                out, err = proc.communicate(stdin if first else None, timeout=min(remaining, 0.05))
                break
            except subprocess.TimeoutExpired:
                pass
            except BrokenPipeError:  # it exited without reading all of stdin
                pass
            first = False
        if why is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                out, err = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipes
                for pipe in (proc.stdout, proc.stderr):
                    if pipe:
                        pipe.close()
                proc.wait()
        duration = time.monotonic() - start
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if why is not None:
            return CommandResult(node, label, -1, stdout, stderr, duration, why)
        if use_sudo and proc.returncode != 0 and _sudo_needs_password(stderr):
            return CommandResult(node, label, -1, stdout, stderr, duration, _sudo_error(node))
        log.debug("local %s: %s -> %s in %.3f s", node, label, proc.returncode, duration)
        return CommandResult(node, label, proc.returncode, stdout, stderr, duration, None)


# --------------------------------------------------------------------------- fake


@dataclass(frozen=True)
class Call:
    """One command a :class:`FakeTransport` was asked to run."""

    node: str
    command: str
    sudo: bool
    timeout_s: float
    stdin: bytes | None


Reply = CommandResult | Callable[[Call], CommandResult]
ScriptKey = tuple[str, "str | re.Pattern[str]"]


class FakeTransport(_BaseTransport):
    """A transport that only answers what it was told, for unit tests.

    ``script`` maps ``(node, command)`` to a :class:`CommandResult` (see
    :func:`reply`) or to a callable taking the :class:`Call`. ``node`` may be
    ``"*"`` for any node; ``command`` is matched exactly, or with
    ``fullmatch`` when it is a compiled ``re.Pattern``. Puts are matched as
    ``"put /remote/path"``; with ``accept_puts=True`` unscripted puts succeed
    and land in :attr:`files`. Anything else raises ``AssertionError`` naming
    the command, so a unit test can never reach a real shell by accident.
    Every call is recorded in :attr:`calls`.
    """

    def __init__(
        self, script: Mapping[ScriptKey, Reply] | None = None, *, nodes: Iterable[str] | None = None,
        settings: TransportSettings | None = None, accept_puts: bool = False,
    ) -> None:
        super().__init__(settings)
        self._script: dict[ScriptKey, Reply] = dict(script or {})
        self._nodes = tuple(nodes) if nodes is not None else None
        self.accept_puts = accept_puts
        self.calls: list[Call] = []
        self.files: dict[tuple[str, str], tuple[bytes, int]] = {}
        self.closed = False
        self._lock = threading.Lock()

    @property
    def nodes(self) -> tuple[str, ...]:
        if self._nodes is not None:
            return self._nodes
        return tuple(dict.fromkeys(n for n, _ in self._script if n != "*"))

    def add(self, node: str, command: str | re.Pattern[str], answer: Reply) -> None:
        with self._lock:
            self._script[(node, command)] = answer

    def commands(self, node: str | None = None) -> list[str]:
        """The commands run so far (on one node, or on all), in order."""
        return [c.command for c in self.calls if node is None or c.node == node]

    def _match(self, node: str, cmd: str) -> Reply | None:
        for key in ((node, cmd), ("*", cmd)):
            if key in self._script:
                return self._script[key]
        for (n, pattern), answer in self._script.items():
            if n in (node, "*") and isinstance(pattern, re.Pattern) and pattern.fullmatch(cmd):
                return answer
        return None

    def _answer(self, call: Call, answer: Reply) -> CommandResult:
        result = answer(call) if callable(answer) else answer
        if not isinstance(result, CommandResult):
            raise AssertionError(f"FakeTransport: the script for {call.command!r} returned {result!r}")
        return replace(result, node=call.node, command=call.command)

    def _refuse(self, call: Call) -> AssertionError:
        known = sorted(f"{n}: {c if isinstance(c, str) else c.pattern}" for n, c in self._script)
        return AssertionError(
            f"FakeTransport: unscripted command on node {call.node!r}: {call.command!r} (sudo={call.sudo}); "
            f"scripted: {known}"
        )

    def _check_node(self, node: str) -> None:
        if self._nodes is not None and node not in self._nodes:
            raise _unknown_node(node, self._nodes)

    def _record(self, node: str, command: str, sudo: bool, timeout_s: float, stdin: bytes | None) -> Call:
        self._check_node(node)
        call = Call(node, command, sudo, timeout_s, stdin)
        with self._lock:
            self.calls.append(call)
        return call

    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: threading.Event | None,
    ) -> CommandResult:
        call = self._record(node, cmd, sudo, timeout_s, stdin)
        answer = self._match(node, cmd)
        if answer is None:
            raise self._refuse(call)
        return self._answer(call, answer)

    def put(self, node: str, remote_path: str, data: bytes, mode: int, *, sudo: bool = False) -> CommandResult:
        put_command(remote_path, mode)  # the same validation as the real thing
        call = self._record(node, put_label(remote_path), sudo, self.settings.command_timeout_s, bytes(data))
        answer = self._match(node, call.command)
        if answer is None and not self.accept_puts:
            raise self._refuse(call)
        result = self._answer(call, answer) if answer is not None else CommandResult(
            node, call.command, 0, "", "", 0.0, None
        )
        if result.ok:
            with self._lock:
                self.files[(node, remote_path)] = (bytes(data), mode)
        return result

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------- ssh


@dataclass(frozen=True)
class _Endpoint:
    """Where and how to log in, after ssh_config and the inventory were merged."""

    label: str  # "node a" / "jump host j (for node a)"
    host: str  # address to connect to (HostName)
    port: int
    user: str
    identities: tuple[str, ...]
    identities_only: bool
    hostkey_host: str  # the name looked up in known_hosts (HostKeyAlias or host)
    jump: _Endpoint | None = None
    is_jump: bool = False

    @property
    def hostkey_name(self) -> str:
        return known_hosts_name(self.hostkey_host, self.port)

    @property
    def key(self) -> str:
        via = f" via {self.jump.key}" if self.jump else ""
        return f"{self.user}@{self.host}:{self.port}{via}"


class _UnknownHostKey(Exception):
    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Our policy: never add a key; tell the caller which key it was."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(key)


class _ConnectFailed(Exception):
    """An expected failure to connect; becomes a CommandResult error."""


@dataclass
class _KnownHosts:
    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: set[bytes] = field(default_factory=set)
    files: list[str] = field(default_factory=list)


def _load_known_hosts(paths: Iterable[Path], into: paramiko.HostKeys | None = None) -> _KnownHosts:
    """Read known_hosts files leniently (paramiko's loader trips on @markers)."""
    kh = _KnownHosts(keys=into if into is not None else paramiko.HostKeys())
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        kh.files.append(str(path))
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@"):
                marker, _, rest = line.partition(" ")
                fields = rest.split()
                if marker == "@revoked" and len(fields) >= 3:
                    try:
                        kh.revoked.add(base64.b64decode(fields[2]))
                    except ValueError:
                        pass
                continue  # @cert-authority: certificates are not supported
            try:
                entry = HostKeyEntry.from_line(line)
            except Exception:  # noqa: BLE001 - a bad line is skipped, as OpenSSH does
                continue
            if entry is None or entry.key is None:
                continue
            for name in entry.hostnames:
                kh.keys.add(name, entry.key.get_name(), entry.key)
    return kh


_JUMP_RE = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?$")


class SSHTransport(_BaseTransport):
    """Runs commands over SSH, one reused connection per node.

    Connections open lazily, are cached and shared between threads, and are
    reopened when they died. ``~/.ssh/config`` (or ``ssh_config``) supplies
    HostName, User, Port, IdentityFile, IdentitiesOnly, HostKeyAlias and
    ProxyJump; the inventory's ssh_user, ssh_port and ssh_identity win over
    it. Host keys come from the node's known_hosts file (or
    ``known_hosts_override``), else ``~/.ssh/known_hosts``, plus
    ``/etc/ssh/ssh_known_hosts``; unknown or changed keys raise
    :class:`HostKeyError`.

    :attr:`connections_opened` counts the connections opened per node,
    :attr:`jumps_opened` the ones to jump hosts.
    """

    def __init__(
        self, inventory_nodes: Iterable[Node], settings: TransportSettings | None = None, *,
        known_hosts_override: str | os.PathLike[str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(settings)
        self._nodes_by_name = {n.name: n for n in inventory_nodes}
        self._kh_override = Path(known_hosts_override).expanduser() if known_hosts_override else None
        cfg_path = Path(ssh_config).expanduser() if ssh_config else Path("~/.ssh/config").expanduser()
        try:
            self._ssh_config = (
                paramiko.SSHConfig.from_path(str(cfg_path)) if cfg_path.is_file() else paramiko.SSHConfig()
            )
        except (paramiko.SSHException, OSError, ValueError) as exc:
            raise TransportError(f"cannot read ssh config: {exc}", Ref(file=str(cfg_path))) from None
        self._endpoints: dict[str, _Endpoint] = {}
        self._lock = threading.Lock()
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._conn_locks: dict[str, threading.Lock] = {}
        self.connections_opened: dict[str, int] = {}
        self.jumps_opened: dict[str, int] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes_by_name)

    def node(self, name: str) -> Node:
        try:
            return self._nodes_by_name[name]
        except KeyError:
            raise _unknown_node(name, self._nodes_by_name) from None

    # -- where to connect ------------------------------------------------
    def _lookup(self, alias: str) -> dict[str, object]:
        return dict(self._ssh_config.lookup(alias))

    def endpoint(self, name: str) -> _Endpoint:
        """Where ``name`` is reached: ssh_config merged with the inventory (computed once)."""
        with self._lock:
            ep = self._endpoints.get(name)
        if ep is None:
            ep = self._resolve(name)
            with self._lock:
                self._endpoints[name] = ep
        return ep

    def _resolve(self, name: str) -> _Endpoint:
        node = self.node(name)
        cfg = self._lookup(node.host)
        if str(cfg.get("proxycommand", "none")).lower() != "none" and "proxyjump" not in cfg:
            raise TransportError(
                f"ssh_config sets ProxyCommand for {node.host}; sparkctl supports ProxyJump only",
                Ref(node=name), hint="replace ProxyCommand with ProxyJump in ~/.ssh/config",
            )
        identities = (node.ssh_identity,) if node.ssh_identity else tuple(cfg.get("identityfile", ()))  # type: ignore[arg-type]
        host = str(cfg.get("hostname", node.host))
        return _Endpoint(
            label=f"node {name}", host=host, port=node.ssh_port, user=node.ssh_user,
            identities=tuple(str(Path(p).expanduser()) for p in identities),
            identities_only=str(cfg.get("identitiesonly", "no")).lower() == "yes",
            hostkey_host=str(cfg.get("hostkeyalias", host)),
            jump=self._jump_chain(str(cfg.get("proxyjump", "none")), f"node {name}"),
        )

    def _jump_chain(self, spec: str, target: str, depth: int = 0) -> _Endpoint | None:
        if spec.lower() == "none" or not spec.strip():
            return None
        if depth > 4:
            raise TransportError(f"ProxyJump chain for {target} is too long (a loop in ssh_config?)")
        hops = [h.strip() for h in spec.split(",") if h.strip()]
        jump: _Endpoint | None = None
        for i, hop in enumerate(hops):
            m = _JUMP_RE.match(hop)
            if not m:
                raise TransportError(f"cannot read ProxyJump {hop!r} for {target}", hint="write [user@]host[:port]")
            alias = m["host"].strip("[]")
            cfg = self._lookup(alias)
            host = str(cfg.get("hostname", alias))
            if i == 0:  # the first hop may itself sit behind a jump host
                jump = self._jump_chain(str(cfg.get("proxyjump", "none")), f"jump host {alias}", depth + 1)
            jump = _Endpoint(
                label=f"jump host {alias} (for {target})", host=host,
                port=int(m["port"] or cfg.get("port", 22)),  # type: ignore[call-overload]
                user=m["user"] or str(cfg.get("user") or _local_user()),
                identities=tuple(str(Path(p).expanduser()) for p in cfg.get("identityfile", ())),  # type: ignore[attr-defined]
                identities_only=str(cfg.get("identitiesonly", "no")).lower() == "yes",
                hostkey_host=str(cfg.get("hostkeyalias", host)), jump=jump, is_jump=True,
            )
        return jump

    def _known_hosts_paths(self, node: Node, *, for_jump: bool) -> list[Path]:
        own = self._kh_override or (Path(node.known_hosts).expanduser() if node.known_hosts else None)
        user = Path("~/.ssh/known_hosts").expanduser()
        paths = [own] if own else [user]
        if for_jump and own:
            paths.append(user)  # so that `ssh JUMP` once is enough to trust a jump host
        paths.append(SYSTEM_KNOWN_HOSTS)
        return paths

    # -- connecting ------------------------------------------------------
    def _sock_for(self, ep: _Endpoint, node: Node) -> paramiko.Channel | None:
        if ep.jump is None:
            return None
        try:
            jump_client = self._client(ep.jump, node)
        except _ConnectFailed as exc:  # say which hop failed, keep the category word first
            kind, _, rest = str(exc).partition(": ")
            raise _ConnectFailed(f"{kind}: {ep.jump.label}: {rest}") from None
        transport = jump_client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (ep.host, ep.port), ("127.0.0.1", 0), timeout=self.settings.connect_timeout_s
            )
        except paramiko.ChannelException as exc:
            raise _ConnectFailed(
                f"unreachable: {ep.jump.label} could not reach {ep.host}:{ep.port} ({exc.text})"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop(self._cache_key(ep.jump, node))
            raise _ConnectFailed(f"unreachable: through {ep.jump.label}: {exc or type(exc).__name__}") from None

    def _cache_key(self, ep: _Endpoint, node: Node) -> str:
        # A connection was verified against one set of known_hosts files: never
        # hand it to a node that trusts different keys (two inventory nodes may
        # well share an address, e.g. in tests or behind NAT).
        if not ep.is_jump:
            return f"node {node.name}"
        files = ",".join(str(p) for p in self._known_hosts_paths(node, for_jump=True))
        return f"jump {ep.key} [{files}]"

    def _client(self, ep: _Endpoint, node: Node) -> paramiko.SSHClient:
        key = self._cache_key(ep, node)
        with self._lock:
            lock = self._conn_locks.setdefault(key, threading.Lock())
        with lock:
            client = self._clients.get(key)
            transport = client.get_transport() if client else None
            if client is not None and transport is not None and transport.is_active():
                return client
            if client is not None:
                client.close()
            client = self._connect(ep, node)
            with self._lock:
                self._clients[key] = client
                count, name = (self.jumps_opened, ep.key) if ep.is_jump else (self.connections_opened, node.name)
                count[name] = count.get(name, 0) + 1
            return client

    def _drop(self, key: str) -> None:
        with self._lock:
            client = self._clients.pop(key, None)
        if client is not None:
            client.close()

    def _connect(self, ep: _Endpoint, node: Node) -> paramiko.SSHClient:
        ct = self.settings.connect_timeout_s
        client = paramiko.SSHClient()
        kh = _load_known_hosts(self._known_hosts_paths(node, for_jump=ep.is_jump), into=client.get_host_keys())
        client.set_missing_host_key_policy(_RejectUnknown())
        where = f"{ep.host}:{ep.port}" + (f" via {ep.jump.host}:{ep.jump.port}" if ep.jump else "")
        began = time.monotonic()
        try:
            # We open the socket ourselves (directly, or as a direct-tcpip
            # channel through the jump host) so that the name paramiko looks
            # up in known_hosts can be HostKeyAlias, and so that the TCP
            # connect honours the connect timeout across all addresses.
            sock = self._sock_for(ep, node) or _open_tcp(ep.host, ep.port, ct)
            client.connect(
                ep.hostkey_host, port=ep.port, username=ep.user, sock=sock,  # type: ignore[arg-type]
                key_filename=list(ep.identities) or None,
                look_for_keys=not ep.identities, allow_agent=not ep.identities_only,
                timeout=ct, banner_timeout=ct, auth_timeout=ct, channel_timeout=ct,
            )
        except _UnknownHostKey as exc:
            client.close()
            raise self._hostkey_error(node, ep, exc.key, None, kh) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise self._hostkey_error(node, ep, exc.key, exc.expected_key, kh) from None
        except (_ConnectFailed, HostKeyError):
            client.close()
            raise
        except paramiko.AuthenticationException as exc:
            client.close()
            raise _ConnectFailed(self._auth_error(ep, where, str(exc))) from None
        except NoValidConnectionsError:
            client.close()
            raise _ConnectFailed(f"unreachable: connection refused by {where} (is sshd running?)") from None
        except socket.gaierror as exc:
            client.close()
            raise _ConnectFailed(f"unreachable: cannot resolve {ep.host} ({exc.strerror})") from None
        except (TimeoutError, socket.timeout):
            client.close()
            raise _ConnectFailed(f"unreachable: no answer from {where} within {ct:g} s (connect timeout)") from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            if "no authentication methods" in text.lower():
                raise _ConnectFailed(self._auth_error(ep, where, text)) from None
            # paramiko's start_client() gives up silently when its timeout
            # wins the race against the banner timeout; the next call then
            # says "No existing session".
            slow = time.monotonic() - began >= 0.9 * ct
            if slow or any(w in text.lower() for w in ("banner", "timeout", "timed out", "no existing session")):
                raise _ConnectFailed(
                    f"timeout: {where} accepted the connection but did not speak SSH within {ct:g} s"
                ) from None
            raise _ConnectFailed(f"ssh: {where}: {text}") from None
        except (OSError, EOFError) as exc:
            client.close()
            what = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else type(exc).__name__
            kind = "unreachable" if isinstance(exc, OSError) and exc.errno in _UNREACHABLE_ERRNOS else "ssh"
            raise _ConnectFailed(f"{kind}: {where}: {what}") from None
        server_key = client.get_transport().get_remote_server_key()  # type: ignore[union-attr]
        if server_key.asbytes() in kh.revoked:
            client.close()
            fp = fingerprint_sha256(server_key.asbytes())
            raise HostKeyError(
                f"host key of {ep.label} ({ep.hostkey_name}) is marked @revoked: {server_key.get_name()} {fp}",
                Ref(node=node.name), "do not connect; find out why the key was revoked",
                node=node.name, host=ep.hostkey_name, key_type=server_key.get_name(), fingerprint=fp,
                key_b64=server_key.get_base64(), changed=True,
            )
        log.debug("connected to %s (%s)", ep.label, ep.key)
        return client

    @staticmethod
    def _auth_error(ep: _Endpoint, where: str, text: str) -> str:
        keys = ", ".join(ep.identities) or "ssh-agent and ~/.ssh/id_* keys"
        return (
            f"auth: {ep.user}@{where} refused the login with {keys} ({text}); "
            "check ssh_user and ssh_identity in the inventory"
        )

    def _hostkey_error(
        self, node: Node, ep: _Endpoint, key: paramiko.PKey, expected: paramiko.PKey | None, kh: _KnownHosts
    ) -> HostKeyError:
        fp = fingerprint_sha256(key.asbytes())
        ktype = key.get_name()
        files = ", ".join(kh.files) or "no known_hosts file"
        is_node = not ep.is_jump
        if expected is None:
            msg = f"unknown host key for {ep.label} ({ep.hostkey_name}): {ktype} {fp} (not in {files})"
            hint = (
                f"run `sparkctl trust {node.name}` after checking the fingerprint "
                f"(on the node: ssh-keygen -lf /etc/ssh/ssh_host_{key.algorithm_name.lower()}_key.pub)"
                if is_node else
                f"check the fingerprint, then record it by connecting once with `ssh -p {ep.port} {ep.user}@{ep.host}`"
            )
            return HostKeyError(
                msg, Ref(node=node.name), hint, node=node.name, host=ep.hostkey_name, key_type=ktype,
                fingerprint=fp, key_b64=key.get_base64(), changed=False,
            )
        old = fingerprint_sha256(expected.asbytes())
        msg = (
            f"HOST KEY CHANGED for {ep.label} ({ep.hostkey_name}): it now offers {ktype} {fp}, "
            f"but {files} records {expected.get_name()} {old}. Someone may be intercepting the connection "
            "(man-in-the-middle), or the node was reinstalled"
        )
        hint = (
            "if the node was reinstalled, check the new fingerprint on its console, remove the old key with "
            f"`ssh-keygen -R {shlex.quote(ep.hostkey_name)} -f FILE`, then run `sparkctl trust {node.name}`"
        )
        return HostKeyError(
            msg, Ref(node=node.name), hint, node=node.name, host=ep.hostkey_name, key_type=ktype, fingerprint=fp,
            key_b64=key.get_base64(), changed=True, expected_fingerprint=old,
        )

    def fetch_host_key(self, name: str) -> tuple[str, str, str]:
        """The key the node offers right now: (key type, SHA256 fingerprint, base64 blob). No login."""
        node = self.node(name)
        ep = self.endpoint(name)
        ct = self.settings.connect_timeout_s
        try:
            sock: object = self._sock_for(ep, node) or _open_tcp(ep.host, ep.port, ct)
            t = paramiko.Transport(sock)  # type: ignore[arg-type]
        except _ConnectFailed as exc:
            raise TransportError(str(exc), Ref(node=name)) from None
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

    # -- running ---------------------------------------------------------
    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: threading.Event | None,
    ) -> CommandResult:
        n = self.node(node)
        start = time.monotonic()
        try:
            ep = self.endpoint(node)
        except TransportError as exc:
            return CommandResult(node, label, -1, "", "", 0.0, f"ssh: {exc.one_line()}")
        use_sudo = sudo and n.sudo and ep.user != "root"
        wire = _wire_command(cmd, sudo=use_sudo, timeout_s=timeout_s)
        log.debug("ssh %s: %s", node, label)  # never the stdin
        for attempt in (1, 2):
            try:
                client = self._client(ep, n)
            except _ConnectFailed as exc:
                return CommandResult(node, label, -1, "", "", time.monotonic() - start, str(exc))
            except HostKeyError as exc:
                exc.ref = Ref(node=node, command=label)
                raise
            try:
                transport = client.get_transport()
                assert transport is not None
                chan = transport.open_session(timeout=self.settings.connect_timeout_s)
            except (paramiko.SSHException, OSError, EOFError, AssertionError) as exc:
                self._drop(self._cache_key(ep, n))  # the cached connection went stale (node rebooted?)
                if attempt == 2:
                    return CommandResult(
                        node, label, -1, "", "", time.monotonic() - start, f"ssh: could not open a session: {exc}"
                    )
                continue
            break
        code, out, err, why = _exec(chan, wire, stdin, timeout_s, cancel)
        duration = time.monotonic() - start
        if why is not None:
            return CommandResult(node, label, -1, out, err, duration, why)
        if use_sudo and code != 0 and _sudo_needs_password(err):
            return CommandResult(node, label, -1, out, err, duration, _sudo_error(node))
        log.debug("ssh %s: %s -> %s in %.3f s", node, label, code, duration)
        return CommandResult(node, label, code, out, err, duration, None)

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.items())
            self._clients.clear()
        # targets first, then the jump hosts their channels run through
        for key, client in sorted(clients, key=lambda kv: (kv[0].startswith("jump"), -kv[0].count(" via "))):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing %s failed", key, exc_info=True)


_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}


def _local_user() -> str:
    return getpass.getuser()


def _open_tcp(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection within ``timeout_s`` (each address tried with what is left)."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
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


def _wire_command(cmd: str, *, sudo: bool, timeout_s: float) -> str:
    """What the remote login shell receives: a plain word list ending in ``sh -c CMD``."""
    argv: list[str] = []
    if sudo:
        argv += ["sudo", "-n", "--"]
    if timeout_s > 0:
        # coreutils timeout in its own process group: kills the whole remote tree
        argv += ["timeout", "-k", "1", f"{timeout_s + _REMOTE_KILL_GRACE_S:g}"]
    argv += ["sh", "-c", cmd]
    return shlex.join(argv)


def _exec(
    chan: paramiko.Channel, wire: str, stdin: bytes | None, timeout_s: float, cancel: threading.Event | None
) -> tuple[int, str, str, str | None]:
    """Run ``wire`` on an open session channel: (exit code, stdout, stderr, error)."""
    start = time.monotonic()
    deadline = start + timeout_s if timeout_s > 0 else float("inf")
    out: list[bytes] = []
    err: list[bytes] = []

    def drain() -> None:
        while chan.recv_ready():
            out.append(chan.recv(65536))
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))

    try:
        chan.exec_command(wire)
        if stdin:
            chan.settimeout(max(0.1, deadline - time.monotonic()) if timeout_s > 0 else None)
            chan.sendall(stdin)
        chan.shutdown_write()  # EOF, so commands that read stdin do not wait forever
        wait = 0.001
        while not chan.status_event.wait(min(wait, max(0.0, deadline - time.monotonic()))):
            drain()
            if time.monotonic() >= deadline:
                chan.close()  # the remote `timeout` wrapper finishes the job
                return -1, _decode(out), _decode(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
            if cancel is not None and cancel.is_set():
                chan.close()
                return -1, _decode(out), _decode(err), "cancelled: the step's deadline passed (killed)"
            wait = min(wait * 2, 0.05)
        # The exit status is in. OpenSSH sends EOF first, so normally all
        # output is already buffered; if a background child still holds the
        # pipes open, take what arrived within a short grace and move on.
        grace = time.monotonic() + _DRAIN_S
        while True:
            drain()
            if chan.eof_received or chan.closed or time.monotonic() >= grace:
                drain()
                break
            time.sleep(0.002)
        code = chan.recv_exit_status()
    except (TimeoutError, socket.timeout):
        chan.close()
        return -1, _decode(out), _decode(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
    except (paramiko.SSHException, OSError, EOFError) as exc:
        chan.close()
        return -1, _decode(out), _decode(err), f"ssh: connection lost while running: {exc or type(exc).__name__}"
    chan.close()
    if timeout_s > 0 and code in (124, 137) and time.monotonic() - start >= timeout_s:
        return -1, _decode(out), _decode(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
    return code, _decode(out), _decode(err), None


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
    name = ep.hostkey_name
    line = f"{name} {ktype} {b64}\n"
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two `trust`s at once must not interleave
        kh = _load_known_hosts([path])
        known = kh.keys.lookup(name)
        if known is not None and ktype in known:
            if known[ktype].get_base64() == b64:
                return ktype, fp, b64
            raise TransportError(
                f"{path} already records a different {ktype} key for {name} "
                f"({fingerprint_sha256(known[ktype].asbytes())}); nothing recorded",
                Ref(node=node.name),
                hint=f"if the node was reinstalled: ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(path))}",
            )
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        os.write(fd, line.encode())  # one write under O_APPEND: no torn lines
        os.fsync(fd)
    finally:
        os.close(fd)
    log.info("trusted %s key %s for node %s in %s", ktype, fp, node.name, path)
    return ktype, fp, b64


__all__ = [
    "Call", "CommandResult", "FakeTransport", "HostKeyError", "LocalTransport", "SSHTransport", "Transport",
    "TransportSettings", "command_line", "default_known_hosts", "fetch_host_key", "fingerprint_sha256",
    "known_hosts_name", "put_command", "put_label", "reply", "trust",
]
