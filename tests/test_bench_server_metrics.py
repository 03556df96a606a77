"""`bench --server-metrics`: histograms parsed, differenced and estimated as Prometheus does.

The quantile code is judged by the real Prometheus (``promtool test rules`` evaluates
``histogram_quantile`` over the same buckets); the differencing by a case whose answer
is wrong unless the engine's buckets are differenced; the whole path on the simulated
vLLM in-process and the simulated llama-server (no histograms: the report says so).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.bench import promhist as ph
from sparkctl.bench import servermetrics as sm

VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0)


def _observed(values: list[float], engine1: list[float] = (), bounds: tuple[float, ...] = VLLM_TTFT,  # type: ignore[assignment]
              name: str = "vllm:time_to_first_token_seconds") -> str:
    """Exposition text of a real prometheus_client Histogram that observed ``values`` (engine 0)
    and ``engine1`` (a second series, engine 1)."""
    import prometheus_client as pc

    reg = pc.CollectorRegistry()
    h = pc.Histogram(name, "x", ["model_name", "engine"], buckets=bounds, registry=reg)
    for engine, vals in (("0", values), ("1", engine1)):
        for v in vals:
            h.labels("m", engine).observe(v)
    return pc.generate_latest(reg).decode()


def _hist(bounds: tuple[float, ...], per_bucket: list[int]) -> ph.Histogram:
    cum, acc = [], 0.0
    for n in per_bucket:
        acc += n
        cum.append(acc)
    return ph.Histogram((*bounds, ph.INF), tuple(cum), acc, 0.0)


def test_parse_sums_series_filters_the_model_and_ignores_created() -> None:
    text = _observed([0.03, 0.3, 3.0])
    h = ph.parse_histogram(text, "vllm:time_to_first_token_seconds", {"model_name": "m"})
    assert h is not None and h.count == 3 and math.isclose(h.sum, 3.33)
    assert h.bounds == (*VLLM_TTFT, ph.INF) and h.per_bucket()[VLLM_TTFT.index(0.04)] == 1
    assert ph.parse_histogram(text, "vllm:time_to_first_token_seconds", {"model_name": "other"}) is None
    # a label the series lack does not filter; two series are summed bucket by bucket (sum by (le))
    two = _observed([0.03, 0.3, 3.0], [0.03])
    both = ph.parse_histogram(two, "vllm:time_to_first_token_seconds", {"lora": "x"})
    assert both is not None and both.count == 4
    assert ph.histogram_families(text) == ("vllm:time_to_first_token_seconds",)


def test_a_suite_is_the_difference_of_two_readings_not_the_engines_lifetime() -> None:
    """Negative control: an engine that already served 100 slow requests, then the suite's 10 fast ones.
    Without differencing, the median would be the old requests' (2.5-5 s); the suite's is 0.02-0.04 s."""
    before = ph.parse_histogram(_observed([3.0] * 100), "vllm:time_to_first_token_seconds")
    after = ph.parse_histogram(_observed([3.0] * 100 + [0.03] * 10), "vllm:time_to_first_token_seconds")
    assert before is not None and after is not None
    suite = ph.difference(before, after)
    assert suite.count == 10 and math.isclose(suite.sum, 0.3)
    e = ph.quantile_estimate(0.5, suite)
    assert e is not None and (e.lower, e.upper) == (0.02, 0.04) and 0.02 < e.value <= 0.04
    assert not 0.02 < (ph.bucket_quantile(0.5, after) or 0) <= 0.04   # the lifetime answer is another bucket
    assert ph.difference(None, after) == after                       # SGLang: no series before the first request


def test_difference_refuses_a_restart_and_other_buckets() -> None:
    a = _hist((0.1, 1.0), [5, 5, 0])
    with pytest.raises(ph.HistogramError, match="went down"):
        ph.difference(a, _hist((0.1, 1.0), [1, 0, 0]))
    with pytest.raises(ph.HistogramError, match="buckets changed"):
        ph.difference(a, _hist((0.2, 1.0), [5, 5, 0]))


def test_quantile_follows_prometheus_special_cases() -> None:
    h = _hist((0.1, 0.5), [2, 2, 1])
    assert ph.bucket_quantile(0.5, h) == pytest.approx(0.2)        # 0.1 + 0.4 * (0.5 / 2)
    assert ph.bucket_quantile(0.2, h) == pytest.approx(0.05)       # the first bucket starts at 0
    assert ph.bucket_quantile(0.95, h) == 0.5                      # in +Inf: the highest finite bound
    assert ph.quantile_estimate(0.95, h) == ph.Estimate(0.5, 0.5, ph.INF)
    assert ph.bucket_quantile(0.5, _hist((0.1, 0.5), [0, 0, 0])) is None  # no observations: NaN there
    not_monotonic = ph.Histogram((0.1, 0.5, ph.INF), (3.0, 2.0, 4.0), 4.0, 0.0)
    assert ph.bucket_quantile(0.5, not_monotonic) == pytest.approx(0.1 * 2 / 3)  # ensureMonotonic
    s = ph.summarize(h)
    assert s["mean"] == 0.0 and s["p99_bucket"] == [0.5, None] and s["p50_bucket"] == [0.1, 0.5]


samples = st.lists(st.floats(min_value=1e-4, max_value=3000.0, allow_nan=False), min_size=1, max_size=60)


@given(before=samples, suite=samples, q=st.sampled_from((0.01, 0.25, 0.5, 0.9, 0.99, 1.0)))
@settings(max_examples=60, deadline=None)
def test_the_estimate_brackets_the_true_sample_quantile_of_the_suite(before: list[float], suite: list[float],
                                                                      q: float) -> None:
    a = ph.parse_histogram(_observed(before), "vllm:time_to_first_token_seconds")
    b = ph.parse_histogram(_observed(before + suite), "vllm:time_to_first_token_seconds")
    assert a is not None and b is not None
    d = ph.difference(a, b)
    assert d.per_bucket() == ph.parse_histogram(_observed(suite), "vllm:time_to_first_token_seconds").per_bucket()
    e = ph.quantile_estimate(q, d)
    assert e is not None
    true = sorted(suite)[math.ceil(q * len(suite)) - 1]    # the sample at rank ceil(q n)
    assert e.lower < true <= e.upper or (e.lower == 0 and true <= e.upper)
    assert e.lower <= e.value <= (e.upper if math.isfinite(e.upper) else e.lower)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) not installed")
@given(cases=st.lists(st.tuples(st.lists(st.integers(0, 50), min_size=4, max_size=4),
                                st.sampled_from((0.0, 0.1, 0.5, 0.9, 0.99, 1.0))), min_size=1, max_size=12))
@settings(max_examples=8, deadline=None)
def test_quantiles_equal_prometheus_histogram_quantile(cases: list[tuple[list[int], float]]) -> None:
    """The real Prometheus evaluates histogram_quantile over the same buckets (promtool test rules)."""
    import tempfile

    import yaml

    bounds = (0.01, 0.1, 1.0)
    series, exprs = [], []
    for i, (per, q) in enumerate(cases):
        h = _hist(bounds, per)
        for b, c in zip(h.bounds, h.cumulative):
            le = "+Inf" if b == ph.INF else repr(b)
            series.append({"series": f'h_bucket{{case="{i}",le="{le}"}}', "values": repr(c)})
        v = ph.bucket_quantile(q, h)
        expr = f'histogram_quantile({q}, sum by (le) (h_bucket{{case="{i}"}}))'
        if v is None:  # NaN there: only NaN is unequal to itself (promtool compares NaN as unequal)
            expr, v = f"count({expr} != {expr})", 1.0
        exprs.append({"expr": expr, "eval_time": "0m", "exp_samples": [{"labels": "{}", "value": v}]})
    doc = {"rule_files": [], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}]}
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "q.yml"
        f.write_text(yaml.safe_dump(doc))
        r = subprocess.run(["promtool", "test", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_table_puts_server_and_client_side_by_side() -> None:
    w = sm._Window(hist={"ttft": _hist((0.1, 0.5), [2, 2, 0])}, client_ttft=[0.05, 0.15, 0.2, 0.3], n_client=4,
                   n_windows=2)
    s = sm.ServerMetrics("http://127.0.0.1:1", "vllm", "m", {})
    s.names, s.suites = {"ttft": "vllm:time_to_first_token_seconds"}, {"decode": w}
    rec = s.record()
    asyncio.run(s.aclose())
    rows = {(r[1], r[2]): r for r in sm.table_rows(rec)}
    assert rows[("TTFT s", "n")][3:] == ["4", "", "4"]
    assert rows[("TTFT s", "p50")][3:] == ["0.1000", "(0.0000, 0.1000]", "0.1750"]
    assert rec["suites"]["decode"]["window"] == "each measured repeat"
    none = sm.ServerMetrics("http://127.0.0.1:1", "llamacpp", "m", {})
    asyncio.run(none.probe())
    asyncio.run(none.aclose())
    assert sm.notes(none.record()) == [f"no server-side histograms: {sm.NO_HISTOGRAMS['llamacpp']}"]


# --- the whole path, on the simulated vLLM (in-process) and the simulated llama-server --------------


@pytest.fixture()
def sim_vllm() -> Iterator[str]:
    """The SIMULATED vLLM rank 0's HTTP app on 127.0.0.1, in a thread (no rendezvous: world size 1)."""
    from aiohttp import web

    from sparkctl_sim.engines import cli
    from sparkctl_sim.engines.logs import EngineLog
    from sparkctl_sim.engines.server import Engine, PerfState, build_app
    from tests.localengine import free_port

    cfg = cli.parse("vllm", ["serve", "/m", "--served-model-name", "m", "--max-model-len", "8192"], {})
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def serve() -> web.AppRunner:
        engine = Engine(cfg, EngineLog("vllm", 0), 20.0, lambda: PerfState())
        runner = web.AppRunner(build_app(engine), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    def main() -> None:
        asyncio.set_event_loop(loop)
        box.append(loop.run_until_complete(serve()))
        started.set()
        loop.run_forever()

    box: list[web.AppRunner] = []
    t = threading.Thread(target=main, daemon=True)
    t.start()
    assert started.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(box[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def test_simulated_vllm_server_side_ttft_beside_the_clients(sim_vllm: str, tmp_path: Path) -> None:
    from sparkctl.bench.results import load_run
    from sparkctl.bench.runner import RunOptions, run

    out = tmp_path / "run"
    run(sim_vllm, "m", out, {"engine": "vllm"}, RunOptions(suites=("decode",), repeats=2, decode_tokens=16,
                                                           server_metrics=True))
    rec = load_run(out).meta["server_metrics"]
    assert rec["available"] and rec["histograms"] == {"ttft": "vllm:time_to_first_token_seconds",
                                                     "itl": "vllm:inter_token_latency_seconds"}
    s = rec["suites"]["decode"]
    ttft, itl = s["ttft"], s["itl"]
    # the same requests on both sides: the warm-up and the probes are outside the windows
    assert ttft["server"]["count"] == ttft["client"]["count"] == s["client_requests"] == 2
    assert itl["server"]["count"] == itl["client"]["count"] == 2 * 15
    # the server's TTFT ends before the client's (it is observed before the chunk is written)
    assert 0 < ttft["server"]["mean"] <= ttft["client"]["mean"] < ttft["server"]["mean"] + 0.05
    lo, hi = ttft["server"]["p50_bucket"]
    assert lo < ttft["client"]["p50"] <= hi + 0.005   # the client's median in the server's bucket (+ wire)


@pytest.mark.e2e
def test_simulated_llama_server_has_no_histograms_and_the_report_says_so(tmp_path: Path) -> None:
    from sparkctl.bench.report import build_report
    from sparkctl.bench.results import load_run
    from sparkctl.bench.runner import RunOptions, run
    from tests.localengine import start_llama_server, stop

    proc, url = start_llama_server(["--alias", "m", "--ctx-size", "4096", "--metrics"], tmp_path / "ls.log", 50.0)
    try:
        run(url, "m", tmp_path / "run", {"engine": "llamacpp"},
            RunOptions(suites=("decode",), repeats=2, decode_tokens=4, server_metrics=True))
    finally:
        stop(proc)
    rec = load_run(tmp_path / "run").meta["server_metrics"]
    assert rec["available"] is False and rec["reason"] == sm.NO_HISTOGRAMS["llamacpp"]
    md = build_report([str(tmp_path / "run")], tmp_path / "report", plots=False).markdown
    assert "## Server-side and client-side latency" in md and "no server-side histograms: llama.cpp" in md


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) not installed")
@pytest.mark.parametrize("engine,argv", [("vllm", ["serve", "/m", "--served-model-name", "m"]),
                                         ("sglang", ["--model-path", "/m", "--served-model-name", "m",
                                                     "--enable-metrics"])])
def test_simulated_engines_metrics_pass_promtool_and_agree_with_what_they_did(engine: str, argv: list[str]) -> None:
    """The real Prometheus parses the simulated /metrics; its only lint is the colon the real names carry.
    The histograms hold exactly the streams' tokens: 1 TTFT and n-1 gaps per stream."""
    from aiohttp.test_utils import TestClient, TestServer

    from sparkctl_sim.engines import cli
    from sparkctl_sim.engines.logs import EngineLog
    from sparkctl_sim.engines.server import Engine, PerfState, build_app

    cfg = cli.parse(engine, argv, {})
    eng = Engine(cfg, EngineLog(engine, 0), 50.0, lambda: PerfState())

    async def go() -> tuple[str, str]:
        async with TestClient(TestServer(build_app(eng))) as client:
            before = await (await client.get("/metrics")).text()
            body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 6,
                    "ignore_eos": True, "stream": True}
            for _ in range(2):
                resp = await client.post("/v1/chat/completions", json=body)
                assert resp.status == 200 and (await resp.text()).endswith("data: [DONE]\n\n")
            return before, await (await client.get("/metrics")).text()

    before, after = asyncio.run(go())
    r = subprocess.run(["promtool", "check", "metrics"], input=after, capture_output=True, text=True, timeout=30)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert r.returncode in (0, 3) and problems, r.stdout + r.stderr   # 3: lint problems only, no parse error
    assert all(line.endswith("metric names should not contain ':'") for line in problems), problems
    names = sm.ENGINE_HISTOGRAMS[engine]
    for kind, n in (("ttft", 2), ("itl", 2 * 5)):
        d = ph.difference(ph.parse_histogram(before, names[kind][0]), ph.parse_histogram(after, names[kind][0]))
        assert d.count == n and d.sum > 0
    assert ("_created" in after) is (engine == "vllm")   # SGLang's multiprocess registry has none
