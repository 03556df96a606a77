"""Host-key trust: which keys a node may offer, what we do when it offers another, and `trust`.

This module owns sparkctl's host-key policy, the one thing it adds on top of
fabric's connections that must never be loosened:

* keys come from known_hosts files only (the node's own file, else
  ``~/.ssh/known_hosts``, plus ``/etc/ssh/ssh_known_hosts``), read leniently
  as OpenSSH does (a bad line is skipped; ``@revoked`` honoured);
* an unknown key is refused (:class:`RejectUnknown`) with its SHA256
  fingerprint, and never added: fabric's ``Connection`` installs paramiko's
  auto-adding policy by default (fabric/connection.py, ``Connection.__init__``),
  so :mod:`sparkctl.transport.connection` replaces it before every connect;
* a CHANGED or revoked key is a loud :class:`HostKeyError` naming the node and
  both fingerprints (exit code 3, as a ``TransportError``);
* :func:`record_host_key` writes a key on purpose (``sparkctl trust``).

paramiko is imported here, beside fabric, for its key types and HostKeys only.
What it must not do: open connections (see connection.py), print, or exit.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from sparkctl.errors import Ref, TransportError
from sparkctl.model.inventory import Node

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


class HostKeyError(TransportError):
    """A node's host key is not (or no longer) the one we recorded.

    The message always names the node and the offered key's fingerprint. The
    structured fields are optional so that code which re-raises an error as
    ``type(exc)(message, ref, hint)`` with a longer message (the phase wrapper
    of ``up``/``down``/``switch`` does) keeps a HostKeyError, exit code 3,
    instead of failing with a TypeError (it was an "internal error" before).
    """

    def __init__(
        self, message: str, ref: Ref | None = None, hint: str | None = None, *, node: str = "", host: str = "",
        key_type: str = "", fingerprint: str = "", key_b64: str = "", changed: bool = False,
        expected_fingerprint: str | None = None,
    ) -> None:
        super().__init__(message, ref, hint)
        self.node = node
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.key_b64 = key_b64
        self.changed = changed
        self.expected_fingerprint = expected_fingerprint


def fingerprint_sha256(key_blob: bytes) -> str:
    """OpenSSH's fingerprint of a public key blob: ``SHA256:`` + unpadded base64."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The host field OpenSSH writes in known_hosts: ``host``, or ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def default_known_hosts(node: Node) -> Path:
    """The file that holds (and :func:`record_host_key` writes) this node's host key."""
    return Path(node.known_hosts).expanduser() if node.known_hosts else Path(USER_KNOWN_HOSTS).expanduser()


def known_hosts_paths(node: Node, override: Path | None, *, for_jump: bool) -> list[Path]:
    """The files a connection for ``node`` trusts, in order."""
    own = override or (Path(node.known_hosts).expanduser() if node.known_hosts else None)
    user = Path(USER_KNOWN_HOSTS).expanduser()
    paths = [own] if own else [user]
    if for_jump and own:
        paths.append(user)  # so that `ssh JUMP` once is enough to trust a jump host
    paths.append(SYSTEM_KNOWN_HOSTS)
    return paths


class UnknownHostKey(Exception):
    """Raised by :class:`RejectUnknown` inside paramiko's connect; carries the offered key."""

    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    """Our policy: never add a key; tell the caller which key it was."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(key)


@dataclass
class KnownHosts:
    """The keys of a set of known_hosts files, with the revoked ones and the files actually read."""

    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: set[bytes] = field(default_factory=set)
    files: list[str] = field(default_factory=list)


def load_known_hosts(paths: Iterable[Path], into: paramiko.HostKeys | None = None) -> KnownHosts:
    """Read known_hosts files leniently (paramiko's loader trips on @markers)."""
    kh = KnownHosts(keys=into if into is not None else paramiko.HostKeys())
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
            except Exception:  # noqa: BLE001 - a bad line is skipped, as OpenSSH does (sshd/hostfile.c)
                continue
            if entry is None or entry.key is None:
                continue
            for name in entry.hostnames:
                kh.keys.add(name, entry.key.get_name(), entry.key)
    return kh


def unknown_key_error(
    node: str, label: str, hostkey_name: str, key: paramiko.PKey, kh: KnownHosts, *, trust_hint: str | None
) -> HostKeyError:
    """An unknown key: refused with its fingerprint and how to record it on purpose."""
    fp = fingerprint_sha256(key.asbytes())
    ktype = key.get_name()
    files = ", ".join(kh.files) or "no known_hosts file"
    hint = trust_hint or (
        f"run `sparkctl trust {node}` after checking the fingerprint "
        f"(on the node: ssh-keygen -lf /etc/ssh/ssh_host_{key.algorithm_name.lower()}_key.pub)"
    )
    return HostKeyError(
        f"unknown host key for {label} ({hostkey_name}): {ktype} {fp} (not in {files})", Ref(node=node), hint,
        node=node, host=hostkey_name, key_type=ktype, fingerprint=fp, key_b64=key.get_base64(), changed=False,
    )


def changed_key_error(
    node: str, label: str, hostkey_name: str, key: paramiko.PKey, expected: paramiko.PKey, kh: KnownHosts
) -> HostKeyError:
    """A key other than the recorded one: refused loudly, with both fingerprints."""
    fp = fingerprint_sha256(key.asbytes())
    old = fingerprint_sha256(expected.asbytes())
    files = ", ".join(kh.files) or "no known_hosts file"
    msg = (
        f"HOST KEY CHANGED for {label} ({hostkey_name}): it now offers {key.get_name()} {fp}, "
        f"but {files} records {expected.get_name()} {old}. Someone may be intercepting the connection "
        "(man-in-the-middle), or the node was reinstalled"
    )
    hint = (
        "if the node was reinstalled, check the new fingerprint on its console, remove the old key with "
        f"`ssh-keygen -R {shlex.quote(hostkey_name)} -f FILE`, then run `sparkctl trust {node}`"
    )
    return HostKeyError(
        msg, Ref(node=node), hint, node=node, host=hostkey_name, key_type=key.get_name(), fingerprint=fp,
        key_b64=key.get_base64(), changed=True, expected_fingerprint=old,
    )


def revoked_key_error(node: str, label: str, hostkey_name: str, key: paramiko.PKey) -> HostKeyError:
    fp = fingerprint_sha256(key.asbytes())
    return HostKeyError(
        f"host key of {label} ({hostkey_name}) is marked @revoked: {key.get_name()} {fp}",
        Ref(node=node), "do not connect; find out why the key was revoked",
        node=node, host=hostkey_name, key_type=key.get_name(), fingerprint=fp, key_b64=key.get_base64(), changed=True,
    )


def record_host_key(node: Node, path: Path, hostkey_name: str, ktype: str, b64: str) -> bool:
    """Append ``hostkey_name ktype b64`` to ``path`` unless that key is already recorded (then False).

    Creates the file 0600 and its directory 0700; refuses if a different key
    of that type is recorded for the name. Safe against a concurrent
    ``trust`` (flock) and against torn lines (one O_APPEND write).
    """
    line = f"{hostkey_name} {ktype} {b64}\n"
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two `trust`s at once must not interleave
        known = load_known_hosts([path]).keys.lookup(hostkey_name)
        if known is not None and ktype in known:
            if known[ktype].get_base64() == b64:
                return False
            raise TransportError(
                f"{path} already records a different {ktype} key for {hostkey_name} "
                f"({fingerprint_sha256(known[ktype].asbytes())}); nothing recorded",
                Ref(node=node.name),
                hint=f"if the node was reinstalled: ssh-keygen -R {shlex.quote(hostkey_name)} -f {shlex.quote(str(path))}",
            )
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


__all__ = [
    "SYSTEM_KNOWN_HOSTS",
    "HostKeyError",
    "KnownHosts",
    "RejectUnknown",
    "UnknownHostKey",
    "changed_key_error",
    "default_known_hosts",
    "fingerprint_sha256",
    "known_hosts_name",
    "known_hosts_paths",
    "load_known_hosts",
    "record_host_key",
    "revoked_key_error",
    "unknown_key_error",
]
