"""Several stacks on one cluster (issue 20, item 2): refusals, records, locks, live stacks.

The refusals and the listing are pure (sparkctl.model.stacks); the records and
the locks run their real shell on this machine (LocalTransport, every "node" a
directory under tmp_path), so a lock script that does not lock fails here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.errors import LockHeld
from sparkctl.model.inventory import load_inventory, loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.record import NodeRecord, RunRecord
from sparkctl.model.resources import Roots
from sparkctl.model.stacks import StackConflict, live_from_records, refusal, stack_of
from sparkctl.ops import executor, lock, unlock
from sparkctl.ops.executor import down_scope, lock_scope
from sparkctl.ops.localstate import write_json
from sparkctl.plan import lockplan, planner
from sparkctl.plan.render import render
from sparkctl.plan.steps import Plan
from sparkctl.transport import FakeTransport, LocalTransport, reply

REPO = Path(__file__).resolve().parent.parent
PLANS = REPO / "tests" / "plans"


def _rec(stack: str, nodes: tuple[str, ...], served: str = "m", state: str = "serving", model: str = "org/m@main",
         **kw: object) -> RunRecord:
    return RunRecord(profile=f"p-{stack}", sets=(), digest="d", engine="tensorfold", engine_version="1",
                     served_name=served, port=8000, heads=(nodes[0],),
                     nodes={n: NodeRecord(i, 0, "h", {}, "systemd") for i, n in enumerate(nodes)}, state=state,
                     started_at="2026-01-01T00:00:00+00:00", updated_at="2026-01-01T00:00:00+00:00", stack=stack,
                     model=model, **kw)  # type: ignore[arg-type]


LEFT = _rec("left", ("spark-a", "spark-b"), served="x")


# --------------------------------------------------------------------------- refusals (pure)


def test_nodes_of_another_live_stack_are_refused_naming_the_stack_and_the_nodes() -> None:
    why = refusal("right", ["spark-b", "spark-c"], "y", "org/y@main", False, [LEFT])
    assert isinstance(why, StackConflict) and why.exit_code == 2
    assert "spark-b is used by live stack 'left'" in why.message and "spark-c" not in why.message.split("(")[0]
    assert "down --stack left" in (why.hint or "")
    assert "\n" not in why.one_line()


def test_a_served_name_another_live_stack_serves_is_refused_unless_a_declared_replica_of_the_same_model() -> None:
    why = refusal("right", ["spark-c", "spark-d"], "x", "org/m@main", False, [LEFT])
    assert why is not None and "already serves 'x'" in why.message and "shared_name" in (why.hint or "")
    assert refusal("right", ["spark-c", "spark-d"], "x", "org/m@main", True, [LEFT]) is None  # a declared replica
    other = refusal("right", ["spark-c", "spark-d"], "x", "org/other@main", True, [LEFT])
    assert other is not None and "same model only" in other.message  # declared, but another model
    old = refusal("right", ["spark-c", "spark-d"], "x", "org/m@main", True, [replace(LEFT, model="")])
    assert old is not None and "does not name" in old.message  # a record from before stacks: unverifiable


def test_only_live_records_of_other_stacks_count() -> None:
    assert refusal("left", ["spark-a", "spark-b"], "x", "org/m@main", False, [LEFT]) is None  # its own: replaced
    for state in ("stopped", "failed"):
        assert refusal("right", ["spark-a"], "x", "", False, [replace(LEFT, state=state)]) is None
    for state in ("starting", "stopping", "switching"):  # engines may run there: still its nodes
        assert refusal("right", ["spark-a"], "y", "", False, [replace(LEFT, state=state)]) is not None


def test_live_from_records_lists_what_a_gateway_registers() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    right = _rec("right", ("spark-c", "spark-d"), served="y", listen={"spark-c": "10.0.0.9"})
    gone = _rec("old", ("spark-a",), state="stopped")
    starting = _rec("new", ("spark-b",), state="starting")
    live = live_from_records({"left": LEFT, "right": right, "old": gone, "new": starting}, inv)
    assert [s.stack for s in live] == ["left", "new", "right"]
    r = next(s for s in live if s.stack == "right")
    assert (r.served_name, r.nodes, r.model) == ("y", ("spark-c", "spark-d"), "org/m@main")
    h = r.heads[0]
    assert (h.node, h.port, h.listen, h.on_node_host) == ("spark-c", 8000, "10.0.0.9", "10.0.0.9")
    assert h.route.via == "spark-c"  # bound to an address only the head reaches: through its SSH
    assert live[0].heads[0].route.url == f"http://{inv.node('spark-a').host}:8000"
    assert [s.stack for s in live_from_records([LEFT, right, starting], inv, serving_only=True)] == ["left", "right"]


# --------------------------------------------------------------------------- records


def test_a_record_from_before_stacks_is_read_as_the_default_stack() -> None:
    old = {k: v for k, v in LEFT.to_dict().items() if k not in ("stack", "model", "shared_name")}
    text = f"\n==> sparkctl-record /var/lib/sparkctl/record.json\n{json.dumps(old)}\n"
    recs = lock.parse_records(text)
    assert list(recs) == ["default"] and recs["default"].stack == "default" and recs["default"].model == ""
    # a named stack's file without the field (written by hand) takes its file's name
    text += f"\n==> sparkctl-record /var/lib/sparkctl/stacks/blue.json\n{json.dumps(old)}\n"
    text += "\n==> sparkctl-record /var/lib/sparkctl/stacks/torn.json\n{\"profile\": \n"  # torn: skipped
    assert sorted(lock.parse_records(text)) == ["blue", "default"]


def _local(tmp_path: Path) -> tuple[object, LocalTransport]:
    nodes = "".join(f"  - {{name: spark-{x}, host: 127.0.0.{i + 1}, prefix: {tmp_path / x}}}\n"
                    for i, x in enumerate("abcd"))
    cables = ("cables:\n  - [spark-a:p0, spark-b:p1]\n  - [spark-b:p0, spark-c:p1]\n"
              "  - [spark-c:p0, spark-d:p1]\n  - [spark-d:p0, spark-a:p1]\n")
    inv = loads_inventory("nodes:\n" + nodes + cables, str(tmp_path / "inv.yaml"))
    return inv, LocalTransport(nodes=inv.names, sudo=False)


def _write(inv: object, t: LocalTransport, rec: RunRecord) -> None:
    """A record written the way every plan writes it: its ``record`` step (atomic, with its rm -f)."""
    step = planner.record_step(inv, "record", "record", "spark-a", rec, "record")  # type: ignore[arg-type]
    state = executor.run_plan(Plan("t", None, (step,)), executor.TransportBackend(inv, t, lambda *_: None))  # type: ignore[arg-type]
    assert state.result == "done", state.failure


def test_records_round_trip_per_stack_and_the_cache_only_fills_in_what_claims_nothing_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv, t = _local(tmp_path)
    _write(inv, t, replace(LEFT, stack="default"))
    _write(inv, t, _rec("right", ("spark-c", "spark-d"), served="y"))
    assert (tmp_path / "a/var/lib/sparkctl/record.json").is_file()
    assert (tmp_path / "a/var/lib/sparkctl/stacks/right.json").is_file()
    recs = lock.read_records(inv, t)
    assert sorted(recs) == ["default", "right"] and recs["right"].served_name == "y"
    assert lock.read_record(inv, t, "right") == recs["right"]
    # the head lost a record: a cached "serving" is not believed, a cached "failed" is kept
    (tmp_path / "a/var/lib/sparkctl/stacks/right.json").unlink()
    assert "right" not in lock.read_records(inv, t)
    write_json(lock.local_record_path(inv, "right"), _rec("right", ("spark-c",), state="failed").to_dict())
    assert lock.read_records(inv, t)["right"].state == "failed"
    # the head does not answer: the cache alone
    dead = FakeTransport(nodes=inv.names)
    dead.add("*", lock.read_records_command(inv), reply(exit_code=255, error="unreachable"))
    assert sorted(lock.read_records(inv, dead)) == ["default", "right"]


# --------------------------------------------------------------------------- locks (the real shell)


class _Lock:
    """The lock step and its release (sparkctl.plan.lockplan) of ``nodes`` (every node when None),
    run as the executor runs them; ``name``'s holder is on another workstation: never judged gone."""

    def __init__(self, inv: object, t: LocalTransport, op: str, nodes: list[str] | None, name: str) -> None:
        self.inv, self.t, self.op, self.nodes = inv, t, op, nodes
        self.holder = {"holder": f"{name}", "since": "t", "operation": op, "host": "elsewhere", "pid": 1,
                       "run": f"{name}:run"}

    def acquire(self) -> None:
        step = lockplan.lock_step(self.inv, self.holder, self.nodes)  # type: ignore[arg-type]
        assert lock.take(self.inv, self.t, step.to_dict()) == "acquired"  # type: ignore[arg-type]

    def release(self) -> None:
        executor.release_lock(self.inv, self.t, self.op, self.holder, lambda *_: None, self.nodes)  # type: ignore[arg-type]


def _unlock(inv: object, t: LocalTransport, nodes: list[str] | None = None) -> str:
    """`sparkctl unlock`: its plan run by the plan interpreter; every command it ran is its plan's one step."""
    seen: list[str] = []
    run = t._run

    def recording(node: str, cmd: str, **kw: object) -> object:
        seen.append(cmd)
        return run(node, cmd, **kw)  # type: ignore[arg-type]

    t._run = recording  # type: ignore[method-assign]
    try:
        holders = unlock.break_locks(inv, t, lambda *_: None, nodes)  # type: ignore[arg-type]
    finally:
        del t._run
    assert seen == list(lockplan.unlock_plan(inv, nodes).steps[0].commands.values()), seen  # type: ignore[arg-type]
    return holders


def test_plan_unlock_prints_the_one_step_unlock_runs() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    every, one = lockplan.unlock_plan(inv), lockplan.unlock_plan(inv, ["spark-d"])
    assert [s.id for s in every.steps] == ["break-locks"] and every.steps[0].nodes == ("spark-a",)
    assert "/var/lib/sparkctl/locks/name-*.d" in every.steps[0].commands["spark-a"]
    assert "/var/lib/sparkctl/lock.d" in every.steps[0].commands["spark-a"]  # the lock of a sparkctl before stacks
    assert "name-*" not in one.steps[0].commands["spark-a"] and "spark-d.d" in one.steps[0].commands["spark-a"]
    assert "spark-a.d" not in one.steps[0].commands["spark-a"]


def test_locks_on_disjoint_nodes_do_not_block_and_overlapping_ones_do(tmp_path: Path) -> None:
    inv, t = _local(tmp_path)
    left = _Lock(inv, t, "up left", ["spark-a", "spark-b"], "alice pid 1")
    right = _Lock(inv, t, "up right", ["spark-c", "spark-d"], "bob pid 2")
    left.acquire()
    right.acquire()  # disjoint: both hold
    locks = tmp_path / "a/var/lib/sparkctl/locks"
    assert sorted(p.name for p in locks.iterdir()) == ["spark-a.d", "spark-b.d", "spark-c.d", "spark-d.d"]
    wide = _Lock(inv, t, "up wide", ["spark-b", "spark-c"], "carol pid 3")
    with pytest.raises(LockHeld) as e:
        wide.acquire()
    assert "spark-b is locked by alice pid 1" in e.value.message and "(up left)" in e.value.message
    everything = _Lock(inv, t, "fabric apply", None, "dave pid 4")
    with pytest.raises(LockHeld) as e:
        everything.acquire()
    assert "the cluster is locked by alice pid 1" in e.value.message
    wide.release()  # a release of locks this run never got is a no-op
    assert sorted(p.name for p in locks.iterdir()) == ["spark-a.d", "spark-b.d", "spark-c.d", "spark-d.d"]
    right.release()
    # the refused acquisitions left nothing behind: c and d are free again, a and b still alice's
    assert sorted(p.name for p in locks.iterdir()) == ["spark-a.d", "spark-b.d"]
    left.release()
    assert list(locks.iterdir()) == []
    wide.acquire()  # and now it can
    wide.release()
    assert list(locks.iterdir()) == []


def test_two_stacks_on_disjoint_nodes_cannot_both_claim_one_served_name(tmp_path: Path) -> None:
    """The race the records alone cannot see: both read no conflict, then lock disjoint nodes. The
    served name's claim (locks/name-<sha>.d, in the same all-or-nothing script) lets one through."""
    inv, t = _local(tmp_path)
    left = _Lock(inv, t, "up left", ["spark-a", "spark-b", "name:x"], "alice pid 1")
    right = _Lock(inv, t, "up right", ["spark-c", "spark-d", "name:x"], "bob pid 2")
    other = _Lock(inv, t, "up other", ["spark-c", "spark-d", "name:y"], "carol pid 3")
    left.acquire()
    with pytest.raises(LockHeld) as e:
        right.acquire()
    assert e.value.message.startswith("the served name 'x' is being claimed by alice pid 1") and "(up left)" in \
        e.value.message and "shared_name" in (e.value.hint or "")
    locks = tmp_path / "a/var/lib/sparkctl/locks"
    assert sorted(p.name for p in locks.iterdir() if not p.name.startswith("name-")) == ["spark-a.d", "spark-b.d"]
    other.acquire()  # another name on the same free nodes: not blocked
    other.release()
    left.release()
    assert list(locks.iterdir()) == []
    right.acquire()
    assert _unlock(inv, t).count('"holder": "bob pid 2"') == 3  # `sparkctl unlock`: the name's claim too
    assert list(locks.iterdir()) == []


def test_the_served_name_claim_is_in_the_lock_steps_text() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    step = lockplan.lock_step(inv, {"run": "r"}, ["spark-c", "spark-d", "name:x y"])
    assert "spark-c, spark-d and the served name 'x y'" in step.summary
    dirs = lockplan.lock_dirs(inv, ["spark-c", "name:x y"])
    assert list(dirs) == ["spark-c", "name:x y"] and dirs["name:x y"].rsplit("/", 1)[1].startswith("name-")
    assert " " not in dirs["name:x y"]  # any served name: hashed into a safe file name


def test_a_refused_lock_keeps_the_holders_dirs_it_made_none_of(tmp_path: Path) -> None:
    """Negative control for the undo: the dir made before the refusal is gone, the holder's stays."""
    inv, t = _local(tmp_path)
    held = _Lock(inv, t, "up d", ["spark-d"], "erin pid 5")
    held.acquire()
    late = _Lock(inv, t, "up all", None, "frank pid 6")
    with pytest.raises(LockHeld):
        late.acquire()  # made a, b, c first, then found d held
    locks = tmp_path / "a/var/lib/sparkctl/locks"
    assert [p.name for p in locks.iterdir()] == ["spark-d.d"]
    assert "erin pid 5" in (locks / "spark-d.d/holder").read_text()
    assert "erin" in _unlock(inv, t, ["spark-d"])
    assert list(locks.iterdir()) == []


def test_a_dead_holders_node_lock_is_broken_and_the_rest_acquired(tmp_path: Path) -> None:
    import socket

    inv, t = _local(tmp_path)
    d = tmp_path / "a/var/lib/sparkctl/locks/spark-b.d"
    d.mkdir(parents=True)
    (d / "holder").write_text(json.dumps({"holder": "ghost pid 999999", "since": "t", "operation": "up",
                                          "host": socket.gethostname(), "pid": 999999}) + "\n")
    g = _Lock(inv, t, "up left", ["spark-a", "spark-b"], "alice pid 1")
    g.acquire()
    assert "alice" in (d / "holder").read_text()
    g.release()
    assert not d.exists()


# --------------------------------------------------------------------------- what up and down take


def _roots() -> Roots:
    return Roots.make(root=str(PLANS), env={})


def test_lock_scope_refuses_before_locking_and_takes_the_stacks_old_nodes_too() -> None:
    inv, roots = load_inventory(REPO / "inventory.yaml"), _roots()
    right = resolve("right", roots)
    assert stack_of(right) == "right"
    name = f"name:{right.profile.model.served_name}"  # the served name it claims for the run
    assert lock_scope(right, inv, {"left": LEFT}) == ["spark-c", "spark-d", name]
    moved = _rec("right", ("spark-b",), served="z")  # right ran on b before (left not live here)
    assert lock_scope(right, inv, {"right": moved}) == ["spark-b", "spark-c", "spark-d", name]
    assert lock_scope(right, inv, {"right": replace(moved, state="stopped")}) == ["spark-c", "spark-d", name]
    shared = resolve("right", roots, ("topology.shared_name=true",))  # several stacks serve it on purpose
    assert lock_scope(shared, inv, {}) == ["spark-c", "spark-d"]
    wide = resolve("right", roots, ("topology.nodes=[spark-b, spark-c]",))
    with pytest.raises(StackConflict, match="spark-b is used by live stack 'left'"):
        lock_scope(wide, inv, {"left": LEFT})
    same_name = resolve("right", roots, ("model.served_name=x",))
    with pytest.raises(StackConflict, match="already serves 'x'"):
        lock_scope(same_name, inv, {"left": LEFT})


def test_the_planner_refuses_the_same_way_under_the_lock() -> None:
    inv, roots = load_inventory(REPO / "inventory.yaml"), _roots()
    wide = resolve("right", roots, ("topology.nodes=[spark-b, spark-c]",))
    rendering = render(wide, inv, roots, secrets={})
    with pytest.raises(StackConflict, match="live stack 'left'"):
        planner.plan_up(wide, inv, rendering, planner.UpFacts(others=(LEFT,)))
    # nothing else live: the same profile plans
    assert planner.plan_up(wide, inv, rendering, planner.UpFacts(others=(replace(LEFT, state="stopped"),))).steps


def test_down_scope_names_the_stacks_there_are() -> None:
    from sparkctl.errors import ConfigError

    inv = load_inventory(REPO / "inventory.yaml")
    assert down_scope(inv, {"left": LEFT}, None) == ([LEFT], None)
    assert down_scope(inv, {"left": LEFT}, "left") == ([LEFT], ["spark-a", "spark-b"])
    with pytest.raises(ConfigError, match="no such stack") as e:
        down_scope(inv, {"left": LEFT}, "blue")
    assert "stacks: left" in (e.value.hint or "")


def test_the_supervisor_takes_over_every_node_lock_of_its_stack_and_releases_each(tmp_path: Path) -> None:
    """The runner on the head writes itself into each lock dir it is handed; its plan's branch
    ``finally`` (sparkctl.plan.supervised.head_plan) releases exactly those, and no other."""
    from sparkctl.plan import supervised
    from sparkctl.remote import planrun

    inv, _t = _local(tmp_path)
    holder = {"since": "t", "operation": "switch --supervise p", "host": "spark-a", "run": "op:1:x"}
    head = supervised.head_plan(Plan("switch --supervise", "p", ()), inv, holder,  # type: ignore[arg-type]
                                ["spark-a", "spark-b"])
    doc = {"version": 1, "head": "spark-a", "plan": head.to_dict(), "blobs": {}, "served_name": "m",
           "nodes": {"spark-a": {"ssh": None, "sudo": False, "fabric_address": None}}}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    locks = lockplan.lock_dirs(inv)  # type: ignore[arg-type]
    dirs = [Path(locks["spark-a"]), Path(locks["spark-b"])]
    other = Path(locks["spark-c"])  # another stack's lock: never touched
    for d in (*dirs, other):
        d.mkdir(parents=True)
        (d / "holder").write_text('{"holder": "alice pid 1", "run": "op:1:x"}\n')
    seen: list[str] = []
    real = planrun.execute

    def execute(plan: dict, backend: object, done: object = ()) -> object:  # while it runs, both name the supervisor
        seen.extend((d / "holder").read_text() for d in dirs)
        return real(plan, backend, done)  # type: ignore[arg-type]

    sup = {**holder, "run": supervised.supervisor_token(holder)}
    planrun.execute, saved = execute, planrun.execute  # type: ignore[assignment]
    try:
        rc = planrun.main(["supervise", str(tmp_path / "plan.json"), str(tmp_path / "ev.jsonl"), str(tmp_path / "pid"),
                           json.dumps([str(d) for d in dirs]), json.dumps(sup)])
    finally:
        planrun.execute = saved  # type: ignore[assignment]
    assert rc == 0
    assert len(seen) == 2 and all("supervisor pid" in h and "op:1:x/supervisor" in h for h in seen), seen
    assert not any(d.exists() for d in dirs)
    assert (other / "holder").is_file()  # the operator's token is a part of it, the supervisor's is not
