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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sparkctl.model.inventory import load_inventory
from sparkctl_sim import procshims

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
