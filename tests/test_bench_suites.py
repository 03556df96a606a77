"""Bench suites: workloads and quality scorers (pure), then the runner, report and
CLI against SIMULATED engines on 127.0.0.1 (sped up; /sim/info gives the rates in effect).

Budget: about 40 s on 2 cores. Prompt lengths and repeats are small on purpose.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkctl.bench import quality as q
from sparkctl.bench import workloads as wl
from sparkctl.bench.options import RunOptions
from sparkctl.bench.results import (
    CONFIG_COLUMNS,
    CSV_COLUMNS,
    TELEMETRY_COLUMNS,
    load_run,
)
from sparkctl.bench.rows import summarize_rows
from sparkctl.bench.runner import run
from sparkctl.bench.telemetry import telemetry_summary
from tests.localengine import prefill_rate, start_local, stop  # a test driver, not part of the simulator

SPEEDUP = 10.0
RECOVERY_BOUND_PCT = 10.0  # see test_runner_recovers_the_engines_configured_rates
SALT = "0123456789abcdef\n"

# --------------------------------------------------------------------------- workloads (pure)


@pytest.mark.parametrize("target", [64, 100, 2048, 8191])
def test_prompts_have_exact_token_counts_with_the_salt_first(target: int) -> None:
    msgs = wl.render_messages(wl.Prompt(wl.PREFILL_INSTRUCTION, target_tokens=target), SALT)
    assert wl.sim_prompt_tokens(msgs) == target
    assert msgs[0]["content"].startswith(SALT)
    assert msgs[0]["content"].rstrip().endswith(wl.PREFILL_INSTRUCTION)


def test_a_prompt_too_short_for_its_fixed_parts_is_refused() -> None:
    with pytest.raises(ValueError):
        wl.render_messages(wl.Prompt(wl.DECODE_INSTRUCTION, target_tokens=5), SALT)


def test_needle_prompts_exact_length_and_depth() -> None:
    (n, d, p), = wl.longctx_prompts([4096], [0.25])
    assert (n, d) == (4096, 0.25) and p.needle is not None
    msgs = wl.render_messages(p, SALT)
    assert wl.sim_prompt_tokens(msgs) == 4096
    content = msgs[0]["content"]
    assert content.count(p.needle.sentence) == 1 and content.endswith(p.needle.question)
    depth = wl.sim_needle_depth_tokens(p, SALT)
    assert 0.2 < depth / 4096 < 0.3
    # the probe is the exact text before the needle: the full prompt starts with it
    assert content.startswith(wl.needle_prefix_messages(p, SALT)[0]["content"])
    assert wl.needle_found(f"It is {p.needle.code.lower()}.", p.needle)
    assert not wl.needle_found("I do not know", p.needle) and not wl.needle_found(None, p.needle)


def test_warm_prefix_pair_shares_the_document_word_for_word() -> None:
    a, b = wl.warm_prefix_prompts(1000)
    ca, cb = (wl.render_messages(x, SALT)[0]["content"] for x in (a, b))
    assert wl.sim_prompt_tokens(wl.render_messages(a, SALT)) == wl.sim_prompt_tokens(wl.render_messages(b, SALT))
    doc_a, doc_b = ca.rsplit("\n\n", 1)[0], cb.rsplit("\n\n", 1)[0]
    assert doc_a == doc_b and ca != cb


def test_suite_plans_follow_the_methods() -> None:
    pre = wl.prefill_plan([8192, 32768], repeats=2)
    assert [p.params["length_tokens"] for p in pre] == [8192, 32768]
    assert all(a.max_tokens == 1 and not p.together for p in pre for a in p.asks)
    (dec,) = wl.decode_plan(256, 2, "ds41f")
    assert dec.asks[0].extra_body == {"ignore_eos": True, "min_tokens": 256} and dec.asks[0].expect_tokens == 256
    assert wl.decode_plan(256, 2, "tensorfold")[0].asks[0].extra_body == {}  # TensorFold ignores them
    assert wl.decode_plan(256, 2, None)[0].asks[0].extra_body == {}
    conc = wl.concurrency_plan([1, 4, 16], 256, 2, "vllm")
    assert [len(p.asks) for p in conc] == [1, 4, 16] and all(p.together for p in conc)
    peak = wl.peak_plan(512, 2, "ds41f")
    assert all(p.warm and p.params["ruler"] == "community" for p in peak)
    assert wl.repeats_for(None, False) == 2 and wl.repeats_for(1, False) == 2
    assert wl.repeats_for(None, True) == 3 and wl.repeats_for(5, True) == 5
    assert wl.thinking_modes({"reasoning_effort": "high"}) == [("off", {}), ("on", {"reasoning_effort": "high"})]
    assert wl.thinking_modes({}) == [("off", {})]


def test_agent_sessions_stagger_and_grow_their_history() -> None:
    plans = wl.agent_sessions("draftable", 3, stagger_s=0.5)
    assert [p.start_offset_s for p in plans] == [0.0, 0.5, 1.0]
    m0 = wl.agent_turn_messages(plans[0], SALT, [], 0)
    hist = [m0[-1], {"role": "assistant", "content": "SELECT 1"}]
    m1 = wl.agent_turn_messages(plans[0], SALT, hist, 1)
    assert m1[0] == m0[0] and m1[1:3] == hist and m1[-1]["content"] != m0[-1]["content"]
    assert m0[0]["content"].startswith(SALT)
    with pytest.raises(ValueError):
        wl.agent_sessions("poetry", 1)


# --------------------------------------------------------------------------- quality scorers (pure)

GOOD_ANSWERS = {
    "json_person": '{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"}',
    "json_primes": "```json\n[2, 3, 5, 7, 11]\n```",
    "json_sentiment": '{"sentiment": "negative", "confidence": 0.9}',
    "json_extract": '{"item": "QSFP cables", "quantity": 12, "unit_price": 39.5}',
    "json_valid_date": '<think>February has 28 days</think>{"valid": false}',
    "tool_weather": '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}',
    "tool_calendar": '{"name": "create_event", "arguments": "{\\"title\\": \\"Ring maintenance\\", '
                     '\\"date\\": \\"2026-11-03\\", \\"duration_minutes\\": 45}"}',
    "tool_choice": '{"name": "calculator", "arguments": {"expression": "17*23"}}',
    "sql_filter": "SELECT name FROM employees WHERE dept = 'sales' AND salary > 50000;",
    "sql_group": "```sql\nSELECT dept, count(id) AS n FROM employees GROUP BY dept ORDER BY dept\n```",
    "sql_anti_join": "SELECT c.name FROM customers c LEFT JOIN orders o ON o.customer_id = c.id WHERE o.id IS NULL",
    "sql_top": "SELECT c.name, SUM(o.total) AS spend FROM customers c JOIN orders o ON c.id = o.customer_id "
               "GROUP BY c.name ORDER BY spend DESC LIMIT 1",
    "math_product": "9,396",
    "math_speed": "The average speed is 72",
    "math_sum": "5050",
    "math_power": "12240 J",
}


def test_at_least_14_scenarios_each_scored_by_rule() -> None:
    assert len(q.SCENARIOS) >= 14
    assert {s.category for s in q.SCENARIOS} == {"json", "tool_call", "sql", "arithmetic"}
    assert set(GOOD_ANSWERS) == {s.id for s in q.SCENARIOS}
    for s in q.SCENARIOS:
        good = q.score(s.id, GOOD_ANSWERS[s.id])
        assert good.passed, (s.id, good.reason)
        bad = q.score(s.id, "the ring carries every token across four nodes")
        assert not bad.passed, s.id
    assert not q.score("json_person", '{"name": "Ada Lovelace", "age": "36", "email": "ada@example.org"}').passed
    assert not q.score("sql_filter", "SELECT name FROM employees").passed
    assert not q.score("math_sum", "<think>5050").passed  # unterminated thinking answers nothing


# --------------------------------------------------------------------------- pure summaries


def test_summaries_skip_flagged_repeats_and_energy_integrates_power() -> None:
    rows = [{"suite": "decode", "point": "decode/1", "params": {}, "valid": True, "flags": "", "decode_tok_s": 60.0},
            {"suite": "decode", "point": "decode/1", "params": {}, "valid": True, "flags": "", "decode_tok_s": 70.0},
            {"suite": "decode", "point": "decode/1", "params": {}, "valid": False, "flags": "short:1",
             "decode_tok_s": 500.0}]
    (p,) = summarize_rows(rows)
    assert p["metrics"]["decode_tok_s"] == {"n": 2, "median": 65.0, "min": 60.0, "max": 70.0}
    assert p["repeats"] == 3 and p["valid_repeats"] == 2 and p["flags"] == ["short:1"]
    tele = [{"suite": "decode", "node": n, "t_s": t, "power_w": w}
            for n in ("a", "b") for t, w in ((0.0, 30.0), (1.0, 40.0), (2.0, 40.0))]
    s = telemetry_summary(tele, {"decode": (100, 20)})["decode"]
    assert s["nodes"]["a"] == {"mean_w": pytest.approx(110 / 3), "peak_w": 40.0, "energy_j": 75.0, "samples": 3}
    assert s["energy_j"] == 150.0 and s["j_per_completion_token"] == 1.5 and s["j_per_token"] == 1.25


# --------------------------------------------------------------------------- simulated engines


def _start_engine(engine: str, name: str, tmp: Path, ctx: int = 1048576) -> Iterator[str]:
    proc, url = start_local(engine, name, tmp / f"{engine}.log", SPEEDUP, ctx)
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def ds41f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _start_engine("ds41f", "dsv41-ds41f", tmp_path_factory.mktemp("ds41f"))


@pytest.fixture(scope="module")
def tensorfold(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _start_engine("tensorfold", "dsv41-tf", tmp_path_factory.mktemp("tf"))


CONFIG = {"profile": "ds41f-sim", "profile_digest": "0123abcd", "engine": "ds41f", "engine_version": "sim-1023",
          "model": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "topology": "single", "tp_size": 1, "nodes": ["n1", "n2"],
          "clock_cap_mhz": 2000, "kernel": "6.17.0-1029-nvidia", "page_size_kib": 4,
          "waivers": ["page_size: stock kernel"], "thinking": {"request_fields": {"reasoning_effort": "high"}}}


@pytest.fixture(scope="module")
def ds41f_run(ds41f: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any]:
    calls = {"n": 0}

    async def telemetry() -> dict[str, dict[str, Any]]:
        calls["n"] += 1
        return {n: {"power_w": 34.0 + i, "sm_mhz": 2000, "temp_c": 55.0, "event_reasons": ["sw_power_cap"],
                    "mem_available_gib": 20.0} for i, n in enumerate(("n1", "n2"))}

    info = httpx.get(ds41f + "/sim/info").json()
    out = tmp_path_factory.mktemp("run") / "ds41f"
    opts = RunOptions(suites=("prefill", "decode", "concurrency"), lengths=(8192, 16384), concurrency=(1, 2, 4),
                      decode_tokens=384, telemetry_interval_s=0.25)
    summary = run(ds41f, "dsv41-ds41f", out, CONFIG, opts, telemetry=telemetry)
    return out, info, summary


@pytest.mark.e2e
def test_runner_recovers_the_engines_configured_rates(ds41f_run: tuple[Path, dict[str, Any], Any]) -> None:
    out, info, summary = ds41f_run
    assert info["speedup"] == SPEEDUP and summary.n_errors == 0
    eff = info["perf"]["effective"]
    pts = {p["point"]: p for p in summary.points}
    errors: dict[str, float] = {}

    def check(point: str, metric: str, expected: float) -> None:
        got = pts[point]["metrics"][metric]["median"] / SPEEDUP
        errors[f"{point} {metric}"] = 100.0 * (got / expected - 1.0)

    for n in (8192, 16384):
        check(f"prefill/{n}", "prefill_tok_s", prefill_rate(eff["prefill_tok_s"], n))
    check("decode/1", "decode_tok_s", eff["per_stream_tok_s"]["1"])
    for c in (1, 2, 4):
        check(f"concurrency/{c}", "aggregate_tok_s", eff["aggregate_tok_s"][str(c)])
        check(f"concurrency/{c}", "stream_decode_median_tok_s", eff["per_stream_tok_s"][str(c)])
    print("recovery errors (%):", json.dumps({k: round(v, 2) for k, v in errors.items()}, indent=1))
    # Why 10 %: a definition error moves every repeat of a point by a fixed factor,
    # and the gross ones fail this by far (the speedup not divided out: x10; an
    # aggregate taken for a per-stream rate: x2, x4; a prompt or answer counted in
    # words instead of tokens). Timing noise must not: engine and client share 2
    # loaded cores, and +-2 % flaked (-2.27 %) under load. Errors under 10 % (e.g.
    # the TTFT inside the aggregate window: ~1 % here with 384 tokens) are for the
    # strict +-2 % check, tools/sim_rate_recovery.py, which prints every error with
    # the CPU pressure beside it.
    assert all(abs(e) <= RECOVERY_BOUND_PCT for e in errors.values()), errors
    assert all(p["valid_repeats"] == p["repeats"] == 2 for p in summary.points)


@pytest.mark.e2e
def test_results_files_carry_the_full_configuration(ds41f_run: tuple[Path, dict[str, Any], Any]) -> None:
    out, _info, summary = ds41f_run
    with (out / "results.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert len(rows) == 2 * (2 + 1 + 3)  # points x repeats
    for r in rows:
        for col in CONFIG_COLUMNS:
            assert r[col] != "", col
        assert r["engine"] == "ds41f" and r["clock_cap_mhz"] == "2000" and r["kernel"] == "6.17.0-1029-nvidia"
        assert r["token_source"] == "usage" and r["salt"] and r["t_start_utc"] <= r["t_end_utc"]
        assert json.loads(r["params"]) and r["valid"] == "1"
    assert {r["prompt_tokens"] for r in rows if r["suite"] == "prefill"} == {"8192", "16384"}
    assert {r["completion_tokens"] for r in rows if r["point"] == "concurrency/4"} == {str(4 * 384)}
    heads = [json.loads(line)["request"] for line in (out / "events.jsonl").read_text().splitlines()
             if line.startswith('{"request"')]
    assert len([h for h in heads if not h["labels"].get("warmup")]) == summary.n_requests == 2 * (2 + 1 + 7)
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["waivers"] == CONFIG["waivers"] and meta["effective"]["repeats"] == 2
    with (out / "telemetry.csv").open() as fh:
        tele = list(csv.DictReader(fh))
    assert tele and tuple(tele[0]) == TELEMETRY_COLUMNS and {t["node"] for t in tele} == {"n1", "n2"}
    t = summary.telemetry["decode"]
    assert t["nodes"]["n2"]["peak_w"] == 35.0 and t["j_per_completion_token"] > 0


@pytest.mark.e2e
def test_report_and_compare_two_stacks(ds41f_run: tuple[Path, dict[str, Any], Any], tensorfold: str,
                                       tmp_path: Path, sparkctl: Any) -> None:
    ds_dir = ds41f_run[0]
    tf_dir = tmp_path / "tf"
    tf_cfg = {"engine": "tensorfold", "profile": "tensorfold-sim", "clock_cap_mhz": None, "tp_size": 1}
    # TensorFold ignores ignore_eos: 100 tokens stay below its shortest natural answer (120)
    s = run(tensorfold, "dsv41-tf", tf_dir, tf_cfg,
            RunOptions(suites=("prefill", "decode", "concurrency"), lengths=(8192,), concurrency=(1, 4),
                       decode_tokens=100))
    assert s.n_errors == 0 and all(p["flags"] == [] for p in s.points)
    r = sparkctl("bench", "report", str(ds_dir), str(tf_dir), "--out", str(tmp_path / "rep"), "--html")
    assert r.code == 0, r.err
    out = r.out
    md = (tmp_path / "rep" / "report.md").read_text()
    header = md.splitlines()[4]
    for col in ("ds41f-sim", "tensorfold-sim", "ds41f (published)", "tensorfold (published)", "TP2 (published)"):
        assert col in header, header
    assert "| Prefill 128K (tok/s) | – | – | 6,239 | 5,985 | 2,928 | 4,058 |" in md
    assert "Decode, 1 stream (tok/s)" in out and "5,783" in out
    for png in ("prefill_by_length", "aggregate_by_concurrency", "ttft_distribution", "itl_distribution",
                "clock_cap"):
        assert (tmp_path / "rep" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "<table>" in (tmp_path / "rep" / "report.html").read_text()
    r = sparkctl("bench", "compare", str(ds_dir), str(tf_dir), "--json")
    assert r.code == 0, r.err
    ratios = {(x["point"], x["metric"]): x for x in json.loads(r.out)["ratios"]}
    agg = ratios[("concurrency/4", "aggregate_tok_s")]
    assert agg["ratio"] == pytest.approx(agg["b"] / agg["a"]) and 0 < agg["ratio"] < 1.5
    r = sparkctl("bench", "compare", str(ds_dir), str(tf_dir))
    assert r.code == 0 and "B/A" in r.out and "decode/1" in r.out


@pytest.mark.e2e
def test_quality_scores_every_scenario_by_rule_with_thinking_on_and_off(ds41f: str, tmp_path: Path) -> None:
    s = run(ds41f, "dsv41-ds41f", tmp_path / "q", CONFIG, RunOptions(suites=("quality",), quality_concurrency=16))
    rows = load_run(tmp_path / "q").rows
    for mode in ("off", "on"):
        per = [r for r in rows if r["point"].startswith(f"quality/{mode}/")]
        assert len({r["scenario"] for r in per}) >= 14 and len(per) == 2 * len(q.SCENARIOS)
        assert all(r["score"] in ("0.0", "1.0") and "why:" in r["flags"] for r in per)
        totals = [r for r in rows if r["point"] == f"quality/{mode}"]
        assert len(totals) == 2 and all(0.0 <= float(r["score"]) <= 100.0 for r in totals)
    heads = [json.loads(x)["request"] for x in (tmp_path / "q" / "events.jsonl").read_text().splitlines()
             if x.startswith('{"request"')]
    assert all(h.get("text") for h in heads if h["labels"].get("suite") == "quality")  # answers kept for audit
    assert s.n_errors == 0


@pytest.mark.e2e
def test_the_other_suites_run_and_reject_what_they_must(ds41f: str, tmp_path: Path, sparkctl: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    opts = RunOptions(suites=("warm-prefix", "longctx", "peak", "agent", "soak"), lengths=(2048,),
                      concurrency=(2,), decode_tokens=64, warm_prefix_tokens=4096, agent_warmup_s=0.3,
                      agent_measure_s=0.8, agent_corpora=("draftable",), duration_s=1.0, soak_scale=0.25)
    s = run(ds41f, "dsv41-ds41f", tmp_path / "o", {"engine": "ds41f"}, opts)
    pts = {p["point"]: p for p in s.points}
    wp = pts["warm-prefix/4096"]["metrics"]
    assert wp["cold_warm_ratio"]["min"] > 3 and wp["cached_tokens"]["min"] >= 3840
    lc = [r for r in load_run(tmp_path / "o").rows if r["suite"] == "longctx"]
    assert {r["prompt_tokens"] for r in lc} == {"2048"} and all(900 < int(r["depth_tokens"]) < 1100 for r in lc)
    assert {r["found"] for r in lc} == {"0"}  # the simulator does not read
    assert pts["agent/draftable/2"]["metrics"]["aggregate_tok_s"]["median"] > 0
    assert pts["soak"]["metrics"]["error_rate"]["median"] == 0.0
    assert all(f"peak/{c}" in pts for c in wl.PEAK_CONTENT)
    # a "cold" point that read the cache is rejected: the same salt twice makes the cold request warm
    monkeypatch.setattr("sparkctl.bench.runner.new_salt", lambda: "fixedsaltfixedsa\n")
    s2 = run(ds41f, "dsv41-ds41f", tmp_path / "w", {"engine": "ds41f"},
             RunOptions(suites=("warm-prefix",), warm_prefix_tokens=4096))
    monkeypatch.undo()
    (p,) = s2.points
    assert p["valid_repeats"] == 1 and any(f.startswith("rejected:") for f in p["flags"])
    # the CLI: no endpoint, no profile -> a usage error; a wrong model -> named in the error
    r = sparkctl("bench", "--suite", "decode")
    assert r.code == 2 and "nothing to benchmark" in r.err
    r = sparkctl("bench", "--base-url", ds41f, "--model", "nope", "--out", str(tmp_path / "x"))
    assert r.code == 2 and "dsv41-ds41f" in r.err


# --------------------------------------------------------------------------- context window


def test_context_window_is_read_from_what_each_server_reports() -> None:
    # vLLM / SGLang / the simulated engines: /v1/models max_model_len
    assert wl.context_window({"id": "m", "owned_by": "vllm", "max_model_len": 131072}, None, 4096) == \
        (131072, "/v1/models max_model_len")
    # llama-server: the per-slot window in /props beats the training length in /v1/models meta
    entry = {"id": "m", "object": "model", "meta": {"n_ctx_train": 131072, "n_vocab": 32000}}
    props = {"total_slots": 4, "default_generation_settings": {"n_ctx": 2048, "params": {}}}
    assert wl.context_window(entry, props, None) == (2048, "/props default_generation_settings.n_ctx")
    assert wl.context_window(entry, {"n_ctx": 8192}, None) == (8192, "/props n_ctx")
    # llama-cpp-python's server reports nothing: the profile's figure, then the training length
    bare = {"id": "tiny-llama", "object": "model", "owned_by": "me", "permissions": []}
    assert wl.context_window(bare, None, 512) == (512, "profile model.context_len_tokens")
    assert wl.context_window(entry, None, None) == (131072, "/v1/models meta.n_ctx_train")
    assert wl.context_window(bare, {"n_ctx": 0}, None) == (None, None)
    assert wl.context_window({"max_model_len": True}, None, None) == (None, None)  # not a count
    assert wl.fits_window(2047, 1, 2048) and not wl.fits_window(2048, 1, 2048) and wl.fits_window(10**7, 1, None)


@pytest.mark.e2e
def test_points_beyond_the_context_window_are_flagged_not_sent(tmp_path: Path) -> None:
    engine = _start_engine("ds41f", "dsv41-small", tmp_path, ctx=4096)
    url = next(engine)
    try:
        opts = RunOptions(suites=("prefill", "longctx"), lengths=(2048, 8192), needle_depths=(0.5,), repeats=2)
        s = run(url, "dsv41-small", tmp_path / "w", {"engine": "ds41f"}, opts)
    finally:
        engine.close()
    assert s.n_errors == 0  # nothing over the window was sent, so nothing broke
    rows = load_run(tmp_path / "w").rows
    assert {r["context_window_tokens"] for r in rows} == {"4096"}
    assert {r["context_window_source"] for r in rows} == {"/v1/models max_model_len"}
    over = {r["point"]: r for r in rows if r["flags"].startswith("not_run:")}
    assert set(over) == {"prefill/8192", "longctx/8192@0.5"}
    # the simulator counts words, so the probes find 1 token per filler word: NEED is the estimate's margins
    fixed = wl.sim_prompt_tokens(wl.render_messages(wl.Prompt(wl.PREFILL_INSTRUCTION), SALT))
    need = wl.TokenScale(1.0, "").need(fixed, 8192 - fixed, 1)
    assert over["prefill/8192"]["flags"] == f"not_run:exceeds_context_window:{need}>4096"
    assert load_run(tmp_path / "w").meta["config"]["context_fit"]["filler_tokens_per_word"] == 1.0
    assert all(r["valid"] == "0" and r["n_requests"] == "0" for r in over.values())
    ran = [r for r in rows if r["point"] in ("prefill/2048", "longctx/2048@0.5")]
    assert sorted(r["n_ok"] for r in ran) == ["1", "1", "2", "2"]  # a longctx row = depth probe + question
    pts = {p["point"]: p for p in s.points}
    assert pts["prefill/8192"]["valid_repeats"] == 0 and pts["prefill/8192"]["flags"]


@pytest.mark.e2e
def test_short_answers_are_flagged_and_left_out_of_the_stream_rates(tensorfold: str, tmp_path: Path) -> None:
    """TensorFold has no ignore_eos / min_tokens (docs/bench.md): its answers end at
    their natural length (120-220 tokens here), so 200 asked comes back short in most
    streams. Each row says how many; its per-stream rates count the full streams only."""
    from sparkctl.bench.events import Event
    from sparkctl.bench.metrics import request_metrics, summarize

    run(tensorfold, "dsv41-tf", tmp_path / "tf", {"engine": "tensorfold"},
        RunOptions(suites=("concurrency",), concurrency=(16,), decode_tokens=200, repeats=2))
    rows = load_run(tmp_path / "tf").rows
    by_rep: dict[str, list[list[Event]]] = {}
    heads: dict[str, dict[str, Any]] = {}
    lines = [json.loads(x) for x in (tmp_path / "tf" / "events.jsonl").read_text().splitlines()]
    for d in lines:
        if "request" in d:
            heads[d["request"]["request_id"]] = d["request"]
    evs: dict[str, list[Event]] = {}
    for d in lines:
        if "request" not in d:
            rid = d.pop("request_id")
            evs.setdefault(rid, []).append(Event.from_dict(d))
    for rid, h in heads.items():
        if h["labels"].get("suite") == "concurrency":
            by_rep.setdefault(h["labels"]["repeat"], []).append(evs[rid])
    assert len(rows) == 2
    for r in rows:
        per = [request_metrics(e) for e in by_rep[r["repeat"]]]
        n_short = sum((m.completion_tokens or 0) < 200 for m in per)
        full = summarize(m.decode_tok_s for m in per if (m.completion_tokens or 0) >= 200)
        assert r["flags"] == (f"short:{n_short}" if n_short else "") and (r["valid"] == "1") == (n_short == 0)
        want = "" if full.median is None else pytest.approx(full.median)
        assert (float(r["decode_tok_s"]) if r["decode_tok_s"] else "") == want


def test_the_fit_estimate_counts_prompt_filler_margins_and_answer() -> None:
    p = wl.Prompt(wl.PREFILL_INSTRUCTION, target_tokens=300)
    fixed = wl.sim_prompt_tokens(wl.render_messages(wl.bare(p), SALT))
    assert wl.filler_words(p, SALT) == 300 - fixed and wl.filler_words(wl.bare(p), SALT) == 0
    # 3 engine tokens per filler word (the tiny llama's tokenizer), 40 tokens of fixed part, 48 out
    need = wl.TokenScale(3.0, "probe").need(40, 100, 48)
    assert need == 40 + math.ceil(300 * (1 + wl.FIT_MARGIN_FRACTION)) + wl.FIT_MARGIN_TOKENS + 48
    # the next agent turn: previous prompt + its answer (re-tokenized, with a margin) + the new user turn alone
    nxt = wl.agent_next_prompt_tokens(200, 100, 60, 150)
    assert nxt == 200 + math.ceil(100 * (1 + wl.FIT_MARGIN_FRACTION)) + wl.CHAT_TOKENS_PER_MESSAGE + 90
    assert [wl.agent_backoff_s(k) for k in range(6)] == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]
    mix = [m for m in wl.SOAK_MIX if m[0] != "document"]
    assert [wl.soak_ask(i, None, 1.0, mix)[0] for i in range(4)] == ["chat", "essay", "chat", "essay"]


# --------------------------------------------------------------------------- a small-window engine (llama-cpp-python)


class SmallWindowServer:
    """An OpenAI chat server with a small window and a tokenizer that counts more than the bench.

    Like llama-cpp-python: /v1/models reports no window, streamed answers carry no
    usage, and a request whose prompt + max_tokens exceeds ``n_ctx`` gets its stream
    dropped after the headers (non-streamed: HTTP 500). ``drop_all`` drops every stream.
    Tokens: 2 per whitespace word + 3 per message (the bench counts 1 + 4).
    """

    def __init__(self, n_ctx: int, drop_all: bool = False) -> None:
        self.n_ctx, self.drop_all = n_ctx, drop_all
        self.log: list[tuple[bool, int, int, bool]] = []  # (stream, prompt tokens, max_tokens, refused)
        self.url = ""
        self._loop: Any = None
        self._runner: Any = None

    @staticmethod
    def tokens(messages: list[dict[str, str]]) -> int:
        return sum(2 * len(str(m.get("content") or "").split()) + 3 for m in messages)

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web
        body = await request.json()
        n_prompt, n_out, stream = self.tokens(body["messages"]), int(body.get("max_tokens") or 16), body.get("stream")
        refused = n_prompt + n_out > self.n_ctx
        self.log.append((bool(stream), n_prompt, n_out, refused))
        if not stream:
            if refused:
                return web.json_response({"error": {"message": "exceeds context window"}}, status=500)
            return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                   "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": n_prompt, "completion_tokens": 1,
                                                "total_tokens": n_prompt + 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if refused or self.drop_all:
            assert request.transport is not None
            request.transport.abort()  # the server raised inside the generator: the stream just ends
            return resp
        for i in range(n_out):
            chunk = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        await resp.write(b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def _models(self, _request: Any) -> Any:
        from aiohttp import web
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "me"}]})

    def __enter__(self) -> "SmallWindowServer":
        import asyncio
        import threading

        from aiohttp import web
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/v1/chat/completions", self._chat)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
            started.set()

        def serve() -> None:
            self._loop.run_until_complete(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        import asyncio
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_small_window_engine_gets_only_requests_that_fit(tmp_path: Path) -> None:
    """Every suite against a 500-token window whose tokenizer counts 2 tokens a word:
    what does not fit is flagged not_run, agent sessions start over, and nothing is refused."""
    opts = RunOptions(suites=("prefill", "longctx", "warm-prefix", "agent", "soak", "quality"), lengths=(128, 256),
                      needle_depths=(0.5,), concurrency=(2,), decode_tokens=64, warm_prefix_tokens=4096,
                      agent_warmup_s=0.2, agent_measure_s=1.0, agent_cooldown_s=2.0, duration_s=0.5,
                      soak_scale=0.25, quality_concurrency=4)
    with SmallWindowServer(500) as srv:
        s = run(srv.url, "tiny", tmp_path / "r", {"engine": "llamacpp", "context_len_tokens": 500}, opts)
    refused = [x for x in srv.log if x[3]]
    assert not [x for x in refused if x[0]], refused[:3]  # no measured (streamed) request was over the window
    assert s.n_requests > 0 and s.n_errors == 0
    rows = load_run(tmp_path / "r").rows
    flags = {r["point"]: r["flags"] for r in rows}
    assert {r["context_window_source"] for r in rows} == {"profile model.context_len_tokens"}
    # the old rule (bench-counted prompt + answer <= window) sent these (257, 304 <= 500): at 2 tokens
    # a word they need 508 and 555
    assert flags["prefill/256"].startswith("not_run:exceeds_context_window:")
    assert flags["longctx/256@0.5"].startswith("not_run:exceeds_context_window:")
    assert flags["warm-prefix/4096"].startswith("not_run:exceeds_context_window:")
    assert flags["prefill/128"] == "" and flags["longctx/128@0.5"] == ""
    need = int(flags["warm-prefix/4096"].split(":")[-1].split(">")[0])
    assert need > 2 * 4096 and flags["warm-prefix/4096"].endswith(">500")
    # agent: the history outgrows 500 tokens within a few turns; sessions start over and say so
    agent = [r for r in rows if r["suite"] == "agent"]
    assert len(agent) == 4 and all(int(r["context_resets"]) > 0 for r in agent)
    assert all(f"context_resets:{r['context_resets']}" in r["flags"] and r["valid"] == "0" for r in agent)
    # soak: the 1K-token document questions are left out of the mix, the rest ran
    assert "soak_mix_not_run:document:" in flags["soak"] and "chat" not in flags["soak"]
    meta = load_run(tmp_path / "r").meta
    assert meta["config"]["context_fit"]["filler_tokens_per_word"] == 2.0


def test_a_failing_agent_session_backs_off_instead_of_spinning(tmp_path: Path) -> None:
    """Every stream dropped: the closed loop used to re-send at once (thousands of requests
    a second on loopback). With the backoff, a session's sends inside warmup + measure
    (1.2 s) are bounded by the pauses: 0.25 + 0.5 + 1.0 > 1.2, so at most 4 per window."""
    opts = RunOptions(suites=("agent",), concurrency=(1,), decode_tokens=16, agent_corpora=("draftable",),
                      agent_warmup_s=0.2, agent_measure_s=1.0, agent_cooldown_s=1.0, repeats=2)
    with SmallWindowServer(10**6, drop_all=True) as srv:
        s = run(srv.url, "tiny", tmp_path / "a", {"engine": "llamacpp"}, opts)
    sent = [x for x in srv.log if x[0]]
    n_warmups = 2  # one untimed warm-up per window, not counted
    assert 2 <= len(sent) - n_warmups <= 2 * 4, len(sent)
    assert s.n_errors == s.n_requests > 0  # every error is still counted ...
    rows = load_run(tmp_path / "a").rows
    assert all(r["valid"] == "0" and f"errors:{r['n_errors']}" in r["flags"] for r in rows)  # ... and flagged


def test_released_together_points_can_run_on_worker_processes(ds41f: str, tmp_path: Path) -> None:
    """client_workers=2: a concurrency point's streams spread over two worker processes; every request
    logged once, in order, and the row computed by the same code as with one loop."""
    rows = {}
    for workers in (1, 2):
        opts = RunOptions(suites=("concurrency",), concurrency=(4,), decode_tokens=32, repeats=1,
                          client_workers=workers)
        s = run(ds41f, "dsv41-ds41f", tmp_path / f"w{workers}", CONFIG, opts)
        assert s.n_errors == 0 and s.n_requests == 4 * s.n_rows
        lines = [json.loads(x) for x in (tmp_path / f"w{workers}" / "events.jsonl").read_text().splitlines()]
        heads = [x["request"] for x in lines if "request" in x]
        assert len({h["request_id"] for h in heads}) == len(heads)  # warm-ups and counted requests: distinct ids
        counted = [h for h in heads if h["labels"].get("point") == "concurrency/4"]
        assert len(counted) == s.n_requests and all(h["status"] == "ok" for h in counted)
        rows[workers] = {p["point"]: p for p in s.points}["concurrency/4"]["metrics"]
    assert rows[1].keys() == rows[2].keys()
    assert rows[2]["aggregate_tok_s"]["median"] > 0
