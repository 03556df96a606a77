"""Transports that need no SSH: :class:`LocalTransport` (this machine) and :class:`FakeTransport` (tests).

This module owns the two stand-ins for :class:`~sparkctl.transport.connection.SSHTransport`,
with the same interface, timeouts and fan-out (both are
:class:`~sparkctl.transport.base.BaseTransport`):

* :class:`LocalTransport` runs each command with ``sh -c`` on this machine, in
  its own process group so that a timeout kills the whole tree;
* :class:`FakeTransport` answers only what it was told and refuses anything
  else with an ``AssertionError`` naming the command, as invoke's
  ``MockContext`` does (invoke/context.py), so a unit test can never reach a
  real shell by accident.

What it must not do: print, exit, or open a network connection.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sparkctl.transport.base import (
    NOT_SENT,
    BaseTransport,
    Cancel,
    TransportSettings,
    put_command,
    put_label,
    sudo_error,
    sudo_needs_password,
    unknown_node,
)
from sparkctl.transport.results import CommandResult

log = logging.getLogger("sparkctl.transport")

# --------------------------------------------------------------------------- local


class LocalTransport(BaseTransport):
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
        cancel: Cancel | None,
    ) -> CommandResult:
        self._check_node(node)
        if cancel is not None and cancel.held():
            return CommandResult(node, label, -1, "", "", 0.0, NOT_SENT)
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
        if use_sudo and proc.returncode != 0 and sudo_needs_password(stderr):
            return CommandResult(node, label, -1, stdout, stderr, duration, sudo_error(node))
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


Reply = CommandResult | Callable[[Call], "CommandResult | None"]
ScriptKey = tuple[str, "str | re.Pattern[str]"]


class FakeTransport(BaseTransport):
    """A transport that only answers what it was told, for unit tests.

    ``script`` maps ``(node, command)`` to a :class:`CommandResult` (see
    :func:`reply`) or to a callable taking the :class:`Call`. ``node`` may be
    ``"*"`` for any node; ``command`` is matched exactly, or with
    ``fullmatch`` when it is a compiled ``re.Pattern``. A callable that returns
    ``None`` does not know the command, which is then refused: a catch-all
    responder never turns into "every command succeeds". Puts are matched as
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

    def _answer(self, call: Call, answer: Reply) -> CommandResult | None:
        result = answer(call) if callable(answer) else answer
        if result is None and callable(answer):
            return None  # a responder that does not know this command gives way: refused
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
            raise unknown_node(node, self._nodes)

    def _record(self, node: str, command: str, sudo: bool, timeout_s: float, stdin: bytes | None) -> Call:
        self._check_node(node)
        call = Call(node, command, sudo, timeout_s, stdin)
        with self._lock:
            self.calls.append(call)
        return call

    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: Cancel | None,
    ) -> CommandResult:
        if cancel is not None and cancel.held():
            return CommandResult(node, label, -1, "", "", 0.0, NOT_SENT)
        call = self._record(node, cmd, sudo, timeout_s, stdin)
        answer = self._match(node, cmd)
        result = self._answer(call, answer) if answer is not None else None
        if result is None:
            raise self._refuse(call)
        return result

    def _put(
        self, node: str, files: Sequence[tuple[str, bytes, int]], label: str, sudo: bool, cancel: Cancel | None,
    ) -> CommandResult:
        """Each file is its own scripted put ``"put /remote/path"``; the node stops at its first failure."""
        put_command([(path, mode, len(data)) for path, data, mode in files])  # the real thing's validation
        result = CommandResult(node, label, 0, "", "", 0.0, None)
        for remote_path, data, mode in files:
            if cancel is not None and cancel.held():
                return CommandResult(node, label, -1, "", "", 0.0, NOT_SENT)
            call = self._record(node, put_label(remote_path), sudo, self.settings.command_timeout_s, bytes(data))
            answer = self._match(node, call.command)
            scripted = self._answer(call, answer) if answer is not None else None
            if scripted is None and not self.accept_puts:
                raise self._refuse(call)
            result = scripted or CommandResult(node, call.command, 0, "", "", 0.0, None)
            if not result.ok:
                return result
            with self._lock:
                self.files[(node, remote_path)] = (bytes(data), mode)
        return result if len(files) == 1 else CommandResult(node, label, 0, "", "", 0.0, None)

    def close(self) -> None:
        self.closed = True


__all__ = ["Call", "FakeTransport", "LocalTransport", "Reply"]
