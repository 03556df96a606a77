"""A reference OpenAI-compatible streaming server with KNOWN rates, for loopback.

Owns serving ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``
on 127.0.0.1 with a timing model whose metrics have closed forms, so the bench
client and metrics can be checked against the truth, plus fault modes that
fuzz the client's classification. It is a test instrument, not an engine.

Timing model (``t0`` = the server's ``loop.time()`` when the handler starts):

* ``n = max_tokens`` (or ``max_completion_tokens``, 16 if neither);
* prompt tokens ``P`` = whitespace words of the prompt; for chat, the sum over
  messages of the words of ``content`` plus 4 per message;
* token ``i`` (0-based) of ``n`` is generated at
  ``t0 + ttft_base_s + ttft_per_token_s * P + i * gap_s``;
* tokens go out ``tokens_per_chunk`` (k) at a time: a chunk is written when
  its last token is generated, so the first *visible* token arrives at
  ``a + b*P + (k-1)*g``; the final partial chunk is written with the last token;
* optionally a role-only chunk (``delta: {role: assistant}``) right after the
  headers (chat only), then a finish chunk, the usage chunk (unless
  ``usage=False``) and ``[DONE]``.

Each emission is scheduled against its absolute target on ``loop.time()``, so
lateness never accumulates; a helper thread wakes the handlers to ~0.1 ms
(:class:`PreciseWaker`) where ``asyncio.sleep`` alone would be up to 1 ms late. Every setting has a default from the command line
or constructor and can be overridden per request by a ``"ref": {...}`` object
in the JSON body (unknown keys are a 400), so one server serves every
configuration of a self-test.

With ``trace: true`` the server keeps when each content chunk really went out
(:class:`EmitTrace`), by the first line of the prompt (the bench's salt), and
``GET /ref/traces`` hands them over: the self-test judges the client against
what the server did, and reports apart how late the machine made the server.

Fault modes (``fault``, after ``fault_after_tokens`` tokens): ``malformed_sse``
(a data line that is not JSON), ``no_data_prefix`` (a chunk's JSON without the
``data:`` field name), ``error_mid_stream`` (an OpenAI error object in
the stream), ``huge_frame`` (one content chunk of ``huge_frame_bytes`` text;
the stream is otherwise valid), ``disconnect`` (the TCP connection is aborted),
``stall`` (silence for ``stall_s``), and ``http_error`` (status
``http_error_status`` before any stream).

Must not: bind anything but the host it is given (127.0.0.1 by default), or
print (its command line, for this server and the lean one, is :mod:`sparkctl.bench.refserve`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

Fault = Literal["malformed_sse", "no_data_prefix", "error_mid_stream", "huge_frame", "disconnect", "stall",
                "http_error"]
FAULTS: tuple[str, ...] = ("malformed_sse", "no_data_prefix", "error_mid_stream", "huge_frame", "disconnect", "stall",
                           "http_error")

CHAT_TOKENS_PER_MESSAGE = 4  # role and separators around each message, as chat templates add


@dataclass(frozen=True)
class RefConfig:
    """The timing model and fault mode of the reference server (units in names)."""

    ttft_base_s: float = 0.05
    ttft_per_token_s: float = 0.0
    gap_s: float = 0.005
    tokens_per_chunk: int = 1
    role_chunk: bool = False
    usage: bool = True
    fault: Fault | None = None
    fault_after_tokens: int = 4
    huge_frame_bytes: int = 1 << 20
    stall_s: float = 30.0
    http_error_status: int = 503
    trace: bool = False
    """Keep when each content chunk really went out (``GET /ref/traces``)."""

    def __post_init__(self) -> None:
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if min(self.ttft_base_s, self.ttft_per_token_s, self.gap_s, self.stall_s) < 0:
            raise ValueError("times must be >= 0")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {', '.join(FAULTS)}")

    def with_overrides(self, overrides: Mapping[str, Any]) -> RefConfig:
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown ref keys: {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **dict(overrides))

    def ttft_s(self, prompt_tokens: int) -> float:
        """Time from request to the first generated token (not yet the first visible chunk)."""
        return self.ttft_base_s + self.ttft_per_token_s * prompt_tokens

    def first_visible_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """Time from request to the first chunk with text: the closed form of the client's TTFT."""
        return self.ttft_s(prompt_tokens) + (min(self.tokens_per_chunk, max_tokens) - 1) * self.gap_s


def count_prompt_tokens(prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None) -> int:
    """The server's token count: whitespace words (+4 per chat message)."""
    if messages is not None:
        return sum(len(str(m.get("content") or "").split()) + CHAT_TOKENS_PER_MESSAGE for m in messages)
    return len((prompt or "").split())


TRACES_KEPT = 4096  # traces held for GET /ref/traces; the oldest go first


@dataclass(frozen=True)
class EmitTrace:
    """When the server really did what its timing model scheduled (``trace: true``).

    ``t_start_s`` is ``t0`` of the timing model; ``emits`` holds, per content
    chunk, (``loop.time()`` just before the chunk was written, tokens in it).
    ``loop.time()`` is ``time.monotonic()`` (CLOCK_MONOTONIC on Linux), the clock
    the bench client's ``perf_counter()`` reads too, so a client on the same host
    can put the two side by side: how late this machine made the server, apart
    from how late the client saw it.
    """

    t_start_s: float
    prompt_tokens: int
    emits: tuple[tuple[float, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"t_start_s": self.t_start_s, "prompt_tokens": self.prompt_tokens, "emits": [list(e) for e in self.emits]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EmitTrace:
        return cls(float(d["t_start_s"]), int(d["prompt_tokens"]), tuple((float(t), int(n)) for t, n in d["emits"]))


def trace_key(prompt: str) -> str:
    """Which request a trace belongs to: the first line of its prompt (the bench's random salt)."""
    return prompt.split("\n", 1)[0][:200] if "\n" in prompt else ""


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class RefServer:
    """The server, run in-process on the current event loop.

    ``srv = RefServer(RefConfig(...)); await srv.start(); srv.base_url; await srv.stop()``
    or ``async with RefServer(...) as srv:``. ``port=0`` picks a free port.
    """

    def __init__(self, config: RefConfig = RefConfig(), *, host: str = "127.0.0.1", port: int = 0,
                 model: str = "refserver") -> None:
        self.config = config
        self.host = host
        self.port = port
        self.model = model
        self._runner: web.AppRunner | None = None
        self._waker_: PreciseWaker | None = None
        self._seq = 0
        self._traces: dict[str, EmitTrace] = {}

    @property
    def _waker(self) -> PreciseWaker:
        if self._waker_ is None:
            raise RuntimeError("RefServer is not started")
        return self._waker_

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/ref/traces", self._take_traces)
        return app

    async def start(self) -> None:
        self._waker_ = PreciseWaker(asyncio.get_running_loop())
        # handler_cancellation: a client that hangs up ends its handler (a stalled
        # stream must not outlive it); shutdown_timeout bounds stop().
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = getattr(site._server, "sockets", None)  # aiohttp exposes the bound port only here (an asyncio.Server)
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._waker_ is not None:
            self._waker_.close()
            self._waker_ = None

    async def __aenter__(self) -> RefServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- handlers ------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _take_traces(self, request: web.Request) -> web.Response:
        """The traces kept since the last call, by :func:`trace_key`; they are then forgotten."""
        out, self._traces = self._traces, {}
        return web.json_response({k: t.to_dict() for k, t in out.items()})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            return await self._stream(request, chat=chat)
        except ConnectionError:  # the client hung up: nothing left to tell it
            return web.Response(status=499)

    async def _stream(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        raw = await request.read()
        # t0 = the whole request is in (the handler starts after the headers only);
        # every emission is scheduled on this clock
        t0 = loop.time()
        try:
            body = json.loads(raw)
            cfg = self.config.with_overrides(body.get("ref") or {})
            # chat clients may send the newer max_completion_tokens instead
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            if chat:
                prompt_tokens = count_prompt_tokens(messages=body["messages"])
            else:
                prompt_tokens = count_prompt_tokens(prompt=body["prompt"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        if cfg.fault == "http_error":
            return web.json_response({"error": {"message": "refserver: injected HTTP error", "type": "server_error"}},
                                     status=cfg.http_error_status)
        if not body.get("stream"):
            return web.json_response({"error": {"message": "refserver streams only", "type": "invalid_request_error"}},
                                     status=400)
        include_usage = cfg.usage and bool((body.get("stream_options") or {}).get("include_usage"))

        self._seq += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-ref{self._seq}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None = None, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return _sse({"id": rid, "object": obj, "created": created, "model": self.model, "choices": [choice]})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if cfg.role_chunk and chat:
            await resp.write(chunk(None, role=True))

        t_first = t0 + cfg.ttft_s(prompt_tokens)
        k = cfg.tokens_per_chunk
        emits: list[tuple[float, int]] = []
        emitted = 0
        fault_pending = cfg.fault is not None
        while emitted < max_tokens or fault_pending:
            if fault_pending and (emitted >= cfg.fault_after_tokens or emitted >= max_tokens):
                fault_pending = False
                if cfg.fault == "huge_frame":
                    # one token whose text is huge: the stream stays valid
                    await resp.write(chunk("x" * cfg.huge_frame_bytes))
                    emitted += 1
                    continue
                if await self._fault(cfg, request, resp):
                    return resp
                continue
            n = min(k, max_tokens - emitted)
            await self._waker.sleep_until(t_first + (emitted + n - 1) * cfg.gap_s)
            data = chunk("".join(f" w{emitted + j}" for j in range(n)))
            emits.append((loop.time(), n))
            await resp.write(data)
            emitted += n
        if cfg.trace:
            first = (body["messages"] or [{}])[0].get("content") if chat else body["prompt"]
            self._traces[trace_key(str(first or ""))] = EmitTrace(t0, prompt_tokens, tuple(emits))
            while len(self._traces) > TRACES_KEPT:
                self._traces.pop(next(iter(self._traces)))
        await resp.write(chunk("" if not chat else None, finish="length"))
        if include_usage:
            await resp.write(_sse({"id": rid, "object": obj, "created": created, "model": self.model, "choices": [],
                                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": emitted,
                                             "total_tokens": prompt_tokens + emitted}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _fault(self, cfg: RefConfig, request: web.Request, resp: web.StreamResponse) -> bool:
        """Inject ``cfg.fault`` (not ``huge_frame``). True: the stream is over, return now."""
        if cfg.fault == "malformed_sse":
            await resp.write(b'data: {"id": "broken", "choices": [\n\n')
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return True
        if cfg.fault == "no_data_prefix":
            await resp.write(b'{"id":"bare","object":"text_completion","choices":[{"index":0,"text":" w",'
                             b'"finish_reason":null}]}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return True
        if cfg.fault == "error_mid_stream":
            await resp.write(_sse({"error": {"message": "refserver: injected error", "type": "server_error",
                                             "code": 500}}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return True
        if cfg.fault == "disconnect":
            if request.transport is not None:
                request.transport.abort()
            return True
        if cfg.fault == "stall":
            await asyncio.sleep(cfg.stall_s)
        return False


class PreciseWaker:
    """Wakes coroutines at ``loop.time()`` targets to ~0.1 ms, without spinning.

    A plain ``asyncio.sleep`` wakes up to 1 ms late: the selector rounds its
    timeout up to whole milliseconds (epoll's unit). This helper keeps a heap
    of targets in one thread that waits on a condition variable (nanosecond
    timeouts on CLOCK_MONOTONIC, the clock ``loop.time()`` reads) and resolves
    the due futures through ``call_soon_threadsafe``, which wakes the loop at
    once. Lateness that does happen never accumulates: targets are absolute.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, coalesce_s: float = 0.0) -> None:
        self._loop = loop
        self.coalesce_s = coalesce_s
        """Targets this close after a due one are released with it (0: each at its own time). The lean
        server uses 0.2 ms: one loop wake-up per decode step of N streams instead of N, each write
        at most that much early (its trace records when it really went out)."""
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Any]] = []  # a future to resolve, or a callback
        self._seq = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="refserver-waker", daemon=True)
        self._thread.start()

    async def sleep_until(self, target: float) -> None:
        if target <= self._loop.time():
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (target, self._seq, fut))
            self._cv.notify()
        await fut

    def call_at(self, target: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the loop at ``target`` (a plain callback: no future, no task step)."""
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (target, self._seq, callback))
            if self._heap[0][2] is callback:
                self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=2.0)

    @staticmethod
    def _release(due: list[Any]) -> None:
        for f in due:
            if isinstance(f, asyncio.Future):
                if not f.done():
                    f.set_result(None)
            else:
                f()

    def _run(self) -> None:
        with self._cv:
            while not self._stopping:
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    # Long timed waits overshoot by milliseconds on a busy VM (0.7 s
                    # woke ~2.5 ms late here); waits of <= 10 ms land within ~0.1 ms.
                    self._cv.wait(min(delay, 0.01))
                    continue
                now = time.monotonic()
                due: list[Any] = []
                horizon = now + self.coalesce_s
                while self._heap and self._heap[0][0] <= horizon:
                    due.append(heapq.heappop(self._heap)[2])
                try:
                    self._loop.call_soon_threadsafe(self._release, due)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return


class RefServerProcess:
    """The server in a child process (``python -m sparkctl.bench.refserve``).

    Measurements should use this: the server then runs on its own interpreter
    and core instead of sharing the client's event loop and GIL.
    ``async with RefServerProcess(cfg) as srv: srv.base_url``.
    """

    def __init__(self, config: RefConfig = RefConfig(), *, host: str = "127.0.0.1", start_timeout_s: float = 20.0,
                 lean: bool = False) -> None:
        self.lean = lean
        """Serve with :mod:`sparkctl.bench.leanserver` (same timing and bytes, no fault modes, less CPU per event)."""
        self.config = config
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.base_url = ""
        self._proc: asyncio.subprocess.Process | None = None

    def argv(self) -> list[str]:
        c = self.config
        args = [sys.executable, "-m", "sparkctl.bench.refserve", "--host", self.host, "--port", "0",
                "--ttft-base-s", repr(c.ttft_base_s), "--ttft-per-token-s", repr(c.ttft_per_token_s),
                "--gap-s", repr(c.gap_s), "--tokens-per-chunk", str(c.tokens_per_chunk),
                "--fault-after-tokens", str(c.fault_after_tokens)]
        if c.role_chunk:
            args.append("--role-chunk")
        if not c.usage:
            args.append("--no-usage")
        if c.fault:
            args += ["--fault", c.fault]
        if self.lean:
            args.append("--lean")
        return args

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(*self.argv(), stdout=asyncio.subprocess.PIPE)
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), self.start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"refserver did not start within {self.start_timeout_s} s") from None
        text = line.decode().strip()
        if not text.startswith("refserver listening on "):
            await self.stop()
            raise RuntimeError(f"refserver failed to start: {text or 'no output'}")
        self.base_url = text.rsplit(" ", 1)[1]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 5.0)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        self._proc = None

    async def __aenter__(self) -> RefServerProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
