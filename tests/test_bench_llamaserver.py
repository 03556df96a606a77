"""llama-server's per-slot window: the simulated server enforces it, the bench learns it and flags what does not fit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkctl.bench import workloads as wl
from sparkctl.bench.options import RunOptions
from sparkctl.bench.results import load_run
from sparkctl.bench.runner import run
from sparkctl.plan import contracts
from sparkctl_sim.engines import llamaserver as ls
from tests.localengine import start_llama_server, stop  # a test driver, not part of the simulator

SPEEDUP = 50.0


def test_the_simulated_command_line_is_the_contracts_and_refuses_as_arg_cpp_does() -> None:
    cfg = ls.parse_args(["--model", "/m.gguf", "--alias", "x", "--ctx-size", "131072", "--parallel", "8",
                         "--n-gpu-layers", "999"])
    assert (cfg.n_parallel, cfg.kv_unified, cfg.n_ctx_slot, cfg.served_name) == (8, False, 16384, "x")
    assert ls.parse_args(["-m", "/m", "-c", "131072", "-np", "8", "-kvu"]).n_ctx_slot == 131072
    assert ls.parse_args(["--model", "/m", "--ctx_size", "8192"]).n_ctx_slot == 8192   # '_' -> '-' on '--' args
    auto = ls.parse_args(["--model", "/m", "--ctx-size", "8192"])  # no --parallel: auto = 4 slots, unified
    assert (auto.n_parallel, auto.kv_unified, auto.n_ctx_slot) == (4, True, 8192)
    assert ls.parse_args(["--model", "/m"]).n_ctx_slot == ls.N_CTX_TRAIN
    # the slot window agrees with the bench's reading of the same flags
    for argv in (["--ctx-size", "131072", "--parallel", "8"], ["--ctx-size", "4096", "--parallel", "2", "-kvu"]):
        assert ls.parse_args(["--model", "/m", *argv]).n_ctx_slot == wl.llama_server_slot_ctx(argv)
    for bad, text in ((["--served-model-name", "x"], "error: invalid argument: --served-model-name"),
                      (["--port=8080"], "error: invalid argument: --port=8080"),   # arg.cpp does not split '='
                      (["--ctx-size", "lots"], 'error while handling argument "--ctx-size": stoi'),
                      (["--port"], 'error while handling argument "--port": expected value for argument')):
        with pytest.raises(ls.ArgError) as e:
            ls.parse_args(["--model", "/m", *bad])
        assert str(e.value).startswith(text)
    c = contracts.load(*ls.CONTRACT)
    assert c is not None and "--served-model-name" not in c.flags and "--kv-unified" in c.flags


def test_a_missing_or_foreign_model_file_is_refused(tmp_path: Path) -> None:
    missing = ls.model_refusal(str(tmp_path / "nope.gguf"))
    assert "failed to open GGUF file" in missing[0] and "No such file" in missing[0]
    (tmp_path / "x.gguf").write_bytes(b"NOTGGUF")
    assert "invalid magic" in ls.model_refusal(str(tmp_path / "x.gguf"))[0]
    (tmp_path / "ok.gguf").write_bytes(b"GGUF" + bytes(28))
    assert ls.model_refusal(str(tmp_path / "ok.gguf")) == []
    assert ls.main(["--model", str(tmp_path / "m"), "--no-such-flag"]) == 1


def test_the_window_falls_back_to_the_rendered_flags_when_there_is_no_props() -> None:
    entry = {"id": "m", "owned_by": "llamacpp", "meta": {"n_ctx_train": 131072}}
    argv = ["--model", "/m", "--ctx-size", "131072", "--parallel", "8"]
    slot = wl.llama_server_slot_ctx(argv)
    assert wl.context_window(entry, None, 131072, slot) == (16384, "llama-server flags: ctx-size / parallel (no /props)")
    props = {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 8}
    assert wl.context_window(entry, props, 131072, slot)[0] == 8192   # what the server says wins
    assert wl.context_window(entry, None, 131072, None) == (131072, "profile model.context_len_tokens")


@pytest.fixture()
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    proc, url = start_llama_server(list(request.param), tmp_path / "llama-server.log", SPEEDUP)
    try:
        yield url
    finally:
        stop(proc)


@pytest.mark.e2e
@pytest.mark.parametrize("server", [["--alias", "m", "--ctx-size", "4096", "--parallel", "8"]], indirect=True)
def test_the_simulated_server_enforces_the_slot_window_and_the_bench_flags_what_does_not_fit(
        server: str, tmp_path: Path) -> None:
    props = httpx.get(server + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 8
    assert [s["n_ctx"] for s in httpx.get(server + "/slots").json()] == [512] * 8
    (entry,) = httpx.get(server + "/v1/models").json()["data"]
    assert entry["id"] == "m" and entry["owned_by"] == "llamacpp"
    m = httpx.get(server + "/metrics")
    assert m.status_code == 501 and "--metrics" in m.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "word " * 600}], "max_tokens": 4})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error" and err["n_ctx"] == 512
    assert err["message"] == (f"request ({err['n_prompt_tokens']} tokens) exceeds the available context size "
                              "(512 tokens), try increasing it")
    # fits the prompt but not the answer: cut where the slot is full (context shift is off)
    r = httpx.post(server + "/v1/completions", json={"prompt": "word " * 500, "max_tokens": 100, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # the bench: the profile says 131072, the server's slot says 512
    opts = RunOptions(suites=("prefill",), lengths=(256, 2048), repeats=1)
    s = run(server, "m", tmp_path / "w", {"engine": "llamacpp", "context_len_tokens": 131072}, opts)
    assert s.n_errors == 0   # nothing over the window was sent
    rows = {r["point"]: r for r in load_run(tmp_path / "w").rows}
    assert {r["context_window_tokens"] for r in rows.values()} == {"512"}
    assert {r["context_window_source"] for r in rows.values()} == {"/props default_generation_settings.n_ctx"}
    assert rows["prefill/2048"]["flags"].startswith("not_run:exceeds_context_window:")
    assert rows["prefill/2048"]["n_requests"] == "0" and rows["prefill/256"]["n_ok"] == "1"


@pytest.mark.e2e
@pytest.mark.parametrize("server", [["--alias", "m", "--ctx-size", "4096", "--parallel", "8", "--kv-unified",
                                     "--metrics"]], indirect=True)
def test_with_kv_unified_one_request_may_use_the_whole_context(server: str, tmp_path: Path) -> None:
    assert httpx.get(server + "/props").json()["default_generation_settings"]["n_ctx"] == 4096
    s = run(server, "m", tmp_path / "w", {"engine": "llamacpp"}, RunOptions(suites=("prefill",), lengths=(2048,),
                                                                          repeats=1))
    assert s.n_errors == 0 and s.points[0]["valid_repeats"] == s.points[0]["repeats"] >= 1
    text = httpx.get(server + "/metrics").text
    samples = dict(ln.split() for ln in text.splitlines() if ln and not ln.startswith("#"))
    c = contracts.load(*ls.CONTRACT)
    assert c is not None and samples and set(samples) <= set(c.metrics)
    assert float(samples["llamacpp:tokens_predicted_total"]) >= 1
