"""Bench measurement core: metrics on synthetic event logs (pure, exact), the
self-test against the reference server, and the client's fault classification."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sparkctl.bench.client import (
    BenchClient,
    ClientTimeouts,
    RequestSpec,
)
from sparkctl.bench.events import (
    Event,
    RequestResult,
    events_from_jsonl,
    result_to_jsonl,
)
from sparkctl.bench.metrics import (
    aggregate_throughput,
    percentile,
    request_metrics,
    summarize,
)
from sparkctl.bench.refserver import RefConfig, RefServer, count_prompt_tokens
from sparkctl.bench.sse import SSESplitter, parse_frame

# -- synthetic logs ----------------------------------------------------------------
# Times are multiples of 1/8 s (exact in binary), so every expected value is exact.


def log(t_sent: float, chunk_times: list[float], *, usage: tuple[int, int] | None, role_at: float | None = None,
        hints: list[int] | None = None) -> list[Event]:
    ev = [Event(t_sent, "sent", raw_len=100), Event(t_sent + 0.125, "headers")]
    first = role_at if role_at is not None else chunk_times[0]
    ev.append(Event(first, "first_byte", raw_len=50))
    if role_at is not None:
        ev.append(Event(role_at, "chunk", n_text_chars=0))
    for i, t in enumerate(chunk_times):
        ev.append(Event(t, "chunk", n_text_chars=3, n_content_tokens_hint=hints[i] if hints else 0))
    end = chunk_times[-1]
    if usage is not None:
        ev.append(Event(end, "usage", prompt_tokens=usage[0], completion_tokens=usage[1]))
    ev.append(Event(end, "done"))
    return ev


def test_one_token_per_chunk_matches_the_brief_formulas() -> None:
    # sent at 10, first token at 10.5, then 4 more every 0.25 s
    ev = log(10.0, [10.5, 10.75, 11.0, 11.25, 11.5], usage=(1000, 5))
    m = request_metrics(ev)
    assert m.ttft_s == 0.5
    assert m.time_to_headers_s == 0.125
    assert m.time_to_first_byte_s == 0.5
    assert m.prefill_tok_s == 2000.0                      # 1000 / 0.5
    assert m.decode_tok_s == 4.0                          # (5 - 1) / (11.5 - 10.5)
    assert m.tpot_s == 0.25                               # (11.5 - 10.5) / (5 - 1)
    assert m.itl_s == (0.25, 0.25, 0.25, 0.25)
    assert m.e2e_s == 1.5
    assert (m.token_source, m.prompt_token_source, m.chunk_token_source) == ("usage", "usage", "usage_estimate")
    assert m.complete


def test_role_only_first_chunk_is_not_the_first_token() -> None:
    ev = log(0.0, [1.0, 1.5], usage=(10, 2), role_at=0.125)
    m = request_metrics(ev)
    assert m.ttft_s == 1.0
    assert m.time_to_first_byte_s == 0.125
    assert m.n_content_chunks == 2


def test_k_tokens_per_chunk_from_usage() -> None:
    # 3 chunks of 3 tokens, chunk gap 0.75 s -> 0.25 s per token
    ev = log(0.0, [1.0, 1.75, 2.5], usage=(100, 9))
    m = request_metrics(ev)
    assert m.tokens_per_chunk == 3.0
    assert m.itl_s == (0.25, 0.25)
    assert m.decode_tok_s == 4.0                          # (9 - 3) / (2.5 - 1.0)
    assert m.tpot_s == 0.25


def test_hints_give_per_chunk_tokens() -> None:
    ev = log(0.0, [1.0, 1.5, 2.5], usage=(100, 7), hints=[1, 2, 4])
    m = request_metrics(ev)
    assert m.chunk_token_source == "hints"
    assert m.itl_s == (0.25, 0.25)                        # 0.5/2, 1.0/4
    assert m.decode_tok_s == 4.0                          # (7 - 1) / 1.5


def test_missing_usage_falls_back_and_says_so() -> None:
    ev = log(0.0, [1.0, 1.25, 1.5], usage=None)
    m = request_metrics(ev)
    assert (m.completion_tokens, m.token_source) == (3, "chunk_count")
    assert m.prompt_tokens is None and m.prefill_tok_s is None
    m2 = request_metrics(ev, prompt_tokens_fallback=50)
    assert (m2.prompt_tokens, m2.prompt_token_source, m2.prefill_tok_s) == (50, "caller", 50.0)
    hinted = log(0.0, [1.0, 1.5], usage=None, hints=[2, 2])
    assert request_metrics(hinted).token_source == "chunk_hints"
    assert request_metrics(hinted).completion_tokens == 4


def test_single_token_has_no_decode_rate() -> None:
    m = request_metrics(log(0.0, [0.5], usage=(64, 1)))
    assert m.ttft_s == 0.5 and m.prefill_tok_s == 128.0
    assert m.decode_tok_s is None and m.tpot_s is None and m.itl_p50_s is None


def test_error_log_is_incomplete() -> None:
    ev = [Event(0.0, "sent"), Event(0.25, "headers"), Event(0.5, "error", detail="disconnected: x")]
    m = request_metrics(ev)
    assert not m.complete and m.ttft_s is None and m.completion_tokens is None and m.e2e_s == 0.5


def test_aggregate_throughput_window_is_first_send_to_last_token() -> None:
    a = log(0.0, [1.0, 2.0], usage=(10, 6))
    b = log(0.5, [1.5, 4.0], usage=(10, 10))
    t = aggregate_throughput([a, b])
    assert (t.completion_tokens, t.window_s, t.tok_s, t.token_source) == (16, 4.0, 4.0, "usage")
    c = log(0.25, [1.0], usage=None)
    assert aggregate_throughput([a, c]).token_source == "chunk_count"


def test_percentile_and_summary() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50.0) == 2.5
    assert percentile([5.0], 99.0) == 5.0
    assert percentile([], 50.0) is None
    s = summarize([3.0, None, 1.0, 2.0])
    assert (s.n, s.median, s.min, s.max) == (3, 2.0, 1.0, 3.0)


def test_event_log_jsonl_round_trip() -> None:
    ev = log(100.0, [100.5, 101.0], usage=(7, 2))
    r = RequestResult("r1", "ok", tuple(ev), http_status=200, salt="ab\n")
    text = result_to_jsonl(r, t_origin_s=100.0)
    back = events_from_jsonl(text)
    assert [e.kind for e in back] == [e.kind for e in ev]
    assert request_metrics(back).ttft_s == request_metrics(ev).ttft_s


# -- SSE framing ---------------------------------------------------------------------


def test_splitter_handles_crlf_split_reads_and_long_frames() -> None:
    sp = SSESplitter()
    assert sp.feed(b"data: {\"a\"") == []
    assert sp.feed(b": 1}\r") == []
    assert sp.feed(b"\n\r\n: comment\n\ndata: x\n") == [b'data: {"a": 1}', b": comment"]
    big = b"data: " + b"y" * 2_000_000
    assert sp.feed(big[:1000]) == []
    assert sp.feed(big[1000:] + b"\n\n") == [b"data: x\n" + big]
    f = parse_frame(b"event: error\ndata: line1\ndata: line2")
    assert (f.event, f.data) == ("error", "line1\nline2")
    assert parse_frame(b": keep-alive").data is None


def test_prompt_token_rule() -> None:
    assert count_prompt_tokens(prompt=" a  b\nc ") == 3
    assert count_prompt_tokens(messages=[{"role": "system", "content": "x y"}, {"role": "user", "content": "z"}]) == 11


# -- client against the reference server ---------------------------------------------


def test_fault_modes_are_classified_and_the_run_goes_on() -> None:
    faults = ["malformed_sse", "error_mid_stream", "huge_frame", "disconnect", "stall", "http_error"]
    expected = ["ok", "malformed_sse", "error_mid_stream", "ok", "disconnected", "timeout", "http_error", "ok"]

    async def go() -> list[RequestResult]:
        quick = {"ttft_base_s": 0.01, "gap_s": 0.002}
        specs = [RequestSpec("chat", "m", 8, messages=({"role": "user", "content": "hi"},),
                             extra_body={"ref": {**quick, "role_chunk": True}})]
        specs += [RequestSpec("completions", "m", 8, prompt="hello", extra_body={"ref": {**quick, "fault": f}})
                  for f in faults]
        specs += [RequestSpec("completions", "m", 8, prompt="after", extra_body={"ref": quick})]
        async with RefServer(RefConfig(stall_s=5.0)) as srv:
            async with BenchClient(srv.base_url, concurrency=len(specs),
                                   timeouts=ClientTimeouts(read_s=5.0, request_s=1.0)) as client:
                return await client.run_batch(specs)

    results = asyncio.run(go())
    assert [r.status for r in results] == expected
    by = dict(zip(["ok0", *faults, "ok1"], results, strict=True))
    assert by["http_error"].http_status == 503
    huge = request_metrics(by["huge_frame"].events)
    assert max(e.n_text_chars for e in by["huge_frame"].events) >= 1 << 20
    assert huge.completion_tokens == 8 and huge.token_source == "usage"
    for r in results:
        assert r.events[0].kind == "sent"
        assert (r.events[-1].kind == "error") == (r.status != "ok")
    assert request_metrics(by["ok0"].events).completion_tokens == 8


def test_hostile_servers_each_request_gets_an_outcome_and_the_run_goes_on() -> None:
    """Issue 7: a frame without "data:", an 8 MiB single line, HTTP 500, a disconnect
    and a stall past the read timeout, released together with healthy requests."""
    quick = {"ttft_base_s": 0.01, "gap_s": 0.002}
    cases = [
        ("ok", {}),
        ("malformed_sse", {"fault": "no_data_prefix", "fault_after_tokens": 0}),
        ("malformed_sse", {"fault": "malformed_sse", "fault_after_tokens": 2}),
        ("error_mid_stream", {"fault": "error_mid_stream", "fault_after_tokens": 3}),
        ("ok", {"fault": "huge_frame", "huge_frame_bytes": 8 << 20}),
        ("http_error", {"fault": "http_error", "http_error_status": 500}),
        ("disconnected", {"fault": "disconnect", "fault_after_tokens": 2}),
        ("timeout", {"fault": "stall", "fault_after_tokens": 2, "stall_s": 5.0}),
        ("ok", {}),
    ]

    async def go() -> list[RequestResult]:
        specs = [RequestSpec("completions", "m", 8, prompt="hi", extra_body={"ref": {**quick, **ref}})
                 for _, ref in cases]
        async with RefServer() as srv:
            # read_s (0.5 s) is the stall limit; request_s leaves room for the 8 MiB frame
            async with BenchClient(srv.base_url, concurrency=len(specs),
                                   timeouts=ClientTimeouts(read_s=0.5, request_s=20.0)) as client:
                return await client.run_batch(specs)

    results = asyncio.run(go())
    assert [r.status for r in results] == [want for want, _ in cases], [(r.status, r.detail) for r in results]
    by = dict(zip(range(len(cases)), results))
    assert "without a data field" in by[1].detail and "not JSON" in by[2].detail
    assert by[5].http_status == 500 and "HTTP 500" in by[5].detail
    assert "ReadTimeout" in by[7].detail
    huge = request_metrics(by[4].events)
    assert max(e.n_text_chars for e in by[4].events) == 8 << 20 and huge.completion_tokens == 8
    for r in results:  # every request: a sent event first; an error event last exactly when not ok
        assert r.events[0].kind == "sent" and (r.events[-1].kind == "error") == (r.status != "ok")


def test_connection_refused_is_a_value_not_an_exception() -> None:
    async def go() -> RequestResult:
        async with RefServer() as srv:
            url = srv.base_url
        async with BenchClient(url, concurrency=1, timeouts=ClientTimeouts(connect_s=1.0, request_s=2.0)) as c:
            return await c.request(RequestSpec("completions", "m", 4, prompt="x"))

    r = asyncio.run(go())
    assert r.status == "disconnected" and "connect" in r.detail


def test_salt_is_fresh_per_request_and_can_be_turned_off() -> None:
    spec = RequestSpec("chat", "m", 4, messages=({"role": "system", "content": "sys"}, {"role": "user", "content": "u"}))
    body = spec.body("abc\n")
    assert body["messages"][0]["content"] == "abc\nsys" and body["stream_options"] == {"include_usage": True}

    async def go() -> list[RequestResult]:
        async with RefServer(RefConfig(ttft_base_s=0.0, gap_s=0.0)) as srv:
            async with BenchClient(srv.base_url, concurrency=3) as c:
                plain = RequestSpec("completions", "m", 2, prompt="p q", salt=False)
                return await c.run_batch([RequestSpec("completions", "m", 2, prompt="p q")] * 2 + [plain])

    a, b, plain = asyncio.run(go())
    assert a.salt and b.salt and a.salt != b.salt and plain.salt == ""
    assert request_metrics(a.events).prompt_tokens == 3 and request_metrics(plain.events).prompt_tokens == 2


# -- the self-test -------------------------------------------------------------------


def _served(sc_words: int, max_tokens: int, cfg: RefConfig, t_sent: float, *, late_first_s: float = 0.0,
            extra_s: float = 0.0004, scale: float = 1.0) -> RequestResult:
    """A request as the reference server schedules it, seen ``extra_s`` later; the first
    content chunk ``late_first_s`` later still (a scheduler stall); ``scale`` stretches
    every interval (a wrong formula)."""
    p = sc_words + 1  # the salt is one more word
    first = t_sent + extra_s + cfg.first_visible_s(p, max_tokens) * scale
    times = [first + late_first_s] + [first + i * cfg.gap_s * scale for i in range(1, max_tokens)]
    ev = log(t_sent, times, usage=(p, max_tokens))
    return RequestResult("r", "ok", tuple(ev), salt="s\n", labels={"prompt_words": str(sc_words)})


def test_selftest_cell_judges_the_median_request_and_reports_the_worst() -> None:
    from sparkctl.bench.selftest import BASE_TIMING, Scenario, check_cell

    sc = Scenario("completions", "completions", 300, 64)
    cfg = BASE_TIMING
    # one of three requests has its first chunk 5 ms late (what a shared core did):
    # that request is 1.2 % off in prefill and +1.6 % in decode, the cell is not
    stalled = [[_served(300, 64, cfg, 10.0)], [_served(300, 64, cfg, 20.0, late_first_s=0.005)],
               [_served(300, 64, cfg, 30.0)]]
    rows = {c.metric: c for c in check_cell(sc, cfg, 1, stalled)}
    assert all(c.passed for c in rows.values()), rows
    assert rows["decode_tok_s"].worst_error_pct > 1.5 and abs(rows["decode_tok_s"].error_pct) < 0.01
    assert rows["prefill_tok_s"].worst_error_pct < -1.0
    assert rows["ttft_excess_ms"].measured == pytest.approx(0.4)
    # a wrong formula (every interval 1.5 % long) fails every request, so the median too
    wrong = [[_served(300, 64, cfg, t, scale=1.015)] for t in (10.0, 20.0, 30.0)]
    failed = {c.metric for c in check_cell(sc, cfg, 1, wrong) if not c.passed}
    assert {"decode_tok_s", "tpot_s", "itl_p50_s", "ttft_s", "prefill_tok_s", "aggregate_tok_s"} <= failed
    # TTFT: one request earlier than the closed form breaks causality, whatever the median
    early = [[_served(300, 64, cfg, 10.0)], [_served(300, 64, cfg, 20.0, extra_s=-0.0001)],
             [_served(300, 64, cfg, 30.0)]]
    assert not {c.metric: c for c in check_cell(sc, cfg, 1, early)}["ttft_s"].passed
    # median TTFT more than 2 ms late fails; 1 ms passes
    assert not {c.metric: c for c in check_cell(sc, cfg, 1, [[_served(300, 64, cfg, t, extra_s=0.0025)]
                                                              for t in (1.0, 2.0, 3.0)])}["ttft_s"].passed


def test_selftest_lockstep_cell_fails_when_two_events_share_a_read() -> None:
    """Lock-step streams read late: every other event arrives in the same read as the
    one before (gaps 0, 2g, 0, 2g, ...). The mean is right, the per-gap ITL is not,
    and the lock-step cell must say so."""
    from sparkctl.bench.selftest import BASE_TIMING, DEFAULT_SCENARIOS, check_cell

    sc = next(s for s in DEFAULT_SCENARIOS if s.lockstep)
    cfg, g = BASE_TIMING, BASE_TIMING.gap_s

    def coalesced(t_sent: float) -> RequestResult:
        first = t_sent + 0.0004 + cfg.first_visible_s(sc.prompt_words + 1, sc.max_tokens)
        times = [first + (i + i % 2) * g for i in range(sc.max_tokens)]
        ev = log(t_sent, times, usage=(sc.prompt_words + 1, sc.max_tokens))
        return RequestResult("r", "ok", tuple(ev), salt="s\n", labels={"prompt_words": str(sc.prompt_words)})

    rows = {c.metric: c for c in check_cell(sc, cfg, 16, [[coalesced(t) for t in (1.0, 2.0, 3.0)]])}
    assert not rows["itl_p50_s"].passed and rows["tpot_s"].passed and rows["decode_tok_s"].passed


def test_stamped_stream_keeps_each_receive_stamp_until_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes are dated when received, not when the task reads them: two receives read
    later keep two stamps; a read split by max_bytes keeps its stamp; EOF reads b""."""
    from sparkctl.bench import stamped

    clock = iter([1.0, 1.005, 1.010])
    monkeypatch.setattr(stamped.time, "perf_counter", lambda: next(clock))

    class _Transport:
        def is_closing(self) -> bool:
            return False

    async def go() -> list[tuple[bytes, float | None]]:
        p = stamped._StampingProtocol()
        s = stamped.StampedStream(_Transport(), p)  # type: ignore[arg-type]
        p.data_received(b"data: a\n\n")
        p.data_received(b"data: b\n\n")
        assert s.get_extra_info("is_readable")
        out = []
        for n in (4, 100, 100):
            out.append((await s.read(n), s.last_read_t))
        p.data_received(b"late")
        out.append((await s.read(100), s.last_read_t))
        p.eof_received()
        out.append((await s.read(100), s.last_read_t))
        return out

    assert asyncio.run(go()) == [(b"data", 1.0), (b": a\n\n", 1.0), (b"data: b\n\n", 1.005), (b"late", 1.010),
                                 (b"", 1.010)]


def test_selftest_cell_takes_the_servers_lateness_from_its_trace_and_judges_the_client() -> None:
    """A machine that wakes the server 6 ms late on its first chunk moves what the
    server did: a client that saw exactly that passes (and the lateness is reported);
    a client that dates the first chunk 4 ms after it was written fails, and so does
    a server whose chunking is not the model's."""
    from sparkctl.bench.refserver import EmitTrace
    from sparkctl.bench.selftest import (
        BASE_TIMING,
        DEFAULT_SCENARIOS,
        check_cell,
        scheduled_trace,
    )

    sc = next(s for s in DEFAULT_SCENARIOS if s.name == "chat-k3")
    cfg = BASE_TIMING.with_overrides(sc.ref)
    p = sc.prompt_words + 1 + 4  # the salt word, 4 per chat message

    def served(t_sent: float, salt: str, *, server_late_s: float, client_late_s: float,
               k: int = 3) -> tuple[RequestResult, EmitTrace]:
        plan = scheduled_trace(cfg.with_overrides({"tokens_per_chunk": k}), t_sent + 0.0003, p, sc.max_tokens)
        emits = ((plan.emits[0][0] + server_late_s, plan.emits[0][1]),) + plan.emits[1:]
        times = [t + 0.0001 + (client_late_s if i == 0 else 0.0) for i, (t, _) in enumerate(emits)]
        ev = log(t_sent, times, usage=(p, sc.max_tokens))
        r = RequestResult("r", "ok", tuple(ev), salt=salt + "\n", labels={"prompt_words": str(sc.prompt_words)})
        return r, EmitTrace(plan.t_start_s, p, emits)

    def cell(**kw: float) -> dict[str, Any]:
        pairs = [served(t, f"s{i}", **kw) for i, t in enumerate((10.0, 20.0, 30.0))]  # type: ignore[arg-type]
        rows = check_cell(sc, BASE_TIMING, 1, [[r] for r, _ in pairs], {f"s{i}": tr for i, (_, tr) in enumerate(pairs)})
        return {c.metric: c for c in rows}

    late_server = cell(server_late_s=0.006, client_late_s=0.0)
    assert all(c.passed for c in late_server.values()), late_server
    assert late_server["server_late_ms"].measured == pytest.approx(6.0)
    assert late_server["request_delay_ms"].measured == pytest.approx(0.3)
    assert late_server["ttft_excess_ms"].measured == pytest.approx(0.1)
    # the same server judged by its schedule alone (no traces) is 6 ms late: that fails
    assert not check_cell(sc, BASE_TIMING, 1, [[served(10.0, "s", server_late_s=0.006, client_late_s=0.0)[0]]])[1].passed
    late_client = cell(server_late_s=0.0, client_late_s=0.004)
    failed = {m for m, c in late_client.items() if not c.passed}
    assert {"ttft_s", "decode_tok_s", "tpot_s"} <= failed, failed
    other_chunks = {f"s{i}": served(t, f"s{i}", server_late_s=0.0, client_late_s=0.0, k=1)[1]
                    for i, t in enumerate((10.0, 20.0, 30.0))}
    rows = check_cell(sc, BASE_TIMING, 1, [[served(10.0, "s0", server_late_s=0.0, client_late_s=0.0)[0]]],
                      other_chunks)
    chunks = next(c for c in rows if c.metric == "server_chunks")
    assert not chunks.passed and chunks.expected == f"P={p} 22x3" and chunks.measured == f"P={p} 66x1"


def test_kernel_stamp_conversion_keeps_only_a_believable_stamp() -> None:
    import socket as so
    import struct

    from sparkctl.bench.stamped import kernel_stamp_to_perf

    def anc(sec: int, nsec: int) -> list[tuple[int, int, bytes]]:
        return [(so.SOL_SOCKET, 35, struct.pack("@qq", sec, nsec))]

    now_ns = 1_700_000_000 * 10**9
    assert kernel_stamp_to_perf(anc(1_700_000_000 - 1, 750_000_000), now_ns, 50.0) == pytest.approx(49.75)
    assert kernel_stamp_to_perf(anc(1_700_000_001, 0), now_ns, 50.0) is None  # from the future
    assert kernel_stamp_to_perf(anc(1_699_999_000, 0), now_ns, 50.0) is None  # realtime stepped
    assert kernel_stamp_to_perf([(so.SOL_SOCKET, 99, b"x" * 16)], now_ns, 50.0) is None
    assert kernel_stamp_to_perf([], now_ns, 50.0) is None


def test_stamped_backend_dates_bytes_by_the_kernel_not_by_when_the_loop_got_to_them() -> None:
    """Over real loopback TCP, with the server in another thread: the client's loop is
    held for 60 ms while the server answers. The bytes keep the time they arrived
    (the kernel's receive stamp), not the time the read callback ran after the hold.
    A first exchange comes before: Linux turns receive stamping on (a static key)
    from a work queue once the first socket asks, so the very first segments of a
    machine's first stamping socket may go unstamped (they then get the loop's stamp)."""
    import socket
    import threading

    from sparkctl.bench.stamped import StampedBackend

    listener = socket.create_server(("127.0.0.1", 0))
    wrote: list[float] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while conn.recv(4) == b"ping":
                time.sleep(0.01)  # the client's loop is held by then
                wrote.append(time.perf_counter())
                conn.sendall(b"pong")

    server = threading.Thread(target=serve, daemon=True)
    server.start()

    async def go() -> list[tuple[float, float, float, str]]:
        stream = await StampedBackend().connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=5.0)
        out = []
        try:
            for _ in range(2):
                await stream.write(b"ping")
                time.sleep(0.06)  # noqa: ASYNC251 -- the loop is held on purpose: nothing reads for 60 ms
                data = await stream.read(100, timeout=5.0)
                t_read = time.perf_counter()
                assert data == b"pong"
                out.append((wrote[-1], stream.last_read_t or 0.0, t_read, stream.stamp_source))
                await asyncio.sleep(0.02)
        finally:
            await stream.aclose()
        return out

    try:
        *_, (t_wrote, t_stamp, t_read, source) = asyncio.run(go())
    finally:
        listener.close()
        server.join(5)
    seen = f"wrote {t_wrote:.6f}, stamp {t_stamp:.6f}, read {t_read:.6f}, source {source}"
    assert source == "kernel", seen
    assert t_wrote <= t_stamp < t_wrote + 0.02 and t_read - t_stamp > 0.03, seen


def test_refserver_traces_when_it_wrote_each_chunk_on_the_clients_clock() -> None:
    from sparkctl.bench.selftest import fetch_traces

    async def go() -> tuple[RequestResult, dict[str, Any], dict[str, Any], float]:
        async with RefServer(RefConfig(ttft_base_s=0.02, gap_s=0.002, tokens_per_chunk=2)) as srv:
            async with BenchClient(srv.base_url, concurrency=2) as c:
                traced, _ = await c.run_batch([RequestSpec("completions", "m", 5, prompt="a b c",
                                                           extra_body={"ref": {"trace": True}}),
                                               RequestSpec("completions", "m", 5, prompt="a b c")])
            first, again = await fetch_traces(srv.base_url), await fetch_traces(srv.base_url)
            return traced, first, again, time.perf_counter()

    r, first, again, t_end = asyncio.run(go())
    assert list(first) == [r.salt.rstrip("\n")] and again == {}  # the untraced request is not kept
    tr = first[r.salt.rstrip("\n")]
    assert tr.prompt_tokens == 4 and [k for _, k in tr.emits] == [2, 2, 1]
    sent = r.t_sent_s or 0.0
    chunks = [e.t_s for e in r.events if e.kind == "chunk" and e.n_text_chars]
    assert sent < tr.t_start_s < tr.emits[0][0] < chunks[0] < t_end
    assert tr.emits[0][0] - tr.t_start_s >= 0.02 + 0.002  # a + (k-1) g
    assert all(e <= c for (e, _), c in zip(tr.emits, chunks))


@pytest.mark.e2e
def test_selftest_at_concurrency_1_and_16() -> None:
    from sparkctl.bench.selftest import format_report, run_selftest

    report = run_selftest((1, 16), capacity_concurrency=None)
    text = format_report(report)
    print(text)
    # Exact checks (statuses, token counts and their sources) hold for every request.
    assert not [c for c in report.failures() if c.tolerance == "exact"], text
    # The issue's tolerances (rates +-1 % at c=1, +-2 % at 16, TTFT [0, +2 ms]) on the
    # median request of every cell; a cell is excused only if it failed while other
    # load contended for the CPU (Linux PSI, measured apart from the errors), and
    # then it is named in the report.
    assert not report.unexplained_failures(), text
