"""The SIMULATED engines: performance model, command lines, rendezvous, HTTP API.

Unit tests pin the performance model to published-numbers.yaml; end-to-end
tests start real engine processes on 127.0.0.1 (no namespaces, no root).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkctl_sim import nodestate, perfmodel
from sparkctl_sim.engine import install_engines, main
from sparkctl_sim.engines import cli, runtime
from sparkctl_sim.engines import tokens as tk
from tests.sim.helpers import free_port

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# performance model against the published figures
# ---------------------------------------------------------------------------


def test_ds41f_tp4_reproduces_the_ring_report() -> None:
    m = perfmodel.model_for("ds41f", 4)
    for n, rate in {2048: 4441, 8192: 5783, 32768: 6377, 131072: 6239}.items():
        assert m.prefill_tok_s(n, clock_cap_mhz=2000) == pytest.approx(rate)
        # the bench's definition: prompt tokens / TTFT
        assert n / m.ttft_s(n, clock_cap_mhz=2000) == pytest.approx(rate)
    assert m.prefill_tok_s(2048, clock_cap_mhz=None) == pytest.approx(4758)
    assert m.ttft_s(131072, clock_cap_mhz=2000) == pytest.approx(21.0, abs=1.0)  # "about 20 seconds"
    assert m.per_stream_tok_s(1) == pytest.approx(67.0)
    assert m.aggregate_tok_s(4) == pytest.approx(162)
    assert m.aggregate_tok_s(16) == pytest.approx(328)
    assert m.per_stream_tok_s(16) == pytest.approx(328 / 16)
    # interpolation stays between the published neighbours, and saturates after
    assert 67 < m.aggregate_tok_s(2) < 162 < m.aggregate_tok_s(8) < 328
    assert m.aggregate_tok_s(64) == pytest.approx(328)
    assert 5783 <= m.prefill_tok_s(16384, 2000) <= 6377


def test_tensorfold_tp4_capped_and_uncapped() -> None:
    m = perfmodel.model_for("tensorfold", 4)
    for n, capped, uncapped in ((8192, 3060, 3265), (32768, 3152, 3393), (131072, 2928, 3129)):
        assert m.prefill_tok_s(n, 2000) == pytest.approx(capped)
        assert m.prefill_tok_s(n, None) == pytest.approx(uncapped)
        assert capped < m.prefill_tok_s(n, 2500) < uncapped
        assert m.prefill_tok_s(n, 1000) == pytest.approx(capped / 2)
    assert m.ttft_s(131072, clock_cap_mhz=2000) == pytest.approx(42, abs=3)
    assert [m.aggregate_tok_s(c) for c in (1, 4, 16)] == pytest.approx([63.7, 133, 193])


def test_decode_ignores_the_clock_cap_and_stale_halves_everything() -> None:
    m = perfmodel.model_for("ds41f", 4)
    capped, uncapped = m.describe(2000)["effective"], m.describe(None)["effective"]
    assert capped["per_stream_tok_s"] == uncapped["per_stream_tok_s"]
    assert capped["prefill_tok_s"]["32768"] < uncapped["prefill_tok_s"]["32768"]
    assert m.per_stream_tok_s(1, stale=True) == pytest.approx(33.5)
    assert m.aggregate_tok_s(16, stale=True) == pytest.approx(164)
    assert m.prefill_tok_s(32768, 2000, stale=True) == pytest.approx(6377 / 2)


def test_two_node_figures() -> None:
    tf = perfmodel.model_for("tensorfold", 2)
    assert tf.per_stream_tok_s(1) == pytest.approx(60)
    assert tf.aggregate_tok_s(4) == pytest.approx(221.8)
    assert tf.prefill_tok_s(32768, 2100) == pytest.approx(2400)  # measured at a 2100 MHz cap
    assert tf.prefill_tok_s(992000, 2100) == pytest.approx(1618)
    v = perfmodel.model_for("vllm", 2)
    assert v.per_stream_tok_s(1) == pytest.approx(65.8)
    assert v.prefill_tok_s(32000, 2100) == pytest.approx(1800)
    assert v.ttft_s(10) == pytest.approx(0.7)
    s = perfmodel.model_for("sglang", 2)
    assert s.per_stream_tok_s(1) == pytest.approx(35)
    assert s.prefill_tok_s(32768, 2100) == pytest.approx(2600)
    ds = perfmodel.model_for("ds41f", 2)
    assert ds.per_stream_tok_s(1) == pytest.approx(60)
    # "going from two to four nodes multiplied prefill by more than 2.5"
    assert perfmodel.model_for("ds41f", 4).prefill_tok_s(32768, 2000) / ds.prefill_tok_s(32768, 2000) > 2.5


def test_every_engine_and_size_has_a_sane_model() -> None:
    for engine in perfmodel.ENGINES:
        for tp in (1, 2, 3, 4, 8):
            m = perfmodel.model_for(engine, tp)
            assert m.tp == tp
            rates = [m.aggregate_tok_s(c) for c in (1, 2, 4, 8, 16, 32)]
            assert rates == sorted(rates) and rates[0] > 0
            assert m.derived == (tp not in (2, 4) or (engine in ("vllm", "sglang") and tp == 4))
    with pytest.raises(ValueError):
        perfmodel.model_for("llamacpp", 1)


def test_prefix_cache_only_charges_uncached_tokens() -> None:
    m = perfmodel.model_for("ds41f", 4)
    assert m.ttft_s(32768, uncached_tokens=32768 - 32512) == pytest.approx(m.base_latency_s)
    assert m.ttft_s(32768, 16384, 2000) == pytest.approx(16384 / 6377)


# ---------------------------------------------------------------------------
# tokenizer, prefix cache, answers
# ---------------------------------------------------------------------------


def test_tokenizer_and_chat_template() -> None:
    assert len(tk.tokenize_prompt("a b  c\nd")) == 4
    assert len(tk.tokenize_prompt([1, 2, 3])) == 3
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "x y z"}]}]
    assert len(tk.tokenize_chat(msgs)) == 2 + 3 + 4 * 2
    with pytest.raises(tk.PromptError):
        tk.tokenize_prompt(["a", "b"])


def test_prefix_cache_pages() -> None:
    pc = tk.PrefixCache()
    toks = [f"w{i}" for i in range(1000)]
    assert pc.lookup(toks) == 0
    pc.insert(toks)
    assert pc.lookup(toks) == 768
    assert pc.lookup(toks[:513]) == 512
    assert pc.lookup(toks[:512]) == 256  # the last prompt token is always computed
    assert pc.lookup(["salt"] + toks) == 0


def test_answers_are_deterministic() -> None:
    toks = "a short prompt".split()
    a = tk.plan_answer(toks, max_tokens=1000, seed=7)
    assert a == tk.plan_answer(toks, max_tokens=1000, seed=7)
    assert 120 <= len(a.pieces) <= 220 and a.finish_reason == "stop"
    assert len(tk.plan_answer(toks, max_tokens=256, ignore_eos=True).pieces) == 256
    assert len(tk.plan_answer(toks, max_tokens=600, min_tokens=500).pieces) == 500
    b = tk.plan_answer(toks, max_tokens=10)
    assert (len(b.pieces), b.finish_reason) == (10, "length")
    word = a.text.split()[5]
    c = tk.plan_answer(toks, max_tokens=1000, seed=7, stop=[word])
    assert c.finish_reason == "stop" and word not in c.text and c.stop_reason == word


# ---------------------------------------------------------------------------
# command lines, NCCL_IB_HCA, node state
# ---------------------------------------------------------------------------


def _sysfs(tmp_path: Path, devs: tuple[str, ...] = ("rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1")) -> Path:
    root = tmp_path / "sysfs"
    for d in devs:
        (root / "class" / "infiniband" / d / "ports" / "1").mkdir(parents=True)
    return root


def test_nccl_ib_hca_selection(tmp_path: Path) -> None:
    known = cli.known_ib_devices(_sysfs(tmp_path))
    names = lambda spec: [d.name for d in cli.select_ib_devices(spec, known)]  # noqa: E731
    assert names("") == names(None) == sorted(known)
    assert names("=rocep1s0f0,roceP2p1s0f0") == ["rocep1s0f0", "roceP2p1s0f0"]
    assert names("=rocep1s0f0:1") == ["rocep1s0f0"]
    assert names("rocep1s0") == ["rocep1s0f0", "rocep1s0f1"]  # prefix match without '='
    assert names("^=rocep1s0f0") == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f1"]
    assert names("^mlx5") == sorted(known)  # excluding what is absent is fine
    for bad in ("=rocep1s0f", "=mlx5_0", "rocep9", "=rocep1s0f0:2"):
        with pytest.raises(cli.HcaError):
            cli.select_ib_devices(bad, known)


def test_bad_nccl_ib_hca_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"SPARKCTL_SYSFS_ROOT": str(_sysfs(tmp_path, ("rocep1s0f0",))), "NCCL_IB_HCA": "=rocep1s0f0,roceP2p1s0f0"}
    argv = ["vllm", "serve", "/m", "--port", str(free_port()), "--host", "127.0.0.1"]
    assert main(argv, env) == 1
    err = capsys.readouterr().err
    assert "NCCL WARN" in err and "roceP2p1s0f0" in err


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["ds41f", "serve", "--model", "/m", "--tp", "4", "--nnodes", "4", "--master-addr", "a", "--master-port", "1"],
         {}, "--node-rank"),
        (["ds41f", "serve", "--model", "/m", "--tp", "4", "--nnodes", "2", "--node-rank", "0"], {}, "differ"),
        (["tensorfold", "serve", "--weights", "/m", "--name", "x", "--tp", "2", "--world", "2", "--rank", "2",
          "--rendezvous", "127.0.0.1:9"], {}, "out of range"),
        (["vllm", "serve", "/m", "-tp", "2", "--nnodes", "2", "--node-rank", "1", "--headless",
          "--master-addr", "h", "--master-port", "9"], {"WORLD_SIZE": "4"}, "WORLD_SIZE=4"),
        (["vllm", "serve", "/m", "-tp", "2", "--nnodes", "2", "--node-rank", "1",
          "--master-addr", "h", "--master-port", "9"], {}, "--headless"),
        (["sglang", "--model-path", "/m", "--tp", "2", "--nnodes", "2", "--dist-init-addr", "h:9"], {}, "--node-rank"),
        (["vllm", "serve", "/m", "--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        # vLLM 0.11.2's CacheDType (vllm/config/cache.py), in argparse's own words:
        (["vllm", "serve", "/m", "--kv-cache-dtype", "nvfp4_ds_mla"], {},
         "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'nvfp4_ds_mla' (choose from 'auto', "
         "'bfloat16', 'fp8', 'fp8_ds_mla', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')"),
        (["sglang", "--model-path", "/m", "--kv-cache-dtype", "fp8"], {}, "invalid choice: 'fp8'"),
    ],
)
def test_inconsistent_command_lines_exit_2(
    argv: list[str], env: dict[str, str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, env) == 2
    assert needle in capsys.readouterr().err


def test_perf_facts_from_node_state() -> None:
    st = nodestate.default_state("spark-a")
    assert runtime.perf_facts(st) == {"clock_cap_mhz": None, "stale": False, "wedged": False}
    st["gpu"]["clock_lock_mhz"] = [0, 2000]
    st["links"]["enp1s0f0np0"]["stale"] = True  # not cabled: does not count
    assert runtime.perf_facts(st)["clock_cap_mhz"] == 2000 and not runtime.perf_facts(st)["stale"]
    st["links"]["enp1s0f0np0"]["cabled"] = True
    assert runtime.perf_facts(st)["stale"]
    worst = runtime.combine([runtime.perf_facts(st), {"clock_cap_mhz": 1800, "stale": False, "wedged": True}])
    assert worst == {"clock_cap_mhz": 1800, "stale": True, "wedged": True}


# ---------------------------------------------------------------------------
# end to end on 127.0.0.1
# ---------------------------------------------------------------------------


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(pred: Any, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKCTL_", "NCCL_")) and k not in
           ("WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = open(log, "w")  # noqa: SIM115
        self.p = subprocess.Popen(args, env=env, stdout=self._fh, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)
        self._fh.close()


def _http(port: int, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read().decode(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


async def _stream(port: int, body: dict[str, Any], path: str = "/v1/completions") -> tuple[list[float], list[dict[str, Any]]]:
    """Arrival times of the token chunks, and every parsed chunk."""
    import aiohttp

    stamps: list[float] = []
    chunks: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}{path}", json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            chunks.append(c)
            if c["choices"]:
                stamps.append(time.monotonic())
    return stamps, chunks


def _rank_cmd(bin_dir: Path, rank: int, mport: int, hport: int, name: str = "dsv41") -> list[str]:
    return [str(bin_dir / "ds41f"), "serve", "--model", "/models/DeepSeek-V4.1-Flash-1017", "--served-model-name",
            name, "--tp", "4", "--nnodes", "4", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
            "--master-port", str(mport), "--host", "127.0.0.1", "--port", str(hport), "--max-model-len", "262144",
            "--gpu-memory-utilization", "0.85"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("engines")
    install_engines(root / "bin", root / "pkgs")
    return root / "bin", root / "pkgs"


@pytest.mark.e2e
def test_installed_wrappers_refuse_unknown_flags(installed: tuple[Path, Path]) -> None:
    bin_dir, pkgs = installed
    runs = {
        "ds41f": [str(bin_dir / "ds41f"), "serve", "--model", "/m", "--tp", "1", "--nnodes", "1",
                  "--node-rank", "0", "--bogus"],
        "tensorfold": [str(bin_dir / "tensorfold"), "serve", "--weights", "/m", "--name", "x", "--tp", "1",
                       "--world", "1", "--rank", "0", "--bogus"],
        "vllm": [str(bin_dir / "vllm"), "serve", "/m", "--bogus"],
        "sglang": [sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--bogus"],
    }
    env = _env(PYTHONPATH=str(pkgs))  # the wrappers find sparkctl on their own
    procs = {k: subprocess.Popen(v, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, v in runs.items()}
    for name, p in procs.items():
        _, err = p.communicate(timeout=30)
        assert p.returncode == 2, (name, err)
        assert "unrecognized arguments: --bogus" in err, (name, err)


@pytest.fixture(scope="module")
def ring(installed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A ds41f TP4 world on 127.0.0.1 at speed-up 50; rank 3 starts late."""
    bin_dir, _ = installed
    logs = tmp_path_factory.mktemp("ring")
    mport, hport = free_port(), free_port()
    env = _env(SPARKCTL_SIM_SPEEDUP="50", SPARKCTL_HOST_IP="127.0.0.1", SPARKCTL_SIM_RDZV_TIMEOUT_S="60")
    procs: dict[Any, Proc] = {}
    ctx: dict[str, Any] = {"procs": procs, "hport": hport, "mport": mport, "env": env, "bin": bin_dir, "logs": logs}
    try:
        for r in (0, 1, 2):
            procs[r] = Proc(_rank_cmd(bin_dir, r, mport, hport), env, logs / f"rank{r}.log")
        yield ctx
    finally:
        for p in procs.values():
            p.stop()


@pytest.mark.e2e
def test_head_waits_for_every_rank_and_refuses_impostors(ring: dict[str, Any]) -> None:
    procs, hport, mport, env, bin_dir, logs = (ring[k] for k in ("procs", "hport", "mport", "env", "bin", "logs"))
    # three of four ranks: the HTTP port must stay closed
    assert not _wait(lambda: _port_open(hport), 2.5)
    # a second rank 1 and a rank with another served name are refused and exit non-zero
    procs["dup"] = Proc(_rank_cmd(bin_dir, 1, mport, hport), env, logs / "dup.log")
    procs["name"] = Proc(_rank_cmd(bin_dir, 3, mport, hport, name="other"), env, logs / "name.log")
    assert procs["dup"].wait(15) not in (0, None)
    assert procs["name"].wait(15) not in (0, None)
    assert "duplicate rank 1" in procs["dup"].text()
    assert "served name" in procs["name"].text()
    assert "refused rank 1" in procs[0].text()
    assert not _port_open(hport)
    procs[3] = Proc(_rank_cmd(bin_dir, 3, mport, hport), env, logs / "rank3.log")
    assert _wait(lambda: _port_open(hport), 20), procs[0].text()
    head = procs[0].text()
    assert "Init COMPLETE" in head and "server ready on http://127.0.0.1" in head
    assert head.index("Init COMPLETE") < head.index("server ready")


@pytest.mark.e2e
def test_ring_serves_models_and_exact_usage(ring: dict[str, Any]) -> None:
    hport = ring["hport"]
    assert _wait(lambda: _port_open(hport), 20)
    status, models = _http(hport, "/v1/models")
    assert status == 200
    (entry,) = models["data"]
    assert (entry["id"], entry["root"], entry["owned_by"], entry["max_model_len"]) == (
        "dsv41", "/models/DeepSeek-V4.1-Flash-1017", "ds41f", 262144)
    prompt = " ".join(f"w{i}" for i in range(600))
    body = {"model": "dsv41", "prompt": prompt, "max_tokens": 40, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "temperature": 0, "seed": 1}
    stamps, chunks = asyncio.run(_stream(hport, body))
    assert len(stamps) == 40
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 600, "completion_tokens": 40, "total_tokens": 640,
                                   "prompt_tokens_details": {"cached_tokens": 0}}
    # the same prompt again reads two full pages from the prefix cache
    status, out = _http(hport, "/v1/completions", {**body, "stream": False, "stream_options": None})
    assert status == 200 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 512
    # chat: 4 template tokens per message; a natural end without ignore_eos
    status, out = _http(hport, "/v1/chat/completions",
                        {"model": "dsv41", "messages": [{"role": "user", "content": "one two three"}]})
    assert status == 200 and out["usage"]["prompt_tokens"] == 7
    assert 120 <= out["usage"]["completion_tokens"] <= 220 and out["choices"][0]["finish_reason"] == "stop"
    status, _ = _http(hport, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404
    _, metrics = _http(hport, "/metrics")
    line = next(ln for ln in metrics.splitlines() if ln.startswith("ds41f_generation_tokens_total{"))
    assert float(line.split()[-1]) >= 80
    assert "sparkctl_sim_speedup 50.0" in metrics
    _, info = _http(hport, "/sim/info")
    assert info["speedup"] == 50 and info["tp"] == 4 and info["perf"]["decode_aggregate_points_tok_s"]["16"] == 328


@pytest.mark.e2e
def test_killing_a_rank_takes_the_head_down(ring: dict[str, Any]) -> None:
    procs = ring["procs"]
    assert _wait(lambda: _port_open(ring["hport"]), 20)
    procs[2].p.send_signal(signal.SIGKILL)
    code = procs[0].wait(15)
    assert code not in (0, None)
    assert "remote process exited" in procs[0].text()
    for r in (1, 3):  # the others lose rank 0 and exit non-zero too
        assert procs[r].wait(15) not in (0, None)


@pytest.fixture(scope="module")
def single(installed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A one-node vLLM (speed-up 10) and TensorFold (speed-up 20), each with a node state file."""
    bin_dir, _ = installed
    d = tmp_path_factory.mktemp("single")
    out: dict[str, Any] = {}
    procs: list[Proc] = []
    try:
        for engine, speed in (("vllm", "10"), ("tensorfold", "20")):
            state = d / f"{engine}.json"
            nodestate.save(state, nodestate.default_state(f"spark-{engine}"))
            port = free_port()
            if engine == "vllm":
                cmd = [str(bin_dir / "vllm"), "serve", "/models/v4", "--served-model-name", "v4", "--host",
                       "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.8"]
            else:
                cmd = [str(bin_dir / "tensorfold"), "serve", "--weights", "/models/v41", "--name", "v41", "--tp", "1",
                       "--world", "1", "--rank", "0", "--listen", f"127.0.0.1:{port}", "--ctx", "65536",
                       "--mem-fraction", "0.5"]
            env = _env(SPARKCTL_SIM_SPEEDUP=speed, SPARKCTL_SIM_STATE=str(state), SPARKCTL_SIM_LOAD_S="1")
            p = Proc(cmd, env, d / f"{engine}.log")
            procs.append(p)
            out[engine] = {"proc": p, "port": port, "state": state}
        for v in out.values():
            assert _wait(lambda: _port_open(v["port"]), 20), v["proc"].text()  # noqa: B023
        yield out
    finally:
        for p in procs:
            p.stop()


@pytest.mark.e2e
def test_decode_rate_is_accurate(single: dict[str, Any]) -> None:
    port = single["vllm"]["port"]
    _, info = _http(port, "/sim/info")
    assert "Application startup complete." in single["vllm"]["proc"].text()
    speed = info["speedup"]
    assert speed == 10
    per_stream = info["perf"]["effective"]["per_stream_tok_s"]
    body = {"prompt": "measure decode", "max_tokens": 256, "ignore_eos": True, "stream": True}
    stamps, _ = asyncio.run(_stream(port, body))
    assert len(stamps) == 256
    rate = 255 / (stamps[-1] - stamps[0])
    assert rate == pytest.approx(per_stream["1"] * speed, rel=0.02)

    async def four() -> list[list[float]]:
        return [s for s, _ in await asyncio.gather(*(_stream(port, {**body, "max_tokens": 128}) for _ in range(4)))]

    t = asyncio.run(four())
    window = max(s[-1] for s in t) - min(s[0] for s in t)
    assert 4 * 127 / window == pytest.approx(info["perf"]["effective"]["aggregate_tok_s"]["4"] * speed, rel=0.03)


@pytest.mark.e2e
def test_tensorfold_request_rules_and_node_state(single: dict[str, Any]) -> None:
    tf = single["tensorfold"]
    port, state = tf["port"], tf["state"]
    pid = str(tf["proc"].p.pid)
    assert nodestate.load(state)["engine_mem_gib"] == {pid: pytest.approx(0.5 * 119)}
    status, err = _http(port, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "think"}], "reasoning_effort": 2})
    assert status == 400 and "string" in err["error"]["message"]
    status, out = _http(port, "/v1/completions", {"prompt": "a b", "max_tokens": 1000, "ignore_eos": True,
                                                  "reasoning_effort": "high"})
    assert status == 200 and out["usage"]["completion_tokens"] <= 220  # ignore_eos is not a TensorFold knob
    # a stale cabled twin halves decode; the engine re-reads the state within 0.5 s
    with nodestate.edit(state) as st:
        st["links"]["enp1s0f1np1"].update(stale=True, cabled=True)
        st["gpu"]["clock_lock_mhz"] = [0, 2000]
    time.sleep(0.6)
    _, info = _http(port, "/sim/info")
    assert info["stale"] and info["clock_cap_mhz"] == 2000
    base = perfmodel.model_for("tensorfold", 1).per_stream_tok_s(1)
    assert info["perf"]["effective"]["per_stream_tok_s"]["1"] == pytest.approx(base / 2)
    # wedged: health and models answer, completions hang
    with nodestate.edit(state) as st:
        st["faults"]["wedged"] = True
    time.sleep(0.6)
    assert _http(port, "/health")[0] == 200 and _http(port, "/v1/models")[0] == 200
    with pytest.raises(OSError):  # urllib's timeout
        _http(port, "/v1/completions", {"prompt": "hello", "max_tokens": 5}, timeout=1.0)
    with nodestate.edit(state) as st:
        st["faults"]["wedged"] = False
        st["faults"]["leak_on_death"] = True
    time.sleep(0.6)
    assert _http(port, "/v1/completions", {"prompt": "hello", "max_tokens": 5})[0] == 200
    tf["proc"].p.send_signal(signal.SIGTERM)
    assert tf["proc"].wait(10) == 0
    st = nodestate.load(state)
    assert st["engine_mem_gib"] == {} and st["leaked_mem_gib"] == pytest.approx(0.5 * 119)


@pytest.mark.e2e
def test_sigterm_releases_memory(single: dict[str, Any]) -> None:
    v = single["vllm"]
    assert str(v["proc"].p.pid) in nodestate.load(v["state"])["engine_mem_gib"]
    v["proc"].p.send_signal(signal.SIGTERM)
    assert v["proc"].wait(10) == 0
    st = nodestate.load(v["state"])
    assert st["engine_mem_gib"] == {} and st["leaked_mem_gib"] == 0.0


def test_simulated_vllm_and_sglang_take_their_flags_from_the_contract() -> None:
    from sparkctl.plan import contracts

    for engine, argv in (("vllm", ["serve", "/m"]), ("sglang", ["--model-path", "/m"])):
        c = cli.contract(engine)
        assert c is not None
        # a flag of the real release the simulator does not model is still accepted ...
        real = "--enable-chunked-prefill" if engine == "vllm" else "--enable-torch-compile"
        assert real in c.flags and cli.parse(engine, argv + [real], {}).argv[-1] == real
        # ... and one it lacks is refused, as by the release's parser
        with pytest.raises(cli.UsageError, match="unrecognized arguments"):
            cli.parse(engine, argv + ["--sparkctl-invented"], {})
        assert contracts.validate(c, argv + [real]) == []


@pytest.mark.parametrize("flags,served", [([], False), (["--enable-metrics"], True)])
def test_simulated_sglang_serves_metrics_only_with_enable_metrics(flags: list[str], served: bool) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from sparkctl_sim.engines.logs import EngineLog
    from sparkctl_sim.engines.server import Engine, PerfState, build_app

    cfg = cli.parse("sglang", ["--model-path", "/m", "--served-model-name", "q", *flags], {})
    engine = Engine(cfg, EngineLog("sglang", 0), 100.0, lambda: PerfState())

    async def go() -> tuple[int, int, int, str]:
        async with TestClient(TestServer(build_app(engine))) as client:
            m = await client.get("/metrics")
            text = await m.text()
            h = await client.get("/health")
            v = await client.get("/v1/models")
            return m.status, h.status, v.status, text

    metrics, health, models, text = asyncio.run(go())
    assert (health, models) == (200, 200)
    assert metrics == (200 if served else 404)  # sglang/srt/entrypoints/http_server.py: only if enable_metrics
    assert ("sglang:generation_tokens_total" in text) is served
