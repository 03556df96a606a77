"""A local TCP port that reaches an address only a node can reach: an SSH local forward.

What this module owns: :func:`forward`, which the operator-side probes
(readiness, ``status``) and ``bench`` use when the endpoint listens on the head's
fabric address (``serve.bind: fabric``): the operator's machine has no route to
that link, the head has. Each connection to the local port becomes one
``direct-tcpip`` channel on the head's existing SSH connection (what ``ssh -L``
does, RFC 4254 section 7.2), so nothing runs on the head and no key or port
appears on any command line.

Why not fabric's ``Connection.forward_local`` (fabric/tunnels.py, 3.2): its
``TunnelManager`` binds the listener in a background thread after the context
is entered, so the caller's first connect can come before the bind and be
refused; it listens with a backlog of 1, which a bench at concurrency 64 would
overflow (dropped SYNs retried a second later, measured as latency); it needs
the caller to pick a free port (a race), and one channel the head cannot open
ends the manager for every later connection. This listener is bound before
:func:`forward` yields, on a port the kernel picks, and a refused channel closes
only its own connection (the client sees a reset, as with ``ssh -L``).

What it must not do: print, exit, or log what passes through the tunnel.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import paramiko

from sparkctl.errors import Ref, TransportError
from sparkctl.transport.base import Transport
from sparkctl.transport.connection import ConnectFailed, SSHTransport

log = logging.getLogger(__name__)

_BACKLOG = 128  # Linux's default somaxconn before 5.4; ample for bench concurrency
_CHUNK = 65536


def _pump(src: Any, dst: Any, done: threading.Event) -> None:
    """Copy src to dst until EOF, then half-close dst (a socket or a paramiko Channel)."""
    try:
        while not done.is_set():
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        try:
            if isinstance(dst, socket.socket):
                dst.shutdown(socket.SHUT_WR)
            else:
                dst.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass


@contextmanager
def forward(transport: Transport, node: str, host: str, port: int) -> Iterator[tuple[str, int]]:
    """``(local_host, local_port)`` that reaches ``host:port`` as ``node`` reaches it.

    A transport that does not log in over SSH (the local runner, the fake) runs its
    commands on this machine: the address is reached directly and yielded as is.
    Raises :class:`TransportError` when the node's SSH connection cannot be opened.
    """
    if not isinstance(transport, SSHTransport):
        yield host, port
        return
    ep = transport.endpoint(node)
    conn = transport.connection(ep, transport.node(node))
    try:
        conn.open()
    except ConnectFailed as exc:
        raise TransportError(f"cannot forward to {host}:{port} through {node}: {exc}", Ref(node=node)) from None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(_BACKLOG)
    listener.settimeout(0.2)
    done = threading.Event()
    opened: list[Any] = []
    lock = threading.Lock()

    def serve_one(client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as OpenSSH's forwarding sockets
        try:
            if conn.transport is None:
                raise EOFError("the SSH connection is closed")
            chan = conn.transport.open_channel("direct-tcpip", (host, port), client.getpeername(),
                                               timeout=transport.settings.connect_timeout_s)
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            log.debug("forward through %s to %s:%s refused: %s", node, host, port, exc)
            client.close()
            return
        with lock:
            opened.extend((client, chan))
        back = threading.Thread(target=_pump, args=(chan, client, done), daemon=True)
        back.start()
        _pump(client, chan, done)
        back.join()
        chan.close()
        client.close()

    def accept_loop() -> None:
        while not done.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            threading.Thread(target=serve_one, args=(client,), daemon=True).start()

    acceptor = threading.Thread(target=accept_loop, daemon=True, name=f"forward-{node}")
    acceptor.start()
    try:
        yield listener.getsockname()[0], listener.getsockname()[1]
    finally:
        done.set()
        acceptor.join()
        listener.close()
        with lock:
            for x in opened:
                try:
                    x.close()
                except (OSError, EOFError, paramiko.SSHException):
                    pass


__all__ = ["forward"]
