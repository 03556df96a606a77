"""The bench client's socket layer: an httpcore network backend that stamps every receive.

Owns one thing: connections whose bytes carry the time they were received, on
the ``time.perf_counter()`` clock, queued with that stamp until the request's
task reads them. :class:`StampedStream.last_read_t` is the stamp of the bytes
the last :meth:`StampedStream.read` returned, so the client can date an SSE
event by when its last byte arrived, not by when its task got around to it.

The stamp is the kernel's: each TCP socket asks for receive timestamps
(``SO_TIMESTAMPNS``) and reads with ``recvmsg``, so a segment is dated when the
network stack took it in (on loopback: when the server's ``send`` ran), not
when this process next got a CPU. A virtual machine wakes an idle process
milliseconds late (1-2 ms measured on the 2-core CI VM, most after a long wait
such as a TTFT); those milliseconds are the client's scheduling, not the
server's timing, and the kernel stamp leaves them out. Where the kernel gives
no stamp (a platform without ``SO_TIMESTAMPNS``, the second TLS record
decrypted from one read), the read callback's ``perf_counter()`` is used, as before:
:attr:`StampedStream.stamp_source` says which ("kernel" or "loop"). Linux
turns receive stamping on from a work queue when the first socket of the
machine asks for it, so the first segments after that may arrive unstamped;
the client's warm-up request absorbs them.

Why: with N streams emitting in lock-step, the N consuming tasks run one after
another. httpcore's default (anyio) stream pauses reading between reads, so
while a task is busy its socket is not read at all; a task that runs later than
one inter-token gap then reads two events in one ``recv`` and stamps both at
once (ITL ~0 for one gap, ~2g for the next). Here the socket is read whenever
it is readable, independently of the task, so each arrival keeps its own stamp
(two events share one only when the whole loop stalls longer than their gap).

Must not: parse HTTP or SSE (httpcore and :mod:`sparkctl.bench.sse` do),
print, or read the environment.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import sys
import time
import typing
from collections import deque
from collections.abc import Iterable

import httpcore
import httpx

# Above this many unread bytes the socket stops being read (TCP flow control then
# slows the server) until the task catches up; far above any SSE stream's backlog.
_HIGH_WATER_BYTES = 4 << 20
_LOW_WATER_BYTES = 1 << 20


# Linux: SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35 (a struct timespec of CLOCK_REALTIME)
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
_TIMESPEC = struct.Struct("@qq")
ANC_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
# A kernel stamp older than this at read time is not believed (the read callback's stamp is used)
_MAX_STAMP_AGE_S = 10.0


def kernel_stamp_to_perf(anc: list[tuple[int, int, bytes]], rt_now_ns: int, pc_now: float) -> float | None:
    """The receive time in an ``SCM_TIMESTAMPNS`` ancillary item, on the ``perf_counter`` clock. Pure.

    The kernel dates a segment on CLOCK_REALTIME; ``rt_now_ns``/``pc_now`` are the
    two clocks read together just after the ``recvmsg``, so the stamp is ``pc_now``
    minus its age. None when there is no stamp, or it is in the future or older
    than ``_MAX_STAMP_AGE_S`` (a realtime clock stepped in between).
    """
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            age_s = (rt_now_ns - (sec * 1_000_000_000 + nsec)) / 1e9
            return pc_now - age_s if 0.0 <= age_s <= _MAX_STAMP_AGE_S else None
    return None


class _StampingSocket(socket.socket):
    """A TCP socket whose ``recv`` also takes the kernel's receive stamp (:attr:`rx_stamp`).

    asyncio's selector transport reads its socket with ``recv`` and hands the
    bytes to ``Protocol.data_received`` in the same callback, so the protocol
    takes the stamp of exactly the bytes it is given.
    """

    __slots__ = ("rx_stamp",)

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_stamp: float | None = None

    def enable_stamps(self) -> bool:
        if SO_TIMESTAMPNS is None or not ANC_SPACE:
            return False
        try:
            self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return False
        return True

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, anc, _, _ = self.recvmsg(bufsize, ANC_SPACE, flags)
        self.rx_stamp = kernel_stamp_to_perf(anc, time.time_ns(), time.perf_counter()) if anc else None
        return data

    def recv_into(self, buffer: typing.Any, nbytes: int = 0, flags: int = 0) -> int:
        # asyncio reads with recv_into for a buffered protocol (its TLS layer)
        view = memoryview(buffer).cast("B")
        n, anc, _, _ = self.recvmsg_into([view[:nbytes] if nbytes else view], ANC_SPACE, flags)
        self.rx_stamp = kernel_stamp_to_perf(anc, time.time_ns(), time.perf_counter()) if anc else None
        return n

    def take_stamp(self) -> float | None:
        t, self.rx_stamp = self.rx_stamp, None
        return t


class _StampingProtocol(asyncio.Protocol):
    """Queues (stamp, bytes) per receive; wakes the one reader, if it waits."""

    def __init__(self, sock: _StampingSocket | None = None) -> None:
        self.sock = sock
        """Where the kernel's stamp of the bytes being delivered is (None: stamp on arrival here)."""
        self.n_kernel_stamped = 0
        self.reads: deque[tuple[float, bytes]] = deque()
        self.queued_bytes = 0
        self.eof = False
        self.exc: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()  # the stamp first, nothing before it
        k = self.sock.take_stamp() if self.sock is not None else None
        if k is not None and k <= t:
            t = k
            self.n_kernel_stamped += 1
        self.reads.append((t, data))
        self.queued_bytes += len(data)
        if self.queued_bytes > _HIGH_WATER_BYTES and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport (HTTP/1.1 has no half-close use here)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if exc is not None:
            self.exc = exc
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def popleft(self) -> tuple[float, bytes]:
        t, data = self.reads.popleft()
        self.queued_bytes -= len(data)
        if self._paused and self.queued_bytes < _LOW_WATER_BYTES and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return t, data

    async def wait_readable(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        timer = loop.call_later(timeout, self._timeout, self._waiter) if timeout is not None else None
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    @staticmethod
    def _timeout(fut: asyncio.Future[None]) -> None:
        if not fut.done():
            fut.set_exception(httpcore.ReadTimeout("no bytes within the read timeout"))


class StampedStream(httpcore.AsyncNetworkStream):
    """A TCP (or TLS) stream whose reads carry their receive stamp (:attr:`last_read_t`)."""

    def __init__(self, transport: asyncio.Transport, protocol: _StampingProtocol) -> None:
        self._transport = transport
        self._p = protocol
        self.last_read_t: float | None = None
        """perf_counter() when the last byte returned by :meth:`read` was received."""

    @property
    def stamp_source(self) -> str:
        """"kernel" once a receive was dated by the kernel's stamp, else "loop" (the read callback's clock)."""
        return "kernel" if self._p.n_kernel_stamped else "loop"

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._p
        if not p.reads:
            if p.exc is not None:
                raise httpcore.ReadError(str(p.exc) or type(p.exc).__name__)
            if p.eof:
                return b""
            await p.wait_readable(timeout)
            if not p.reads:
                if p.exc is not None:
                    raise httpcore.ReadError(str(p.exc) or type(p.exc).__name__)
                return b""
        t, data = p.popleft()
        if len(data) > max_bytes:
            data, rest = data[:max_bytes], data[max_bytes:]
            p.reads.appendleft((t, rest))
            p.queued_bytes += len(rest)
        self.last_read_t = t
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("connection closed")
        self._transport.write(buffer)
        drain = self._p._drain
        if drain is not None:
            try:
                await asyncio.wait_for(asyncio.shield(drain), timeout)
            except TimeoutError:
                raise httpcore.WriteTimeout("write buffer did not drain within the write timeout") from None

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> StampedStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(self._transport, self._p, ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            raise httpcore.ConnectTimeout("TLS handshake timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(f"TLS handshake failed: {exc}") from exc
        if tls is None:
            raise httpcore.ConnectError("TLS handshake failed: no transport")
        self._p.transport = tls
        return StampedStream(tls, self._p)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            # httpcore asks this of an idle pooled connection: readable = the server closed it
            return bool(self._p.reads) or self._p.eof
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int,
                   local_address: str | None) -> _StampingSocket:
    """A connected non-blocking :class:`_StampingSocket`: each address of ``host`` in turn."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host}: no address")
    last: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = _StampingSocket(family, kind, proto)
        try:
            sock.setblocking(False)
            if local_address:
                sock.bind((local_address, 0))
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    assert last is not None
    raise last


class StampedBackend(httpcore.AsyncNetworkBackend):
    """Opens :class:`StampedStream` connections on the running asyncio loop (TCP only).

    ``kernel_stamps=False`` dates every receive in the read callback only (the
    comparison in ``tools/client_capacity.py --stamps kernel,loop``).
    """

    def __init__(self, kernel_stamps: bool = True) -> None:
        self.kernel_stamps = kernel_stamps

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[tuple[int, int, int] | tuple[int, int, bytes | bytearray]
                                                   | tuple[int, int, None, int]] | None = None,
                          ) -> StampedStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                sock = await _connect(loop, host, port, local_address)
                stamps = self.kernel_stamps and sock.enable_stamps()
                # asyncio sets TCP_NODELAY; the caller's options go on top
                for opt in socket_options or ():
                    sock.setsockopt(*opt)
                transport, protocol = await loop.create_connection(
                    lambda: _StampingProtocol(sock if stamps else None), sock=sock)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return StampedStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class StampedTransport(httpx.AsyncHTTPTransport):
    """httpx's HTTP/1.1 transport over :class:`StampedBackend`.

    httpx does not take a network backend, so the pool it builds is replaced by
    one that uses ours (same limits, same TLS context); request mapping and
    exception mapping stay httpx's own.
    """

    def __init__(self, *, limits: httpx.Limits, verify: ssl.SSLContext | bool = True,
                 kernel_stamps: bool = True) -> None:
        super().__init__(http1=True, http2=False, limits=limits, verify=verify)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=StampedBackend(kernel_stamps),
        )

