#!/usr/bin/env python3
"""What the gateway costs: time to first token and throughput through smg against the replica directly.

One run, side by side, on loopback: the REAL llama.cpp engine (llama-cpp-python on the tiny GGUF,
with llama-server's /health, sparkctl_sim/llamacpp_routes) and the REAL gateway (smg 1.13.0, from
the pinned wheel sparkctl installs, ``sparkctl.ops.wheelhouse``), the engine registered through
``sparkctl/remote/gateway_ctl.py`` as ``up`` does. Requests alternate between the two paths (A, B,
A, B, ...) so drift in the engine hits both alike.

* TTFT: streamed chat completions, one at a time: from the request's first byte to the first
  SSE frame carrying content; p50, p99 per path and the difference (target: p50 adds <= 1 ms).
* throughput: ``--concurrency`` requests at once (not streamed, 32 tokens each) for
  ``--throughput-requests`` requests per path: completion tokens per second as usage counts them
  (a gateway may re-frame a stream, so frames are not tokens), per path and the ratio, twice.

Prints figures; asserts nothing. Needs llama-cpp-python and the package index once (the wheel
is cached). Example: ``python tools/gateway_overhead.py --requests 200``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkctl.model import wheels  # noqa: E402
from sparkctl.ops.wheelhouse import fetch_wheel  # noqa: E402
from sparkctl.plan.gatewayplan import _wheels_for  # noqa: E402
from sparkctl_sim.tinymodel import TINY_MODEL_ALIAS, ensure_tiny_model  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(port: int, path: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"127.0.0.1:{port}{path} did not answer within {deadline_s:.0f} s")


def _platform() -> wheels.NodePlatform:
    import platform

    g = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()
    return wheels.NodePlatform(platform.machine(), "%d.%d" % sys.version_info[:2], sys.implementation.name,
                               g[1] if len(g) == 2 else "")


def _stream(port: int, body: bytes) -> tuple[float, int]:
    """(seconds to the first content frame, completion tokens) of one streamed chat completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, tokens = None, 0
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        frame = json.loads(line[5:])
        delta = (frame.get("choices") or [{}])[0].get("delta") or {}
        if ttft is None and delta.get("content"):
            ttft = time.perf_counter() - t0
        if delta.get("content"):
            tokens += 1
    c.close()
    return (ttft if ttft is not None else float("nan")), tokens


def _complete(port: int, body: bytes) -> int:
    """Completion tokens (usage) of one non-streamed request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
    return int(json.loads(data)["usage"]["completion_tokens"])


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="TTFT samples per path")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--throughput-requests", type=int, default=40)
    ap.add_argument("--gateway-arg", action="append", default=[], help="extra smg launch argument (repeatable), "
                    "e.g. --gateway-arg=--policy --gateway-arg=round_robin")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    site = work / "site"
    for pin in _wheels_for(_platform(), "1.13.0", "this machine"):
        with zipfile.ZipFile(fetch_wheel(pin)) as z:
            z.extractall(site)
    model = ensure_tiny_model(work / "model")
    ep, gp, mp = _port(), _port(), _port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sparkctl_sim.llamacpp_routes.llama_cpp.server", "--model", str(model),
             "--model_alias", TINY_MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(ep), "--n_ctx", "512",
             "--interrupt_requests", "False"], stdout=open(work / "engine.log", "wb"), stderr=subprocess.STDOUT,
            env=env, start_new_session=True))
        procs.append(subprocess.Popen(
            [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
             "from smg.cli import main; main()", str(site), "launch", "--host", "127.0.0.1", "--port", str(gp),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mp), "--log-level", "warn", *a.gateway_arg],
            stdout=open(work / "gateway.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True))
        _wait_http(ep, "/health", 120)
        _wait_http(gp, "/workers", 60)
        cfg = work / "gateway.json"
        cfg.write_text(json.dumps({"url": f"http://127.0.0.1:{gp}", "records": []}))
        ctl = [sys.executable, str(REPO / "sparkctl/remote/gateway_ctl.py")]
        subprocess.run([*ctl, "register", "--config", str(cfg), "--backend", f"http://127.0.0.1:{ep}",
                        "--model", TINY_MODEL_ALIAS, "--timeout", "60"], check=True)
        body = json.dumps({"model": TINY_MODEL_ALIAS, "messages": [{"role": "user", "content": "hello"}],
                           "max_tokens": a.max_tokens, "stream": True, "temperature": 0}).encode()
        plain = json.dumps({**json.loads(body), "stream": False, "max_tokens": 32}).encode()
        for port in (ep, gp, ep, gp):  # warm both paths (connection pools, first-request costs)
            _stream(port, body)
        ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
        for _ in range(a.requests):
            for name, port in (("direct", ep), ("gateway", gp)):
                ttft[name].append(_stream(port, body)[0])

        def throughput(port: int) -> float:
            tokens, lock = [0], threading.Lock()
            todo = list(range(a.throughput_requests))

            def worker() -> None:
                while True:
                    with lock:
                        if not todo:
                            return
                        todo.pop()
                    n = _complete(port, plain)
                    with lock:
                        tokens[0] += n
            t0 = time.perf_counter()
            ts = [threading.Thread(target=worker) for _ in range(a.concurrency)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return tokens[0] / (time.perf_counter() - t0)

        tput = {"direct": throughput(ep), "gateway": throughput(gp)}
        tput2 = {"direct": throughput(ep), "gateway": throughput(gp)}  # twice, alternating: drift shows
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)

    ms = {k: [x * 1000 for x in v] for k, v in ttft.items()}
    print(f"gateway overhead: smg 1.13.0 in front of llama-cpp-python (tiny GGUF), loopback, "
          f"{a.requests} alternating streams per path, max_tokens {a.max_tokens}")
    print(f"{'':10s} {'TTFT p50 ms':>12s} {'TTFT p99 ms':>12s} {'mean ms':>9s} {'tok/s (c=' + str(a.concurrency) + ')':>14s}")
    for k in ("direct", "gateway"):
        print(f"{k:10s} {_pct(ms[k], 0.5):12.2f} {_pct(ms[k], 0.99):12.2f} {statistics.mean(ms[k]):9.2f} "
              f"{tput[k]:8.1f} /{tput2[k]:6.1f}")
    d50 = _pct(ms["gateway"], 0.5) - _pct(ms["direct"], 0.5)
    d99 = _pct(ms["gateway"], 0.99) - _pct(ms["direct"], 0.99)
    paired = statistics.median(g - d for g, d in zip(ms["gateway"], ms["direct"]))
    print(f"gateway adds: p50 {d50:+.2f} ms, p99 {d99:+.2f} ms, median of paired differences {paired:+.2f} ms "
          f"(target p50 <= +1 ms); throughput ratio {tput['gateway'] / tput['direct']:.3f} / "
          f"{tput2['gateway'] / tput2['direct']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
