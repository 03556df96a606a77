"""What every transport shares: the protocol, the three timeouts, command wrapping, put, and the fan-out.

This module owns:

* :class:`Transport`, the protocol the rest of sparkctl runs commands through;
* :class:`TransportSettings`: connect timeout, command timeout and the overall
  deadline of a fan-out, kept apart on purpose;
* command wrapping and quoting: what the remote login shell receives is one
  plain word list, ``[sudo -n --] [timeout -k 1 T] sh -c CMD``
  (:func:`wire_command`), so no login shell or ``.bashrc`` is relied upon;
  callers quote their own values (a list is joined with :func:`shlex.join`);
* :func:`put_command` (sparkctl/remote/putfiles.py, shared with the head's plan runner), the
  remote half of atomic file writes (one session per node);
* :class:`BaseTransport.run_all`, the fan-out: every node at once, wait for
  all, each node's outcome kept (a :class:`~sparkctl.transport.results.FanOut`),
  stragglers cut at the deadline and cancelled; :meth:`BaseTransport.put_all`,
  the same fan-out for files (each node's files in one session, in order); Ctrl-C during a
  fan-out sends nothing more and lets what was sent end (:class:`Cancel`).

What it must not do: decide what to run, parse output, print, or exit. The
stdin of :meth:`Transport.put` (file contents, possibly secrets) is never logged.
"""

from __future__ import annotations

import logging
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable

from sparkctl.errors import Ref, SparkctlError, TransportError
from sparkctl.remote.putfiles import PUT_SCRIPT, put_command, put_files
from sparkctl.transport.hostkeys import HostKeyError
from sparkctl.transport.results import Command, CommandResult, FanOut, command_line

log = logging.getLogger("sparkctl.transport")

NOT_SENT = "interrupted: not sent (Ctrl-C came before this node's command was sent)"


class Cancel(threading.Event):
    """One fan-out's stop, as its calls see it.

    ``set()`` (the deadline passed, or a second Ctrl-C): each call cuts its command (closes its
    channel, kills its process group). ``hold()`` (Ctrl-C): a call that has not sent its command
    yet never sends it (:data:`NOT_SENT`), and a command already sent runs to its end: a command
    on a host does not stop because the operator's client stopped waiting (an SSH channel closed
    without a pty leaves it running), so what the run does next (its Ctrl-C branch: a stop on the
    same node) must start after it, never beside it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held = threading.Event()

    def hold(self) -> None:
        self._held.set()

    def held(self) -> bool:
        return self._held.is_set() or self.is_set()

# Extra time the remote `timeout` wrapper allows beyond our own command
# timeout: we close the channel first; the wrapper makes sure the remote
# process tree dies even though sshd leaves no-pty children running when a
# channel closes (OpenSSH session.c sends no signal to a no-pty session's
# command when the channel closes; only a pty's hangup does).
REMOTE_KILL_GRACE_S = 0.5
_SUDO_PASSWORD_RE = re.compile(r"sudo: (a password is required|a terminal is required)")


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


@runtime_checkable
class Transport(Protocol):
    """How the rest of sparkctl runs commands. Swap in :class:`~sparkctl.transport.fake.FakeTransport` in tests."""

    @property
    def nodes(self) -> tuple[str, ...]: ...

    def run(
        self, node: str, command: Command, *, sudo: bool = False, timeout_s: float | None = None,
        stdin: str | bytes | None = None,
    ) -> CommandResult: ...

    def run_all(
        self, commands: Mapping[str, Command], *, sudo: bool | Mapping[str, bool] = False,
        timeout_s: float | None = None, deadline_s: float | None = None,
    ) -> FanOut: ...

    def put(self, node: str, remote_path: str, data: bytes, mode: int, *, sudo: bool = False) -> CommandResult: ...

    def put_all(
        self, files: Mapping[str, Sequence[tuple[str, bytes, int]]], *, sudo: bool | Mapping[str, bool] = False,
        deadline_s: float | None = None,
    ) -> FanOut: ...

    def close(self) -> None: ...

    def __enter__(self) -> Transport: ...

    def __exit__(self, *exc: object) -> None: ...


def put_label(remote_path: str) -> str:
    """How a put appears in results, logs and FakeTransport scripts."""
    return f"put {remote_path}"


def wire_command(cmd: str, *, sudo: bool, timeout_s: float) -> str:
    """What the remote login shell receives: a plain word list ending in ``sh -c CMD``."""
    argv: list[str] = []
    if sudo:
        argv += ["sudo", "-n", "--"]  # -n: fail at once instead of prompting (sudo(8))
    if timeout_s > 0:
        # coreutils timeout in its own process group: kills the whole remote tree
        argv += ["timeout", "-k", "1", f"{timeout_s + REMOTE_KILL_GRACE_S:g}"]
    argv += ["sh", "-c", cmd]
    return shlex.join(argv)


def sudo_needs_password(stderr: str) -> bool:
    return bool(_SUDO_PASSWORD_RE.search(stderr))


def sudo_error(node: str) -> str:
    return (
        f"sudo: sudo needs a password on {node}: allow passwordless sudo for these commands "
        "(a sudoers NOPASSWD rule for the ssh user) or set sudo: false for this node "
        "and log in as a user that has the rights"
    )


def unknown_node(node: str, known: Iterable[str]) -> TransportError:
    return TransportError(
        f"no node {node!r} in this transport", Ref(node=node), hint=f"known nodes: {', '.join(known) or '(none)'}"
    )


class BaseTransport:
    """Fan-out, put and context management shared by every transport."""

    settings: TransportSettings

    def __init__(self, settings: TransportSettings | None) -> None:
        self.settings = settings or TransportSettings()

    @property
    def nodes(self) -> tuple[str, ...]:
        raise NotImplementedError

    # Subclasses implement this; `cancel` is the fan-out's (None for one command): a call checks
    # `cancel.held()` just before it sends its command, and `cancel.is_set()` while it waits.
    def _run(
        self, node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
        cancel: Cancel | None,
    ) -> CommandResult:
        raise NotImplementedError

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            raise unknown_node(node, self.nodes)

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
        return self._put(node, [(remote_path, data, mode)], put_label(remote_path), sudo, None)

    def _put(
        self, node: str, files: Sequence[tuple[str, bytes, int]], label: str, sudo: bool, cancel: Cancel | None,
    ) -> CommandResult:
        """One session writes the node's files (:data:`PUT_SCRIPT`); stdin is never logged."""
        cmd = shlex.join(put_command([(path, mode, len(data)) for path, data, mode in files]))
        return self._run(node, cmd, label=label, sudo=sudo, timeout_s=self.settings.command_timeout_s,
                         stdin=b"".join(bytes(data) for _, data, _ in files), cancel=cancel)

    def run_all(
        self, commands: Mapping[str, Command], *, sudo: bool | Mapping[str, bool] = False,
        timeout_s: float | None = None, deadline_s: float | None = None,
    ) -> FanOut:
        """Run one command per node in parallel and wait for all of them.

        ``sudo`` is one flag or one per node: nodes with and without sudo in one
        step are one fan-out, never two waves.

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
            return FanOut()
        for node in commands:
            self._check_node(node)
        timeout = self._timeout(timeout_s)
        cmds = {node: command_line(c) for node, c in commands.items()}

        def one(node: str, cancel: Cancel) -> CommandResult:
            use_sudo = bool(sudo.get(node, False)) if isinstance(sudo, Mapping) else sudo
            return self._run(node, cmds[node], label=cmds[node], sudo=use_sudo, timeout_s=timeout, stdin=None,
                             cancel=cancel)

        return self._fan_out({n: one for n in cmds}, cmds, deadline_s)

    def put_all(
        self, files: Mapping[str, Sequence[tuple[str, bytes, int]]], *, sudo: bool | Mapping[str, bool] = False,
        deadline_s: float | None = None,
    ) -> FanOut:
        """Write each node's files (``(remote_path, data, mode)``, in order), all nodes at once; wait for all.

        One session per node writes its files, each as :meth:`put` writes one
        (atomic, mode set, stdin never logged); a node stops at its first
        failed file, and its stderr names it. The result is labelled ``put
        PATH`` for one file, ``put <n> files`` for more. ``sudo`` is one flag
        or one per node. Deadline and failures as :meth:`run_all`: every
        node's outcome kept, stragglers reported at the deadline.
        """
        if not files:
            return FanOut()
        for node in files:
            self._check_node(node)
        labels = {n: put_label(fs[0][0]) if len(fs) == 1 else f"put {len(fs)} files" for n, fs in files.items()}

        def one(node: str, cancel: Cancel) -> CommandResult:
            use_sudo = bool(sudo.get(node, False)) if isinstance(sudo, Mapping) else sudo
            return self._put(node, files[node], labels[node], use_sudo, cancel)

        return self._fan_out({n: one for n in files}, labels, deadline_s)

    def _fan_out(
        self, calls: Mapping[str, Callable[[str, Cancel], CommandResult]], labels: Mapping[str, str],
        deadline_s: float | None,
    ) -> FanOut:
        """Every node's call at once, each on its own thread; wait for all, up to the deadline.

        Ctrl-C while waiting: nothing more is sent, the commands already sent are waited for (up to
        the deadline), then KeyboardInterrupt goes on; a second Ctrl-C cuts them (:class:`Cancel`)."""
        deadline = self.settings.deadline_s if deadline_s is None else deadline_s
        cancel = Cancel()
        start = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="sparkctl-run")
        try:
            futures = {node: pool.submit(call, node, cancel) for node, call in calls.items()}
            try:
                done, _ = wait_futures(futures.values(), timeout=deadline)
            except KeyboardInterrupt:
                cancel.hold()
                running = sorted(n for n, f in futures.items() if not f.done())
                if running:
                    log.warning("Ctrl-C: waiting for the command already sent to %s to end (Ctrl-C again cuts it)",
                                ", ".join(running))
                wait_futures(futures.values(), timeout=max(0.0, deadline - (time.monotonic() - start)))
                raise
        finally:
            cancel.set()  # stragglers close their channels / kill their processes
            pool.shutdown(wait=False, cancel_futures=True)
        elapsed = time.monotonic() - start
        results: dict[str, CommandResult] = {}
        bug: BaseException | None = None
        for node, fut in futures.items():
            if fut not in done:
                results[node] = CommandResult(
                    node, labels[node], -1, "", "", elapsed,
                    f"deadline: no result within the {deadline:g} s deadline of this step",
                )
                continue
            exc = fut.exception()
            if exc is None:
                results[node] = fut.result()
            elif isinstance(exc, SparkctlError):
                kind = "hostkey" if isinstance(exc, HostKeyError) else "ssh"
                results[node] = CommandResult(node, labels[node], -1, "", "", elapsed, f"{kind}: {exc.one_line()}")
            elif bug is None:
                bug = exc
        if bug is not None:
            raise bug
        return FanOut(results)

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "NOT_SENT",
    "PUT_SCRIPT",
    "BaseTransport",
    "Cancel",
    "Transport",
    "TransportSettings",
    "put_command",
    "put_files",
    "put_label",
    "sudo_error",
    "sudo_needs_password",
    "unknown_node",
    "wire_command",
]
