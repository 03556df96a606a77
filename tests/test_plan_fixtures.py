"""Plans as data: fixture files (profile, inventory, facts, record) -> the exact plan.

The pyinfra way (tests/operations/*/…json there): each case in tests/plans/
is (case.yaml -> expected.json). `--update-plans` rewrites expected.json.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.record import RunRecord
from sparkctl.model.resources import Roots
from sparkctl.ops import nodessh
from sparkctl.plan import lockplan, planner, resumeplan, supervised
from sparkctl.plan.render import render

REPO = Path(__file__).resolve().parent.parent
PLANS = REPO / "tests" / "plans"
STARTED = "2026-01-01T00:00:00+00:00"
CASES = sorted(p.name for p in PLANS.iterdir() if (p / "case.yaml").is_file())
# Who holds the lock in every fixture: what `sparkctl.ops.lock.holder_info` says of a live process.
HOLDER = {"holder": "op@workstation pid 1", "since": STARTED, "host": "workstation", "pid": 1,
          "run": "workstation:1:fixture"}


def _roots() -> Roots:
    return Roots.make(root=str(PLANS), env={})


def _inventory(rel: str) -> Any:
    inv = load_inventory(REPO / rel)
    return type(inv)(**{**inv.__dict__, "file": rel})  # stable text in the fixtures


def _gateway(res: Any, inv: Any, roots: Roots, spec: dict[str, Any] | None) -> Any:
    """serve.gateway's setup on a DGX Spark's interpreter and the facts of its node (case key ``gateway``)."""
    if not res.profile.serve.gateway.enabled:
        return None
    from sparkctl.plan import gatewayplan

    setup = gatewayplan.render_gateway(res, inv, roots, {}, gatewayplan.SPARK_PLATFORM)
    spec = spec or {}
    installed = {setup.site: setup.marker.replace("\n", " ").strip()} if spec.get("installed") else {}
    files = setup.files_hash() if spec.get("same_files") else {}
    return setup, gatewayplan.GatewayFacts(setup.platform, spec.get("free_kib"), installed, files,
                                           bool(spec.get("active")))


def _record(spec: dict[str, Any] | None, inv: Any, roots: Roots) -> Any:
    if not spec:
        return None
    if "digest" in spec:  # a whole record, as a run wrote it
        return RunRecord.from_dict(spec)
    if "from" in spec:  # the record another case's branch writes last: {case, branch}
        steps = plan_case(spec["from"]["case"])["branches"][spec["from"]["branch"]]
        return RunRecord.from_dict([s for s in steps if s["kind"] == "record"][-1]["params"]["record"])
    res = resolve(spec["profile"], roots, spec.get("sets", ()))
    rendering = render(res, inv, roots, secrets={})
    gw = _gateway(res, inv, roots, {})
    entry = planner.gatewayplan.record_entry(res, inv, rendering, gw[0]) if gw else None
    rec = planner.record_for(res, rendering, spec.get("sets", ()), spec["state"], {}, STARTED, gateway=entry)
    nodes = {}
    for n, r in rec.nodes.items():
        want = spec.get("hashes", {}).get(n, "@rendered")
        nodes[n] = replace(r, hash=r.hash if want == "@rendered" else "0" * 64)
    return replace(rec, nodes=nodes)


def _locked(plan: Any, inv: Any, nodes: Any = None) -> Any:
    """``plan`` between the locks of ``nodes`` (every node when None), as the executor takes them."""
    return lockplan.with_lock(plan, inv, {**HOLDER, "operation": plan.op}, nodes)


def plan_case(name: str, **override: Any) -> dict[str, Any]:
    """The plan of case ``name``; ``override``: case keys replaced (a variant of the case)."""
    case = {**yaml.safe_load((PLANS / name / "case.yaml").read_text()), **override}
    roots = _roots()
    inv = _inventory(case["inventory"])
    record = _record(case.get("record"), inv, roots)
    others = tuple(_record(o, inv, roots) for o in case.get("others", ()))  # the other stacks' records
    if case["op"] == "fabric-apply":  # the node's netplan files as read: {node: {file name: text}}
        from sparkctl.facts.netplanfiles import describe_file
        from sparkctl.ops.fabric import plan_apply

        netplan = {n: tuple(describe_file(name, text.encode()) for name, text in files.items())
                   for n, files in case.get("netplan", {}).items()}
        profile = resolve(case["profile"], roots) if case.get("profile") else None
        return _bundle_neutral(plan_apply(inv, roots, profile, None, netplan,
                                          {**HOLDER, "operation": "fabric apply"})[0].to_dict())
    if case["op"] == "down":
        if case.get("stack"):  # down --stack: that stack's record and nodes (sparkctl.ops.executor.down_scope)
            from sparkctl.ops.executor import down_scope

            recs, nodes = down_scope(inv, {r.stack: r for r in (record, *others) if r}, case["stack"])
            return _locked(planner.plan_down(inv, recs, nodes=nodes, reset_clocks=bool(case.get("reset_clocks")),
                                             started_at=STARTED), inv, nodes).to_dict()
        return _locked(planner.plan_down(inv, record, reset_clocks=bool(case.get("reset_clocks")),
                                         started_at=STARTED), inv).to_dict()
    if case["op"] == "fabric-restore":
        from sparkctl.ops.fabric import plan_restore

        return plan_restore(inv, {**HOLDER, "operation": "fabric restore"}).to_dict()
    res = resolve(case["profile"], roots, case.get("sets", ()))
    rendering = render(res, inv, roots, secrets={})
    f = case.get("facts", {})
    facts = planner.UpFacts(record, dict(f.get("alive", {})), bool(f.get("healthy", False)), others=others,
                            serving=tuple(f["serving"]) if "serving" in f else None)
    gateway = _gateway(res, inv, roots, case.get("gateway"))
    if case["op"] == "up":
        plan = planner.plan_up(res, inv, rendering, facts, started_at=STARTED, gateway=gateway)
        return (_locked(plan, inv, [*planner.own_nodes(rendering, record), *lockplan.name_claim(res)]) if plan.steps
                else plan).to_dict()
    # the way back: the serving stack's profile, or the other profile a degraded record's replicas serve
    other = resumeplan.other_profile(record, res.name) if record.state == "degraded" else \
        (record.profile, tuple(case["record"].get("sets", ())))
    prev_res = resolve(other[0], roots, other[1]) if other else None
    previous = (prev_res, render(prev_res, inv, roots, secrets={})) if prev_res else None
    # the stack's nodes, old and new, and the served name it claims (executor.lock_scope)
    scope = [*planner.own_nodes(rendering, record), *lockplan.name_claim(res)]
    if case["op"] == "switch":
        return _locked(resumeplan.plan_switch(res, inv, rendering, facts, started_at=STARTED, sets=case.get("sets", ()),
                                              previous=previous, gateway=gateway), inv, scope).to_dict()
    return _supervised(inv, res, rendering, facts, previous, record, gateway, scope, case.get("sets", ()))


def _supervised(inv: Any, res: Any, rendering: Any, facts: Any, previous: Any, record: Any, gateway: Any,
                scope: Any, sets: Any) -> dict[str, Any]:
    """`switch --supervise`, with stand-in bytes for the key, the host keys and the runner."""
    holder = {**HOLDER, "operation": f"switch --supervise {res.name}"}
    plan = lockplan.with_lock(resumeplan.plan_switch(res, inv, rendering, facts, started_at=STARTED, sets=sets,
                                                     previous=previous, rollback_note=supervised.ROLLBACK_NOTE,
                                                     gateway=gateway),
                              inv, holder, scope)
    head, peers = inv.nodes[0].name, tuple(inv.names[1:])
    addrs = {n: nodessh.fabric_address_from(inv, head, n) for n in peers}
    hand = supervised.Handover(head, peers, nodessh.grant_line(inv, head, "ssh-ed25519 AAAAfixture sparkctl"),
                               b"KEY", b"KNOWN HOSTS", b"RUNNER", b"PROBE", b"PUTFILES")
    mine, theirs = supervised.split(plan)
    theirs = supervised.head_plan(theirs, inv, holder, scope)
    doc = supervised.handover_document(inv, head, theirs, {}, addrs,
                                       {n: nodessh.ssh_argv(inv, head, n, addrs[n]) for n in peers},
                                       res.profile.model.served_name, record)
    mine = supervised.operator_plan(mine, inv, hand, doc, record, res.name, holder, STARTED)
    return {"operator": mine.to_dict(), "head": theirs.to_dict()}


def _bundle_neutral(plan: dict[str, Any]) -> dict[str, Any]:
    """The exporter's zip holds sparkctl's own code: its hash changes with any edit of it, so the
    fixture names it ``@bundle`` (tests/test_exporter.py checks the zip itself)."""
    import hashlib

    from sparkctl.plan.exporterplan import bundle

    sha = hashlib.sha256(bundle()).hexdigest()
    return json.loads(json.dumps(plan).replace(sha, "@bundle"))


@pytest.mark.parametrize("name", CASES)
def test_plan_fixture(name: str, request: pytest.FixtureRequest) -> None:
    got = plan_case(name)
    path = PLANS / name / "expected.json"
    if request.config.getoption("--update-plans"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"{name}: the plan changed; review and rerun with --update-plans"


def _steps(d: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    return [(s["phase"], tuple(s["nodes"])) for s in d["steps"]]


def test_the_fixtures_say_what_the_issue_asks() -> None:
    """Read as an operator would: the behaviours each case exists for."""
    assert set(CASES) >= {"fresh-up", "noop-up", "partial-restart", "stale-stack", "down", "switch-rollback",
                          "supervised-switch"}
    noop = plan_case("noop-up")
    assert noop["steps"] == [] and "already serving" in noop["note"]
    part = plan_case("partial-restart")
    push = next(s for s in part["steps"] if s["phase"] == "push")
    assert push["nodes"] == ["spark-c", "spark-d"]  # the changed replica, whole, and nothing else
    stop = next(s for s in part["steps"] if s["phase"] == "stop-stale")
    assert stop["nodes"] == ["spark-c", "spark-d"]
    stale = plan_case("stale-stack")
    assert next(s for s in stale["steps"] if s["phase"] == "stop-stale")["nodes"] == ["spark-a", "spark-b", "spark-c",
                                                                                      "spark-d"]
    fresh = plan_case("fresh-up")
    assert [s["phase"] for s in fresh["steps"]][:5] == ["lock", "check", "clock", "record-start", "stop-stale"]
    assert all(s["on_fail"] == "abort" for s in fresh["steps"][:4])  # nothing stopped yet: nothing to undo
    # the lock is released whatever happened, and only if it is still this run's
    assert [s["id"] for s in fresh["branches"]["finally"]] == ["unlock"]
    assert fresh["branches"]["finally"][0]["params"]["stdin"] == {"spark-a": '"run": "workstation:1:fixture"'}
    # from the first stop on, a failure stops what this run started; only housekeeping may fail and go on
    soft = {s["id"] for s in fresh["steps"][4:] if s["on_fail"] == "continue"}
    assert soft <= {"logs", "drop-caches", "unpersist"}, soft  # unpersist: an earlier run's enable
    assert all(s["on_fail"] == "stop" for s in fresh["steps"][4:] if s["id"] not in soft)
    # every record write says its sudo, and a record claiming nothing serves is removed if it cannot be written
    rec = next(s for s in fresh["steps"] if s["id"] == "record-start")
    assert rec["sudo"] == {"spark-a": True} and rec["params"]["remove_on_failure"]["spark-a"].startswith("rm -f ")
    sw = plan_case("switch-rollback")
    assert {s["on_fail"] for s in sw["steps"][4:] if s["id"] not in soft} == {"rollback"}
    back = sw["branches"]["rollback"]
    assert back[-1]["params"]["record"]["profile"] == "ds41f-tp4-ring"
    inv, roots = _inventory("inventory.yaml"), _roots()
    ds41f = render(resolve("ds41f-tp4-ring", roots), inv, roots, secrets={})
    push = next(s for s in back if s["kind"] == "put")  # the way back is ds41f's own files
    assert {n: {f["sha256"] for f in fs} for n, fs in push["files"].items()} == {
        n: {f.sha256 for f in files.values()} for n, files in ds41f.files.items()}
    starts = [s["nodes"] for s in back if s["phase"] == "rollback" and s["id"].startswith("rollback-start")]
    assert starts == [["spark-b", "spark-c", "spark-d"], ["spark-a"]]  # ds41f: workers first, then the head
    sup = plan_case("supervised-switch")
    # everything the supervised switch changes is a step: the grant, the push, the record, the launch
    assert [s["id"] for s in sup["operator"]["steps"]] == [
        "lock", "check", "clock", "supervisor-grant", "supervisor-grant-user", "supervisor-key", "supervisor-push",
        "record-switching", "launch"]
    op = {s["id"]: s for s in sup["operator"]["steps"]}
    assert set(op["supervisor-grant"]["nodes"]) == {"spark-b", "spark-c", "spark-d"}
    assert [f["path"].rsplit("/", 1)[1] for f in op["supervisor-push"]["files"]["spark-a"]] == [
        "supervisor-plan.json", "endpoint_probe.py", "putfiles.py", "planrun.py"]
    assert op["launch"]["on_fail"] == "restore-record" and "setsid" in op["launch"]["commands"]["spark-a"]
    assert sup["operator"]["branches"]["restore-record"][0]["params"]["record"]["state"] == "serving"
    assert [s["id"] for s in sup["operator"]["branches"]["finally"]] == ["unlock"]
    # the head runs the rest of the same plan; its lock release names the runner's own token
    head_steps = [s for s in sw["steps"][3:]]
    assert [s["id"] for s in sup["head"]["steps"]] == [s["id"] for s in head_steps]
    assert sup["head"]["branches"]["finally"][0]["params"]["stdin"]["spark-a"].endswith('/supervisor"')
    # the rollback's note is decided at planning time
    assert sup["head"]["branches"]["rollback"][-1]["params"]["record"]["note"] == "rolled back by supervisor"
    assert sw["branches"]["rollback"][-1]["params"]["record"]["note"] == "rolled back"
    down = plan_case("down")
    assert [s["id"] for s in down["steps"]] == ["lock", "record-stopping", "disable", "stop", "record", "leaks",
                                                "reset-clocks"]  # nothing may come back at boot once down ran
    assert next(s["nodes"] for s in down["steps"] if s["id"] == "stop") == ["spark-a", "spark-b", "spark-c",
                                                                           "spark-d"]  # the head first


def test_the_fabric_fixtures_say_what_the_issue_asks() -> None:
    """Issue 18: relays forward fabric to fabric only (a unit before network and docker, its chain
    gone after restore); apt-get waits, bounded, for the dpkg lock."""
    apply = plan_case("fabric-apply")
    watchdog = next(s for s in apply["steps"] if s["id"] == "watchdog")
    assert all("apt-get -o DPkg::Lock::Timeout=300 install" in c for c in watchdog["commands"].values())
    assert "waiting up to 300 s for the dpkg lock" in watchdog["summary"]
    push = next(s for s in apply["steps"] if s["id"] == "push")
    assert all(any(f["path"].endswith("sparkctl-fabric-forward.service") for f in fs) for fs in push["files"].values())
    restore = plan_case("fabric-restore")
    back = next(s for s in restore["steps"] if s["id"] == "restore")
    assert all("iptables -w -X SPARKCTL-FABRIC" in c for c in back["commands"].values())


def _on_state_node(s: dict[str, Any]) -> bool:
    """The record and the node locks live on the state node (spark-a), whichever stack they are for."""
    return s["kind"] in ("record", "lock") or s["id"] == "unlock"


def test_the_stack_fixtures_keep_to_their_own_nodes() -> None:
    """Issue 20, item 2: a stack beside another stops, starts, records and locks only its own."""
    up = plan_case("up-beside-stack")
    touched = {n for s in up["steps"] for n in s["nodes"] if not _on_state_node(s)}
    assert touched == {"spark-c", "spark-d"}, touched
    for branch in up["branches"].values():
        assert {n for s in branch for n in s["nodes"] if not _on_state_node(s)} <= {"spark-c", "spark-d"}
    recs = [s for s in up["steps"] if s["kind"] == "record"]
    assert {s["params"]["path"] for s in recs} == {"/var/lib/sparkctl/stacks/right.json"}
    assert all(s["params"]["record"]["stack"] == "right" for s in recs)
    # the lock step takes exactly the stack's node locks and the claim of its served name, and the
    # release lets go of exactly those
    lock = up["steps"][0]
    assert lock["kind"] == "lock" and lock["params"]["nodes"] == ["spark-c", "spark-d", "name:dsv41-flash-right"]
    unlock = up["branches"]["finally"][0]["commands"]["spark-a"]
    assert "locks/spark-c.d" in unlock and "locks/spark-d.d" in unlock and "spark-a.d" not in unlock
    assert unlock.count("locks/name-") == 1
    down = plan_case("down-one-stack")
    assert {n for s in down["steps"] for n in s["nodes"] if not _on_state_node(s)} == {"spark-c", "spark-d"}
    assert down["steps"][0]["params"]["nodes"] == ["spark-c", "spark-d"]
    assert [s["id"] for s in down["steps"] if s["kind"] == "record"] == ["record-stopping-right", "record-right"]
    assert {s["params"]["record"]["stack"] for s in down["steps"] if s["kind"] == "record"} == {"right"}
