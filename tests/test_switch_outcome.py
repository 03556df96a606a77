"""A rolling switch whose way back fails part way: degraded, never stopped (issue 20).

The plan (tests/plans/rolling-switch) runs through the one interpreter (planrun) with a
backend whose probes fail where the test says: the new replica, then an old one on the way back.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from typing import Any

import pytest

from sparkctl.errors import ExitStatus, SwitchDegraded
from sparkctl.remote import planrun
from tests.test_plan_fixtures import plan_case

from helpers import FailsAt, StubBackend

A, C = "192.168.1.101", "192.168.1.103"  # spark-a's and spark-c's addresses: the replicas' heads


def _stopped_on(backend: StubBackend, nodes: tuple[str, ...]) -> list[str]:
    return [c for ph, n, c in backend.ran if n in nodes and "echo \"left:" in c]


def test_the_plan_has_a_degraded_branch_for_each_replica_on_each_way_back() -> None:
    plan = plan_case("rolling-switch")
    assert {"degraded-1-1", "degraded-2-2", "degraded-2-1"} <= set(plan["branches"])
    for k in (1, 2):
        fails = {s.get("on_fail", "abort") for s in plan["branches"][f"rollback-{k}"]}
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
                                           ["served_name"], "port": 8000, "engine": "vllm", "clock_cap_mhz": 2100,
                                           "nodes": ["spark-c", "spark-d"], "sets": ["serve.gateway.enabled=true"]}}
    assert "spark-a" not in rec["listen"]  # a stopped head listens nowhere
    assert "sparkctl switch halves-next" in rec["note"] and "sparkctl down" in rec["note"]


def test_the_old_replica_that_does_not_come_back_leaves_the_others_serving() -> None:
    plan = plan_case("rolling-switch")
    backend = FailsAt({("ready", A), ("rollback", A)})  # replica 1 fails, and its old replica too
    state = planrun.execute(plan, backend)
    assert state.branches == ["rollback-1", "degraded-1-1"] and state.completed == ["degraded-1-1"]
    assert state.branch_failure is not None and state.branch_failure.step["id"] == "rb1-ready"
    assert not _stopped_on(backend, ("spark-c", "spark-d"))  # the old replica there served throughout
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {"spark-c"}
    assert rec["replicas"]["spark-c"]["profile"] == "halves"


def test_a_failure_giving_back_an_earlier_replica_keeps_both_others_serving() -> None:
    plan = plan_case("rolling-switch")
    backend = FailsAt({("ready", C), ("rollback", A)})  # replica 2 fails; replica 1's old one does not come back
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


# --------------------------------------------------------------------------- status of a degraded record


class _Models(http.server.BaseHTTPRequestHandler):
    """An engine that serves ``m-old`` only (the old profile's name, on the old profile's port)."""

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"object": "list", "data": [{"id": "m-old"}]} if self.path == "/v1/models" else {}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_status_judges_each_node_of_a_degraded_record_by_the_replica_it_serves_in() -> None:
    """spark-a was given back the old profile (m-old on its port, clock cap 1800 MHz) and serves;
    spark-b's replica did not come back and was stopped on purpose: no drift names it. The new
    profile's name, port and clock cap (m-new, 9, 2400) are asked of nobody."""
    from sparkctl.model.inventory import loads_inventory
    from sparkctl.model.record import NodeRecord, RunRecord
    from sparkctl.ops.status import cluster_status
    from sparkctl.transport import FakeTransport, reply

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        inv = loads_inventory("nodes:\n  - {name: spark-a, host: 127.0.0.1}\n  - {name: spark-b, host: 127.0.0.2}\n"
                              "cables:\n  - [spark-a:p0, spark-b:p1]\n", "inv.yaml")
        rec = RunRecord(profile="new", sets=(), digest="d", engine="vllm", engine_version="v", served_name="m-new",
                        port=9, heads=("spark-a",), state="degraded", started_at="t", updated_at="t",
                        clock_cap_mhz=2400, nodes={n: NodeRecord(0, i, "h", {}, "systemd")
                                                   for i, n in enumerate(("spark-a", "spark-b"))},
                        replicas={"spark-a": {"profile": "old", "served_name": "m-old", "port": port,
                                              "engine": "vllm", "clock_cap_mhz": 1800, "nodes": ["spark-a"]}})
        assert rec.serves_on("spark-b") is None and rec.serves_on("spark-a").port == port  # type: ignore[union-attr]
        t = FakeTransport(nodes=["spark-a", "spark-b"])
        t.add("*", re.compile(r"for f in .*sparkctl-record.*", re.DOTALL),
              reply("\n==> sparkctl-record /var/lib/sparkctl/record.json\n" + json.dumps(rec.to_dict())))
        t.add("*", re.compile(r"\[ -e .*supervisor.*", re.DOTALL), reply(""))
        t.add("*", re.compile(r"sh -c .*", re.DOTALL), reply(""))  # the batch: no engine runs, no clock lock
        st = cluster_status(inv, t)
        assert st["endpoint"]["spark-a"]["state"] == "serving" and st["endpoint"]["spark-a"]["url"].endswith(f":{port}")
        drift = st["drift"]
        assert "spark-a: rank 0 is not running" in drift
        assert "spark-a: clock lock lost (record: 0,1800 MHz)" in drift
        assert not [d for d in drift if d.startswith("spark-b")], drift
        assert not [d for d in drift if "does not serve" in d or "2400" in d], drift
    finally:
        srv.shutdown()
        srv.server_close()


class _CtrlC(StubBackend):
    """The operator presses Ctrl-C while replica ``k``'s new engine is being waited for."""

    def __init__(self, address: str) -> None:
        super().__init__("nowhere")
        self.address, self.pressed = address, False

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool, api_key: Any = None,
              via: str | None = None) -> tuple[bool, str]:
        if self.phase == "ready" and self.address in url and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt
        return True, "serving"


@pytest.mark.parametrize("address,branch,stopped,serving", [(A, "degraded-1-1", ("spark-a", "spark-b"), "spark-c"),
                                                            (C, "degraded-2-2", ("spark-c", "spark-d"), "spark-a")])
def test_ctrl_c_mid_roll_stops_the_replica_being_replaced_and_nothing_that_serves(
        address: str, branch: str, stopped: tuple[str, ...], serving: str) -> None:
    plan = plan_case("rolling-switch")
    ids = [s["id"] for s in plan["steps"]]
    k = branch[-1]
    until = ids.index(f"r{k}-gateway-register") + 1  # once registered, Ctrl-C stops nothing (paused-K)
    assert {s.get("on_interrupt") for s in plan["steps"][:until] if s["on_fail"] == f"rollback-{k}"} == {branch}
    assert {s.get("on_interrupt") for s in plan["steps"][until:] if s["on_fail"] == f"rollback-{k}"} <= {
        f"paused-{k}"}
    # from the first drain on, no step's Ctrl-C takes branch stop (which would stop what serves)
    assert all(s.get("on_interrupt") for s in plan["steps"][ids.index("r1-gateway-drain"):])
    backend = _CtrlC(address)
    with pytest.raises(KeyboardInterrupt) as exc:
        planrun.execute(plan, backend)
    state = exc.value.args[0]
    assert state.interrupted and state.branches == [branch] and state.completed == [branch]
    after = [(n, c) for ph, n, c in backend.ran if ph == "degraded" and "echo \"left:" in c]  # the branch's stops
    assert after and {n for n, _ in after} == set(stopped)
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {serving}
    assert "interrupted (Ctrl-C)" in rec["note"] and "sparkctl down" in rec["note"]
    from sparkctl.ops.executor import interrupted_hint

    assert "the other replicas serve" in interrupted_hint(state)
    assert interrupted_hint(None).startswith("what this run started was stopped")


def test_a_plain_switch_still_stops_on_ctrl_c() -> None:
    """No replica can stay up in a plain switch: Ctrl-C takes branch stop, as before."""
    assert not [s for s in plan_case("switch-rollback")["steps"] if s.get("on_interrupt")]


class _CtrlCOnRecord(StubBackend):
    """The operator presses Ctrl-C as the run records replica 1 replaced (just after its registration)."""

    def write_record(self, node: str, path: str, data: Any, sudo: bool, remove_on_failure: Any) -> dict[str, Any]:
        if self.phase == "record" and not getattr(self, "pressed", False):
            self.pressed = True
            raise KeyboardInterrupt
        return super().write_record(node, path, data, sudo, remove_on_failure)


def test_ctrl_c_just_after_a_replica_is_registered_stops_nothing() -> None:
    plan = plan_case("rolling-switch")
    assert next(s for s in plan["steps"] if s["id"] == "r1-record")["on_interrupt"] == "paused-1"
    backend = _CtrlCOnRecord("nowhere")
    with pytest.raises(KeyboardInterrupt) as exc:
        planrun.execute(plan, backend)
    state = exc.value.args[0]
    assert state.completed == ["paused-1"]
    # spark-a+b were stopped once (their old replica, r1-stop); spark-c+d never
    assert [ph for ph, n, c in backend.ran if n == "spark-a" and "echo \"left:" in c] == ["stop"]
    assert not _stopped_on(backend, ("spark-c", "spark-d"))
    rec = backend.records[-1]
    assert rec["state"] == "degraded" and "after replica 1" in rec["note"]
    assert {h: r["profile"] for h, r in rec["replicas"].items()} == {"spark-a": "halves-next", "spark-c": "halves"}
    # the same switch again resumes from it: spark-a+b kept, spark-c+d rolled
    again = plan_case("resume-switch", record=rec)
    assert "spark-a+spark-b: keep" in again["note"] and "spark-c+spark-d: roll" in again["note"]


class _CtrlCInRollback(FailsAt):
    """Replica 2 never serves; the operator presses Ctrl-C while its way back waits for the old replica."""

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool, api_key: Any = None,
              via: str | None = None) -> tuple[bool, str]:
        if self.phase == "rollback" and C in url:
            raise KeyboardInterrupt
        return super().probe(url, served_name, metric, smoke, api_key, via)


def test_ctrl_c_inside_a_way_back_ends_it_there_and_says_so() -> None:
    plan = plan_case("rolling-switch")
    backend = _CtrlCInRollback({("ready", C)})
    with pytest.raises(KeyboardInterrupt) as exc:
        planrun.execute(plan, backend)
    state = exc.value.args[0]
    assert isinstance(state, planrun.RunState) and state.interrupted and state.result == "interrupted"
    assert state.branches == ["rollback-2"] and state.completed == []  # cut short, nothing else run
    assert state.interrupted_in == "rollback-2 at step rb2-ready"
    assert [o["id"] for o in state.outcomes][-1] == "unlock"  # branch finally still runs
    from sparkctl.ops.executor import interrupted_hint

    assert interrupted_hint(state).startswith("interrupted inside branch rollback-2 at step rb2-ready")
