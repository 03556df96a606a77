"""End-to-end on the SIMULATED pair: `bench --server-metrics` puts the engine's own TTFT beside the client's.

The simulated vLLM and SGLang export the histograms of their real releases
(sparkctl_sim/engines/promexport.py) observed from the times they really
produce, so the server-side figures must agree with the client's within what
the buckets resolve: the same requests counted on both sides, the server's exact
mean (``_sum / _count``) at or below the client's by no more than the wire and
the HTTP handling, and the client's median, less that offset, inside the bucket
the server's median estimate came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim.helpers import Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

WAIVE = ("--waive", "page_size", "--reason", "stock 4 KiB kernel, as in the field report")


@pytest.fixture(scope="module")
def sim_pair(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("srvmetrics"), 2)


@pytest.mark.parametrize("profile,ttft,itl", [
    ("vllm-tp2-fallback", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    ("sglang-tp2", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"),
])
def test_simulated_pair_bench_server_metrics_beside_the_clients(sim_pair: Sim, tmp_path: Path, profile: str,
                                                                ttft: str, itl: str) -> None:
    inv = str(sim_pair.inventory)
    r = sim_pair.sparkctl("-i", inv, "up", profile, *WAIVE, "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    try:
        out = tmp_path / "bench"
        r = sim_pair.sparkctl("-i", inv, "bench", profile, "--suite", "decode", "--suite", "concurrency",
                              "--concurrency", "4", "--repeats", "2", "--decode-tokens", "16", "--server-metrics",
                              "--out", str(out), "--force", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        print(r.stdout)  # the side-by-side table (pytest -s shows it)
        assert "server-side vs client-side" in r.stdout, r.stdout
        rec = json.loads((out / "run.json").read_text())["server_metrics"]
        assert rec["available"], rec
        assert rec["histograms"] == {"ttft": ttft, "itl": itl}
        for suite, n in (("decode", 2), ("concurrency", 8)):
            s = rec["suites"][suite]
            srv, cli = s["ttft"]["server"], s["ttft"]["client"]
            # the same requests on both sides: warm-ups and context probes are outside the windows
            assert srv["count"] == cli["count"] == n, s
            offset = cli["mean"] - srv["mean"]   # exact on both sides: the wire and the HTTP handling
            assert 0 <= offset < 0.01, (suite, srv, cli)
            lo, hi = srv["p50_bucket"]
            assert lo <= cli["p50"] - offset <= hi or lo <= cli["p50"] <= hi, (suite, srv, cli)
            assert s["itl"]["server"]["count"] == s["itl"]["client"]["count"] == n * 15, s["itl"]
        sim_pair.sparkctl("bench", "report", str(out), check=True)
        report = (out / "report" / "report.md").read_text()
        assert "## Server-side and client-side latency" in report and "| decode | TTFT s | p50 |" in report
    finally:
        assert sim_pair.sparkctl("-i", inv, "down", timeout=300).returncode == 0
