"""The reference server's lean mode: the same timing model and bytes, without aiohttp, for capacity runs.

Owns serving ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models`` and ``GET /ref/traces`` over a bare asyncio protocol, with
:class:`~sparkctl.bench.refserver.RefConfig`'s timing model (the same closed
forms, per-request ``"ref"`` overrides, role chunk, k tokens per chunk, usage,
``trace``) and the same SSE bytes as :class:`~sparkctl.bench.refserver.RefServer`
(chunked transfer encoding, as aiohttp's stream). Each emission is a plain
callback run by :meth:`PreciseWaker.call_at` at its absolute target: no
handler task, no future, one ``transport.write`` per chunk.

Why: the reference server is part of the measurement; its own cost per event
must stay below the client's budget. aiohttp's handler path costs tens of
microseconds per chunk, and at 256 streams x 80 chunks/s it competes with the
client for the same 2 cores (issue 23). Fault modes are not served here
(``fault`` is a 400): the full server keeps them.

Must not: bind anything but the host it is given, or print.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sparkctl.bench.refserver import (
    TRACES_KEPT,
    EmitTrace,
    PreciseWaker,
    RefConfig,
    count_prompt_tokens,
    trace_key,
)

_MAX_HEAD = 64 * 1024
COALESCE_S = 0.0002  # chunks due within 0.2 ms of each other leave in one loop wake-up (PreciseWaker)
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(status: int, obj: Any, keep_alive: bool = True) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("" if keep_alive else "Connection: close\r\n") + "\r\n").encode() + body


class _Stream:
    """One streamed response: each chunk is written by a callback at its target time."""

    __slots__ = ("conn", "cfg", "chat", "max_tokens", "prompt_tokens", "t0", "t_first", "emitted", "emits",
                 "pre", "post", "rid", "created", "obj", "model", "include_usage", "trace_key")

    def __init__(self, conn: _LeanProtocol, cfg: RefConfig, chat: bool, max_tokens: int, prompt_tokens: int,
                 t0: float, rid: str, model: str, include_usage: bool, key: str | None) -> None:
        self.conn, self.cfg, self.chat = conn, cfg, chat
        self.max_tokens, self.prompt_tokens, self.t0 = max_tokens, prompt_tokens, t0
        self.t_first = t0 + cfg.ttft_s(prompt_tokens)
        self.emitted = 0
        self.emits: list[tuple[float, int]] = []
        self.rid, self.created, self.model = rid, int(time.time()), model
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.include_usage = include_usage
        self.trace_key = key
        # the content chunk's JSON around its text, as refserver's json.dumps(separators=(",", ":")) writes it
        head = f'{{"id":"{rid}","object":"{self.obj}","created":{self.created},"model":{json.dumps(model)},'
        if chat:
            self.pre = (head + '"choices":[{"index":0,"delta":{"content":').encode()
            self.post = b'},"finish_reason":null}]}'
        else:
            self.pre = (head + '"choices":[{"index":0,"text":').encode()
            self.post = b',"finish_reason":null}]}'

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        return _sse({"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                     "choices": [choice]})

    def schedule_next(self) -> None:
        n = min(self.cfg.tokens_per_chunk, self.max_tokens - self.emitted)
        self.conn.server.waker.call_at(self.t_first + (self.emitted + n - 1) * self.cfg.gap_s, self.emit)

    def emit(self) -> None:
        tr = self.conn.transport
        if tr is None or tr.is_closing():
            return
        n = min(self.cfg.tokens_per_chunk, self.max_tokens - self.emitted)
        # the text is " w<i>" words: nothing in it that JSON escapes
        text = (" w%d" % self.emitted).encode() if n == 1 else \
            "".join(f" w{self.emitted + j}" for j in range(n)).encode()
        data = b'data: %s"%s"%s\n\n' % (self.pre, text, self.post)
        self.emits.append((self.conn.loop.time(), n))
        tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.emitted += n
        if self.emitted < self.max_tokens:
            self.schedule_next()
        else:
            self.finish()

    def finish(self) -> None:
        srv = self.conn.server
        if self.trace_key is not None:
            srv.traces[self.trace_key] = EmitTrace(self.t0, self.prompt_tokens, tuple(self.emits))
            while len(srv.traces) > TRACES_KEPT:
                srv.traces.pop(next(iter(srv.traces)))
        out = [_chunked(self.chunk("" if not self.chat else None, finish="length"))]
        if self.include_usage:
            out.append(_chunked(_sse({"id": self.rid, "object": self.obj, "created": self.created,
                                      "model": self.model, "choices": [],
                                      "usage": {"prompt_tokens": self.prompt_tokens,
                                                "completion_tokens": self.emitted,
                                                "total_tokens": self.prompt_tokens + self.emitted}})))
        out.append(_chunked(b"data: [DONE]\n\n"))
        out.append(b"0\r\n\r\n")
        if self.conn.transport is not None and not self.conn.transport.is_closing():
            self.conn.transport.write(b"".join(out))
        self.conn.stream_done()


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _LeanProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests with Content-Length bodies, one at a time."""

    def __init__(self, server: LeanRefServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def stream_done(self) -> None:
        self.busy = False
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEAD:
                    self.transport.close()
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return  # the body is not all in yet
            t0 = self.loop.time()  # the whole request is in: every emission is scheduled from here
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            method, path = (head[0].split(" ") + ["", ""])[:2]
            self._handle(method, path, body, t0)

    def _handle(self, method: str, path: str, raw: bytes, t0: float) -> None:
        assert self.transport is not None
        srv = self.server
        if method == "GET" and path == "/v1/models":
            self.transport.write(_json_response(200, {"object": "list", "data": [{"id": srv.model,
                                                                                  "object": "model"}]}))
            return
        if method == "GET" and path == "/ref/traces":
            out, srv.traces = srv.traces, {}
            self.transport.write(_json_response(200, {k: t.to_dict() for k, t in out.items()}))
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self.transport.write(_json_response(404, {"error": {"message": f"no route {method} {path}"}}))
            return
        chat = path == "/v1/chat/completions"
        try:
            body = json.loads(raw)
            cfg = srv.config.with_overrides(body.get("ref") or {})
            if cfg.fault is not None:
                raise ValueError("the lean reference server has no fault modes (use the full one)")
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            prompt_tokens = count_prompt_tokens(messages=body["messages"]) if chat else \
                count_prompt_tokens(prompt=body["prompt"])
            if not body.get("stream"):
                raise ValueError("refserver streams only")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.transport.write(_json_response(400, {"error": {"message": str(exc),
                                                                "type": "invalid_request_error"}}))
            return
        include_usage = cfg.usage and bool((body.get("stream_options") or {}).get("include_usage"))
        srv.seq += 1
        key = None
        if cfg.trace:
            first = (body["messages"] or [{}])[0].get("content") if chat else body["prompt"]
            key = trace_key(str(first or ""))
        st = _Stream(self, cfg, chat, max_tokens, prompt_tokens, t0,
                     f"{'chatcmpl' if chat else 'cmpl'}-ref{srv.seq}", srv.model, include_usage, key)
        self.busy = True
        head = _SSE_HEAD
        if cfg.role_chunk and chat:
            head += _chunked(st.chunk(None, role=True))
        self.transport.write(head)
        if max_tokens > 0:
            st.schedule_next()
        else:
            st.finish()


class LeanRefServer:
    """The lean server on the current event loop: ``async with LeanRefServer(cfg) as srv: srv.base_url``."""

    def __init__(self, config: RefConfig = RefConfig(), *, host: str = "127.0.0.1", port: int = 0,
                 model: str = "refserver") -> None:
        self.config, self.host, self.port, self.model = config, host, port, model
        self.traces: dict[str, EmitTrace] = {}
        self.seq = 0
        self._server: asyncio.Server | None = None
        self._waker: PreciseWaker | None = None

    @property
    def waker(self) -> PreciseWaker:
        assert self._waker is not None, "LeanRefServer is not started"
        return self._waker

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._waker = PreciseWaker(loop, coalesce_s=COALESCE_S)
        self._server = await loop.create_server(lambda: _LeanProtocol(self), self.host, self.port,
                                                reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._waker is not None:
            self._waker.close()
            self._waker = None

    async def __aenter__(self) -> LeanRefServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
