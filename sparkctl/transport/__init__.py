"""Running commands on nodes: SSH on fabric, a local runner, a refusing fake, and results as data.

The package is the only place that imports fabric or paramiko (a test walks
every other module's imports). Its modules:

* ``results``: :class:`CommandResult` and :class:`FanOut` (a fan-out's results,
  with ``.ok``, ``.failed`` and ``.raise_for``);
* ``base``: the :class:`Transport` protocol, :class:`TransportSettings` (connect
  timeout, command timeout, overall deadline), command wrapping, ``put``, the fan-out;
* ``hostkeys``: known_hosts, the refusing policy, :class:`HostKeyError`, recording a key;
* ``endpoints``: ssh_config + inventory -> where to connect, ProxyJump chains;
* ``connection``: fabric Connections per node and :class:`SSHTransport`, ``trust``;
* ``session``: one command on an open session channel;
* ``fake``: :class:`LocalTransport` and :class:`FakeTransport`.
"""

from sparkctl.transport.base import (
    Cancel,
    Transport,
    TransportSettings,
    put_command,
    put_label,
    wire_command,
)
from sparkctl.transport.connection import SSHTransport, fetch_host_key, trust
from sparkctl.transport.fake import Call, FakeTransport, LocalTransport
from sparkctl.transport.hostkeys import (
    HostKeyError,
    default_known_hosts,
    fingerprint_sha256,
    known_hosts_name,
)
from sparkctl.transport.results import (
    Command,
    CommandResult,
    FanOut,
    command_line,
    reply,
)

__all__ = [
    "Call", "Cancel", "Command", "CommandResult", "FakeTransport", "FanOut", "HostKeyError", "LocalTransport", "SSHTransport",
    "Transport", "TransportSettings", "command_line", "default_known_hosts", "fetch_host_key", "fingerprint_sha256",
    "known_hosts_name", "put_command", "put_label", "reply", "trust", "wire_command",
]
