"""Helpers shared by the tests on the SIMULATED cluster (tests/sim/), imported by its conftest.

The handle on a simulated cluster (:class:`Sim`, built by :func:`make_sim` through
the real CLI), polling (:func:`wait_until`), the page-size waiver every bundled
profile needs on the simulated stock kernel, and the views of a running stack
that several modules read (``status --json``, the served model names, the engine
processes on a node).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sparkctl.model.inventory import load_inventory
from sparkctl.model.schema import GatewaySpec
from sparkctl_sim import procshims
from sparkctl_sim.tinymodel import exact_length_logit_bias

RING = ("spark-a", "spark-b", "spark-c", "spark-d")
# The simulated nodes boot the stock 4 KiB-page kernel (as in the field report); the
# page_size law fails there, so the tests that run bundled profiles waive it.
WAIVE_REASON = "stock 4 KiB kernel, as in the field report"
WAIVE = ("--waive", "page_size", "--reason", WAIVE_REASON)
# The engine processes of a node: the simulated ds41f and tensorfold, and the real llama.cpp server.
ENGINE_PS = "ps -eo pid,args | grep -E '[d]s41f serve|[t]ensorfold serve|[l]lama_cpp.server' || true"


@dataclass
class Sim:
    root: Path
    inventory: Path
    env: dict[str, str]

    def sparkctl(self, *args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "sparkctl.cli", *args], env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"sparkctl {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def ssh(self, node: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        from sparkctl_sim import cluster

        return subprocess.run([*cluster.ssh_argv(self.root, node), command], capture_output=True, text=True,
                              timeout=timeout)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@dataclass
class ShimHost:
    """A directory with the simulator's process shims (docker, systemctl) installed: no cluster, no namespace."""
    root: Path
    env: dict[str, str]

    @property
    def run_dir(self) -> Path:
        return Path(self.env[procshims.RUN_DIR_ENV])

    @property
    def unit_dir(self) -> Path:
        return Path(self.env[procshims.UNIT_DIR_ENV])

    def run(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)

    def unit(self, name: str, body: str) -> Path:
        path = self.unit_dir / name
        path.write_text(textwrap.dedent(body).lstrip())
        return path

    def recorded_pids(self) -> set[int]:
        pids: set[int] = set()
        for path in self.run_dir.rglob("*.json"):
            rec = json.loads(path.read_text())
            for key in ("pid", "monitor_pid", "MainPID"):
                if isinstance(rec.get(key), int) and rec[key] > 0:
                    pids.add(rec[key])
            if isinstance(rec.get("supervisor"), dict):
                pids.add(int(rec["supervisor"]["pid"]))
        return pids


def wait_until(predicate, deadline_s: float = 120.0, every_s: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it holds or the deadline passes; its last answer.

    A deadline for waiting only: the e2e assertions are on states, never on durations."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def make_sim(tmp: Path, nodes: int, *, ready: bool = True, load_images: bool = True,
              up_args: tuple[str, ...] = (), speedup: str = "20") -> Iterator[Sim]:
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state"),
           "SPARKCTL_SIM_SPEEDUP": speedup, "SPARKCTL_SIM_LOAD_S": "1"}
    env.pop("SPARKCTL_INVENTORY", None)
    sim = Sim(tmp / "sim", tmp / "sim" / "inventory.yaml", env)
    r = sim.sparkctl("sim", "up", "--nodes", str(nodes), *(["--ready"] if ready else []),
                     *([] if load_images else ["--no-images"]), *up_args, timeout=300)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        # SIMULATION: a real Spark has no engine image until its operator builds or
        # pulls one; the simulated nodes start with none either. Stand in for that
        # here, explicitly, so the tests that run bundled profiles find their images.
        if load_images:
            r = sim.sparkctl("sim", "image", "load", "all", "--bundled", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
        yield sim
    finally:
        sim.sparkctl("sim", "down", timeout=120)


# the gateway's port where a profile does not set serve.gateway.port (the schema's default)
GW_PORT = GatewaySpec.model_fields["port"].default
LOAD_PERIOD_S = 0.25  # the open-loop load's period (Load)
SHORT_TOKENS = 3
BODY = {"model": "tiny-llama", "messages": [{"role": "user", "content": "count to ten"}],
        "max_tokens": SHORT_TOKENS, "stream": True, "temperature": 0}
# SIMULATED decode speed: the tiny engine paces its stream at one event a second (SPARKCTL_SIM_DECODE_MS in the
# rolling switch's profiles: sparkctl_sim/llamacpp_routes), so a 3-token answer streams for about 5 s and a long one of 62
# tokens (EOS biased away: exactly 62) for over a minute. Slow per token on purpose: a long stream needs few
# tokens, and llama-cpp-python's streaming costs more per token the longer the answer (measured on this
# engine, 16 paced streams in flight: 24 tokens in 0.01 s, 62 in 0.06 s, 470 in 16 s), time in which its
# one slot serves nobody else (a real engine batches).
LONG_TOKENS = 62
LONG_S = 60.0


class Load:
    """Open loop through an OpenAI endpoint: a streaming request every ``period`` s in its own thread, whatever
    the earlier ones do, up to ``limit``; each one's status, time to first token and whether it ended whole."""

    def __init__(self, url: str, period: float = LOAD_PERIOD_S, limit: int = 2000, max_tokens: int = SHORT_TOKENS,
                 long: frozenset[int] = frozenset(), model: str = "tiny-llama") -> None:
        """``long``: the indices of the requests that ask for a LONG_TOKENS answer (a stream of over a minute,
        with the tiny engine's EOS biased away)."""
        self.url, self.period, self.limit, self.long = url, period, limit, long
        self.body = {**BODY, "model": model, "max_tokens": max_tokens}
        self.long_body = {**BODY, "model": model, "max_tokens": LONG_TOKENS, "logit_bias": exact_length_logit_bias()}
        self.results: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _one(self, long: bool) -> None:
        r: dict[str, Any] = {"t": time.monotonic(), "status": None, "done": False, "finished": False, "model": None,
                             "error": "", "retry_after": None, "ttft": None, "long": long, "seconds": None,
                             "ids": set()}
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=self.long_body if long else self.body,
                              timeout=60) as s:
                r["status"] = s.status_code
                r["retry_after"] = s.headers.get("retry-after")
                if s.status_code == 200:
                    for line in s.iter_lines():
                        if line == "data: [DONE]":
                            r["done"] = True
                        elif line.startswith("data:"):
                            frame = json.loads(line[5:])
                            if frame.get("id"):  # one completion id a stream: one backend start to end
                                r["ids"].add(frame["id"])
                            if "error" in frame:  # smg ends a stream its backend cut with an error frame, then [DONE]
                                r["error"] = f"error frame: {json.dumps(frame['error'])}"[:200]
                            if (frame.get("choices") or [{}])[0].get("finish_reason"):
                                r["finished"] = True
                            if r["model"] is None:
                                r["ttft"] = time.monotonic() - r["t"]
                                r["model"] = frame.get("model")
                else:
                    s.read()
                    r["error"] = s.text[:200]
        except (httpx.HTTPError, ValueError) as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"[:200]
        r["seconds"] = time.monotonic() - r["t"]
        with self._lock:
            self.results.append(r)

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set() and n < self.limit:
            t = threading.Thread(target=self._one, args=(n in self.long,), daemon=True)
            t.start()
            self._threads.append(t)
            n += 1
            self._stop.wait(self.period)

    def __enter__(self) -> Load:
        self._main = threading.Thread(target=self._loop, daemon=True)
        self._main.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._main.join()
        for t in self._threads:
            t.join(LONG_S + 30 if self.long else 70)

    def summary(self) -> str:
        """Figures for the run's output: counts by status, time to first token, the longest gap."""
        by: dict[Any, int] = {}
        for r in self.results:
            by[r["status"]] = by.get(r["status"], 0) + 1
        ttft = sorted(r["ttft"] for r in self.results if r["ttft"] is not None)
        firsts = sorted(r["t"] + r["ttft"] for r in self.results if r["ttft"] is not None)
        gap = max((b - a for a, b in zip(firsts, firsts[1:])), default=0.0)

        def q(f: float) -> float:
            return ttft[min(len(ttft) - 1, int(f * len(ttft)))] * 1000 if ttft else float("nan")
        return (f"{len(self.results)} requests, {len(self.failed())} failed, by status {by}; time to first token "
                f"p50 {q(0.5):.0f} ms p99 {q(0.99):.0f} ms; longest gap between first tokens {gap:.2f} s")

    @staticmethod
    def whole(r: dict[str, Any]) -> bool:
        """200, a stream with a finish_reason and [DONE], no error frame, one completion id throughout. A
        backend cut mid-stream reaches the client through smg as 200, the frames sent so far, an error frame
        ("Stream error: ... unexpected EOF") and [DONE]: [DONE] alone says nothing of truncation."""
        return r["status"] == 200 and r["done"] and r["finished"] and not r["error"] and len(r["ids"]) == 1

    def failed(self) -> list[dict[str, Any]]:
        """Every request that did not end whole."""
        return [r for r in self.results if not self.whole(r)]


def status(sim: Sim, *args: str) -> dict[str, Any]:
    """``sparkctl status --json [ARGS]`` of the cluster (it must succeed)."""
    r = sim.sparkctl("-i", str(sim.inventory), "status", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def served(sim: Sim, port: int = 8000, head: str = "spark-a") -> list[str]:
    """The model names ``head`` lists on ``/v1/models``."""
    inv = load_inventory(sim.inventory)
    return [m["id"] for m in httpx.get(f"http://{inv.node(head).host}:{port}/v1/models", timeout=5).json()["data"]]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
