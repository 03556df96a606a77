"""E2E on the SIMULATED ring: `up --persist`, a ring reboot brings the stack back serving with the
clock cap; a rank that fails at boot stays down after serve.restart_burst starts, and `status` says so.

The simulated boot starts enabled units in After= order (sparkctl_sim.clusterinit); across
nodes nothing orders them: the head waits at its rendezvous and the workers retry their
connect (sparkctl_sim.engines.rendezvous, as torch.distributed's TCPStore does).
"""

from __future__ import annotations

import json

import pytest

from tests.sim.helpers import RING, WAIVE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "ds41f-tp4-ring"
# a short pause so the test sees the limit trip quickly; burst 3 (the default); a fabric wait
# that fits the window (3 x (1 + 120) < 600: sparkctl.plan.render._check_fabric_wait)
FAST = ("--set", "serve.restart_delay_s=1", "--set", "serve.restart_interval_s=600",
        "--set", "serve.fabric_wait_s=120")
SHOW = "systemctl show -p ActiveState,Result,NRestarts,UnitFileState sparkctl-engine.service"


def _unit(sim, node: str) -> dict[str, str]:
    out = sim.ssh(node, SHOW).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _wait(predicate, deadline_s: float = 240.0, every_s: float = 1.0) -> bool:  # type: ignore[no-untyped-def]
    return wait_until(predicate, deadline_s, every_s)


def _serves(sim) -> bool:
    r = sim.ssh("spark-a", "curl -s -m 3 http://127.0.0.1:8000/v1/models")
    return r.returncode == 0 and "deepseek-v4.1-flash" in r.stdout


def test_a_persisted_ring_comes_back_after_a_reboot_and_a_failing_rank_stays_down(sim_ring) -> None:
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "up", PROFILE, "--persist", *FAST, *WAIVE, check=True, timeout=300)
    for n in RING:
        assert _unit(sim, n)["UnitFileState"] == "enabled", n
        assert sim.ssh(n, "systemctl is-enabled sparkctl-clock-cap.service").stdout.strip() == "enabled"

    sim.sparkctl("sim", "reboot", *RING, check=True, timeout=300)
    assert _wait(lambda: _serves(sim)), "the persisted stack did not come back after the reboot"
    cap = sim.ssh("spark-c", "cat /var/lib/sparkctl/clock-lock; cat /proc/sys/kernel/random/boot_id").stdout
    lock, boot = cap.split("\n")[:2]
    assert lock.split()[0] == boot.strip(), cap  # the cap was applied in THIS boot
    for n in RING:  # nothing looped: one start each, still running
        u = _unit(sim, n)
        assert (u["ActiveState"], u["Result"], u["NRestarts"]) == ("active", "success", "0"), (n, u)
    st = json.loads(sim.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    assert not [d for d in st["drift"] if "stays down" in d], st["drift"]

    # spark-d boots with an extra link-local IPv4 on ONE twin: its RoCE v2 GID indexes
    # differ between devices and launch.sh refuses (exit 78) at every start.
    sim.sparkctl("sim", "set", "spark-d", "links.enp1s0f0np0.link_local_ipv4=169.254.99.1", check=True)
    sim.sparkctl("sim", "reboot", *RING, check=True, timeout=300)
    assert _wait(lambda: _unit(sim, "spark-d")["Result"] == "start-limit-hit", 120), _unit(sim, "spark-d")
    u = _unit(sim, "spark-d")
    assert u["ActiveState"] == "failed" and u["NRestarts"] == "2", u  # 3 starts (restart_burst), then no more
    log = sim.ssh("spark-d", "cat /var/log/sparkctl/engine.log").stdout
    assert log.count("fabric RoCE v2 GID index differs") == 3, log[-1500:]
    st = json.loads(sim.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    row = next(r for r in st["nodes"] if r["node"] == "spark-d")
    assert row["unit"]["result"] == "start-limit-hit" and row["unit"]["restarts"] == 2, row
    assert any(d.startswith("spark-d: rank 3 stays down") for d in st["drift"]), st["drift"]
    human = sim.sparkctl("-i", inv, "status").stdout
    assert "start-limit-hit" in human, human

    sim.sparkctl("-i", inv, "down", check=True, timeout=300)
    for n in RING:
        assert _unit(sim, n)["UnitFileState"] == "disabled", n
    sim.sparkctl("sim", "set", "spark-d", "links.enp1s0f0np0.link_local_ipv4=null", check=True)


def test_simulated_ring_a_plain_up_after_a_persisted_one_leaves_nothing_enabled(sim_ring) -> None:
    """`up --persist`, then `up` without it: the units differ (no Restart=), the stack restarts
    and the engine unit is disabled again, so a reboot brings back nothing this run did not ask for."""
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "up", PROFILE, "--persist", *FAST, *WAIVE, check=True, timeout=300)
    assert all(_unit(sim, n)["UnitFileState"] == "enabled" for n in RING)
    sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=300)
    for n in RING:
        assert _unit(sim, n)["UnitFileState"] == "disabled", n
    assert _serves(sim)
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)


def test_simulated_ring_a_neighbour_booting_3_minutes_late_is_waited_for_no_start_limit_hit(sim_ring) -> None:
    """Ring reboot, spark-b boots 3 simulated minutes after the others (its cables dark meanwhile):
    spark-a's and spark-c's ports to it have no carrier, so no address and no GID; their launches
    wait for the GIDs (serve.fabric_wait_s) instead of failing every start, and the persisted stack
    serves once spark-b is up, every unit on its first start."""
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "up", PROFILE, "--persist", *FAST, *WAIVE, check=True, timeout=300)
    r = sim.sparkctl("sim", "reboot", *RING, "--late", "spark-b=180", check=True, timeout=300)
    assert "late" in r.stdout, r.stdout
    assert _wait(lambda: _serves(sim)), "the persisted stack did not come back after the late boot"
    for n in RING:
        u = _unit(sim, n)
        assert (u["ActiveState"], u["Result"], u["NRestarts"]) == ("active", "success", "0"), (n, u)
    for n in ("spark-a", "spark-c"):  # spark-b's neighbours waited for it, and said so
        log = sim.ssh(n, "cat /var/log/sparkctl/engine.log").stdout
        assert "sparkctl: waiting for the RoCEv2 GID of the fabric address" in log, (n, log[-1500:])
        assert "no RoCEv2 GID" not in log, (n, log[-1500:])
    log = sim.ssh("spark-d", "cat /var/log/sparkctl/engine.log").stdout
    assert "waiting for the RoCEv2 GID" not in log  # both of spark-d's neighbours were up
    st = json.loads(sim.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    assert not [d for d in st["drift"] if "stays down" in d], st["drift"]
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)


def test_simulated_ring_a_rank_whose_gid_never_appears_stops_after_its_burst(sim_ring) -> None:
    """spark-b stays off: spark-a's port to it never gets its address; spark-a's launch waits
    fabric_wait_s at each start, exits 78, and after restart_burst starts the unit stays down
    with Result=start-limit-hit, which `status` reports."""
    sim, inv = sim_ring, str(sim_ring.inventory)
    wait = ("--set", "serve.fabric_wait_s=4")
    sim.sparkctl("-i", inv, "up", PROFILE, "--persist", *FAST, *wait, *WAIVE, check=True, timeout=300)
    sim.sparkctl("sim", "power-off", "spark-b", check=True, timeout=120)
    sim.sparkctl("sim", "reboot", "spark-a", "spark-c", "spark-d", check=True, timeout=300)
    assert _wait(lambda: _unit(sim, "spark-a")["Result"] == "start-limit-hit", 180), _unit(sim, "spark-a")
    u = _unit(sim, "spark-a")
    assert u["ActiveState"] == "failed" and u["NRestarts"] == "2", u  # 3 starts (restart_burst), then no more
    log = sim.ssh("spark-a", "cat /var/log/sparkctl/engine.log").stdout
    assert log.count("after waiting 4 s (serve.fabric_wait_s=4)") == 3, log[-2000:]
    sim.sparkctl("sim", "power-cycle", "spark-b", check=True, timeout=300)  # back, but too late for spark-a
    st = json.loads(sim.sparkctl("-i", inv, "status", "--json", check=True).stdout)
    row = next(r for r in st["nodes"] if r["node"] == "spark-a")
    assert row["unit"]["result"] == "start-limit-hit" and row["unit"]["restarts"] == 2, row
    assert any(d.startswith("spark-a: rank 0 stays down") for d in st["drift"]), st["drift"]
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)


def test_simulated_ring_a_container_that_outlived_its_cli_is_cleared_and_the_rank_starts(sim_ring) -> None:
    """spark-b's `docker run` CLI is SIGKILLed, its container runs on under the name
    sparkctl-engine (sparkctl_sim.clusterdocker). The unit restarts (serve.persist); its
    ExecStartPre removes the leftover, so the new `docker run --name` gets no Conflict and
    the ring serves again, with no start limit hit."""
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "up", PROFILE, "--persist", *FAST, *WAIVE, check=True, timeout=300)
    inspect = "docker inspect -f '{{.Id}}' sparkctl-engine"
    old = sim.ssh("spark-b", inspect).stdout.strip()
    r = sim.sparkctl("sim", "fault", "spark-b", "orphan-container", check=True)
    assert old[:12] in r.stdout, r.stdout

    def recovered() -> bool:
        u = _unit(sim, "spark-b")
        new = sim.ssh("spark-b", inspect).stdout.strip()
        return u["ActiveState"] == "active" and int(u["NRestarts"]) >= 1 and new not in ("", old) and _serves(sim)

    assert _wait(recovered, 240), (_unit(sim, "spark-b"), sim.ssh("spark-b", "docker ps -a").stdout)
    log = sim.ssh("spark-b", "cat /var/log/sparkctl/engine.log").stdout
    assert "Conflict" not in log, log[-1500:]
    for n in RING:
        assert _unit(sim, n)["Result"] != "start-limit-hit", (n, _unit(sim, n))
    names = sim.ssh("spark-b", "docker ps -a --format '{{.Names}}'").stdout.split()
    assert names == ["sparkctl-engine"], names  # the leftover is gone, one container runs
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)
