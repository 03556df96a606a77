"""The bench client at scale (issue 23), correctness only: bodies built without growing copies,
the wire engine's un-chunking, streams spread over worker processes and merged exactly, the lean
reference server's bytes, the floor client, and the CPU-starvation rule. Speed is measured by
tools/client_capacity.py, never asserted here."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import tracemalloc
from typing import Any

import pytest

from sparkctl.bench.client import BenchClient, ClientTimeouts, RequestSpec
from sparkctl.bench.events import Event, RequestResult
from sparkctl.bench.leanserver import LeanRefServer
from sparkctl.bench.metrics import aggregate_throughput, request_metrics
from sparkctl.bench.pool import WorkerPool, merge_lag, merge_results, spread
from sparkctl.bench.pressure import Pressure, PressureMeter
from sparkctl.bench.refserver import RefConfig, RefServer
from sparkctl.bench.selftest import fetch_traces
from sparkctl.bench.wire import WireConnection, WireError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

FAST = {"ref": {"ttft_base_s": 0.005, "gap_s": 0.001}}


# -- request bodies ------------------------------------------------------------------

SPECS = [
    RequestSpec("completions", "m", 8, prompt='a "quoted" \\ back\nslash \u00e9 \U0001f600 end'),
    RequestSpec("chat", "m", 4, messages=({"role": "user", "content": "hi \u2028 there"},
                                          {"role": "assistant", "content": "ok"}),
                extra_body={"ignore_eos": True, "ref": {"gap_s": 0.0}}),
    RequestSpec("completions", "m", 8, prompt="", seed=None),
]


@pytest.mark.parametrize("spec", SPECS, ids=["completions-escapes", "chat-two-messages", "empty-prompt"])
def test_body_parts_are_exactly_the_json_body(spec: RequestSpec) -> None:
    for salt in ("", "0123456789abcdef\n"):
        assert b"".join(spec.body_parts(salt)) == json.dumps(spec.body(salt)).encode()


def test_a_long_prompt_is_escaped_once_per_spec_and_shared_by_every_request() -> None:
    spec = RequestSpec("completions", "m", 16, prompt=" ".join(["lorem"] * 131072))
    first = spec.body_parts("aaaaaaaaaaaaaaaa\n")
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        parts = [spec.body_parts(f"{i:016x}\n") for i in range(20)]
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert all(p[2] is first[2] for p in parts)  # the very same prompt buffer, not a copy
    assert len(first[2]) > 700_000
    assert grown < 50_000  # 20 requests of a 0.79 MB prompt: a few small pieces each, no prompt copy


def test_wire_send_hands_the_prompt_buffer_itself_to_sendmsg() -> None:
    big = b"x" * 3_000_000  # more than a loopback socket takes at once: partial sends advance views
    seen: list[Any] = []

    class Recording(socket.socket):
        def sendmsg(self, buffers: Any, *args: Any) -> int:  # type: ignore[override]
            buffers = list(buffers)
            seen.extend(b.obj for b in buffers)
            return super().sendmsg(buffers, *args)

    async def go() -> bytes:
        a, b = socket.socketpair()
        rec = Recording(a.family, a.type, fileno=a.detach())
        rec.setblocking(False)
        loop = asyncio.get_running_loop()
        conn = WireConnection(loop, rec, stamps=False)
        got = bytearray()

        async def drain() -> None:
            b.setblocking(False)
            while len(got) < 3 + len(big):
                got.extend(await loop.sock_recv(b, 1 << 20))

        class Sink:
            def on_head(self, *a: Any) -> None: ...
            def on_body(self, *a: Any) -> bool: return True
            def on_end(self, *a: Any) -> None: ...

        reader = asyncio.create_task(drain())
        await conn.send([b"abc", big], Sink(), timeout_s=10.0)
        await reader
        conn.close()
        b.close()
        return bytes(got)

    assert asyncio.run(go()) == b"abc" + big
    assert any(o is big for o in seen) and all(o is big or len(o) < 10 for o in seen)


# -- the wire engine's response parsing ---------------------------------------------------

def _chunk(data: bytes, ext: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), ext, data)


RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(b'data: {"a":1}\n\ndata: ') + _chunk(b"[DONE]\n", b";ext=1") + _chunk(b"\n") + b"0\r\n\r\n")
BODY = b'data: {"a":1}\n\ndata: [DONE]\n\n'


class RecordingSink:
    def __init__(self) -> None:
        self.head: tuple[int, dict[str, str]] | None = None
        self.body = bytearray()
        self.ends: list[WireError | None] = []

    def on_head(self, t: float, status: int, headers: dict[str, str]) -> None:
        self.head = (status, headers)

    def on_body(self, t: float, data: bytes, source: str) -> bool:
        self.body += data
        return True

    def on_end(self, t: float, error: WireError | None) -> None:
        self.ends.append(error)


def _feed_in_pieces(pieces: list[bytes]) -> tuple[RecordingSink, WireConnection]:
    async def go() -> tuple[RecordingSink, WireConnection]:
        a, b = socket.socketpair()
        a.setblocking(False)
        conn = WireConnection(asyncio.get_running_loop(), a, stamps=False)
        sink = RecordingSink()
        conn._sink, conn._state = sink, "head"
        for p in pieces:
            conn._feed(1.0, p)
        conn.close()
        b.close()
        return sink, conn

    return asyncio.run(go())


def test_wire_unchunks_a_response_split_at_every_byte() -> None:
    for cut in range(1, len(RESPONSE)):
        sink, conn = _feed_in_pieces([RESPONSE[:cut], RESPONSE[cut:]])
        assert sink.head is not None and sink.head[0] == 200, cut
        assert bytes(sink.body) == BODY, cut
        assert sink.ends == [None], cut
    sink, _ = _feed_in_pieces([bytes([c]) for c in RESPONSE])  # one byte per read
    assert bytes(sink.body) == BODY and sink.ends == [None]


def test_wire_reads_content_length_bodies_and_rejects_garbage() -> None:
    sink, _ = _feed_in_pieces([b"HTTP/1.1 503 Busy\r\nContent-Length: 5\r\n\r\nab", b"cde"])
    assert sink.head is not None and sink.head[0] == 503 and bytes(sink.body) == b"abcde" and sink.ends == [None]
    with pytest.raises(WireError):
        _feed_in_pieces([b"SSH-2.0-OpenSSH\r\n\r\n"])
    with pytest.raises(WireError):
        _feed_in_pieces([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])


# -- spreading and merging ----------------------------------------------------------------


def test_spread_gives_every_stream_to_exactly_one_worker() -> None:
    for n, w in [(256, 2), (7, 3), (1, 4), (0, 2)]:
        shares = spread(n, w)
        assert len(shares) == w
        assert sorted(i for s in shares for i in s) == list(range(n))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def _result(i: int) -> RequestResult:
    return RequestResult(f"r{i:06d}", "ok", (Event(float(i), "sent"),))


def test_merge_results_is_exact_in_spec_order_and_refuses_gaps_and_doubles() -> None:
    parts = [[(i, _result(i)) for i in share] for share in spread(9, 2)]
    merged = merge_results(9, parts)
    assert [r.request_id for r in merged] == [f"r{i:06d}" for i in range(9)]
    with pytest.raises(ValueError):
        merge_results(9, parts[:1])
    with pytest.raises(ValueError):
        merge_results(9, parts + [[(3, _result(3))]])
    samples, times = merge_lag([([0.1, 0.3], [1.0, 3.0]), ([0.2], [2.0])])
    assert samples == [0.1, 0.2, 0.3] and times == [1.0, 2.0, 3.0]


def test_worker_pool_returns_every_event_of_every_stream_and_the_same_metrics() -> None:
    """Two worker processes against one server: every request's full log, ids in spec order, metrics
    by the same code; the in-process client's results for the same batch have the same shape."""
    n_tokens = 12
    specs = [RequestSpec("completions", "refserver", n_tokens, prompt=" ".join(["w"] * (3 + i)),
                         extra_body={"ref": {"ttft_base_s": 0.02, "gap_s": 0.002, "trace": True}})
             for i in range(6)]

    async def go() -> tuple[list[RequestResult], list[RequestResult], dict[str, Any], Any]:
        async with RefServer(RefConfig()) as srv:
            async with WorkerPool(srv.base_url, concurrency=6, workers=2,
                                  timeouts=ClientTimeouts(read_s=10, request_s=30)) as pool:
                assert len(pool.pids) == 2
                await pool.warm_up(RequestSpec("completions", "refserver", 1, prompt="w", extra_body=FAST))
                batch = await pool.run_batch(specs)
            traces = await fetch_traces(srv.base_url)
            async with BenchClient(srv.base_url, concurrency=6) as client:
                local = await client.run_batch(specs)
            return batch.results, local, traces, batch

    pooled, local, traces, batch = asyncio.run(go())
    assert [r.request_id for r in pooled] == [f"r{i:06d}" for i in range(7, 13)]  # after the 6 warm-ups
    assert len({r.salt for r in pooled}) == 6
    assert batch.lag_samples_s and batch.lag_times_s == sorted(batch.lag_times_s)
    assert len(batch.lag_p99_ms_by_worker) == 2
    for i, (p, q) in enumerate(zip(pooled, local)):
        assert p.status == q.status == "ok"
        assert [e.kind for e in p.events] == [e.kind for e in q.events]
        mp = request_metrics(p.events)
        assert mp.completion_tokens == n_tokens and mp.prompt_tokens == 3 + i + 1  # + the salt word
        assert sum(1 for e in p.events if e.kind == "chunk" and e.n_text_chars) == n_tokens
        tr = traces[p.salt.rstrip("\n")]
        assert mp.ttft_s is not None and p.t_sent_s is not None
        assert mp.ttft_s >= tr.emits[0][0] - p.t_sent_s - 5e-5  # causal: not before the server wrote it
    agg = aggregate_throughput([r.events for r in pooled])
    assert agg.tok_s > 0 and agg.n_requests == 6


# -- the lean server and the floor ----------------------------------------------------------


def _events_shape(results: list[RequestResult]) -> list[Any]:
    return [(r.status, r.text, [(e.kind, e.n_text_chars, e.raw_len, e.prompt_tokens, e.completion_tokens)
                                for e in r.events if e.kind != "sent"]) for r in results]


def test_lean_server_streams_the_same_frames_as_the_full_server() -> None:
    specs = [RequestSpec("completions", "refserver", 5, prompt="a b c", salt=False, keep_text=True, extra_body=FAST),
             RequestSpec("chat", "refserver", 7, messages=({"role": "user", "content": "x y"},), salt=False,
                         keep_text=True, extra_body={"ref": {"role_chunk": True, "tokens_per_chunk": 3,
                                                             "ttft_base_s": 0.005, "gap_s": 0.001}}),
             RequestSpec("completions", "refserver", 3, prompt="q", salt=False, extra_body={
                 "ref": {"usage": False, "ttft_base_s": 0.0, "gap_s": 0.0}})]

    async def go(cls: Any) -> list[Any]:
        async with cls(RefConfig()) as srv:
            async with BenchClient(srv.base_url, concurrency=3) as c:
                return _events_shape(await c.run_batch(specs) + await c.run_batch(specs))  # keep-alive reuse

    full, lean = asyncio.run(go(RefServer)), asyncio.run(go(LeanRefServer))
    assert all(s == "ok" for s, _, _ in lean)
    assert lean == full


def test_lean_server_refuses_fault_modes_with_a_400() -> None:
    async def go() -> RequestResult:
        async with LeanRefServer() as srv, BenchClient(srv.base_url, concurrency=1) as c:
            return await c.request(RequestSpec("completions", "m", 3, prompt="p",
                                               extra_body={"ref": {"fault": "disconnect"}}))

    r = asyncio.run(go())
    assert r.status == "http_error" and r.http_status == 400 and "fault" in r.detail


def test_floor_client_counts_every_token_with_the_benchs_definitions() -> None:
    from floor_client import run_floor_batch

    spec = RequestSpec("completions", "refserver", 20, prompt="floor", extra_body=FAST)

    async def go() -> list[RequestResult]:
        async with LeanRefServer() as srv:
            return await asyncio.get_running_loop().run_in_executor(None, run_floor_batch, srv.base_url, [spec] * 4)

    rs = asyncio.run(go())
    assert [r.status for r in rs] == ["ok"] * 4
    for r in rs:
        m = request_metrics(r.events, prompt_tokens_fallback=2)
        assert m.completion_tokens == 20 and m.ttft_s is not None and m.ttft_s > 0.004


# -- CPU starvation -------------------------------------------------------------------------


def test_starved_means_pressure_while_others_used_the_cpu() -> None:
    assert not Pressure(10.0, 0.0, 1.0, 1.5).starved(25.0)  # little pressure
    assert not Pressure(60.0, 40.0, 1.0, 0.05).starved(25.0)  # pressure of our own making: a capacity limit
    assert Pressure(60.0, 40.0, 1.0, 0.9).starved(25.0)
    assert Pressure(60.0, 40.0, 1.0, None).starved(25.0)  # no /proc/stat: PSI alone decides
    assert not Pressure(None, 0.0, 1.0, 2.0).starved(25.0)  # no PSI: nothing to say
    with PressureMeter() as m:
        t = time.process_time() + 0.05
        while time.process_time() < t:
            pass
    assert m.result.wall_s >= 0.05 and m.result.own_wait_pct >= 0.0


def test_a_server_that_refuses_a_long_body_early_ends_the_request_as_a_value() -> None:
    """The server answers 413 and closes after the head, while the client is still sending 8 MB."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntoo large")
        conn.close()

    import threading

    th = threading.Thread(target=serve, daemon=True)
    th.start()

    async def go() -> RequestResult:
        async with BenchClient(f"http://127.0.0.1:{port}", concurrency=1,
                               timeouts=ClientTimeouts(connect_s=5, write_s=20, request_s=60)) as c:
            return await c.request(RequestSpec("completions", "m", 1, prompt="x " * 4_000_000))

    r = asyncio.run(go())
    th.join(5)
    srv.close()
    assert (r.status, r.http_status) == ("http_error", 413) or r.status == "disconnected", r


def test_splitter_gives_the_same_frames_however_the_stream_is_cut() -> None:
    import random

    from sparkctl.bench.sse import SSESplitter

    stream = b"".join(b'data: {"i":%d}\n\n' % i + (b": keep-alive\n\n" if i % 7 == 0 else b"") for i in range(200))
    stream += b"data: a\n\n\ndata: b\n\n"  # three LFs: the third opens the next frame
    want = stream.split(b"\n\n")[:-1]
    rnd = random.Random(23)
    for _ in range(50):
        sp, got, pos = SSESplitter(), [], 0
        while pos < len(stream):
            step = rnd.choice([1, 2, 3, 17, 64, 500])
            got += sp.feed(stream[pos:pos + step])
            pos += step
        assert got == want and sp.flush() == b""


def test_capacity_counts_no_starved_step_and_names_it() -> None:
    import client_capacity as cc

    quiet, busy = Pressure(5.0, 1.0, 1.0, 0.0), Pressure(60.0, 30.0, 1.0, 1.2)

    def step(offered: float, lag_p99: float, p: Pressure) -> Any:
        return cc.Step(2, offered, offered * 0.99, 2.0, 0.1, lag_p99, 3.0, None, p, {"ok": 1}, p.starved(25.0))

    steps = [step(5000, 1.0, quiet), step(10000, 2.0, quiet), step(20000, 3.0, busy), step(30000, 9.0, quiet)]
    best, starved = cc.capacity(steps, 5.0)
    assert best is not None and best.offered_events_per_s == 10000  # 20,000 kept up, but on a starved machine
    assert starved is not None and starved.offered_events_per_s == 20000
