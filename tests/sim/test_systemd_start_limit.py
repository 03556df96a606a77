"""The simulated systemctl's start rate limit: StartLimitIntervalSec=/StartLimitBurst= from
the unit, systemd's defaults (10 s, 5) when absent; every start counts, reset-failed resets."""

from __future__ import annotations

import time
from pathlib import Path

from tests.sim.helpers import ShimHost, alive, wait_until

FAILING = """\
    [Unit]
    Description=fails at once
    {limits}
    [Service]
    Type=simple
    ExecStart=/bin/sh -c 'echo start >> {log}; exit 3'
    Restart=on-failure
    RestartSec=0.05
"""


def _show(sim: ShimHost, name: str) -> dict[str, str]:
    out = sim.run("systemctl", "show", "-p", "ActiveState,Result,NRestarts", name).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _starts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_failing_unit_stops_after_its_burst_and_stays_failed(sim: ShimHost) -> None:
    log = sim.root / "starts.log"
    sim.unit("flaky.service", FAILING.format(limits="StartLimitIntervalSec=120\nStartLimitBurst=3", log=log))
    assert sim.run("systemctl", "start", "flaky").returncode == 0
    assert wait_until(lambda: _show(sim, "flaky")["Result"] == "start-limit-hit", 15, 0.05)
    props = _show(sim, "flaky")
    assert props["ActiveState"] == "failed"
    assert _starts(log) == 3, "3 starts within the interval: the first and 2 restarts"
    assert props["NRestarts"] == "2"
    # the operator's start counts too: refused while the interval lasts
    again = sim.run("systemctl", "start", "flaky")
    assert again.returncode == 1 and "attempted too often" in again.stderr
    assert _starts(log) == 3
    # reset-failed resets the counter: one more round of 3
    assert sim.run("systemctl", "reset-failed", "flaky").returncode == 0
    assert sim.run("systemctl", "start", "flaky").returncode == 0
    assert wait_until(lambda: _starts(log) == 6 and _show(sim, "flaky")["Result"] == "start-limit-hit", 15, 0.05)


def test_without_limits_the_defaults_allow_five_starts(sim: ShimHost) -> None:
    log = sim.root / "starts.log"
    sim.unit("flaky.service", FAILING.format(limits="", log=log))
    assert sim.run("systemctl", "start", "flaky").returncode == 0
    assert wait_until(lambda: _show(sim, "flaky")["Result"] == "start-limit-hit", 15, 0.05)
    assert _starts(log) == 5 and _show(sim, "flaky")["NRestarts"] == "4"


def test_a_zero_interval_disables_the_limit(sim: ShimHost) -> None:
    log = sim.root / "starts.log"
    sim.unit("flaky.service", FAILING.format(limits="StartLimitIntervalSec=0", log=log))
    assert sim.run("systemctl", "start", "flaky").returncode == 0
    assert wait_until(lambda: _starts(log) >= 8, 15, 0.05), "no limit: it keeps restarting"
    assert sim.run("systemctl", "stop", "flaky").returncode == 0
    assert _show(sim, "flaky")["Result"] != "start-limit-hit"


RESTARTS_AT_ONCE = """\
    [Unit]
    Description=exits at once and is restarted at once
    StartLimitIntervalSec=0
    [Service]
    Type=simple
    ExecStart=/bin/sh -c 'echo $$$$ >> {log}; sleep 0.01; exit 3'
    Restart=on-failure
    RestartSec=0
"""


def test_a_stop_during_restarts_leaves_nothing_running(sim: ShimHost) -> None:
    """systemctl stop wins over an auto-restart under way, whenever it comes.

    The supervisor restarts the unit in a loop; a stop that landed between its
    "restart?" check and the spawn once left a process running after `stop`
    returned (the unit said inactive). Stopped at 20 moments, nothing runs after.
    """
    log = sim.root / "pids.log"
    sim.unit("loop.service", RESTARTS_AT_ONCE.format(log=log))
    for i in range(20):
        assert sim.run("systemctl", "start", "loop").returncode in (0, 1)
        time.sleep((i % 5) * 0.013)
        assert sim.run("systemctl", "stop", "loop").returncode == 0
        starts = _starts(log)
        time.sleep(0.1)
        assert _starts(log) == starts, f"round {i}: started again after systemctl stop returned"
        assert _show(sim, "loop")["ActiveState"] in ("inactive", "failed")
        running = [pid for pid in map(int, log.read_text().split()) if alive(pid)]
        assert not running, f"round {i}: {running} still run after systemctl stop"
