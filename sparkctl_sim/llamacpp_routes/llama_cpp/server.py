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
"""

from __future__ import annotations

import json
from typing import Any

_IDLE_PATHS = ("/v1/models",)


def _asgi(app: Any) -> Any:
    in_flight = 0

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
