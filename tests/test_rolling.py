"""The rolling switch (sparkctl/plan/rolling.py): which switches roll, the plan's shape, and its way back.

The plan fixtures (tests/plans/rolling-switch, supervised-rolling-switch, gateway-switch-outage)
hold the exact plans; these tests say what must hold of them, and run the plan through the one
interpreter (planrun) with a backend whose new replica never becomes ready.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.model.layout import bind
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.remote import planrun
from tests.test_plan_fixtures import PLANS, REPO, plan_case

from helpers import StubBackend

GW = ["serve.gateway.enabled=true"]


def _layout(name: str, sets: tuple[str, ...] = ()) -> Any:
    inv = load_inventory(REPO / "inventory.yaml")
    return bind(resolve(name, Roots.make(root=str(PLANS), env={}), sets), inv)


def test_which_switches_roll_and_why_the_others_do_not() -> None:
    from sparkctl.plan import switchplan as rolling

    halves, tp4 = _layout("halves"), _layout("ds41f-tp4-ring")
    roll, why = rolling.groups(_layout("halves-next"), halves)
    assert why == "" and [(g.nodes, g.old_heads) for g in roll] == [(("spark-a", "spark-b"), ("spark-a",)),
                                                                    (("spark-c", "spark-d"), ("spark-c",))]
    assert rolling.groups(halves, tp4) == ([], "the old stack has one replica: no replica can stay up while it "
                                               "is replaced")
    assert rolling.groups(tp4, halves)[1].startswith("the new stack has one replica")
    # four single-node replicas -> two TP2 replicas: each new replica takes two old ones
    singles = _layout("halves", ("topology.tp_size=1", "topology.replicas=4", "topology.layout=single"))
    roll, why = rolling.groups(halves, singles)
    assert why == "" and [g.old_heads for g in roll] == [("spark-a", "spark-b"), ("spark-c", "spark-d")]
    # an old TP2 replica across two new ones cannot be replaced while the other serves
    assert "spans two new replicas" in rolling.groups(singles, halves)[1] or rolling.groups(singles, halves)[0]


def test_the_rolling_plan_replaces_one_replica_at_a_time_behind_the_gateway() -> None:
    plan = plan_case("rolling-switch")
    ids = [s["id"] for s in plan["steps"]]
    assert plan["outage"].startswith("none expected: 2 replicas replaced one at a time")
    # the gateway runs and the old replicas are registered before anything is drained
    assert ids.index("gateway-start") < ids.index("gateway-keep") < ids.index("record-start") \
        < ids.index("r1-gateway-drain")
    for k, nodes in ((1, ["spark-a", "spark-b"]), (2, ["spark-c", "spark-d"])):
        order = [f"r{k}-gateway-drain", f"r{k}-stop", f"r{k}-push", f"r{k}-start-1", f"r{k}-ready",
                 f"r{k}-gateway-register"]
        assert [ids.index(i) for i in order] == sorted(ids.index(i) for i in order), ids
        step = {s["id"]: s for s in plan["steps"]}
        assert step[f"r{k}-stop"]["nodes"] == nodes and step[f"r{k}-push"]["nodes"] == nodes
        assert list(step[f"r{k}-ready"]["params"]["endpoints"]) == [nodes[0]]  # this replica's head only
        assert list(step[f"r{k}-ready"]["params"]["watch"]) == nodes
        drain = step[f"r{k}-gateway-drain"]["commands"]["spark-a"]
        assert " drain " in drain and drain.count("--backend") == 1 and "--timeout" in drain
        assert step[f"r{k}-gateway-register"]["commands"]["spark-a"].count("--backend") == 1
        assert {step[i]["on_fail"] for i in order[1:]} == {f"rollback-{k}"}
    # traffic never leaves the old stack before a new replica is ready: replica 2 is drained
    # only after replica 1 is registered
    assert ids.index("r1-gateway-register") < ids.index("r1-record") < ids.index("r2-gateway-drain")
    assert "stop-stale" not in ids and ids[-1] == "record"


def test_each_rollback_branch_gives_the_old_replicas_back_and_undoes_the_replicas_replaced_before() -> None:
    plan = plan_case("rolling-switch")
    b1, b2 = plan["branches"]["rollback-1"], plan["branches"]["rollback-2"]
    # replica 1 failed: only its nodes change; spark-c and spark-d (old, serving) are never touched
    assert {n for s in b1 for n in s["nodes"] if s["kind"] in ("stop", "put", "run") and s["id"] != "rb1-gateway-"
            "register" and s["id"] != "rb1-gateway-deregister"} == {"spark-a", "spark-b"}
    ids2 = [s["id"] for s in b2]
    assert ids2.index("rb2-stop") < ids2.index("rb2-ready") < ids2.index("rb2-gateway-register") \
        < ids2.index("rb2-r1-gateway-drain") < ids2.index("rb2-r1-stop") < ids2.index("rb2-r1-ready") \
        < ids2.index("rb2-r1-gateway-register") < ids2.index("rb2-record")
    for b in (b1, b2):
        rec = b[-1]["params"]["record"]
        assert (rec["profile"], rec["state"]) == ("halves", "serving") and "did not come up" in rec["note"]
        assert b[-1].get("on_fail", "abort") == "abort"  # the old replicas serve: a record failure stops nothing


def test_a_plain_switch_states_its_outage() -> None:
    out = plan_case("gateway-switch-outage")
    assert "rollback" in out["branches"] and not any(b.startswith("rollback-") for b in out["branches"])
    assert "one replica" in out["outage"] and "503 with Retry-After" in out["outage"]
    assert "no refused connection" in out["outage"]
    assert "refused connections" in plan_case("switch-rollback")["outage"]  # no gateway: the ports refuse


def test_the_supervised_rolling_switch_hands_the_whole_roll_to_the_head() -> None:
    sup = plan_case("supervised-rolling-switch")
    assert [s["id"] for s in sup["operator"]["steps"]][:3] == ["lock", "check", "clock"]
    head = sup["head"]
    assert {"rollback-1", "rollback-2", "degraded-1-1", "degraded-2-1", "degraded-2-2", "paused-1", "paused-2", "stop",
            "finally"} == set(head["branches"])
    assert [s["id"] for s in head["steps"]] == [s["id"] for s in plan_case("rolling-switch")["steps"]][3:]


@pytest.mark.parametrize("bad,branch", [("192.168.1.101", "rollback-1"), ("192.168.1.103", "rollback-2")])
def test_a_new_replica_that_never_becomes_ready_rolls_back_and_the_record_says_so(bad: str, branch: str) -> None:
    plan = plan_case("rolling-switch")
    backend = StubBackend(bad)
    state = planrun.execute(plan, backend)
    assert state.result == "failed" and state.branches == [branch] and state.completed == [branch]
    assert state.failure is not None and state.failure["step"].endswith("-ready")
    rec = backend.records[-1]
    assert (rec["profile"], rec["state"]) == ("halves", "serving") and "did not come up" in rec["note"]
    run = [o["id"] for o in state.outcomes]
    if branch == "rollback-1":  # the other old replica kept serving: nothing but the clock cap ran on its nodes
        assert not [c for ph, n, c in backend.ran if n in ("spark-c", "spark-d") and ph != "clock"], run
        assert "r2-gateway-drain" not in run
    else:  # replica 1 (already new) got its old replica back after replica 2's nodes did
        assert run.index("rb2-ready") < run.index("rb2-r1-gateway-drain") < run.index("rb2-r1-ready")


def test_the_rolling_switch_when_every_replica_serves() -> None:
    plan = plan_case("rolling-switch")
    backend = StubBackend("nowhere")
    state = planrun.execute(plan, backend)
    assert state.result == "done", state.failure
    notes = [(r["profile"], r["state"], r["note"]) for r in backend.records]
    assert notes[0][:2] == ("halves-next", "starting")
    assert "spark-a+spark-b serve halves-next, spark-c+spark-d still serve halves" in notes[1][2]
    assert notes[-1][:2] == ("halves-next", "serving")


def test_each_record_of_the_roll_names_what_serves_for_a_gateway_rebuilt_meanwhile() -> None:
    """A gateway restarted mid-roll rebuilds from the last record written (gateway_ctl.live_backends):
    before the first drain the old replica 2 (replica 1 is drained next); once replica 1 is registered
    the new replica 1 (replica 2 is drained next); the serving record, every new replica."""
    from sparkctl.remote import gateway_ctl

    backend = StubBackend("nowhere")
    assert planrun.execute(plan_case("rolling-switch"), backend).result == "done"
    live = [gateway_ctl.live_backends([r]) for r in backend.records]
    assert live == [[("http://192.168.1.103:8000", "deepseek-v4-flash")],  # record-start: old spark-c
                    [("http://127.0.0.1:8000", "deepseek-v4-flash")],  # r1-record: new spark-a
                    [("http://127.0.0.1:8000", "deepseek-v4-flash"), ("http://192.168.1.103:8000",
                                                                     "deepseek-v4-flash")]], live
    assert "serving" not in backend.records[-1]["gateway"]  # the serving record's backends say it


# --------------------------------------------------------------------------- the hold (gateway_ctl)


def test_hold_keeps_the_name_draining_with_its_settle_time_and_release_removes_it_at_once() -> None:
    """Against a stand-in of smg's worker API that drains as smg 1.13.0 does (DELETE of a ready worker:
    Draining for its settle time; of a draining one: removed). The real smg: the e2e module."""
    import json
    import threading
    from http.server import ThreadingHTTPServer

    from sparkctl.remote import gateway_ctl
    from tests.test_gateway import _Stub

    calls: list[tuple[str, str, Any]] = []

    class Smg(_Stub):
        def handler(self) -> Any:
            stub, base = self, super().handler()

            class H(base):  # type: ignore[misc,valid-type]
                def do_POST(self) -> None:  # noqa: N802
                    spec = json.loads(self.rfile.read(int(self.headers["content-length"])))
                    # smg asks the backend before it registers it: the stand-in must answer /v1/models
                    with gateway_ctl._OPENER.open(f"{spec['url']}/v1/models", timeout=5) as r:
                        served = json.loads(r.read())["data"][0]["id"]
                    wid = f"w{len(stub.workers) + len(stub.deleted)}"
                    stub.workers[wid] = {"id": wid, "url": spec["url"], "model_id": served, "status": "ready",
                                         "labels": spec.get("labels", {}), "settle": 5}
                    calls.append(("POST", wid, spec.get("labels")))
                    self._send(202, {"worker_id": wid})

                def do_PATCH(self) -> None:  # noqa: N802
                    wid = self.path.rsplit("/", 1)[-1]
                    body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                    stub.workers[wid]["settle"] = body["health"]["drain_settle_secs"]
                    calls.append(("PATCH", wid, body))
                    self._send(202, {"worker_id": wid})

                def do_DELETE(self) -> None:  # noqa: N802
                    wid = self.path.rsplit("/", 1)[-1]
                    w = stub.workers[wid]
                    calls.append(("DELETE", wid, w["status"]))
                    if w["status"] == "draining":
                        del stub.workers[wid]
                    else:
                        w["status"] = "draining"
                    self._send(202, {"worker_id": wid})

                def do_GET(self) -> None:  # noqa: N802
                    if self.path.startswith("/workers/"):
                        self._send(200, stub.workers[self.path.rsplit("/", 1)[-1]])
                    else:
                        super().do_GET()
            return H

    s = Smg()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), s.handler())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    gw = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        msg = gateway_ctl.hold(gw, None, ["x", "y"], 900, 5)
        assert msg == "holding x, y at 503 + Retry-After for up to 900 s"
        held = sorted((w["model_id"], w["status"], w["settle"], w["labels"]) for w in s.workers.values())
        assert held == [("x", "draining", 900, {"sparkctl_hold": "1"}), ("y", "draining", 900, {"sparkctl_hold": "1"})]
        # the settle time is set before the removal (the removal sleeps the value it reads)
        kinds = [c[0] for c in calls]
        assert kinds == ["POST", "PATCH", "DELETE", "POST", "PATCH", "DELETE"], calls
        s.workers["r"] = {"id": "r", "url": "http://10.0.0.1:8080", "model_id": "x", "status": "ready", "labels": {}}
        assert gateway_ctl.release(gw, None, ["x"]) == "released 1 holder(s)"
        assert sorted(w["model_id"] for w in s.workers.values()) == ["x", "y"]  # the replica stays; y still held
        assert gateway_ctl.release(gw, None, []) == "released 1 holder(s)" and list(s.workers) == ["r"]
    finally:
        srv.shutdown()
        srv.server_close()
