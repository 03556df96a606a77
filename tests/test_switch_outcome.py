"""A rolling switch whose way back fails part way: degraded, never stopped (issue 20).

The plan (tests/plans/rolling-switch) runs through the one interpreter (planrun) with a
backend whose probes fail where the test says: the new replica, then an old one on the way back.
"""

from __future__ import annotations

from typing import Any

from sparkctl.errors import ExitStatus, SwitchDegraded
from sparkctl.remote import planrun
from tests.test_plan_fixtures import plan_case
from tests.test_rolling import _Backend

A, C = "192.168.1.101", "192.168.1.103"  # spark-a's and spark-c's addresses: the replicas' heads


class _Fails(_Backend):
    """Every probe of ``bad`` (phase, address) pairs fails: the engine there never serves."""

    def __init__(self, bad: set[tuple[str, str]]) -> None:
        super().__init__("nowhere")
        self.bad_at = bad

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool, api_key: Any = None,
              via: str | None = None) -> tuple[bool, str]:
        if any(self.phase == ph and ip in url for ph, ip in self.bad_at):
            return False, "connection refused"
        return True, "serving"


def _stopped_on(backend: _Backend, nodes: tuple[str, ...]) -> list[str]:
    return [c for ph, n, c in backend.ran if n in nodes and "echo \"left:" in c]


def test_the_plan_has_a_degraded_branch_for_each_replica_on_each_way_back() -> None:
    plan = plan_case("rolling-switch")
    assert {"degraded-1-1", "degraded-2-2", "degraded-2-1"} <= set(plan["branches"])
    for k in (1, 2):
        fails = {s["on_fail"] for s in plan["branches"][f"rollback-{k}"] if s["id"] != f"rb{k}-record"}
        assert "stop" not in fails, fails  # a failure on the way back never takes the stop branch
    for name, steps in plan["branches"].items():
        if name.startswith("degraded-"):
            rec = steps[-1]["params"]["record"]
            assert rec["state"] == "degraded" and "remove_on_failure" not in steps[-1]["params"]
            assert {b["head"] for b in rec["gateway"]["backends"]} == set(rec["replicas"]) == set(rec["heads"])
    # degraded-2-1: replica 2 already had its old replica back (spark-c), replica 1 did not come back
    d21 = plan["branches"]["degraded-2-1"]
    assert [s["nodes"] for s in d21 if s["kind"] == "stop"] == [["spark-a", "spark-b"]]
    rec = d21[-1]["params"]["record"]
    assert rec["replicas"] == {"spark-c": {"profile": "halves", "served_name": rec["replicas"]["spark-c"]
                                           ["served_name"], "port": 8000, "nodes": ["spark-c", "spark-d"]}}
    assert "sparkctl switch halves-next" in rec["note"] and "sparkctl down" in rec["note"]


def test_the_old_replica_that_does_not_come_back_leaves_the_others_serving() -> None:
    plan = plan_case("rolling-switch")
    backend = _Fails({("ready", A), ("rollback", A)})  # replica 1 fails, and its old replica too
    state = planrun.execute(plan, backend)
    assert state.branches == ["rollback-1", "degraded-1-1"] and state.completed == ["degraded-1-1"]
    assert state.branch_failure is not None and state.branch_failure.step["id"] == "rb1-ready"
    assert not _stopped_on(backend, ("spark-c", "spark-d"))  # the old replica there served throughout
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {"spark-c"}
    assert rec["replicas"]["spark-c"]["profile"] == "halves"


def test_a_failure_giving_back_an_earlier_replica_keeps_both_others_serving() -> None:
    plan = plan_case("rolling-switch")
    backend = _Fails({("ready", C), ("rollback", A)})  # replica 2 fails; replica 1's old one does not come back
    state = planrun.execute(plan, backend)
    assert state.branches == ["rollback-2", "degraded-2-1"] and state.completed == ["degraded-2-1"]
    run = [o["id"] for o in state.outcomes]
    assert "rb2-ready" in run and "stop" not in state.branches
    # after rb2-gateway-register (spark-c serves halves again) nothing stopped spark-c or spark-d
    after = run.index("rb2-gateway-register")
    assert not [i for i in run[after:] if i.endswith("-stop") and i.startswith(("dg2-2", "rb2-stop"))]
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and rec["replicas"]["spark-c"]["profile"] == "halves"


def test_degraded_has_its_own_exit_code() -> None:
    assert SwitchDegraded("x").exit_code == ExitStatus.DEGRADED == 8
