"""The gateway seen from outside and the laws per stack (issues 20 and 21), without a cluster.

Real shells on this machine (LocalTransport: every "node" a directory under tmp_path) run the
commands status and the record steps send; a stand-in for smg's worker API (tests/test_gateway's
``_Stub``) answers the ctl. Covered: each stack's laws' verdicts beside its record, read with the
records in one round trip; status's view of the gateway in one round trip per gateway node, the
operator's key on stdin; ``gateway down`` as a plan, refused while a stack serves through it;
the record's copy beside a gateway on another node, from which the ctl's rebuild registers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from sparkctl.errors import ConfigError
from sparkctl.model.inventory import loads_inventory
from sparkctl.model.paths import GATEWAY_CONFIG, GATEWAY_CTL, under
from sparkctl.node import headstate, pagehtml
from sparkctl.node.metrics import head_families
from sparkctl.ops import executor, gatewayops, lock
from sparkctl.plan import gatewayplan, planner
from sparkctl.plan.steps import Plan, calls, describe
from sparkctl.remote import gateway_ctl
from sparkctl.transport import LocalTransport
from tests.test_gateway import _Stub, stub  # noqa: F401 - the fixture
from tests.test_stacks import _rec

HOLDER = {"holder": "t", "since": "t", "operation": "gateway down", "host": "elsewhere", "pid": 1, "run": "t:run"}


def _local(tmp_path: Path) -> tuple[Any, LocalTransport]:
    nodes = "".join(f"  - {{name: spark-{x}, host: 127.0.0.{i + 1}, prefix: {tmp_path / x}}}\n"
                    for i, x in enumerate("abcd"))
    cables = ("cables:\n  - [spark-a:p0, spark-b:p1]\n  - [spark-b:p0, spark-c:p1]\n"
              "  - [spark-c:p0, spark-d:p1]\n  - [spark-d:p0, spark-a:p1]\n")
    inv = loads_inventory("nodes:\n" + nodes + cables, str(tmp_path / "inv.yaml"))
    return inv, LocalTransport(nodes=inv.names, sudo=False)


class _Counting:
    """A transport that counts its round trips."""

    def __init__(self, inner: LocalTransport) -> None:
        self.inner, self.runs = inner, 0

    def run(self, *a: Any, **k: Any) -> Any:
        self.runs += 1
        return self.inner.run(*a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _gw(node: str, backends: list[str], url: str = "http://127.0.0.1:30000") -> dict[str, Any]:
    return {"node": node, "url": url, "listen": "0.0.0.0", "port": 30000, "metrics_port": 29000,
            "backends": [{"url": b, "model": "m", "head": "spark-a", "replica": i} for i, b in enumerate(backends)]}


def _write_record(inv: Any, t: Any, rec: Any) -> Any:
    step = planner.record_step(inv, "record", "record", "spark-a", rec, "record")
    state = executor.run_plan(Plan("t", None, (step,)), executor.TransportBackend(inv, t, lambda *_: None))
    assert state.result == "done", state.failure
    return step


# --------------------------------------------------------------------------- laws per stack


def test_each_stacks_verdicts_survive_the_others_check_and_are_read_with_the_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv, t = _local(tmp_path)
    _write_record(inv, t, _rec("default", ("spark-a", "spark-b")))
    _write_record(inv, t, _rec("right", ("spark-c", "spark-d"), served="y"))
    for stack, law in (("default", "kernel_pin"), ("right", "fabric")):
        target = planner.verdicts_target(inv, stack)
        lock.write_verdicts(t, target, f"p-{stack}", "now", [{"law": law, "node": "spark-c", "status": "ok"}])
    assert (tmp_path / "a/var/lib/sparkctl/laws.json").is_file()  # the default stack keeps the old file
    assert (tmp_path / "a/var/lib/sparkctl/laws/right.json").is_file()
    c = _Counting(t)
    records, verdicts = lock.read_state(inv, c)
    assert c.runs == 1  # one round trip for the records and the verdicts
    assert sorted(records) == ["default", "right"]
    assert {s: v["verdicts"][0]["law"] for s, v in verdicts.items()} == {"default": "kernel_pin", "right": "fabric"}
    assert verdicts["right"]["stack"] == "right"
    assert lock.read_verdicts(inv, t, "right")["profile"] == "p-right"  # type: ignore[index]


def test_a_laws_file_from_before_stacks_reads_as_the_default_stacks() -> None:
    old = {"profile": "p", "at": "t", "verdicts": [{"law": "kernel_pin", "status": "ok"}]}  # no "stack" key
    text = (f"\n==> sparkctl-record /var/lib/sparkctl/record.json\n{json.dumps(_rec('default', ('spark-a',)).to_dict())}"
            f"\n==> sparkctl-laws /var/lib/sparkctl/laws.json\n{json.dumps(old)}\n"
            "\n==> sparkctl-laws /var/lib/sparkctl/laws/torn.json\n{\"profile\": \n")
    records, verdicts = lock.parse_state(text)
    assert list(records) == ["default"] and verdicts == {"default": old}  # the torn one skipped


def test_the_check_step_of_a_stack_writes_beside_its_record() -> None:
    inv = loads_inventory("nodes:\n  - {name: spark-a, host: 10.0.0.1, sudo: true}\n"
                          "  - {name: spark-b, host: 10.0.0.2}\ncables:\n  - [spark-a:p0, spark-b:p0]\n")
    target = planner.verdicts_target(inv, "blue")
    assert target == {"node": "spark-a", "path": "/var/lib/sparkctl/laws/blue.json", "sudo": True, "stack": "blue"}
    assert planner.verdicts_target(inv)["path"] == "/var/lib/sparkctl/laws.json"


def test_the_exporter_shows_every_stacks_verdicts_with_a_stack_label(tmp_path: Path) -> None:
    (tmp_path / "laws").mkdir()
    (tmp_path / "laws.json").write_text(json.dumps({"verdicts": [{"law": "kernel_pin", "node": "a", "status": "ok"}]}))
    (tmp_path / "laws" / "right.json").write_text(json.dumps(
        {"stack": "right", "verdicts": [{"law": "fabric", "node": "c", "status": "fail"}]}))
    cfg = {"laws": str(tmp_path / "laws.json"), "laws_dir": str(tmp_path / "laws")}
    by_stack = headstate.laws(cfg)
    assert sorted(by_stack) == ["default", "right"]
    text = _expose(list(head_families(None, by_stack, None, None)))
    assert 'sparkctl_law_verdict{law="fabric",law_node="c",stack="right",status="fail",subject=""} 1.0' in text
    assert 'stack="default"' in text
    # a configuration from before stacks (no laws_dir): the default stack's alone
    assert list(headstate.laws({"laws": str(tmp_path / "laws.json")})) == ["default"]
    html = pagehtml.render({"at": 0, "laws_by_stack": by_stack})
    assert 'id="laws" data-stack="default"' in html and 'id="laws-right" data-stack="right"' in html


def _expose(fams: list[Any]) -> str:
    class _C:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(fams)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_C())
    text = generate_latest(reg).decode()
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    return text


# --------------------------------------------------------------------------- the gateway in status


def _install_ctl(tmp_path: Path, inv: Any, node: str, url: str) -> None:
    prefix = inv.node(node).prefix
    ctl, cfg = Path(under(prefix, GATEWAY_CTL)), Path(under(prefix, GATEWAY_CONFIG))
    ctl.parent.mkdir(parents=True, exist_ok=True)
    cfg.parent.mkdir(parents=True, exist_ok=True)
    ctl.write_text(gatewayplan.ctl_source())
    cfg.write_text(json.dumps({"url": url, "node": node, "records": gatewayplan.record_globs(inv, node)}))


def test_status_sees_the_gateway_in_one_round_trip_and_names_a_missing_backend(
        tmp_path: Path, stub: tuple[_Stub, str]) -> None:  # noqa: F811 - the fixture
    s, url = stub
    inv, t = _local(tmp_path)
    _install_ctl(tmp_path, inv, "spark-c", url)
    s.workers["w0"] = {"id": "w0", "url": "http://10.0.0.1:8000", "model_id": "m", "status": "ready",
                       "is_healthy": True}
    s.workers["w1"] = {"id": "w1", "url": "http://10.0.0.2:8000", "model_id": "m", "status": "draining",
                       "is_healthy": True}
    rec = _rec("default", ("spark-a", "spark-b"), gateway=_gw("spark-c", ["http://10.0.0.1:8000",
                                                                          "http://10.0.0.2:8000"]))
    c = _Counting(t)
    gws, drift = gatewayops.gateway_status(inv, c, {"default": rec})
    assert c.runs == 1
    (g,) = gws
    assert (g["node"], g["port"], g["up"], g["state"]) == ("spark-c", 30000, True, "up")
    assert g["backends"] == {"m": [{"url": "http://10.0.0.1:8000", "status": "ready", "healthy": True},
                                   {"url": "http://10.0.0.2:8000", "status": "draining", "healthy": True}]}
    assert drift == {"default": ["spark-c: the gateway does not route m to http://10.0.0.2:8000"]}
    # a stopped stack expects nothing of it; a gateway that does not answer is down
    assert gatewayops.gateway_status(inv, t, {"default": replace(rec, state="stopped")})[1] == {}
    _install_ctl(tmp_path, inv, "spark-c", "http://127.0.0.1:9")
    gws, drift = gatewayops.gateway_status(inv, t, {"default": rec})
    assert gws[0]["state"] == "down" and not gws[0]["up"] and drift["default"][0].startswith("spark-c: the gateway is down")


def test_status_asks_the_gateway_with_the_operators_key_on_stdin(
        tmp_path: Path, stub: tuple[_Stub, str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    s, url = stub
    seen: list[str | None] = []
    inner = s.handler()

    class Keyed(inner):  # type: ignore[misc,valid-type]
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer k3y":
                self._send(401, {"error": "unauthorized"})
            else:
                super().do_GET()

    import threading
    from http.server import ThreadingHTTPServer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        inv, t = _local(tmp_path)
        _install_ctl(tmp_path, inv, "spark-a", f"http://127.0.0.1:{srv.server_address[1]}")
        rec = _rec("default", ("spark-a",), gateway=_gw("spark-a", []), api_key_env="GW_TEST_KEY")
        monkeypatch.delenv("GW_TEST_KEY", raising=False)
        g = gatewayops.gateway_status(inv, t, {"default": rec})[0][0]
        assert g["state"] == "needs key" and "GW_TEST_KEY" in g["error"]
        monkeypatch.setenv("GW_TEST_KEY", "wrong")
        assert gatewayops.gateway_status(inv, t, {"default": rec})[0][0]["state"] == "key refused"
        monkeypatch.setenv("GW_TEST_KEY", "k3y")
        g = gatewayops.gateway_status(inv, t, {"default": rec})[0][0]
        assert g["state"] == "up", g
        assert "Bearer k3y" in seen
        assert "k3y" not in gatewayops.status_command(inv, "spark-a")  # never on a command line
    finally:
        srv.shutdown()
        srv.server_close()


# --------------------------------------------------------------------------- the gateway in the exporter


def test_the_head_exporter_lists_the_gateways_backends_and_is_silent_without_one(
        tmp_path: Path, stub: tuple[_Stub, str]) -> None:  # noqa: F811
    s, url = stub
    s.workers["w0"] = {"id": "w0", "url": "http://10.0.0.1:8000", "model_id": "m", "status": "ready",
                       "is_healthy": True}
    s.workers["w1"] = {"id": "w1", "url": "http://10.0.0.2:8000", "model_id": "m", "status": "draining",
                       "is_healthy": False}
    rec = _rec("default", ("spark-a", "spark-b"), gateway=_gw("spark-a", ["http://10.0.0.1:8000"], url)).to_dict()
    gws = headstate.read_gateways({"default": rec}, "spark-a", {}, None)
    text = _expose(list(head_families(rec, None, None, None, gws)))
    assert 'sparkctl_gateway_up{gateway_node="spark-a"} 1.0' in text
    assert ('sparkctl_gateway_backend{gateway_node="spark-a",model="m",status="draining",url="http://10.0.0.2:8000"}'
            ' 1.0') in text
    assert 'sparkctl_gateway_backend_healthy{gateway_node="spark-a",model="m",url="http://10.0.0.2:8000"} 0.0' in text
    assert ('sparkctl_gateway_backend_expected{gateway_node="spark-a",model="m",stack="default",'
            'url="http://10.0.0.1:8000"} 1.0') in text
    html = pagehtml.render({"at": 0, "gateways": gws})
    assert 'id="gateway" data-node="spark-a"' in html and 'data-url="http://10.0.0.2:8000">draining' in html
    # no record names a gateway: no gateway series at all
    plain = _rec("default", ("spark-a",)).to_dict()
    assert headstate.read_gateways({"default": plain}, "spark-a", {}, None) == []
    assert "sparkctl_gateway" not in _expose(list(head_families(plain, None, None, None, [])))
    # another node's gateway is asked at its bound address (its management host for 0.0.0.0)
    entry = {"node": "spark-c", "url": "http://127.0.0.1:30000", "listen": "0.0.0.0", "port": 30000}
    assert headstate.gateway_url(entry, "spark-a", {"spark-c": "192.168.1.103"}) == "http://192.168.1.103:30000"
    assert headstate.gateway_url({**entry, "listen": "10.20.0.3"}, "spark-a", {}) == "http://10.20.0.3:30000"


def test_metrics_config_scrapes_the_gateway(tmp_path: Path) -> None:
    from sparkctl.model.inventory import load_inventory
    from sparkctl.model.profiles import resolve
    from sparkctl.model.resources import Roots
    from sparkctl.plan import exporterplan

    repo = Path(__file__).resolve().parent.parent
    inv = load_inventory(repo / "inventory.yaml")
    roots = Roots.make(env={})
    res = resolve("tiny-llamacpp", roots, sets=("serve.gateway.enabled=true", "serve.gateway.node=spark-c"))
    gw = exporterplan.gateway_target(res, inv)
    assert gw == ("spark-c", f"{inv.node('spark-c').host}:29000", None)
    text = exporterplan.scrape_config(inv, None, 15, gw)
    assert "job_name: sparkctl-gateway" in text and f"{inv.node('spark-c').host}:29000" in text
    if shutil.which("promtool"):
        (tmp_path / "p.yml").write_text(text)
        r = subprocess.run(["promtool", "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    assert exporterplan.gateway_target(resolve("tiny-llamacpp", roots), inv) is None


# --------------------------------------------------------------------------- gateway down


def test_gateway_down_is_a_plan_refused_while_a_stack_serves_through_it() -> None:
    inv = loads_inventory("nodes:\n  - {name: spark-a, host: 10.0.0.1, sudo: true}\n"
                          "  - {name: spark-b, host: 10.0.0.2}\ncables:\n  - [spark-a:p0, spark-b:p0]\n")
    serving = _rec("default", ("spark-a",), gateway=_gw("spark-b", ["http://10.0.0.1:8000"]))
    with pytest.raises(ConfigError, match="the gateway on spark-b still serves default") as exc:
        gatewayops.plan_gateway_down(inv, {"default": serving}, HOLDER)
    assert "sparkctl down" in str(exc.value.hint) and "--force" in str(exc.value.hint)
    plan = gatewayops.plan_gateway_down(inv, {"default": serving}, HOLDER, force=True)
    assert [s.kind for s in plan.steps] == ["lock", "run"] and plan.branches["finally"][0].id == "unlock"
    stop = plan.steps[1]
    assert stop.nodes == ("spark-b",) and "systemctl disable --now sparkctl-gateway.service" in stop.commands["spark-b"]
    assert any("disable --now sparkctl-gateway" in line for line in describe(plan))
    assert [c.sudo for c in calls(stop)] == [inv.node("spark-b").sudo]  # the inventory's sudo there
    # stopped: no refusal; no gateway in the records and no --node: one clear error
    stopped = replace(serving, state="stopped")
    assert gatewayops.plan_gateway_down(inv, {"default": stopped}, HOLDER).steps[1].nodes == ("spark-b",)
    with pytest.raises(ConfigError, match="no record names a gateway"):
        gatewayops.plan_gateway_down(inv, {"default": _rec("default", ("spark-a",))}, HOLDER)
    assert gatewayops.plan_gateway_down(inv, {}, HOLDER, node="spark-a").steps[1].nodes == ("spark-a",)


# --------------------------------------------------------------------------- rebuild on another node


def test_a_gateway_on_another_node_rebuilds_from_the_record_copy_its_record_step_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stub: tuple[_Stub, str]) -> None:  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    s, url = stub
    inv, t = _local(tmp_path)
    rec = _rec("blue", ("spark-a", "spark-b"), gateway=_gw("spark-c", ["http://10.0.0.1:8000"]))
    step = _write_record(inv, t, rec)
    copy = tmp_path / "c/var/lib/sparkctl/gateway-records/blue.json"
    assert step.params["mirror"]["node"] == "spark-c" and copy.is_file()
    assert [(c.node, c.text) for c in calls(step) if c.kind == "put"] == [
        ("spark-a", str(tmp_path / "a/var/lib/sparkctl/stacks/blue.json")), ("spark-c", str(copy))]
    assert "its copy on the gateway's node spark-c" in step.changes
    cfg = {"url": url, "node": "spark-c", "records": gatewayplan.record_globs(inv, "spark-c")}
    assert gateway_ctl.rebuild(cfg, None, 5) == "rebuilt 1 backend(s) from the record"
    assert [w["url"] for w in s.workers.values()] == ["http://10.0.0.1:8000"]
    # negative control: without the copy (the gateway's node holds no record) the rebuild registers nothing
    copy.unlink()
    s.workers.clear()
    assert gateway_ctl.rebuild(cfg, None, 5) == "rebuilt 0 backend(s) from the record"
    # a gateway on the state node reads every stack's record there, and needs no copy
    assert gatewayplan.record_globs(inv, "spark-a") == [str(tmp_path / "a/var/lib/sparkctl/record.json"),
                                                        str(tmp_path / "a/var/lib/sparkctl/stacks") + "/*.json"]
    on_head = _rec("green", ("spark-c",), gateway=_gw("spark-a", []))
    assert "mirror" not in planner.record_step(inv, "r", "r", "spark-a", on_head, "r").params


def test_the_rebuild_registers_only_the_stacks_routed_through_its_own_node(
        tmp_path: Path, stub: tuple[_Stub, str]) -> None:  # noqa: F811
    s, url = stub
    for name, node, backend in (("a", "spark-c", "http://10.0.0.1:8000"), ("b", "spark-a", "http://10.0.0.2:8000")):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "state": "serving", "served_name": "m",
            "gateway": {"node": node, "backends": [{"url": backend, "model": "m"}]}}))
    cfg = {"url": url, "node": "spark-c", "records": [str(tmp_path / "*.json")]}
    assert gateway_ctl.rebuild(cfg, None, 5) == "rebuilt 1 backend(s) from the record"
    assert [w["url"] for w in s.workers.values()] == ["http://10.0.0.1:8000"]


def test_the_supervisor_writes_the_record_copy_on_a_peer_through_its_ssh(tmp_path: Path) -> None:
    from sparkctl.remote.planrun import HeadBackend

    # a peer's "ssh" argv here is a local shell: the command the supervisor would send, run as sent
    b = HeadBackend({"spark-a": {"ssh": None}, "spark-c": {"ssh": ["sh", "-c"]}}, {}, str(tmp_path / "events"))
    path = tmp_path / "c" / "gateway-records" / "blue.json"
    assert b.write_record("spark-c", str(path), {"state": "serving"}, False, None)["ok"]
    assert json.loads(path.read_text()) == {"state": "serving"}
    r = b.write_record("spark-x", str(path), {"state": "stopped"}, False, None)  # not one of the plan's nodes
    assert not r["ok"] and "spark-x" in r["error"] and json.loads(path.read_text()) == {"state": "serving"}


def test_a_degraded_record_is_a_state_the_exporter_names_and_its_backends_are_expected() -> None:
    """A rolling switch's failed way back leaves state "degraded" (sparkctl.model.record.STATES): the
    state gauge has a series for it (1 for it, 0 for serving), and the replicas it lists stay expected
    at the gateway (they serve)."""
    import dataclasses

    rec = dataclasses.replace(_rec("default", ("spark-a", "spark-b"),
                                   gateway=_gw("spark-a", ["http://10.0.0.1:8000"])), state="degraded").to_dict()
    text = _expose(list(head_families(rec, None, None, None)))
    assert 'sparkctl_record_state{state="degraded"} 1.0' in text
    assert 'sparkctl_record_state{state="serving"} 0.0' in text
    gws = headstate.read_gateways({"default": rec}, "spark-a", {}, None)
    assert [e["url"] for e in gws[0]["expected"]] == ["http://10.0.0.1:8000"]
    stopped = {**rec, "state": "stopped"}
    assert headstate.read_gateways({"default": stopped}, "spark-a", {}, None)[0]["expected"] == []
