"""E2E on SIMULATED fresh nodes: unattended-upgrades holds the dpkg lock after the first boot.

A fresh Ubuntu box runs unattended-upgrades minutes after its first boot, holding
/var/lib/dpkg/lock-frontend; apt-get does not wait for it unless told to
(``-o DPkg::Lock::Timeout``; apt-pkg/deb/debsystem.cc). The simulated nodes hold it
for 90 simulated seconds (``sparkctl sim up --dpkg-lock-s``, the default), at speedup 1
here so that the lock is still held when `fabric apply` starts on a slow machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim.helpers import Sim, make_sim

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

NODES = ("spark-a", "spark-b")


@pytest.fixture(scope="module")
def fresh_pair_locked(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    yield from make_sim(tmp_path_factory.mktemp("lockedpair"), 2, ready=False, load_images=False, speedup="1")


def _lock(sim: Sim, node: str) -> dict:
    return json.loads(Path(sim.root, "nodes", node, "state.json").read_text())["dpkg_lock"]


def test_simulated_fresh_nodes_fabric_apply_waits_for_the_dpkg_lock(fresh_pair_locked) -> None:
    sim, inv = fresh_pair_locked, str(fresh_pair_locked.inventory)
    lock = _lock(sim, "spark-a")
    assert lock["comm"] == "unattended-upgr" and lock["speedup"] == 1.0

    # apt-get as it comes: no wait, exit 100 at once with apt's own texts
    r = sim.ssh("spark-a", "apt-get install -y -qq earlyoom")
    assert time.time() < lock["until"], "the machine was too slow: the lock was gone before the probe"
    assert r.returncode == 100, r
    assert r.stderr.splitlines() == [
        f"E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process {lock['pid']} (unattended-upgr)",
        "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?"]
    # with a timeout shorter than the hold: apt says so once a (simulated) second, then gives up
    r = sim.ssh("spark-b", "apt-get -o DPkg::Lock::Timeout=2 install -y earlyoom")
    assert r.returncode == 100 and r.stdout.count("Waiting for cache lock: Could not get lock") == 2, r
    assert r.stderr.strip().startswith("E: Unable to acquire the dpkg frontend lock"), r.stderr

    started = time.time()
    assert started < min(_lock(sim, n)["until"] for n in NODES)  # still held when the apply starts
    sim.sparkctl("-i", inv, "fabric", "apply", check=True, timeout=900)
    ended = time.time()
    for n in NODES:
        assert ended >= _lock(sim, n)["until"]  # it could only install once the lock was gone
        assert sim.ssh(n, "dpkg-query -W -f '${db:Status-Status}' earlyoom").stdout == "installed", n
        assert sim.ssh(n, "systemctl is-active earlyoom").stdout.strip() == "active", n
    print(f"fabric apply waited for the dpkg lock: {ended - started:.1f} s")
