"""The tiny random GGUF: deterministic bytes, and served by the real llama.cpp engine."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkctl_sim import tinymodel
from tests.sim.helpers import free_port

pytest.importorskip("gguf")

READY_DEADLINE_S = 60.0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_written_deterministically(tmp_path: Path) -> None:
    first = tinymodel.write_tiny_gguf(tmp_path / "a.gguf")
    second = tinymodel.write_tiny_gguf(tmp_path / "b.gguf")
    assert _sha256(first) == _sha256(second)
    assert 200_000 < first.stat().st_size < 1_000_000


def test_vocabulary_is_unique_with_byte_tokens() -> None:
    tokens, scores, types = tinymodel._vocabulary()
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[tinymodel.BYTE_TOKEN_BASE] == "<0x00>"
    assert tokens[tinymodel.BYTE_TOKEN_BASE + 255] == "<0xFF>"
    assert len(tokens) - 259 >= 200  # a few hundred ordinary pieces


def test_ensure_writes_once(tmp_path: Path) -> None:
    path = tinymodel.ensure_tiny_model(tmp_path / "cache")
    stamp = path.stat().st_mtime_ns
    again = tinymodel.ensure_tiny_model(tmp_path / "cache")
    assert again == path and again.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [tinymodel.TINY_MODEL_FILENAME]
    assert _sha256(path) == _sha256(tinymodel.write_tiny_gguf(tmp_path / "ref.gguf"))


def _request(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.load(resp)


@pytest.fixture
def tiny_server(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("llama_cpp")
    model = tinymodel.ensure_tiny_model(tmp_path)
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
         "--model_alias", tinymodel.TINY_MODEL_ALIAS, "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "512"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_DEADLINE_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited {proc.returncode}: "
                            + (tmp_path / "server.log").read_text(errors="replace")[-2000:])
            try:
                _request(f"{base}/v1/models", timeout_s=2.0)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail("llama_cpp.server not ready within deadline")
                time.sleep(0.2)
        yield base
    finally:
        with_group = os.getpgid(proc.pid) if proc.poll() is None else None
        if with_group is not None:
            os.killpg(with_group, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(with_group, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.mark.e2e
def test_served_by_llama_cpp(tiny_server: str) -> None:
    models = _request(f"{tiny_server}/v1/models")
    assert [m["id"] for m in models["data"]] == [tinymodel.TINY_MODEL_ALIAS]

    for n_tokens in (1, 17, 64):
        answer = _request(f"{tiny_server}/v1/completions",
                          tinymodel.tiny_completion_request("the ring of sparks", n_tokens))
        assert answer["choices"][0]["finish_reason"] == "length"
        usage = answer["usage"]
        assert usage["completion_tokens"] == n_tokens
        assert usage["total_tokens"] == usage["prompt_tokens"] + n_tokens
        assert usage["prompt_tokens"] > 0

    chat = _request(f"{tiny_server}/v1/chat/completions", {
        "model": tinymodel.TINY_MODEL_ALIAS,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 9, "temperature": 0.7, "seed": 1,
        "logit_bias": tinymodel.exact_length_logit_bias(),
    })
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 9
