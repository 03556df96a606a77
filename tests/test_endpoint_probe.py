"""The one readiness probe (sparkctl/remote/endpoint_probe.py), asked by both sides of one plan.

A tiny OpenAI-style server on loopback (http.server in a thread) plays each case; every
case is asked through the operator's path (the executor's TransportBackend.probe, what
``up``'s ready step calls), the head's path in this process (planrun.HeadBackend.probe)
and the head's path as it runs there: planrun.py and endpoint_probe.py copied into a
directory and imported by a bare interpreter without site-packages (``python3 -S``, no
sparkctl installed). All three must give the same verdict and the same detail.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparkctl.ops.executor import TransportBackend
from sparkctl.remote import endpoint_probe, planrun
from sparkctl.transport import FakeTransport

KEY = "sk-probe-5b0f3c9e1d"
NAME = "m1"
METRIC = "engine_generation_tokens_total"
REMOTE = Path(planrun.__file__).parent


class Endpoint(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.case = "ready"
        self.key: str | None = None  # the key the endpoint wants (serve.api_key_env), None: no key
        self.tokens = 0.0
        self.seen_auth: list[str | None] = []
        self.release = threading.Event()  # the slow case answers only once the test is over

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization")
        self.server.seen_auth.append(got)
        if self.server.key and got != f"Bearer {self.server.key}":  # vLLM's AuthenticationMiddleware
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        s, case = self.server, self.server.case
        if not self._authorized():
            return
        if self.path == "/v1/models":
            if case == "5xx":
                self._send(503, {"error": "engine loading"})
                return
            self._send(200, {"object": "list", "data": [{"id": "other-model" if case == "wrong-name" else NAME}]})
        elif self.path == "/metrics":
            self._send(200, f"# TYPE {METRIC} counter\n{METRIC}{{model=\"{NAME}\"}} {s.tokens}\n", "text/plain")
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        s, case = self.server, self.server.case
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if not self._authorized():
            return
        if case == "slow":
            s.release.wait(30)
            return
        tokens = 0 if case == "finish-stop" else 1
        if case != "stuck-counter":
            s.tokens += tokens
        answer: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                                  "choices": [{"index": 0, "text": " pong"[:tokens * 5],
                                               "finish_reason": "stop" if case == "finish-stop" else "length"}]}
        if case != "no-usage":
            answer["usage"] = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}
        self._send(200, answer)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    srv = Endpoint()
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        t.join(10)


def _refused_url() -> str:
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------- the two sides


Probe = Callable[[str, str | None, "str | None"], tuple[bool, str]]  # (url, metric, key) -> verdict


def _operator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Probe:
    backend = TransportBackend(None, FakeTransport(nodes=["spark-a"]), lambda *_: None)  # type: ignore[arg-type]

    def probe(url: str, metric: str | None, key: str | None) -> tuple[bool, str]:
        monkeypatch.setenv("PROBE_KEY", key) if key else monkeypatch.delenv("PROBE_KEY", raising=False)
        return backend.probe(url, NAME, metric, True, api_key={"env": "PROBE_KEY"})
    return probe


def _spec(tmp_path: Path, key: str | None) -> dict[str, str]:
    """The ready step's api_key params; on the head the key is in the engine's 0600 env file."""
    env_file = tmp_path / "engine.env"
    env_file.write_text(f"SPARKCTL_API_KEY='{key}'\n" if key else "")
    return {"env": "PROBE_KEY_UNSET_ON_HEAD", "var": "SPARKCTL_API_KEY", "file": str(env_file)}


def _head(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Probe:
    backend = planrun.HeadBackend({}, {}, str(tmp_path / "events.jsonl"))

    def probe(url: str, metric: str | None, key: str | None) -> tuple[bool, str]:
        monkeypatch.delenv("PROBE_KEY_UNSET_ON_HEAD", raising=False)
        return backend.probe(url, NAME, metric, True, _spec(tmp_path, key))
    return probe


def _head_as_pushed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Probe:
    opt = tmp_path / "opt-sparkctl"
    opt.mkdir()
    for f in ("planrun.py", "endpoint_probe.py", "putfiles.py"):  # what supervise pushes to the head
        shutil.copy(REMOTE / f, opt / f)

    def probe(url: str, metric: str | None, key: str | None) -> tuple[bool, str]:
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import planrun, endpoint_probe\n"
                "assert 'sparkctl' not in sys.modules, 'the head has no sparkctl package'\n"
                "endpoint_probe.TIMEOUT_S = float(sys.argv[5])\n"
                "b = planrun.HeadBackend({}, {}, '/dev/null')\n"
                "print(json.dumps(b.probe(sys.argv[2], 'm1', sys.argv[3] or None, True, json.loads(sys.argv[4]))))")
        r = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(opt), url, metric or "",
                            json.dumps(_spec(tmp_path, key)), str(endpoint_probe.TIMEOUT_S)],
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        ok, detail = json.loads(r.stdout)
        return ok, detail
    return probe


SIDES = {"operator": _operator, "head": _head, "head-as-pushed": _head_as_pushed}


@pytest.fixture(params=sorted(SIDES))
def probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Probe:
    return SIDES[request.param](monkeypatch, tmp_path)


# --------------------------------------------------------------------------- one verdict per case


def test_ready_with_the_counter_advancing(endpoint: Endpoint, probe: Probe) -> None:
    assert probe(endpoint.url, METRIC, None) == (True, "serving")
    assert endpoint.tokens == 1


def test_the_metric_is_honoured_a_counter_that_stands_still_is_not_ready(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.case = "stuck-counter"
    assert probe(endpoint.url, METRIC, None) == (False, f"generated-token counter {METRIC} did not advance")
    assert probe(endpoint.url, None, None) == (True, "serving")  # no counter named: usage is the witness
    assert probe(endpoint.url, "absent_metric_total", None)[0] is False


def test_a_wrong_model_name_is_not_ready(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.case = "wrong-name"
    assert probe(endpoint.url, METRIC, None) == (False, "/v1/models lists ['other-model'], not 'm1'")


def test_a_completion_without_usage_is_not_ready(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.case = "no-usage"
    assert probe(endpoint.url, None, None) == (False, "1-token completion carried no usage block")


def test_finish_stop_does_not_excuse_zero_tokens(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.case = "finish-stop"
    ok, detail = probe(endpoint.url, None, None)
    assert not ok and detail.startswith("1-token completion returned no tokens"), detail


def test_401_needs_a_key_or_refuses_it_and_never_shows_it(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.key = KEY
    assert probe(endpoint.url, METRIC, None) == (
        False, "/v1/models: HTTP 401, the endpoint needs a key (serve.api_key_env)")
    assert probe(endpoint.url, METRIC, "sk-wrong-key") == (False, "/v1/models: HTTP 401, the key was refused")
    endpoint.seen_auth.clear()
    assert probe(endpoint.url, METRIC, KEY) == (True, "serving")
    # every request (listing, both counter reads, the completion) carried the Bearer key
    assert endpoint.seen_auth == [f"Bearer {KEY}"] * 4


def test_5xx_is_named(endpoint: Endpoint, probe: Probe) -> None:
    endpoint.case = "5xx"
    assert probe(endpoint.url, METRIC, None) == (False, "/v1/models: HTTP 503")


def test_connection_refused_is_not_ready(probe: Probe) -> None:
    ok, detail = probe(_refused_url(), METRIC, KEY)
    assert not ok and "Connection refused" in detail, detail
    assert KEY not in detail


def test_a_slow_endpoint_is_not_ready_and_the_probe_returns(endpoint: Endpoint, probe: Probe,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint_probe, "TIMEOUT_S", 0.5)  # the completion never answers while the test runs
    endpoint.case = "slow"
    ok, detail = probe(endpoint.url, None, KEY)
    assert not ok and "timed out" in detail, detail
    assert KEY not in detail


def test_a_detail_that_quotes_the_key_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: Any, **__: Any) -> Any:
        raise OSError(f"header Authorization: Bearer {KEY} rejected")

    monkeypatch.setattr(endpoint_probe._OPENER, "open", refused)
    ok, detail = endpoint_probe.probe_endpoint("http://127.0.0.1:9", NAME, None, api_key=KEY)
    assert not ok and KEY not in detail and "***" in detail, detail
