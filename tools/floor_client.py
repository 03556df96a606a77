"""The bare-socket floor: a raw-socket streaming client with kernel receive stamps, for comparison.

What the bench client is measured against. One process, one ``epoll``
(``selectors``), non-blocking sockets opened before the measured window, the
request bytes the bench client would send (``RequestSpec.body_parts``, sent
with ``sendmsg``), and, per ``recvmsg``, the kernel's receive stamp
(``SO_TIMESTAMPNS``, converted as :func:`sparkctl.bench.stamped.kernel_stamp_to_perf`)
and a count of content frames by byte search (the reference server's
completions chunks: ``"text":" w``). No HTTP parser, no JSON, no per-event
object: the least a client can do and still date every token. After the batch
its reads become :class:`~sparkctl.bench.events.Event` logs, so its figures come
from :mod:`sparkctl.bench.metrics`, the bench's own definitions.

Only for the reference server's completions streams (it does not un-chunk
or parse; a frame split across two reads is counted in the read that brings
its marker's last byte, the byte search running over the seam). Importable
(``run_floor_batch``) and runnable::

    python tools/floor_client.py URL [--concurrency 256] [--tokens 64]
"""

from __future__ import annotations

import argparse
import selectors
import socket
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.bench.client import RequestSpec, new_salt
from sparkctl.bench.events import Event, RequestResult
from sparkctl.bench.stamped import ANC_SPACE, SO_TIMESTAMPNS, kernel_stamp_to_perf

_MARK = b'"text":" w'  # a content chunk of the reference server's completions stream
_DONE = b"data: [DONE]"


@dataclass
class _Conn:
    sock: socket.socket
    salt: str
    pending: list[memoryview]
    t_sent: float = 0.0
    reads: list[tuple[float, int]] | None = None  # (stamp, content frames completed in that read)
    tail: bytes = b""
    done: bool = False
    n_body: int = 0


def open_sockets(url: str, n: int) -> list[socket.socket]:
    """``n`` connected TCP sockets with kernel receive stamps on (before anything is timed)."""
    u = urllib.parse.urlsplit(url)
    out = []
    for _ in range(n):
        s = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if SO_TIMESTAMPNS is not None:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setblocking(False)
        out.append(s)
    return out


def run_floor_batch(url: str, specs: Sequence[RequestSpec], socks: Sequence[socket.socket] | None = None,
                    timeout_s: float = 120.0) -> list[RequestResult]:
    """Send ``specs`` together on fresh (or given) sockets; one result per spec, in order."""
    u = urllib.parse.urlsplit(url)
    socks = list(socks) if socks is not None else open_sockets(url, len(specs))
    conns: list[_Conn] = []
    for s, spec in zip(socks, specs):
        salt = new_salt() if spec.salt else ""
        parts = spec.body_parts(salt)
        n = sum(len(p) for p in parts)
        head = (f"POST {u.path.rstrip('/')}/v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
                f"Accept: text/event-stream\r\nAccept-Encoding: identity\r\nContent-Type: application/json\r\n"
                f"Content-Length: {n}\r\n\r\n").encode()
        conns.append(_Conn(s, salt, [memoryview(p) for p in [head, *parts]], reads=[], n_body=n))
    sel = selectors.DefaultSelector()
    for c in conns:
        c.t_sent = time.perf_counter()
        _send_some(c)
        sel.register(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.pending else 0), c)
    left = len(conns)
    deadline = time.perf_counter() + timeout_s
    while left and time.perf_counter() < deadline:
        for key, mask in sel.select(1.0):
            c = key.data
            if mask & selectors.EVENT_WRITE and c.pending:
                _send_some(c)
                if not c.pending:
                    sel.modify(c.sock, selectors.EVENT_READ, c)
            if not mask & selectors.EVENT_READ:
                continue
            try:
                data, anc, _, _ = c.sock.recvmsg(262144, ANC_SPACE)
            except (BlockingIOError, InterruptedError):
                continue
            t = time.perf_counter()
            k = kernel_stamp_to_perf(anc, time.time_ns(), t) if anc else None
            if k is not None and k <= t:
                t = k
            seam = c.tail + data
            n = seam.count(_MARK) - c.tail.count(_MARK)
            if n:
                assert c.reads is not None
                c.reads.append((t, n))
            c.tail = seam[-(len(_DONE) - 1):]
            if not data or _DONE in seam:
                c.done = True
                sel.unregister(c.sock)
                left -= 1
    sel.close()
    out = []
    for i, c in enumerate(conns):
        c.sock.close()
        events = [Event(c.t_sent, "sent", raw_len=c.n_body, detail="written")]
        for t, n in c.reads or []:
            events += [Event(t, "chunk", n_text_chars=1)] * n
        if c.done:
            events.append(Event(events[-1].t_s, "done"))
        out.append(RequestResult(f"f{i + 1:06d}", "ok" if c.done else "timeout", tuple(events), salt=c.salt,
                                 endpoint="completions", t_release_s=c.t_sent))
    return out


def _send_some(c: _Conn) -> None:
    while c.pending:
        try:
            n = c.sock.sendmsg(c.pending)
        except (BlockingIOError, InterruptedError):
            return
        while n and c.pending:
            if n >= len(c.pending[0]):
                n -= len(c.pending.pop(0))
            else:
                c.pending[0] = c.pending[0][n:]
                n = 0


def main() -> None:
    from sparkctl.bench.metrics import aggregate_throughput, request_metrics

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64)
    a = p.parse_args()
    spec = RequestSpec("completions", "refserver", a.tokens, prompt="floor probe")
    rs = run_floor_batch(a.url, [spec] * a.concurrency)
    ttfts = sorted(m.ttft_s for m in (request_metrics(r.events) for r in rs) if m.ttft_s is not None)
    print(f"floor: {len(rs)} streams, statuses {sorted({r.status for r in rs})}, "
          f"median TTFT {ttfts[len(ttfts) // 2] * 1e3:.3f} ms, "
          f"aggregate {aggregate_throughput([r.events for r in rs]).tok_s:,.1f} tok/s")


if __name__ == "__main__":
    main()
