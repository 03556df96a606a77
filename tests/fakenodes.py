"""Fake nodes for the tests that collect every command sparkctl would send.

:func:`fake_for` gives a :class:`sparkctl.transport.FakeTransport` whose nodes
answer just enough for ``up``, ``check --fix``, ``status``, ``down``,
``switch --supervise`` and ``weights`` to run through: the lock is acquired,
nothing is left running, a started job has pid 4242, a supervisor has started,
and a weights job is done at its first ``tail``. Used by test_injection.py and
test_secrets.py.

The responder is not a catch-all: a command whose program is not one sparkctl
is known to run (:data:`PROGRAMS`) gets ``None``, which makes the
FakeTransport refuse it (an ``AssertionError`` naming the command), and puts
are not matched at all, so they go through the fake's own ``accept_puts``.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from sparkctl.model import paths
from sparkctl.transport import Call, FakeTransport, reply

SERVE_EVENTS = '{"event":"started","pid":4242,"port":39999}\n'
# What the operations run with no answer needed beyond "ok, no output" (the
# first word of the command; `f=` and `[` open the small sh snippets).
PROGRAMS = ("cat", "nvidia-smi", "sh", "systemctl", "grep", "f=", "sha256sum", "mkdir", "[", "tail", "ps", "rm",
            "kill", "test", "ls", "docker", "sync", "set --", "echo 3 >", "for ")


def answer(call: Call) -> Any:
    c = call.command
    if "echo acquired" in c:
        return reply("acquired\n")
    if 'echo "left:$left"' in c:
        return reply("left:\nports:\n")
    if 'echo "pid:$!"' in c:
        return reply("pid:4242\n")
    if paths.SUPERVISOR_EVENTS.rsplit("/", 1)[-1] in c and "cat " in c:
        return reply('{"phase": "started", "pid": 4242, "node": "*", "message": "x"}\n')
    if "dpkg-query" in c and "earlyoom" in c:  # up's watchdog step: earlyoom installed, file kept
        return reply("kept\n")
    if "weights_agent.py" in c:
        words = shlex.split(c)
        if "tail" in words and "--offset" in words:
            done = {"event": "done", "verified": True, "bytes": 1, "files": 1,
                    "manifest": {"kind": "file", "files": {"m": {"size": 1, "sha256": "0" * 64}}}}
            return reply(json.dumps(done) + "\n" + json.dumps({"event": "tail", "offset": 1, "alive": False}) + "\n")
        return reply(SERVE_EVENTS)
    if c.lstrip().startswith(PROGRAMS):
        return reply("")
    return None  # not a command sparkctl sends: the FakeTransport refuses it


class FakeNodes(FakeTransport):
    def _record(self, node: str, command: str, sudo: bool, timeout_s: float, stdin: bytes | None) -> Call:
        if len(self.calls) > 500:  # a polling loop that never ends is a harness bug: fail, do not hang
            raise RuntimeError(f"runaway: more than 500 commands, last {command[:200]!r}")
        return super()._record(node, command, sudo, timeout_s, stdin)

    def verified_host_key(self, name: str) -> tuple[str, str, str]:
        return ("ssh-ed25519", "SHA256:AAAA", "AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyForTests")


def fake_for(inv: Any) -> FakeNodes:
    return FakeNodes({("*", re.compile(r"(?!put ).*", re.DOTALL)): answer}, nodes=inv.names, accept_puts=True)
