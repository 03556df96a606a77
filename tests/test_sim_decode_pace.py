"""The SIMULATED slow decoder: sparkctl_sim.llamacpp_routes paces the tiny engine's streams.

The wrapper stands in front of llama-cpp-python (a real engine); these tests drive it with an ASGI
app that answers at once, so what they see is the wrapper alone: the stream's bytes unchanged, the
first event at once and the next ones paced, the engine free before the stream ends, and the
request counted in flight (``/slots``) until its last event is sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from sparkctl_sim.llamacpp_routes.llama_cpp import server

EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]


def _app(done: list[float], content_type: bytes = b"text/event-stream") -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for ev in EVENTS:
            await send({"type": "http.response.body", "body": ev, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done.append(asyncio.get_running_loop().time())
    return app


async def _slots(asgi: Any) -> bool:
    out: list[Any] = []

    async def send(msg: Any) -> None:
        out.append(msg)
    await asgi({"type": "http", "method": "GET", "path": "/slots"}, None, send)
    return bool(json.loads(out[1]["body"])[0]["is_processing"])


def _run(monkeypatch: pytest.MonkeyPatch, ms: str | None, content_type: bytes = b"text/event-stream") -> Any:
    if ms is None:
        monkeypatch.delenv(server.DECODE_MS_ENV, raising=False)
    else:
        monkeypatch.setenv(server.DECODE_MS_ENV, ms)
    done: list[float] = []
    asgi = server._asgi(_app(done, content_type))

    async def go() -> tuple[list[tuple[float, Any]], list[float], list[bool], float]:
        loop = asyncio.get_running_loop()
        sent: list[tuple[float, Any]] = []
        busy: list[bool] = []

        async def send(msg: Any) -> None:
            sent.append((loop.time(), msg))
        t0 = loop.time()
        req = asyncio.ensure_future(asgi({"type": "http", "method": "POST", "path": "/v1/chat/completions"},
                                         None, send))
        await asyncio.sleep(0)  # the request starts
        while not req.done():
            busy.append(await _slots(asgi))
            await asyncio.sleep(0.01)
        busy.append(await _slots(asgi))
        return sent, done, busy, t0
    return asyncio.run(go())


def test_a_paced_stream_keeps_its_bytes_sends_the_first_event_at_once_and_the_rest_paced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent, done, busy, _t0 = _run(monkeypatch, "200")
    bodies = [m for _, m in sent if m["type"] == "http.response.body"]
    assert b"".join(m["body"] for m in bodies) == b"".join(EVENTS)
    times = [t for t, m in sent if m["type"] == "http.response.body"]
    # the engine wrote all of it at once and was done before its stream had begun: its slot is free
    # for the next request; the first event follows with no pace before it, each next one a pace later
    assert done[0] <= times[0] and times[0] - done[0] < 0.1
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) == len(EVENTS) and min(gaps) >= 0.195, gaps
    # in flight until the last event is sent, idle after
    assert busy[0] is True and busy[-2] is True and busy[-1] is False


@pytest.mark.parametrize(("ms", "content_type"), [(None, b"text/event-stream"), ("200", b"application/json")])
def test_no_pace_set_or_no_stream_passes_through_as_the_engine_sends(
        monkeypatch: pytest.MonkeyPatch, ms: str | None, content_type: bytes) -> None:
    sent, done, _busy, _t0 = _run(monkeypatch, ms, content_type)
    times = [t for t, m in sent if m["type"] == "http.response.body"]
    # sent before the engine's last line ran (unpaced), or right after it with no pace between
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[-1] <= done[0] or max(gaps) < 0.1, (times, done)
