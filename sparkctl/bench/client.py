"""The bench runner's streaming client for OpenAI-compatible endpoints.

Owns sending ``/v1/completions`` and ``/v1/chat/completions`` requests with
``stream: true`` and ``stream_options.include_usage``, reading the SSE byte
stream (split into frames and turned into events by :mod:`sparkctl.bench.sse`),
and recording every observation as an
:class:`~sparkctl.bench.events.Event` stamped with ``time.perf_counter()`` when
its bytes were received (in the loop's read callback, by
:mod:`sparkctl.bench.stamped`), not when this task got around to parsing them. Every request ends as a
:class:`~sparkctl.bench.events.RequestResult` with exactly one status:

``ok`` | ``http_error`` (``http_status`` set) | ``malformed_sse`` |
``error_mid_stream`` | ``disconnected`` | ``timeout``.

Expected failures are values, never exceptions, so a batch keeps the results
of the requests that succeeded. Connection failures (refused, reset before a
status line) are reported as ``disconnected`` with ``detail`` saying
``connect``.

Must not: compute metrics (that is :mod:`sparkctl.bench.metrics`), write files
(the caller writes :func:`~sparkctl.bench.events.result_to_jsonl`), print, or
read proxy settings from the environment unless asked (``trust_env``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from sparkctl.bench.events import Event, RequestResult, Status
from sparkctl.bench.sse import Endpoint, Malformed, SSESplitter, StreamState
from sparkctl.bench.stamped import StampedStream, StampedTransport
from sparkctl.bench.wire import WireConnection, WireError, WirePool

_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_ERROR_BODY_MAX = 4096
# stands in for salt + prompt while the body's JSON is built (NULs: no prompt holds this)
_SENTINEL = "\x00sparkctl-salted-prompt\x00"


def new_salt() -> str:
    """A short random line: 16 hex digits and a newline (one whitespace word)."""
    return secrets.token_hex(8) + "\n"


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. ``prompt`` for ``completions``, ``messages`` for ``chat``.

    ``salt=True`` puts a fresh random line at the very start of the prompt (the
    first message's content for chat), so no request can read another's prefix
    cache. ``extra_body`` is merged last into the JSON body (e.g.
    ``{"ignore_eos": true}`` or a server's thinking switch).
    """

    endpoint: Endpoint
    model: str
    max_tokens: int
    prompt: str = ""
    messages: tuple[Mapping[str, str], ...] = ()
    temperature: float = 0.0
    seed: int | None = 0
    salt: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    keep_text: bool = False
    """Keep the generated content text in :attr:`RequestResult.text` (off by
    default: the timing path only counts characters)."""

    def body(self, salt: str) -> dict[str, Any]:
        """The JSON body, with ``salt`` ("" for none) at the start of the prompt."""
        b: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.seed is not None:
            b["seed"] = self.seed
        if self.endpoint == "completions":
            b["prompt"] = salt + self.prompt
        else:
            msgs = [dict(m) for m in self.messages]
            if not msgs:
                raise ValueError("a chat request needs at least one message")
            msgs[0]["content"] = salt + msgs[0].get("content", "")
            b["messages"] = msgs
        b.update(self.extra_body)
        return b

    @functools.cached_property
    def _body_template(self) -> tuple[bytes, bytes, bytes]:
        """(before, the prompt JSON-escaped, after): the body is ``before + salt + prompt + after``.

        Built once per spec (``json.dumps`` escapes code point by code point, so
        escaping the salt and the prompt apart and putting them side by side is
        the escaping of ``salt + prompt``); every request then sends the same
        prompt bytes.
        """
        whole = json.dumps(self.body(_SENTINEL)).encode()
        mark = json.dumps(_SENTINEL)[1:-1].encode()
        if whole.count(mark) != 1:
            raise ValueError("the prompt placeholder is not unique in the body (extra_body overrides the prompt?)")
        before, after = whole.split(mark)
        text = self.prompt if self.endpoint == "completions" else self.messages[0].get("content", "")
        prompt = json.dumps(text)[1:-1].encode()
        if not after.startswith(prompt):
            raise ValueError("the prompt does not follow its placeholder in the body")
        return before, prompt, after[len(prompt):]

    def body_parts(self, salt: str) -> list[bytes]:
        """The JSON body of :meth:`body` as pieces to send as they are (``sendmsg``), never joined.

        ``b"".join(spec.body_parts(salt)) == json.dumps(spec.body(salt)).encode()``;
        the piece holding the prompt is the same object for every request of
        this spec, so a long prompt costs no copy per request.
        """
        before, prompt, after = self._body_template
        return [before, json.dumps(salt)[1:-1].encode(), prompt, after]


# -- the client ------------------------------------------------------------------


@dataclass(frozen=True)
class ClientTimeouts:
    """Separate limits, in seconds. ``read_s`` is the longest silence between two
    reads (it must exceed the longest TTFT you expect); ``request_s`` bounds a
    whole request. Either ending a request classifies it ``timeout``."""

    connect_s: float = 10.0
    read_s: float = 600.0
    write_s: float = 30.0
    request_s: float = 3600.0


Engine = Literal["auto", "wire", "httpx"]


class BenchClient:
    """Async streaming client; one per (base URL, concurrency).

    Use as ``async with BenchClient(url, concurrency=16) as c: await c.run_batch(specs)``.
    The pool holds ``concurrency`` HTTP/1.1 connections; call :meth:`warm_up`
    (or :meth:`open_connections`) before timing so no measured request pays
    for a TCP connect.

    ``engine``: ``"wire"`` (:mod:`sparkctl.bench.wire`: raw sockets read in the
    loop's reader callback, bodies sent as pieces) for plain ``http://`` without
    proxies, ``"httpx"`` (httpx over :mod:`sparkctl.bench.stamped`) for TLS or
    when ``trust_env`` asks for proxies; ``"auto"`` picks. Both record the same
    events by the same definitions (docs/bench-metrics.md).
    """

    def __init__(
        self,
        base_url: str,
        *,
        concurrency: int,
        timeouts: ClientTimeouts = ClientTimeouts(),
        api_key: str | None = None,
        trust_env: bool = False,
        kernel_stamps: bool = True,
        engine: Engine = "auto",
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.timeouts = timeouts
        url = urllib.parse.urlsplit(self.base_url)
        if engine == "auto":
            engine = "wire" if url.scheme == "http" and not trust_env else "httpx"
        if engine == "wire" and url.scheme != "http":
            raise ValueError("the wire engine speaks plain http:// only")
        self.engine: Engine = engine
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client: httpx.AsyncClient | None = None
        self._pool: WirePool | None = None
        if engine == "wire":
            port = url.port or 80
            host = url.hostname or "127.0.0.1"
            hostport = host if port == 80 else f"{host}:{port}"
            self._heads = {
                ep: (f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {hostport}\r\n"
                     + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                     + "Content-Type: application/json\r\nContent-Length: ")
                for ep, path in _PATHS.items()}
            self._pool = WirePool(host, port, concurrency, connect_s=timeouts.connect_s, kernel_stamps=kernel_stamps)
        else:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            self._client = httpx.AsyncClient(
                http1=True,
                http2=False,
                limits=limits,
                timeout=httpx.Timeout(connect=timeouts.connect_s, read=timeouts.read_s, write=timeouts.write_s,
                                      pool=None),
                headers=headers,
                trust_env=trust_env,
                transport=StampedTransport(limits=limits, kernel_stamps=kernel_stamps),
            )
        self._seq = 0

    async def __aenter__(self) -> BenchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._pool is not None:
            self._pool.close()

    async def open_connections(self) -> None:
        """Open all ``concurrency`` connections now (wire engine; httpx opens them on first use)."""
        if self._pool is not None:
            try:
                await self._pool.open_all()
            except WireError:
                pass  # each request reports its own connect failure

    async def warm_up(self, spec: RequestSpec) -> list[RequestResult]:
        """Fill the pool: ``concurrency`` copies of ``spec`` released together."""
        await self.open_connections()
        return await self.run_batch([spec] * self.concurrency)

    @staticmethod
    def prepare(specs: Sequence[RequestSpec]) -> None:
        """Build each distinct spec's body template now (before anything is timed)."""
        for spec in {id(s): s for s in specs}.values():
            spec.body_parts("")

    async def run_batch(self, specs: Sequence[RequestSpec],
                        request_ids: Sequence[str] | None = None) -> list[RequestResult]:
        """Release all ``specs`` together (behind one gate); results in the same order.

        Each distinct spec's body is built before the gate opens (outside
        every request's timing).
        """
        self.prepare(specs)
        gate = asyncio.Event()

        async def one(i: int, spec: RequestSpec) -> RequestResult:
            await gate.wait()
            return await self.request(spec, request_ids[i] if request_ids is not None else None)

        tasks = [asyncio.create_task(one(i, s)) for i, s in enumerate(specs)]
        await asyncio.sleep(0)  # every task reaches the gate before it opens
        gate.set()
        return list(await asyncio.gather(*tasks))

    async def request(self, spec: RequestSpec, request_id: str | None = None) -> RequestResult:
        """Send one streamed request and record it. Never raises for an expected failure."""
        self._seq += 1
        rid = request_id or f"r{self._seq:06d}"
        salt = new_salt() if spec.salt else ""
        parts = spec.body_parts(salt)
        if self._pool is not None:
            return await self._request_wire(spec, rid, salt, parts)
        return await self._request_httpx(spec, rid, salt, b"".join(parts))

    def _result(self, spec: RequestSpec, rid: str, salt: str, events: list[Event], state: StreamState,
                t_release: float, n_body: int, status: Status, detail: str = "",
                http_status: int | None = None) -> RequestResult:
        if not any(e.kind == "sent" for e in events):
            # never fully written (connect failed, ...): the release time stands in
            events.insert(0, Event(t_release, "sent", raw_len=n_body, detail="not written"))
        if status != "ok":
            events.append(Event(time.perf_counter(), "error", detail=f"{status}: {detail}"))
        return RequestResult(
            request_id=rid,
            status=status,
            events=tuple(events),
            http_status=http_status,
            detail=detail,
            salt=salt,
            endpoint=spec.endpoint,
            t_release_s=t_release,
            labels=dict(spec.labels),
            text="".join(state.texts) if state.texts is not None else None,
        )

    async def _request_wire(self, spec: RequestSpec, rid: str, salt: str, parts: list[bytes]) -> RequestResult:
        assert self._pool is not None
        t_release = time.perf_counter()
        n_body = sum(len(p) for p in parts)
        events: list[Event] = []
        state = StreamState(spec.endpoint, events, keep_text=spec.keep_text)
        loop = asyncio.get_running_loop()
        sink = _WireSink(state, events, loop.create_future())
        conn: WireConnection | None = None
        read_timer: asyncio.TimerHandle | None = None

        def check_read() -> None:
            nonlocal read_timer
            silent = time.perf_counter() - max(conn.last_read_t if conn else 0.0, t_sent)
            if silent >= self.timeouts.read_s:
                sink.finish("timeout", f"ReadTimeout: no bytes for {self.timeouts.read_s:g} s")
                if conn is not None:
                    conn.close()
            else:
                read_timer = loop.call_later(self.timeouts.read_s - silent, check_read)

        t_sent = t_release
        try:
            async with asyncio.timeout(self.timeouts.request_s):
                try:
                    conn = await self._pool.acquire()
                except WireError as exc:
                    return self._result(spec, rid, salt, events, state, t_release, n_body, "disconnected",
                                        f"connect failed: {exc}")
                head = (self._heads[spec.endpoint] + f"{n_body}\r\n\r\n").encode()
                t_sent = time.perf_counter()
                events.append(Event(t_sent, "sent", raw_len=n_body, detail="written"))
                read_timer = loop.call_later(self.timeouts.read_s, check_read)
                try:
                    await conn.send([head, *parts], sink, timeout_s=self.timeouts.write_s)
                except WireError as exc:
                    sink.finish("timeout" if exc.kind == "write_timeout" else "disconnected", str(exc))
                    conn.close()
                status, detail = await sink.outcome
        except TimeoutError:
            status, detail = "timeout", f"request took longer than {self.timeouts.request_s:g} s"
            if conn is not None:
                conn.close()
        finally:
            if read_timer is not None:
                read_timer.cancel()
            if conn is not None:
                self._pool.release(conn)
        return self._result(spec, rid, salt, events, state, t_release, n_body, status, detail, sink.http_status)

    async def _request_httpx(self, spec: RequestSpec, rid: str, salt: str, content: bytes) -> RequestResult:
        assert self._client is not None
        events: list[Event] = []
        status_code: int | None = None
        state = StreamState(spec.endpoint, events, keep_text=spec.keep_text)
        t_release = time.perf_counter()

        def result(status: Status, detail: str = "") -> RequestResult:
            return self._result(spec, rid, salt, events, state, t_release, len(content), status, detail,
                                status_code)

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            # 'sent' = the moment the request body goes to the socket. httpcore calls
            # this hook and then, with no await in between, transport.write()s the
            # body (the headers went out just before; a server can act on a request
            # only once its body is in). The ".complete" hook would be too late: the
            # stream yields to the loop after writing, and N requests released
            # together would stamp each other's send work into their TTFT.
            if name == "http11.send_request_body.started":
                events.append(Event(time.perf_counter(), "sent", raw_len=len(content), detail="written"))

        req = self._client.build_request("POST", self.base_url + _PATHS[spec.endpoint], content=content,
                                         headers={"Content-Type": "application/json"},
                                         extensions={"trace": trace})
        try:
            async with asyncio.timeout(self.timeouts.request_s):
                resp = await self._client.send(req, stream=True)
                try:
                    events.append(Event(time.perf_counter(), "headers"))
                    status_code = resp.status_code
                    if resp.status_code != 200:
                        body = b""
                        async for part in resp.aiter_raw():
                            body += part
                            if len(body) >= _ERROR_BODY_MAX:
                                break
                        return result("http_error", f"HTTP {resp.status_code}: {body[:300].decode(errors='replace')}")
                    encoded = resp.headers.get("content-encoding", "identity").lower() not in ("", "identity")
                    reader = resp.aiter_bytes() if encoded else resp.aiter_raw()
                    stream = resp.extensions.get("network_stream")
                    stamped = stream if isinstance(stream, StampedStream) else None
                    splitter = SSESplitter()
                    first = True
                    async for data in reader:
                        # when the bytes were received (the read callback's stamp), else now
                        last = stamped.last_read_t if stamped is not None else None
                        t = last if last is not None else time.perf_counter()
                        if first:
                            # detail: who dated the bytes ("kernel": its receive stamp; "loop": the read callback)
                            events.append(Event(t, "first_byte", raw_len=len(data),
                                                detail=stamped.stamp_source if stamped is not None else "loop"))
                            first = False
                        for frame in splitter.feed(data):
                            state.frame(frame, t)
                            if state.error is not None:
                                return result(*state.error)
                            if state.done:
                                break
                        if state.done:
                            break
                    if state.done:
                        # read the chunked terminator too, so the connection goes back to the pool
                        async for _ in reader:
                            pass
                        return result("ok")
                    rest = splitter.flush()
                    if rest:
                        return result("disconnected", f"stream ended inside a frame ({len(rest)} bytes unterminated)")
                    if state.finish_seen:
                        return result("ok", "stream ended after finish_reason without [DONE]")
                    return result("disconnected", "stream ended without [DONE]")
                finally:
                    await resp.aclose()
        except Malformed as exc:
            return result("malformed_sse", str(exc))
        except (TimeoutError, httpx.TimeoutException) as exc:
            return result("timeout", f"{type(exc).__name__}: {exc}".rstrip(": "))
        except httpx.ConnectError as exc:
            return result("disconnected", f"connect failed: {exc}")
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return result("disconnected", f"{type(exc).__name__}: {exc}")


class _WireSink:
    """One request's response as the wire connection delivers it, in the loop's reader callback.

    The same decisions as the httpx path of :meth:`BenchClient.request`, in
    the same order: status, error body, first byte, frames, ``[DONE]``.
    """

    def __init__(self, state: StreamState, events: list[Event], outcome: asyncio.Future[tuple[Status, str]]) -> None:
        self.state = state
        self.events = events
        self.outcome = outcome
        self.http_status: int | None = None
        self.splitter = SSESplitter()
        self.first = True
        self.error_body: bytearray | None = None
        self.encoded = ""

    def finish(self, status: Status, detail: str = "") -> None:
        if not self.outcome.done():
            self.outcome.set_result((status, detail))

    def on_head(self, t: float, status: int, headers: dict[str, str]) -> None:
        self.events.append(Event(t, "headers"))
        self.http_status = status
        if status != 200:
            self.error_body = bytearray()
        enc = headers.get("content-encoding", "identity").lower()
        self.encoded = "" if enc in ("", "identity") else enc

    def on_body(self, t: float, data: bytes, source: str) -> bool:
        if self.outcome.done():
            return False
        if self.error_body is not None:
            self.error_body += data
            if len(self.error_body) >= _ERROR_BODY_MAX:
                self._http_error()
                return False
            return True
        if self.encoded:
            self.finish("malformed_sse", f"content-encoding {self.encoded} on a stream asked as identity")
            return False
        state = self.state
        if self.first:
            self.events.append(Event(t, "first_byte", raw_len=len(data), detail=source))
            self.first = False
        if state.done:
            return True  # the rest of the body (the chunked terminator) keeps the connection reusable
        try:
            for frame in self.splitter.feed(data):
                state.frame(frame, t)
                if state.error is not None:
                    self.finish(*state.error)
                    return False
                if state.done:
                    break
        except Malformed as exc:
            self.finish("malformed_sse", str(exc))
            return False
        return True

    def _http_error(self) -> None:
        body = bytes(self.error_body or b"")
        self.finish("http_error", f"HTTP {self.http_status}: {body[:300].decode(errors='replace')}")

    def on_end(self, t: float, error: WireError | None) -> None:
        if self.outcome.done():
            return
        if self.error_body is not None and error is None:
            self._http_error()
        elif self.state.done:
            self.finish("ok")
        elif error is not None and self.http_status is None:
            self.finish("disconnected", f"RemoteProtocolError: {error}")
        elif error is not None and error.kind == "protocol":
            self.finish("disconnected", f"RemoteProtocolError: {error}")
        else:
            rest = self.splitter.flush()
            if rest:
                self.finish("disconnected", f"stream ended inside a frame ({len(rest)} bytes unterminated)")
            elif self.state.finish_seen:
                self.finish("ok", "stream ended after finish_reason without [DONE]")
            else:
                self.finish("disconnected", "stream ended without [DONE]" + (f" ({error})" if error else ""))


# -- event-loop lag ----------------------------------------------------------------


class LoopLagProbe:
    """A ticker that wakes every ``period_s`` and records how late it woke.

    The lateness is how long the event loop was busy with something else, i.e.
    how much any timestamp the client took could have been delayed. Run it
    beside a measurement: ``async with LoopLagProbe() as lag: ...``; then
    ``lag.samples_s`` (and ``lag.times_s``, when each sample was taken, to cut a window).
    """

    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s
        self.samples_s: list[float] = []
        self.times_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        target = time.perf_counter() + self.period_s
        while True:
            await asyncio.sleep(max(target - time.perf_counter(), 0.0))
            now = time.perf_counter()
            self.samples_s.append(max(now - target, 0.0))
            self.times_s.append(now)
            target = now + self.period_s

    async def __aenter__(self) -> LoopLagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
