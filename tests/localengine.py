"""One SIMULATED engine as a plain local process on 127.0.0.1: no ring, no namespaces, no SSH.

For measuring the bench against known rates (tests/test_bench_suites.py,
tools/sim_rate_recovery.py): :func:`start_local` starts ds41f or TensorFold
with one rank, sped up, and returns once ``/v1/models`` answers;
:func:`prefill_rate` reads the engine's own prefill table (``/sim/info``) the
way the engine interpolates it; :func:`start_llama_server` starts the
simulated llama-server with the flags given (its model: a GGUF header stub).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sparkctl_sim.perfmodel import interp_log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_local(engine: str, name: str, log: Path, speedup: float, ctx: int = 1048576,
                timeout_s: float = 30.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``engine`` (ds41f or tensorfold) serving ``name``; (process, base URL) once it answers."""
    port, mport = free_port(), free_port()
    if engine == "ds41f":
        args = ["serve", "--model", "/m", "--served-model-name", name, "--tp", "1", "--nnodes", "1",
                "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(mport),
                "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(ctx),
                "--gpu-memory-utilization", "0.85"]
    else:
        args = ["serve", "--weights", "/m", "--name", name, "--tp", "1", "--world", "1", "--rank", "0",
                "--listen", f"127.0.0.1:{port}", "--ctx", str(ctx), "--mem-fraction", "0.85"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKCTL_SIM_STATE", "WORLD_SIZE", "NODE_RANK"))}
    env.update(SPARKCTL_SIM_SPEEDUP=str(speedup), SPARKCTL_SIM_LOAD_S="0.2")
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sparkctl_sim.engine", engine, *args], env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"{engine} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def start_llama_server(args: list[str], log: Path, speedup: float, timeout_s: float = 30.0
                       ) -> tuple[subprocess.Popen[bytes], str]:
    """The simulated llama-server with ``args`` (plus --model, --host, --port); (process, URL) once healthy."""
    port = free_port()
    model = log.with_suffix(".gguf")
    model.write_bytes(b"GGUF" + bytes(28))  # the magic is all the simulated loader reads
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_STATE")}
    env.update(SPARKCTL_SIM_SPEEDUP=str(speedup), SPARKCTL_SIM_LOAD_S="0.2")
    argv = ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sparkctl_sim.engines.llamaserver", *argv], env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"llama-server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prefill_rate(table: dict[str, float], prompt_tokens: float) -> float:
    """The rate ``/sim/info`` lists by prompt length, interpolated on log(length) as the engine does."""
    return interp_log(tuple(sorted((float(k), v) for k, v in table.items())), prompt_tokens)
