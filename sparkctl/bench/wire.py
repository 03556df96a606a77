"""The bench client's lean HTTP/1.1 wire: raw sockets read in the event loop's reader callback.

Owns one thing: plain-HTTP (no TLS, no proxy) keep-alive connections on
non-blocking sockets registered with the loop's selector (``add_reader``), whose
reader callback takes the kernel's receive stamp (``SO_TIMESTAMPNS``, as
:mod:`sparkctl.bench.stamped`), un-chunks the response and hands each body
piece, with the stamp of the receive that brought it, to the request's
:class:`BodySink` there and then. No task wakes per read and no HTTP parser
of general purpose runs per read; at 256 streams that is what kept the loop
from staying on time (httpx/httpcore/h11: ~85 us per event; here a fraction
of it, measured in ``tools/client_capacity.py``).

Requests go out as a list of byte pieces with ``sendmsg`` (scatter/gather,
``writev``): the pieces are never joined, so a 128K-token prompt built once
(:meth:`sparkctl.bench.client.RequestSpec.body_parts`) is sent from the same
buffer by every request, without a copy that grows with the prompt; a partial
send advances ``memoryview`` slices.

Same definitions as the httpx path (docs/bench-metrics.md): bytes are dated
when the kernel took them in (else when the reader callback ran), and an SSE
frame gets the stamp of the receive that brought its last byte.

Must not: parse SSE (:mod:`sparkctl.bench.sse` does), print, or read the
environment.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from sparkctl.bench.stamped import ANC_SPACE, SO_TIMESTAMPNS, kernel_stamp_to_perf

_READ_SIZE = 256 * 1024
_MAX_HEAD_BYTES = 64 * 1024

Piece = bytes | memoryview


class WireError(Exception):
    """The connection failed (``kind``: "connect", "closed", "protocol", "write_timeout")."""

    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind


class BodySink(Protocol):
    """What a connection tells the request it is reading (all called in the reader callback)."""

    def on_head(self, t: float, status: int, headers: dict[str, str]) -> None: ...

    def on_body(self, t: float, data: bytes, source: str) -> bool:
        """A piece of the (un-chunked) body, received at ``t``. False: stop reading (the sink is done)."""
        ...

    def on_end(self, t: float, error: WireError | None) -> None: ...


class WireConnection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, stamps: bool) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.stamps = stamps
        self.alive = True
        self.last_read_t = 0.0
        self._sink: BodySink | None = None
        self._buf = bytearray()
        self._state = "idle"  # idle | head | chunk_size | chunk_data | chunk_crlf | trailer | length | close
        self._left = 0
        self._keep_alive = True
        self.n_kernel_stamped = 0
        self._write_waiter: asyncio.Future[None] | None = None
        loop.add_reader(self.fd, self._on_readable)

    @classmethod
    async def open(cls, host: str, port: int, *, timeout_s: float, kernel_stamps: bool = True) -> WireConnection:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        last: BaseException | None = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                async with asyncio.timeout(timeout_s):
                    await loop.sock_connect(sock, addr)
                stamps = False
                if kernel_stamps and SO_TIMESTAMPNS is not None and ANC_SPACE:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                        stamps = True
                    except OSError:
                        pass
                return cls(loop, sock, stamps)
            except TimeoutError:
                sock.close()
                raise WireError("connect", f"connect to {host}:{port} timed out") from None
            except OSError as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        raise WireError("connect", f"connect to {host}:{port} failed: {last or 'no address'}")

    def close(self) -> None:
        if self.alive:
            self.alive = False
            try:
                self.loop.remove_reader(self.fd)
                self.loop.remove_writer(self.fd)
            except (ValueError, OSError):
                pass
            self.sock.close()
            w = self._write_waiter
            if w is not None and not w.done():
                w.set_result(None)  # a send waiting to write wakes, sees the connection closed, returns

    # -- writing -----------------------------------------------------------------

    async def send(self, pieces: Sequence[Piece], sink: BodySink, *, timeout_s: float) -> None:
        """Hand ``pieces`` to the socket (``sendmsg``, no join) and read the response into ``sink``.

        The response may start before the last piece is out (a server that
        answers early); the sink is set first.
        """
        if not self.alive or self._state != "idle":
            raise WireError("closed", "connection is not idle")
        self._sink = sink
        self._state = "head"
        views = [memoryview(p).cast("B") for p in pieces if len(p)]
        while views:
            try:
                n = self.sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._fail(WireError("closed", f"send failed: {exc}"))
                return
            while n and views:
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0
            if views:
                if not self.alive:
                    return  # the server answered and closed before taking the whole body: the sink knows
                await self._writable(timeout_s)

    async def _writable(self, timeout_s: float) -> None:
        fut: asyncio.Future[None] = self.loop.create_future()
        self._write_waiter = fut

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self.loop.add_writer(self.fd, ready)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except TimeoutError:
            raise WireError("write_timeout", "request body did not drain within the write timeout") from None
        finally:
            if self.alive:
                self.loop.remove_writer(self.fd)

    # -- reading -----------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            if self.stamps:
                data, anc, _, _ = self.sock.recvmsg(_READ_SIZE, ANC_SPACE)
                t = time.perf_counter()  # the stamp first, nothing before it
                k = kernel_stamp_to_perf(anc, time.time_ns(), t) if anc else None
                if k is not None and k <= t:
                    t = k
                    self.n_kernel_stamped += 1
            else:
                data = self.sock.recv(_READ_SIZE)
                t = time.perf_counter()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(WireError("closed", f"{type(exc).__name__}: {exc}"))
            return
        self.last_read_t = t
        if not data:
            if self._state == "close":
                self._finish(t, None)
            else:
                self._fail(WireError("closed", "server closed the connection"
                                     + ("" if self._state in ("idle", "head") else " inside the body")))
            self.close()
            return
        if self._sink is None:
            # bytes on an idle connection: nothing can be expected; do not reuse it
            self.close()
            return
        try:
            self._feed(t, data)
        except WireError as exc:
            self._fail(exc)

    def _feed(self, t: float, data: bytes) -> None:
        src = "kernel" if self.n_kernel_stamped else "loop"
        if self._state == "head":
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD_BYTES:
                    raise WireError("protocol", "response head too long")
                return
            head, rest = bytes(self._buf[:end]), bytes(self._buf[end + 4:])
            self._buf.clear()
            status, headers = parse_head(head)
            te = headers.get("transfer-encoding", "").lower()
            self._keep_alive = headers.get("connection", "").lower() != "close"
            if "chunked" in te:
                self._state = "chunk_size"
            elif "content-length" in headers:
                self._state, self._left = "length", int(headers["content-length"])
            else:
                self._state, self._keep_alive = "close", False
            assert self._sink is not None
            self._sink.on_head(t, status, headers)
            if self._state == "length" and self._left == 0:
                self._finish(t, None)
                return
            data = rest
            if not data:
                return
        if self._state in ("length", "close"):
            if self._state == "length":
                piece, data = data[:self._left], data[self._left:]
                self._left -= len(piece)
            else:
                piece, data = data, b""
            if piece and self._sink is not None and not self._sink.on_body(t, piece, src):
                self._abandon()
                return
            if self._state == "length" and self._left == 0:
                self._finish(t, None)
            return
        self._unchunk(t, data, src)

    def _unchunk(self, t: float, data: bytes, src: str) -> None:
        """Transfer-Encoding: chunked (RFC 9112 7.1), across reads split anywhere."""
        pos, n = 0, len(data)
        sink = self._sink
        if self._state == "chunk_size" and not self._buf and sink is not None:
            # the common read: whole chunks ("<hex>\r\n<data>\r\n" ...), no extension
            while True:
                i = data.find(b"\r\n", pos, pos + 18)
                if i < 0:
                    break
                try:
                    size = int(data[pos:i], 16)
                except ValueError:
                    break
                start = i + 2
                end = start + size
                if size == 0 or end + 2 > n or data[end:end + 2] != b"\r\n":
                    break
                pos = end + 2
                if not sink.on_body(t, data[start:end], src):
                    self._abandon()
                    return
                if pos == n:
                    return
        while pos < n or (self._state == "chunk_size" and self._buf and b"\n" in self._buf):
            if self._state == "chunk_size":
                i = data.find(b"\n", pos)
                if i < 0:
                    self._buf += data[pos:]
                    if len(self._buf) > 1024:
                        raise WireError("protocol", "chunk size line too long")
                    return
                line = bytes(self._buf) + data[pos:i]
                self._buf.clear()
                pos = i + 1
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise WireError("protocol", f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    self._state = "trailer"
                else:
                    self._state, self._left = "chunk_data", size
            elif self._state == "chunk_data":
                take = min(self._left, n - pos)
                piece = data[pos:pos + take]
                pos += take
                self._left -= take
                if self._left == 0:
                    self._state, self._left = "chunk_crlf", 2
                if self._sink is not None and not self._sink.on_body(t, piece, src):
                    self._abandon()
                    return
            elif self._state == "chunk_crlf":
                # the CRLF after a chunk's data (tolerate a bare LF)
                while self._left and pos < n:
                    c = data[pos]
                    pos += 1
                    if c == 0x0A:
                        self._left = 0
                    elif c != 0x0D:
                        raise WireError("protocol", "chunk data not followed by CRLF")
                if not self._left:
                    self._state = "chunk_size"
            elif self._state == "trailer":
                self._buf += data[pos:]
                pos = n
                if self._buf.startswith(b"\r\n") or self._buf.startswith(b"\n"):
                    self._buf.clear()
                    self._finish(t, None)
                    return
                end = self._buf.find(b"\r\n\r\n")
                if end >= 0:
                    self._buf.clear()
                    self._finish(t, None)
                return
            else:  # idle: bytes after the end of a response
                self._keep_alive = False
                return

    def _finish(self, t: float, error: WireError | None) -> None:
        sink, self._sink = self._sink, None
        self._state = "idle"
        self._buf.clear()
        if not self._keep_alive:
            self.close()
        if sink is not None:
            sink.on_end(t, error)

    def _fail(self, error: WireError) -> None:
        sink, self._sink = self._sink, None
        self.close()
        if sink is not None:
            sink.on_end(time.perf_counter(), error)

    def _abandon(self) -> None:
        """The sink has what it needs before the body ended (an error in the stream): drop the connection."""
        self._sink = None
        self.close()


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """(status, lower-cased headers) of an HTTP/1.1 response head (without the blank line). Pure."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise WireError("protocol", f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise WireError("protocol", f"bad status line {lines[0][:60]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip().lower()
            headers[key] = (headers[key] + ", " + value.strip()) if key in headers else value.strip()
    return status, headers


class WirePool:
    """Up to ``size`` keep-alive connections to one host:port; :meth:`open_all` opens them ahead of time."""

    def __init__(self, host: str, port: int, size: int, *, connect_s: float, kernel_stamps: bool = True) -> None:
        self.host, self.port, self.size = host, port, size
        self.connect_s = connect_s
        self.kernel_stamps = kernel_stamps
        self._idle: deque[WireConnection] = deque()
        self._n_open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def _open(self) -> WireConnection:
        self._n_open += 1
        try:
            return await WireConnection.open(self.host, self.port, timeout_s=self.connect_s,
                                             kernel_stamps=self.kernel_stamps)
        except BaseException:
            self._n_open -= 1
            self._wake()
            raise

    async def open_all(self) -> int:
        """Open connections until ``size`` are open (together, before any is needed); the number idle."""
        alive = deque(c for c in self._idle if c.alive)
        self._n_open -= len(self._idle) - len(alive)
        self._idle = alive
        missing = self.size - self._n_open
        if missing > 0:
            self._idle.extend(await asyncio.gather(*(self._open() for _ in range(missing))))
        return len(self._idle)

    async def acquire(self) -> WireConnection:
        while True:
            while self._idle:
                c = self._idle.popleft()
                if c.alive:
                    return c
                self._n_open -= 1
            if self._n_open < self.size:
                return await self._open()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    def release(self, conn: WireConnection) -> None:
        if conn.alive and conn._state == "idle":
            self._idle.append(conn)
        else:
            conn.close()
            self._n_open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()
        self._n_open = 0
