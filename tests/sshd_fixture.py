"""A real, throwaway OpenSSH sshd on 127.0.0.1 for end-to-end tests.

``start_sshd(tmp_path)`` generates a host key and a client key in ``tmp_path``,
writes an sshd_config that trusts only that client key, starts
``sshd -D -e -f cfg`` on a free high port and waits until it speaks SSH. The
handle carries everything a test needs to reach it: address, port, user,
client key, a known_hosts file that already trusts it (``known_hosts``) and
the host key's fingerprint as ``ssh-keygen`` prints it. Call ``stop()`` (or use
the handle as a context manager); ``start()`` brings it back on the same port
with the same keys.

Runs as root (it then needs ``/run/sshd``) or as an ordinary user (who can then
only log in as themself). Nothing here touches ~/.ssh.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and os.access(SSH_KEYGEN, os.X_OK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A new passphrase-less key pair at ``path`` / ``path.pub``."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", kind, "-N", "", "-C", f"sparkctl-test-{path.name}", "-f", str(path)],
        check=True, capture_output=True,
    )
    return path


def fingerprint_of(pub: Path) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -lf PUB -E sha256`` prints it."""
    out = subprocess.run([SSH_KEYGEN, "-lf", str(pub), "-E", "sha256"], check=True, capture_output=True, text=True)
    return out.stdout.split()[1]


@dataclass
class SshdHandle:
    host: str
    port: int
    user: str
    key_path: Path  # client private key that may log in
    known_hosts: Path  # a known_hosts file that already trusts this sshd
    hostkey_path: Path
    fingerprint: str  # of the host key, from ssh-keygen
    dir: Path
    config: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def hostkey_pub(self) -> Path:
        return self.hostkey_path.with_name(self.hostkey_path.name + ".pub")

    @property
    def log_path(self) -> Path:
        return self.dir / "sshd.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, wait_s: float = 10.0) -> SshdHandle:
        if self.proc is not None and self.proc.poll() is None:
            return self
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                env={**os.environ, **self.env}, start_new_session=True,
            )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd did not answer on {self.host}:{self.port} within {wait_s} s:\n{self.log()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # the listener only: sessions already open keep their own sshd child
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill_sessions(self) -> None:
        """Stop the listener and the per-connection sshd processes it forked (Linux /proc)."""
        proc = self.proc
        pids: list[int] = []
        if proc is not None:
            for status in Path("/proc").glob("[0-9]*/status"):
                try:
                    ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
                except (OSError, StopIteration):
                    continue
                if int(ppid.split()[1]) == proc.pid:
                    pids.append(int(status.parent.name))
        self.stop()
        for pid in pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass

    def node(self, name: str = "a", **overrides: Any) -> Any:
        """An inventory ``Node`` that reaches this sshd (defaults as the schema gives them)."""
        from sparkctl.model.inventory import Node
        from sparkctl.model.schema import default_ports

        values: dict[str, Any] = dict(
            name=name, index=0, host=self.host, ssh_user=self.user, ssh_port=self.port,
            ssh_identity=str(self.key_path), sudo=True, known_hosts=str(self.known_hosts), prefix="/",
            sysfs_root="/sys", proc_root="/proc", mgmt_iface="enP7s7", ports=default_ports(),
        )
        values.update(overrides)
        return Node(**values)

    def __enter__(self) -> SshdHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _setenv_line(env: dict[str, str]) -> str:
    for k, v in env.items():
        if not k.replace("_", "a").isalnum() or any(c in v for c in '"\n\\'):
            raise ValueError(f"cannot pass {k}={v!r} through sshd SetEnv")
    return "SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items()) + "\n" if env else ""


def start_sshd(tmp_path: Path, port: int | None = None, env: dict[str, str] | None = None) -> SshdHandle:
    """Start an unprivileged-style sshd on 127.0.0.1; ``env`` is set in every session (SetEnv)."""
    d = Path(tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    hostkey = d / "ssh_host_ed25519_key"
    if not hostkey.exists():
        keygen(hostkey)
    client_key = d / "client_key"
    if not client_key.exists():
        keygen(client_key)
    authorized = d / "authorized_keys"
    authorized.write_text(client_key.with_name("client_key.pub").read_text())
    port = port or free_port()
    env = dict(env or {})
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {hostkey}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\n"
        "AllowTcpForwarding yes\n"
        "MaxStartups 100:30:200\n"
        "MaxSessions 50\n"
        "LogLevel INFO\n"
        + _setenv_line(env)
    )
    known_hosts = d / "known_hosts"
    host = "127.0.0.1"
    pub_fields = hostkey.with_name(hostkey.name + ".pub").read_text().split()
    known_hosts.write_text(f"[{host}]:{port} {pub_fields[0]} {pub_fields[1]}\n")
    known_hosts.chmod(0o600)
    handle = SshdHandle(
        host=host, port=port, user=getpass.getuser(), key_path=client_key, known_hosts=known_hosts,
        hostkey_path=hostkey, fingerprint=fingerprint_of(hostkey.with_name(hostkey.name + ".pub")), dir=d,
        config=config, env=env,
    )
    return handle.start()
