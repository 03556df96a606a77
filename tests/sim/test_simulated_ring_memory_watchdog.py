"""E2E on the SIMULATED ring: the memory_watchdog law. `up` configures earlyoom from the
profile's limits on every node; an engine that over-commits is killed by it and the box
stays reachable; with the watchdog stopped, the same over-commit hangs the box until a
power cycle.

SIMULATED: the nodes run sparkctl_sim.earlyoomsim (earlyoom 1.7's limits, victim choice
and messages; checked against Debian's earlyoom in tests/test_earlyoom_sim.py), and the
livelock is sparkctl_sim.overcommit's model of a GB10 box with no OOM kill. The
pre-configured ring (`sim up --ready`) has earlyoom installed as `fabric apply` leaves it,
with Debian's arguments: `up` must write sparkctl's.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.sim.helpers import RING, WAIVE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "ds41f-tp4-ring"


def _verdict(sim, node: str) -> dict | None:  # type: ignore[no-untyped-def]
    log = sim.root / "nodes" / node / "overcommit.log"
    lines = [ln for ln in (log.read_text().splitlines() if log.exists() else []) if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _watchdog_rows(sim, inv: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    r = sim.sparkctl("-i", inv, "check", PROFILE, "--bandwidth", "0", "--json", timeout=180)
    data = json.loads(r.stdout)
    return {v["node"]: v["status"] for v in data["verdicts"] if v["law"] == "memory_watchdog"}


def test_simulated_ring_earlyoom_kills_the_overcommitting_engine_and_the_box_survives(sim_ring) -> None:
    sim, inv = sim_ring, str(sim_ring.inventory)
    # pre-configured nodes: installed with Debian's "-r 3600", so not yet sparkctl's limits
    assert set(_watchdog_rows(sim, inv).values()) == {"warn"}
    up = sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=300)
    assert "watchdog" in up.stdout + up.stderr
    assert _watchdog_rows(sim, inv) == {n: "ok" for n in RING}
    args = sim.ssh("spark-c", "grep ^EARLYOOM_ARGS= /etc/default/earlyoom; systemctl is-active earlyoom").stdout
    assert "-M 6291456,3145728" in args and args.strip().endswith("active"), args

    r = sim.sparkctl("sim", "fault", "spark-c", "overcommit", check=True)
    pid = int(re.search(r"'pid': (\d+)", r.stdout).group(1))
    # SIMULATED: the node's journal of earlyoom.service, as its systemctl shim keeps it
    log = sim.root / "nodes" / "spark-c" / "run" / "systemd" / "earlyoom.service.journal.log"

    def journal() -> str:
        return log.read_text() if log.exists() else ""

    # the fault leaves 1 % available: below sparkctl's SIGKILL limit too, so earlyoom 1.7 kills
    # outright (main.c lowmem_sig checks the kill limit first)
    assert wait_until(lambda: re.search(rf"sending SIG(TERM|KILL) to process {pid} ", journal())), journal()
    assert wait_until(lambda: "process exited after" in journal()), journal()
    assert "low memory! at or below SIGKILL limits" in journal()
    # the watcher's verdict, after its grace: the engine was gone, the box did not hang
    assert wait_until(lambda: _verdict(sim, "spark-c") is not None, deadline_s=60)
    assert _verdict(sim, "spark-c")["livelocked"] is False
    assert sim.ssh("spark-c", "true").returncode == 0
    st = json.loads(sim.sparkctl("-i", inv, "status", "--json").stdout)
    row = next(n for n in st["nodes"] if n["node"] == "spark-c")
    assert row["watchdog"] == "active" and not row["alive"], row  # the watchdog lives, the engine it killed not
    assert any("spark-c: rank" in d for d in st["drift"]), st["drift"]


def test_simulated_ring_without_the_watchdog_an_overcommit_hangs_the_box(sim_ring) -> None:
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=300)  # restarts what the last test killed
    sim.ssh("spark-b", "systemctl stop earlyoom")
    assert _watchdog_rows(sim, inv)["spark-b"] == "warn"  # inactive: `up` would restart it
    (sim.root / "nodes" / "spark-b" / "overcommit.log").unlink(missing_ok=True)
    sim.sparkctl("sim", "fault", "spark-b", "overcommit", check=True)
    assert wait_until(lambda: _verdict(sim, "spark-b") is not None, deadline_s=60)
    assert _verdict(sim, "spark-b")["livelocked"] is True
    assert sim.ssh("spark-b", "true", timeout=15).returncode != 0  # SSH hangs with the box
    sim.sparkctl("sim", "power-cycle", "spark-b", check=True, timeout=300)
    assert wait_until(lambda: sim.ssh("spark-b", "true").returncode == 0, deadline_s=60)
    # earlyoom is enabled: it comes back at boot with the profile's arguments
    assert wait_until(lambda: sim.ssh("spark-b", "systemctl is-active earlyoom").stdout.strip() == "active")
