"""The fault matrix (issue #7) on the SIMULATED 4-node ring: the reduced CI set,
and the faults the matrix found, each pinned by a test.

Simulated: engines, GB10 tools, the full disk (a filled tmpfs in the head's mount
namespace). Real: OpenSSH, sparkctl's CLI as a subprocess, SIGINT, the lock, HTTP.
The full matrix runs from tools/fault_matrix.py; docs/RELIABILITY.md has its table.
The first tests are pure (the matrix and its judgement) and need no cluster.
"""

from __future__ import annotations

import json
import time

import pytest
from faultmatrix import (  # tests/faultmatrix.py: a test driver, not part of the simulator
    FAULTS,
    NEW,
    OLD,
    REDUCED,
    SERVED,
    Cell,
    Outcome,
    Ring,
    Snapshot,
    classify,
    judge,
    matrix,
    na_reason,
    plan_for,
    record_integrity,
    run_cell,
)

from sparkctl_sim import cluster
from tests.sim.helpers import RING

RECORD = {"profile": NEW, "sets": [], "digest": "d", "engine": "tensorfold", "engine_version": "1",
          "served_name": SERVED[NEW], "port": 8000, "heads": ["spark-a"], "nodes": {}, "state": "serving",
          "started_at": "t", "updated_at": "t", "schema": 1}


def engine_line(profile: str) -> str:
    return f"123 python -m sparkctl_sim.engine {'tensorfold serve' if profile == NEW else 'ds41f serve'} --tp 4"


def serving_snapshot(profile: str = NEW, **kw) -> Snapshot:
    base = dict(served=(SERVED[profile],), procs={n: (engine_line(profile),) for n in RING},
                record_text=json.dumps({**RECORD, "profile": profile, "served_name": SERVED[profile]}),
                state_dir=("record.json",), lock_held=False)
    return Snapshot(**{**base, **kw})


# --------------------------------------------------------------------------- pure


def test_every_cell_runs_or_says_why_not() -> None:
    cells = matrix()
    assert len(cells) == 3 * 5 * len(FAULTS)
    running = [c for c, why in cells if why is None]
    assert all(why for c, why in cells if c not in running)
    # down has no push, start or readiness; up/switch have no separate stop column
    assert na_reason(Cell("down", "during_ready", "rank_killed"))
    assert na_reason(Cell("switch", "during_stop", "rank_killed"))
    assert na_reason(Cell("switch", "during_ready", "sigint")) is None
    assert {c.command for c in running} == {"up", "switch", "down"}


def test_the_reduced_set_has_one_cell_per_fault_over_several_phases() -> None:
    assert sorted(c.fault for c in REDUCED) == sorted(FAULTS)
    assert len({c.phase for c in REDUCED}) >= 4 and {c.command for c in REDUCED} == {"up", "switch", "down"}
    assert all(na_reason(c) is None for c in REDUCED)


def test_judgement_finds_orphans_corrupt_records_and_a_lying_record() -> None:
    assert classify(serving_snapshot()) == (f"serving {NEW}", 0, [])
    # a rank of the old stack beside the new one is an orphan
    procs = {n: (engine_line(NEW),) for n in RING} | {"spark-c": (engine_line(NEW), engine_line(OLD))}
    state, orphans, _ = classify(serving_snapshot(procs=procs))
    assert state == f"serving {NEW}" and orphans == 1
    # nothing answers but a wrapper is left: not stopped
    left = {n: () for n in RING} | {"spark-b": ("9 python -m sparkctl_sim.procshims docker run x",)}
    state, orphans, _ = classify(serving_snapshot(served=None, procs=left))
    assert state.startswith("mixed") and orphans == 1
    assert record_integrity('{"profile": ', ("record.json",))[0] is False
    assert record_integrity(json.dumps(RECORD), ("record.json", ".sparkctl-put.AbC123"))[0] is False
    assert record_integrity(None, ())[0] is True  # absent claims nothing runs
    # the record says serving, the ring is stopped: the cell fails however sparkctl exited
    cell = Cell("down", "while_serving", "unreachable")
    out = Outcome(cell.id, "", exit_code=5, message="error: node spark-c: down failed in phase stop: ...")
    snap = serving_snapshot(served=None, procs={n: () for n in RING})
    judged = judge(cell, plan_for(cell), out, snap)
    assert judged.status == "FAIL" and any("record says" in p for p in judged.problems)
    ok = judge(cell, plan_for(cell), Outcome(cell.id, "", exit_code=5, message=out.message),
               serving_snapshot(served=None, procs={n: () for n in RING}, record_text=None))
    assert ok.status == "ok" and ok.names_node and ok.names_phase


def test_a_second_operator_that_ran_after_the_first_may_leave_its_own_stack() -> None:
    """`down` then the second operator's `up` (the lock serialized them, seen under load):
    the ring serving the second's stack is a stated state, not a failure; a refused or
    absent second operator does not excuse the same state."""
    cell = Cell("down", "during_stop", "second_operator")
    snap = serving_snapshot(OLD)
    ran = judge(cell, plan_for(cell), Outcome(cell.id, "", exit_code=0, second_exit=0), snap)
    assert ran.status == "ok", ran.problems
    refused = judge(cell, plan_for(cell), Outcome(cell.id, "", exit_code=0, second_exit=6,
                                                  second_message="error: node spark-a: up failed in phase lock"),
                    serving_snapshot(OLD))
    assert refused.status == "FAIL" and any("exit 0 but" in p for p in refused.problems)


# --------------------------------------------------------------------------- on the simulated ring


@pytest.fixture(scope="module")
def ring(sim_ring, tmp_path_factory):
    r = Ring(sim_ring.root, sim_ring.inventory, sim_ring.env, tmp_path_factory.mktemp("fault-cells"))
    yield r
    r.heal()
    sim_ring.sparkctl("-i", str(sim_ring.inventory), "down")


@pytest.mark.e2e
@pytest.mark.needs_root
@pytest.mark.parametrize("cell", REDUCED, ids=[f"SIMULATED-{c.id.replace('/', '-')}" for c in REDUCED])
def test_simulated_fault_cell(ring, cell: Cell) -> None:
    """One cell per fault kind on the SIMULATED ring: zero orphans, an intact record that
    agrees with what serves (checked over HTTP), a stated final state, and an error that
    names the node and the phase."""
    out = run_cell(ring, cell)
    assert out.orphans == 0, out.problems
    assert out.record_intact, out.problems
    assert out.final_state in (plan_for(cell).success, *plan_for(cell).fallback), out.final_state
    assert out.record_agrees, (out.record_state, out.final_state)
    assert not out.lock_left
    if out.exit_code != 0:
        assert out.names_phase, out.message
        assert cell.node is None or out.names_node, out.message
    if cell.fault == "second_operator":
        assert out.second_exit == 6 and "spark-a" in out.second_message, out.second_message
    assert out.status == "ok", out.problems


@pytest.mark.e2e
@pytest.mark.needs_root
def test_simulated_full_disk_before_push_keeps_the_previous_stack_and_a_true_record(ring) -> None:
    """Found by the matrix: `switch` on a full state disk stopped the old stack and left a
    record saying it served. Now the record is written before anything stops."""
    out = run_cell(ring, Cell("switch", "before_push", "disk_full"))
    assert out.exit_code not in (0, None) and out.names_node and out.names_phase, out.message
    assert out.final_state == f"serving {OLD}" and out.record_agrees, (out.final_state, out.record_state)
    assert out.orphans == 0 and out.record_intact and not out.lock_left


@pytest.mark.e2e
@pytest.mark.needs_root
def test_simulated_switch_that_fails_its_check_touches_nothing_and_restores_nothing(ring) -> None:
    """Found by the matrix: a switch whose check failed (spark-c unreachable) "rolled back"
    a stack it never stopped, and then reported "restoring ds41f-tp4-ring failed too"."""
    out = run_cell(ring, Cell("switch", "while_serving", "unreachable"))
    assert out.exit_code == 4, out.message  # CheckFailed, not a rollback
    assert "in phase check" in out.message and "spark-c" in out.message, out.message
    assert "restor" not in out.message and "rolled back" not in out.message, out.message
    assert out.final_state == f"serving {OLD}" and out.record_agrees and out.orphans == 0


@pytest.mark.e2e
@pytest.mark.needs_root
def test_simulated_full_disk_refuses_the_lock_clearly_and_leaves_none(ring, sim_ring) -> None:
    """Found by the matrix: a full disk made `up` say "locked by unknown" and left an
    empty lock dir that blocked every later command until `unlock`."""
    inv = str(sim_ring.inventory)
    ring.reset_to("stopped")
    cluster.disk_full(sim_ring.root, "spark-a")
    try:
        r = sim_ring.sparkctl("-i", inv, "up", NEW)
    finally:
        cluster.disk_ok(sim_ring.root, "spark-a")
    assert r.returncode == 5, r.stderr
    assert "node spark-a" in r.stderr and "in phase lock" in r.stderr and "No space left" in r.stderr, r.stderr
    assert "locked by" not in r.stderr
    assert not ring.snapshot().lock_held
    r = sim_ring.sparkctl("-i", inv, "up", NEW)
    assert r.returncode == 0, r.stderr
    sim_ring.sparkctl("-i", inv, "down", check=True)


@pytest.mark.e2e
@pytest.mark.needs_root
def test_simulated_supervisor_killed_mid_switch_does_not_leave_the_lock_held(ring, sim_ring) -> None:
    """A supervisor (switch --supervise) SIGKILLed mid-switch left the cluster lock held:
    the next command was refused until `unlock`. Now the next acquirer checks the holder's
    pid on the head and breaks the lock of a supervisor that is gone."""
    inv = str(sim_ring.inventory)
    ring.reset_to(f"serving {OLD}")
    r = sim_ring.sparkctl("-i", inv, "switch", NEW, "--supervise", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    pid = json.loads(r.stdout)["pid"]
    assert sim_ring.ssh("spark-a", f"kill -KILL {pid}").returncode == 0
    held = sim_ring.ssh("spark-a", "cat /var/lib/sparkctl/locks/spark-a.d/holder")
    assert f"supervisor pid {pid}" in held.stdout, held.stdout  # the kill left the lock behind
    r = sim_ring.sparkctl("-i", inv, "up", NEW)
    assert r.returncode == 0, r.stderr
    assert ring.served() == (SERVED[NEW],)
    snap = ring.settled()
    assert classify(snap)[:2] == (f"serving {NEW}", 0)
    assert not snap.lock_held
    sim_ring.sparkctl("-i", inv, "down", check=True)


@pytest.mark.e2e
@pytest.mark.needs_root
def test_simulated_lock_of_a_live_supervisor_is_respected(ring, sim_ring) -> None:
    """The other side of stale-lock detection: a supervisor that still runs keeps its lock."""
    inv = str(sim_ring.inventory)
    ring.reset_to(f"serving {OLD}")
    r = sim_ring.sparkctl("-i", inv, "switch", NEW, "--supervise", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    r2 = sim_ring.sparkctl("-i", inv, "down")
    events = sim_ring.ssh("spark-a", "cat /var/lib/sparkctl/supervisor.jsonl").stdout
    if '"phase": "done"' in events or '"phase": "rolled-back"' in events:
        pytest.skip("the supervisor finished before the second command: nothing to contend for")
    assert r2.returncode == 6 and "supervisor pid" in r2.stderr, r2.stderr
    # the supervisor keeps its lock until it ends (slowly on a loaded machine): wait for it
    deadline = time.monotonic() + 240
    while not any(f'"phase": "{p}"' in events for p in ("done", "rolled-back", "failed")):
        assert time.monotonic() < deadline, "the supervisor did not finish:\n" + events
        time.sleep(2)
        events = sim_ring.ssh("spark-a", "cat /var/lib/sparkctl/supervisor.jsonl").stdout
    ring.settled()
    sim_ring.sparkctl("-i", inv, "down", check=True)

