"""One command on one open SSH session channel: send stdin, read both streams, honour the timeout.

This module owns the exchange on a session channel of a fabric ``Connection``
(``Connection.transport.open_session``). It does not go through fabric's
``Connection.run`` (invoke's ``Runner``), on purpose, for three behaviours
sparkctl needs and that Runner does not give:

* stdin from bytes at full speed: Runner reads a non-terminal ``in_stream``
  one byte per loop with a 10 ms nap between reads (invoke/terminals.py
  ``bytes_to_read`` returns 1 unless it is a tty; invoke/runners.py
  ``handle_stdin`` and ``input_sleep = 0.01``), so a 30 kB put would take
  minutes; and it decodes stdin as text, which mangles binary files;
* the end of a command seen at its exit status: Runner joins its stdout and
  stderr readers without a timeout (runners.py ``_thread_join_timeout``
  returns None), so a background child that keeps the channel's stdout open
  (``sleep 3 & echo started``) holds the result until the child exits;
  here the output that arrived within :data:`DRAIN_S` of the exit status is kept;
* cancellation from outside when a fan-out's deadline passes (Runner only
  knows its own timer; fabric's ``Remote.kill`` closes the channel, which is
  what :func:`run_on_channel` does too).

Output is decoded once, whole, as UTF-8 with replacement (Runner decodes each
1000-byte chunk apart and can split a multi-byte character).

What it must not do: open connections, decide what to run, print, or exit.
The stdin (file contents, possibly secrets) is never logged.
"""

from __future__ import annotations

import time

from paramiko.channel import Channel
from paramiko.ssh_exception import SSHException

from sparkctl.transport.base import NOT_SENT, Cancel

# How long we keep reading output after the exit status arrived, for when a
# background child keeps the remote stdout open.
DRAIN_S = 0.5


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")


def run_on_channel(
    chan: Channel, wire: str, stdin: bytes | None, timeout_s: float, cancel: Cancel | None
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

    if cancel is not None and cancel.held():  # Ctrl-C while this channel opened: never sent
        chan.close()
        return -1, "", "", NOT_SENT
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
                return -1, _text(out), _text(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
            if cancel is not None and cancel.is_set():
                chan.close()
                return -1, _text(out), _text(err), "cancelled: the step's deadline passed (killed)"
            wait = min(wait * 2, 0.05)
        # The exit status is in. OpenSSH sends EOF first, so normally all
        # output is already buffered; if a background child still holds the
        # pipes open, take what arrived within a short grace and move on.
        grace = time.monotonic() + DRAIN_S
        while True:
            drain()
            if chan.eof_received or chan.closed or time.monotonic() >= grace:
                drain()
                break
            time.sleep(0.002)
        code = chan.recv_exit_status()
    except TimeoutError:
        chan.close()
        return -1, _text(out), _text(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
    except (SSHException, OSError, EOFError) as exc:
        chan.close()
        return -1, _text(out), _text(err), f"ssh: connection lost while running: {exc or type(exc).__name__}"
    chan.close()
    if timeout_s > 0 and code in (124, 137) and time.monotonic() - start >= timeout_s:
        return -1, _text(out), _text(err), f"timeout: command did not finish within {timeout_s:g} s (killed)"
    return code, _text(out), _text(err), None


__all__ = ["DRAIN_S", "run_on_channel"]
