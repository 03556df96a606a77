"""llama-cpp-python's server with two routes llama-server has and it lacks: ``/health``, ``/slots``.

SIMULATION ONLY, and only a route: inference stays the real llama-cpp-python
(``python3 -m sparkctl_sim.llamacpp_routes.llama_cpp.server ARGS`` takes exactly the arguments
of ``python3 -m llama_cpp.server``). Why: the tiny real engine stands in for
llama-server, and llama-server answers ``GET /health`` without a key
(llama.cpp ``tools/server/server.cpp``: ``ctx_http.get("/health", ...) //
public endpoint (no API key check)``; ``server-context.cpp`` ``get_health``
answers 200 ``{"status": "ok"}``, and 503 while the model loads, from its
middleware), as vLLM and SGLang do. llama-cpp-python 0.3.36's FastAPI app has
no such route (``llama_cpp/server/app.py``), and the gateway sparkctl runs
(smg) registers a local backend only once its ``/health`` answers 2xx (smg
``model_gateway/src/workflow/steps/util.rs``, ``try_http_reachable``). The
app loads its model before uvicorn serves, so any answer here is the "loaded"
state: 200, as llama-server's.

``GET /slots``: llama-server lists its slots, each with ``is_processing``
(``server.cpp``: ``ctx_http.get("/slots", ...)``, on by default,
``common.h`` ``endpoint_slots = true``; ``server-context.cpp`` slot
``to_json``); sparkctl's drain reads it as the engine's in-flight gauge.
llama-cpp-python has one slot: it is reported processing while any
generation request is in flight, queued ones included (stricter than
llama-server, whose queued requests are in no slot). Both llama.cpp files
are the copies llama-cpp-python 0.3.36 vendors (its sdist, ``vendor/llama.cpp``).

``SPARKCTL_SIM_DECODE_MS`` (the profile's ``engine.env``), when set, paces a streamed answer at one
event every that many milliseconds, as a big model decodes on GB10 (sparkctl/bench/published-numbers.yaml:
33 to 92 tokens a second for one stream, fewer per stream under load), where the tiny model writes
hundreds of tokens in milliseconds.
The engine generates at its own speed into a queue (so its one slot is free for the next request,
as a batching engine's would be) and the client gets the events paced: the first at once, so time
to first token is the engine's. The request counts in flight, for ``/slots``, until its last event
is sent: a drain that waits on it waits for the whole stream, as on a real engine. Unset, nothing
is paced. It is time only: the bytes are llama-cpp-python's, in its order. Its streaming costs more
per token the longer the answer (24 tokens in 0.01 s, 470 in 16 s with 16 paced streams in flight):
a long stream wants a slow pace and few tokens, not many.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

_IDLE_PATHS = ("/v1/models",)
DECODE_MS_ENV = "SPARKCTL_SIM_DECODE_MS"


def _paced(send: Any, interval_s: float) -> tuple[Any, Any]:
    """A ``send`` that never waits (the app runs at its speed) and the task that replays it paced."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def replay() -> None:
        streaming, last = False, None
        while (msg := await queue.get()) is not None:
            if msg["type"] == "http.response.start":
                streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                for k, v in msg.get("headers", []))
            elif msg["type"] == "http.response.body" and streaming and last is not None:
                await asyncio.sleep(max(0.0, last + interval_s - asyncio.get_running_loop().time()))
            if msg["type"] == "http.response.body":
                last = asyncio.get_running_loop().time()
            await send(msg)

    async def enqueue(msg: Any) -> None:
        queue.put_nowait(msg)

    task = asyncio.ensure_future(replay())

    async def close() -> None:
        queue.put_nowait(None)
        await task
    return enqueue, close


def _asgi(app: Any) -> Any:
    in_flight = 0
    pace_s = float(os.environ.get(DECODE_MS_ENV) or 0) / 1000.0

    async def reply(send: Any, body: Any) -> None:
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await send({"type": "http.response.body", "body": raw})

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        nonlocal in_flight
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/health":
            await reply(send, {"status": "ok"})
            return
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/slots":
            await reply(send, [{"id": 0, "is_processing": in_flight > 0}])
            return
        counted = scope["type"] == "http" and scope["path"].startswith("/v1/") and scope["path"] not in _IDLE_PATHS
        if counted:
            in_flight += 1
        try:
            if counted and pace_s > 0:
                paced_send, close = _paced(send, pace_s)
                try:
                    await app(scope, receive, paced_send)
                finally:
                    await close()  # the last event sent: only now is the stream over
            else:
                await app(scope, receive, send)  # returns once a streamed response has ended
        finally:
            if counted:
                in_flight -= 1
    return wrapped


def _wrap(create_app: Any) -> Any:
    def create(*args: Any, **kwargs: Any) -> Any:
        return _asgi(create_app(*args, **kwargs))
    return create


def main() -> None:
    import llama_cpp.server.__main__ as server_main

    server_main.create_app = _wrap(server_main.create_app)  # type: ignore[attr-defined]
    server_main.main()


if __name__ == "__main__":
    main()
