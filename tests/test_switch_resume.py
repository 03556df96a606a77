"""``switch`` from a degraded record resumes the roll; it never restarts what serves (issue 20).

The degraded records are the ones the rolling switch's own branches write (tests/plans/rolling-switch,
branches degraded-K-J); the resumed plan (tests/plans/resume-switch) runs through the one interpreter
(planrun) with backends whose probes fail, or whose operator presses Ctrl-C, where the test says.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkctl.ops.supervise import FINAL_PHASES
from sparkctl.plan.steps import Plan, describe
from sparkctl.remote import planrun
from tests.test_plan_fixtures import plan_case

from helpers import FailsAt, StubBackend

A, C = "192.168.1.101", "192.168.1.103"  # spark-a's and spark-c's addresses: the replicas' heads
AB, CD = ("spark-a", "spark-b"), ("spark-c", "spark-d")


def _from(branch: str) -> dict[str, Any]:
    """The resumed switch from the record branch ``branch`` of the rolling switch leaves."""
    return plan_case("resume-switch", record={"from": {"case": "rolling-switch", "branch": branch}})


def _touched(plan: dict[str, Any], nodes: tuple[str, ...]) -> list[str]:
    """The main line's steps that drain, stop, push or start anything on ``nodes``."""
    out = []
    for s in plan["steps"]:
        if s["id"].startswith("gateway-"):  # the gateway's own files and unit (on spark-a): not a replica
            continue
        if s["kind"] in ("stop", "put", "start") and set(s["nodes"]) & set(nodes):
            out.append(s["id"])
        if s["id"].endswith("gateway-drain") and any(n in str(s.get("params")) for n in nodes):
            out.append(s["id"])
    return out


def _stops(backend: StubBackend, nodes: tuple[str, ...]) -> list[str]:
    """The phases of the stop commands the run sent to the first of ``nodes`` (each stop step runs on all)."""
    return [ph for ph, n, c in backend.ran if n == nodes[0] and "echo \"left:" in c]


def test_the_resumed_plan_starts_the_stopped_replica_first_then_replaces_the_old_one() -> None:
    plan = plan_case("resume-switch")  # degraded-2-1: spark-c+d serve halves again, spark-a+b stopped
    assert "resuming the switch to halves-next" in plan["note"]
    assert "spark-a+spark-b: start" in plan["note"] and "spark-c+spark-d: roll" in plan["note"]
    ids = [s["id"] for s in plan["steps"]]
    # replica 1 (nothing serves there) comes up and is registered before the old replica is drained
    assert ids.index("r1-gateway-register") < ids.index("r2-gateway-drain") < ids.index("r2-stop")
    assert "r1-gateway-drain" not in ids  # nothing to drain on stopped nodes
    assert ids[-1] == "record" and ids[0] == "lock"
    rec = next(s for s in plan["steps"] if s["id"] == "record-start")["params"]["record"]
    assert rec["state"] == "degraded" and "resuming" in rec["note"]  # never "starting": a dead run resumes again
    assert set(rec["replicas"]) == {"spark-c"}
    assert {"resume-1", "resume-2", "resume-2-stopped", "paused-1", "paused-2", "finally"} == set(plan["branches"])
    assert "stop" not in plan["branches"]  # no step of a resume stops every replica
    assert plan["outage"].startswith("none expected")
    # `sparkctl plan switch` prints the note and each step's Ctrl-C branch
    lines = describe(Plan.from_dict(plan))
    assert "  note: resuming the switch to halves-next from a degraded record: replica 1 on spark-a+spark-b: " \
        "start, replica 2 on spark-c+spark-d: roll" in lines
    assert any("[on Ctrl-C: paused-1]" in ln for ln in lines) and any("[on Ctrl-C: resume-1]" in ln for ln in lines)


def test_a_replica_already_serving_the_new_profile_is_never_touched() -> None:
    plan = _from("degraded-2-2")  # spark-a+b serve halves-next, spark-c+d stopped
    assert "spark-a+spark-b: keep" in plan["note"]
    assert _touched(plan, AB) == []
    backend = StubBackend("nowhere")
    state = planrun.execute(plan, backend)
    assert state.result == "done" and not _stops(backend, AB)
    assert backend.records[-1]["state"] == "serving" and backend.records[-1]["profile"] == "halves-next"
    assert "replicas" not in backend.records[-1]


def test_a_replica_the_record_says_serves_but_does_not_answer_is_restarted_not_kept() -> None:
    """The facts read before planning (executor.gather_up_facts probes the degraded record's replicas of
    the profile): spark-a's engine died since the record was written."""
    rec = {"from": {"case": "rolling-switch", "branch": "degraded-2-2"}}
    assert "spark-a+spark-b: keep" in plan_case("resume-switch", record=rec, facts={"serving": ["spark-a"]})["note"]
    plan = plan_case("resume-switch", record=rec, facts={"serving": []})
    assert "spark-a+spark-b: roll" in plan["note"]
    ids = [s["id"] for s in plan["steps"]]
    assert ids.index("r1-gateway-register") < ids.index("r2-gateway-drain")  # spark-c+d (stopped) come up first
    assert "resume-2-stopped" not in plan["branches"]  # nothing of another profile to give back there


def test_resuming_from_the_first_replicas_failure_rolls_the_rest() -> None:
    plan = _from("degraded-1-1")  # spark-a+b stopped, spark-c+d still halves
    ids = [s["id"] for s in plan["steps"]]
    assert ids.index("r1-gateway-register") < ids.index("r2-gateway-drain")
    backend = StubBackend("nowhere")
    state = planrun.execute(plan, backend)
    assert state.result == "done"
    # the old replica on spark-c+d is stopped once, after spark-a+b serve halves-next
    assert _stops(backend, CD) == ["stop"]


def test_a_replica_that_does_not_come_up_again_is_given_back_and_the_one_before_stays() -> None:
    plan = plan_case("resume-switch")
    backend = FailsAt({("ready", C)})  # replica 2 (spark-c+d) never serves halves-next
    state = planrun.execute(plan, backend)
    assert state.branches == ["resume-2"] and state.completed == ["resume-2"]
    run = [o["id"] for o in state.outcomes]
    assert "rb2-ready" in run and "rb2-gateway-register" in run
    # spark-a+b (resumed first) serve halves-next throughout: nothing stopped them after they were registered
    assert _stops(backend, AB) == ["stop"]  # its own verify-nothing-runs step
    rec = backend.records[-1]
    assert rec["state"] == "degraded"
    assert {h: r["profile"] for h, r in rec["replicas"].items()} == {"spark-a": "halves-next", "spark-c": "halves"}
    assert {b["head"] for b in rec["gateway"]["backends"]} == {"spark-a", "spark-c"}
    assert "halves given back" in rec["note"] and "switch halves-next` again resumes" in rec["note"]


def test_a_way_back_that_fails_too_leaves_that_replica_stopped_and_the_others_serving() -> None:
    plan = plan_case("resume-switch")
    backend = FailsAt({("ready", C), ("rollback", C)})
    state = planrun.execute(plan, backend)
    assert state.branches == ["resume-2", "resume-2-stopped"] and state.completed == ["resume-2-stopped"]
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {"spark-a"}
    assert "spark-c" not in rec["listen"]


def test_the_first_resumed_replica_that_fails_is_stopped_again_and_nothing_else_changes() -> None:
    plan = plan_case("resume-switch")
    backend = FailsAt({("ready", A)})
    state = planrun.execute(plan, backend)
    assert state.completed == ["resume-1"]
    assert not _stops(backend, CD)  # the old replica on spark-c+d never left the gateway
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {"spark-c"}
    assert rec["replicas"]["spark-c"]["profile"] == "halves"


class _CtrlCAt(StubBackend):
    """The operator presses Ctrl-C when the run writes the record of ``step``'s phase the ``nth`` time."""

    def __init__(self, phase: str, nth: int) -> None:
        super().__init__("nowhere")
        self.at, self.nth, self.seen = phase, nth, 0

    def write_record(self, node: str, path: str, data: Any, sudo: bool, remove_on_failure: Any) -> dict[str, Any]:
        if self.phase == self.at:
            self.seen += 1
            if self.seen == self.nth:
                raise KeyboardInterrupt
        return super().write_record(node, path, data, sudo, remove_on_failure)


def test_ctrl_c_after_a_replica_is_registered_stops_nothing() -> None:
    plan = plan_case("resume-switch")
    marks = {s["id"]: s.get("on_interrupt") for s in plan["steps"]}
    assert marks["r1-ready"] == "resume-1" and marks["r1-record"] == "paused-1"
    assert marks["r2-gateway-drain"] == "resume-2-stopped" and marks["record"] == "paused-2"
    backend = _CtrlCAt("record", 1)  # r1-record: spark-a+b were registered just before
    with pytest.raises(KeyboardInterrupt) as exc:
        planrun.execute(plan, backend)
    state = exc.value.args[0]
    assert state.completed == ["paused-1"]
    assert _stops(backend, AB) == ["stop"] and not _stops(backend, CD)
    rec = backend.records[-1]
    assert rec["state"] == "degraded"
    assert {h: r["profile"] for h, r in rec["replicas"].items()} == {"spark-a": "halves-next", "spark-c": "halves"}
    assert "interrupted (Ctrl-C) after replica 1" in rec["note"]
    # and that record resumes: spark-a+b are kept, only spark-c+d roll
    again = plan_case("resume-switch", record=rec)
    assert "spark-a+spark-b: keep" in again["note"] and _touched(again, AB) == []


def test_a_record_with_a_third_profile_is_not_resumed_and_the_plan_says_why() -> None:
    base = plan_case("rolling-switch")["branches"]["degraded-2-1"][-1]["params"]["record"]
    rec = {**base, "replicas": {h: {**r, "profile": "elsewhere"} for h, r in base["replicas"].items()}}
    rec["replicas"]["spark-x"] = {**rec["replicas"]["spark-c"], "profile": "third", "nodes": []}
    plan = plan_case("resume-switch", record=rec)
    assert "not resumed from the degraded record" in plan["note"] and "3 profiles" in plan["note"]


def test_the_supervisor_ends_left_degraded_when_a_resumed_replica_does_not_come_up() -> None:
    """A supervised switch runs the same plan on the head: its last event says "left-degraded" (exit 8),
    never "failed ... nothing serves" while replicas serve."""
    plan = plan_case("resume-switch")
    doc = {"plan": plan, "served_name": "deepseek-v4-flash", "previous": None, "previous_served_name": None}
    state = planrun.execute(plan, FailsAt({("ready", C)}))
    phase, message, rc = planrun.outcome(state, doc)
    assert (phase, rc) == ("left-degraded", 8) and "halves given back" in message
    assert phase in FINAL_PHASES
    # a step of a degraded branch emits its phase "degraded": the follower must not take it for the end
    assert "degraded" not in FINAL_PHASES
    done = planrun.execute(plan, StubBackend("nowhere"))
    assert planrun.outcome(done, doc)[::2] == ("done", 0)


@pytest.mark.parametrize("branch", ["degraded-1-1", "degraded-2-1", "degraded-2-2", "paused-1", "paused-2"])
@pytest.mark.parametrize("fails", [None, (A, ()), (C, ()), (A, (A,)), (C, (C,))])
def test_from_every_degraded_record_a_roll_writes_whose_backends_are_its_replicas(
        branch: str, fails: tuple[str, tuple[str, ...]] | None) -> None:
    """Every record the rolling switch can leave degraded, resumed, with each replica failing (and its way
    back failing too): what the record said serves the profile is never stopped, and the run ends with a
    record whose gateway backends are exactly its serving heads (degraded) or with the profile serving."""
    plan = _from(branch)
    before = plan_case("rolling-switch")["branches"][branch][-1]["params"]["record"]
    kept = [h for h, r in before["replicas"].items() if r["profile"] == "halves-next"]
    bad = set() if fails is None else {("ready", fails[0]), *(("rollback", ip) for ip in fails[1])}
    backend = FailsAt(bad)
    state = planrun.execute(plan, backend)
    rec = backend.records[-1]
    for h in kept:  # its nodes are never sent a stop
        nodes = tuple(before["replicas"][h]["nodes"])
        assert not _stops(backend, nodes), (h, _stops(backend, nodes))
    if state.result == "done":
        assert rec["state"] == "serving" and "replicas" not in rec
        return
    assert rec["state"] == "degraded" and state.completed, (state.branches, state.completed)
    assert {b["head"] for b in rec["gateway"]["backends"]} == set(rec["replicas"]) == set(rec["heads"])
    assert set(rec["replicas"]) >= set(kept)  # a resume never ends with less of the profile serving
    assert "again resumes" in rec["note"]
