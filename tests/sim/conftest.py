"""Fixtures for end-to-end tests on the SIMULATED cluster.

`sim_cluster(nodes)` builds the cluster through the real CLI (`sparkctl sim up`)
under a private SPARKCTL_SIM_DIR and XDG_STATE_HOME, yields its paths, and
tears it down with `sparkctl sim down`. Namespace names and the bridge are
host-wide, so modules that build a cluster hold the host lock for their whole
duration (pytest runs modules one after another). The cluster's handle and the
helpers the modules share are in tests/sim/helpers.py.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl_sim import dockerimages, procshims
from tests.sim.helpers import ShimHost, Sim, alive, make_sim

LEDGER = Path("/run/sparkctl-sim")


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


@pytest.fixture(scope="module")
def sim_ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("simring"), 4)


@pytest.fixture(scope="module")
def sim_pair_bare(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    """A pre-configured pair with NO engine image on any node (the images tests load their own)."""
    yield from make_sim(tmp_path_factory.mktemp("barepair"), 2, load_images=False)


@pytest.fixture(scope="module")
def fresh_ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    """A ring of nodes as they come out of the box (`sparkctl sim up`, no --ready)."""
    yield from make_sim(tmp_path_factory.mktemp("freshring"), 4, ready=False)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ShimHost]:
    """The process shims in a temporary directory; no process they started survives the test."""
    bin_dir = tmp_path / "bin"
    procshims.install_procshims(bin_dir)
    (tmp_path / "units").mkdir()
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', os.defpath)}"
    env[procshims.RUN_DIR_ENV] = str(tmp_path / "run")
    env[procshims.UNIT_DIR_ENV] = str(tmp_path / "units")
    # SIMULATION: the image the tests run is in this node's store (as if built here)
    dockerimages.Images(dockerimages.store_dir(tmp_path / "run")).add(dockerimages.make_image("img", layer_bytes=1024))
    sim = ShimHost(tmp_path, env)
    seen: set[int] = set()
    try:
        yield sim
    finally:
        # Every pid the shims ever recorded must be gone; kill leftovers so a
        # failing test never leaks processes into the next one.
        if sim.run_dir.exists():
            seen = sim.recorded_pids()
        deadline = time.monotonic() + 3.0
        while any(alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = sorted(p for p in seen if alive(p))
        for pid in orphans:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        assert not orphans, f"processes left behind: {orphans}"
