"""Fixtures for end-to-end tests on the SIMULATED cluster.

`sim_cluster(nodes)` builds the cluster through the real CLI (`sparkctl sim up`)
under a private SPARKCTL_SIM_DIR and XDG_STATE_HOME, yields its paths, and
tears it down with `sparkctl sim down`. Namespace names and the bridge are
host-wide, so modules that build a cluster hold the host lock for their whole
duration (pytest runs modules one after another).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

LEDGER = Path("/run/sparkctl-sim")


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


def wait_until(predicate, deadline_s: float = 120.0, every_s: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it holds or the deadline passes; its last answer.

    A deadline for waiting only: the e2e assertions are on states, never on durations."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


@pytest.fixture(scope="module")
def host_lock() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the simulated cluster's namespaces need root")
    LEDGER.mkdir(parents=True, exist_ok=True)
    with open(LEDGER / "e2e-tests.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _make_sim(tmp: Path, nodes: int, *, ready: bool = True, load_images: bool = True,
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


@pytest.fixture(scope="module")
def sim_ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from _make_sim(tmp_path_factory.mktemp("simring"), 4)


@pytest.fixture(scope="module")
def sim_pair_bare(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    """A pre-configured pair with NO engine image on any node (the images tests load their own)."""
    yield from _make_sim(tmp_path_factory.mktemp("barepair"), 2, load_images=False)


@pytest.fixture(scope="module")
def fresh_ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    """A ring of nodes as they come out of the box (`sparkctl sim up`, no --ready)."""
    yield from _make_sim(tmp_path_factory.mktemp("freshring"), 4, ready=False)
