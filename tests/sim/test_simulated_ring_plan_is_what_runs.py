"""End-to-end on the SIMULATED 4-node ring: nothing runs that the printed plan does not list.

Each operation (fabric apply, up, switch, switch --supervise, down, unlock) runs in this
process over real SSH with a :class:`plancheck.Recorder` on its transport: every
command and every write, with its node and its sudo. The plans the operation
executed are caught at the interpreter (``planrun.execute``), and the check is
strict: every recorded command must be one a step of those plans lists
(``sparkctl.plan.steps.calls``), save the commented read-only fact gathering of
``plancheck.READ_ONLY``. The executed plan is the printed one: the CLI's
``sparkctl plan ... --json`` (another process, through real SSH) has the same
steps with the same commands and files. A planted extra command and a planted
write are caught (:func:`test_simulated_checker_reports_a_planted_command`).
Real: OpenSSH, the rendered files, the scripts, the supervisor on the head;
simulated: engines, GB10 tools.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sparkctl.cli.base import secrets_from_env
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops import executor, fabric, supervise, unlock
from sparkctl.plan.laws import Waiver
from sparkctl.remote import planrun
from sparkctl.transport import SSHTransport, TransportSettings
from tests.plancheck import Ran, Recorder, unplanned
from tests.sim.helpers import WAIVE, WAIVE_REASON

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

OLD, NEW = "ds41f-tp4-ring", "tensorfold-tp4-ring"
# Two stacks side by side (as tests/sim/test_simulated_ring_two_stacks.py): each locks its own nodes.
STACKS = {"left": ("topology.nodes=[spark-a, spark-b]", "topology.stack=left"),
          "right": ("topology.nodes=[spark-c, spark-d]", "topology.stack=right", "model.served_name=dsv41-right")}
# The real gateway in front of the real llama.cpp engine (as tests/sim/test_simulated_ring_gateway.py).
GATEWAY = "tiny-gateway"
GATEWAY_TEXT = """\
description: the tiny real engine, two replicas behind the gateway (a SIMULATED-ring test)
extends: tiny-llamacpp
engine:
  binary: python3 -m sparkctl_sim.llamacpp_routes.llama_cpp.server
topology:
  nodes: [spark-a, spark-b]
  replicas: 2
serve:
  api_key_env: SPARKCTL_GW_TEST_KEY
  gateway:
    enabled: true
"""
# The next profile of a rolling switch through the gateway: another engine setting, two replicas again.
GATEWAY_NEXT = "tiny-gateway-next"
GATEWAY_NEXT_TEXT = GATEWAY_TEXT.replace("llama_cpp.server\n", "llama_cpp.server\n"
                                         "  args: [\"--interrupt_requests\", \"False\", \"--n_threads\", \"1\"]\n", 1)


@pytest.fixture(scope="module")
def ring(sim_ring: Any) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in sim_ring.env.items():
            if k.startswith(("SPARKCTL_", "XDG_")):
                mp.setenv(k, v)
        yield sim_ring


def _printed(sim: Any, *args: str) -> dict[str, Any]:
    r = sim.sparkctl("-i", str(sim.inventory), "plan", *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _operation(sim: Any, op: str, profile: str | None = None, plant: Callable[[Any], None] | None = None,
               sets: tuple[str, ...] = (), stack: str | None = None) -> tuple[list[dict[str, Any]], list[Ran], Any]:
    """Run ``op`` here: (every plan it executed, every command its transport ran, its result)."""
    inv = load_inventory(sim.inventory)
    roots = Roots.make(inventory=str(sim.inventory), env={})  # profiles beside the inventory too, as the CLI
    waivers = {"page_size": Waiver("page_size", WAIVE_REASON)}
    plans: list[dict[str, Any]] = []
    real = planrun.execute

    def execute(plan: dict[str, Any], backend: Any, done: Any = ()) -> Any:
        plans.append(json.loads(json.dumps(plan)))
        return real(plan, backend, done)

    with pytest.MonkeyPatch.context() as mp, SSHTransport(inv.nodes, TransportSettings(5, 60, 120)) as tr:
        mp.setattr(planrun, "execute", execute)
        if plant:
            plant(mp)
        rec = Recorder(tr)
        res = resolve(profile, roots, sets) if profile else None
        secrets = secrets_from_env(res) if res else {}
        if op == "fabric":
            out: Any = fabric.apply(inv, tr, roots)
        elif op == "up":
            out = executor.up(res, inv, tr, roots, sets=sets, waivers=waivers, secrets=secrets)
        elif op == "switch":
            out = executor.switch(res, inv, tr, roots, waivers=waivers, secrets=secrets)
        elif op == "supervise":
            out = supervise.switch_supervised(res, inv, tr, roots, waivers=waivers, secrets=secrets, wait=True)
        elif op == "gateway down":
            from sparkctl.ops.gatewayops import gateway_down

            out = gateway_down(inv, tr)
        elif op == "unlock":
            out = unlock.break_locks(inv, tr, lambda *_: None)
        else:
            out = executor.down(inv, tr, stack=stack)
    return plans, rec.log, out


def _main(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """The operation's plan (the first one ran only the lock step, before the reads)."""
    assert [s["id"] for s in plans[0]["steps"]] == ["lock"], plans[0]
    return plans[-1]


def _shape(plan: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What must match between the printed and the executed plan: steps, commands, sudo, files (by hash)."""
    out = []
    for name, steps in [("", plan["steps"]), *sorted(plan.get("branches", {}).items())]:
        for s in steps:
            out.append((name, s["id"], s["kind"], tuple(s["nodes"]), json.dumps(s.get("commands", {}), sort_keys=True),
                        json.dumps(s.get("sudo", {}), sort_keys=True), json.dumps(s.get("files", {}), sort_keys=True)))
    return out


def _strict(plans: list[dict[str, Any]], log: list[Ran], *, writes: int) -> None:
    extra = unplanned(plans, log)
    assert not extra, "ran outside the plan:\n" + "\n".join(f"  {r.node} {r.kind} sudo={r.sudo}: {r.text[:160]!r}"
                                                           for r in extra)
    assert sum(r.kind == "put" for r in log) >= writes, [r for r in log if r.kind == "put"]


def test_simulated_every_command_of_fabric_up_switch_supervise_down_is_in_the_printed_plan(ring: Any) -> None:
    t0 = time.monotonic()
    plans, log, _ = _operation(ring, "fabric")
    _strict(plans, log, writes=4)  # the fabric files on every cabled node
    assert _shape(_main(plans)) == _shape(_printed(ring, "fabric"))

    printed = _printed(ring, "up", OLD, *WAIVE)
    plans, log, out = _operation(ring, "up", OLD)
    assert out.action == "started"
    _strict(plans, log, writes=10)
    assert _shape(_main(plans)) == _shape(printed)  # the printed plan is the executed one
    assert any(r.text == printed["branches"]["finally"][0]["commands"]["spark-a"] for r in log)  # unlocked

    printed = _printed(ring, "switch", NEW, *WAIVE)
    plans, log, out = _operation(ring, "switch", NEW)
    assert out.switched and "rollback" in _main(plans)["branches"]
    _strict(plans, log, writes=10)
    assert _shape(_main(plans)) == _shape(printed)

    printed = _printed(ring, "switch", OLD, "--supervise", *WAIVE)
    plans, log, out = _operation(ring, "supervise", OLD)
    assert out.phase == "done", out.events[-3:]
    _strict(plans, log, writes=6)  # record, key, known_hosts, plan file, runner, probe
    ran = _main(plans)
    assert [s["id"] for s in ran["steps"]] == [s["id"] for s in printed["operator"]["steps"]]
    for sid in ("supervisor-grant", "supervisor-grant-user", "launch"):
        assert sid in {s["id"] for s in ran["steps"]}, sid
    # the plan file the runner executes is the printed head plan (same steps and commands)
    doc = json.loads(ring.ssh("spark-a", "cat /var/lib/sparkctl/supervisor-plan.json").stdout)
    assert [s["id"] for s in doc["plan"]["steps"]] == [s["id"] for s in printed["head"]["steps"]]
    assert doc["plan"]["branches"]["rollback"][-1]["params"]["record"]["note"] == "rolled back by supervisor"

    printed = _printed(ring, "down")
    plans, log, _ = _operation(ring, "down")
    _strict(plans, log, writes=1)
    assert _shape(_main(plans)) == _shape(printed)

    printed = _printed(ring, "unlock")  # the recovery from a holder that is gone: one step, no lock of its own
    plans, log, _ = _operation(ring, "unlock")
    _strict(plans, log, writes=0)
    assert len(plans) == 1 and _shape(plans[0]) == _shape(printed)
    print(f"fabric apply, up, switch, switch --supervise, down, unlock: {time.monotonic() - t0:.0f} s")


def test_simulated_checker_reports_a_planted_command(ring: Any) -> None:
    """The negative control: a step that also runs `true` and writes a file is caught, by name."""
    real_run_all, real_put_all = executor.TransportBackend.run_all, executor.TransportBackend.put_all

    def run_all(self: Any, commands: Any, sudo: Any, timeout_s: Any, stdin: Any = None) -> Any:
        if "spark-b" in commands:
            self.transport.run("spark-b", "true")  # planted: no step lists it
            self.transport.put("spark-b", "/tmp/sparkctl-planted", b"x", 0o644)
        return real_run_all(self, commands, sudo, timeout_s, stdin)

    def plant(mp: pytest.MonkeyPatch) -> None:
        mp.setattr(executor.TransportBackend, "run_all", run_all)

    plans, log, _ = _operation(ring, "down", plant=plant)
    extra = unplanned(plans, log)
    assert Ran("spark-b", "run", "true", False) in extra, extra
    assert any(r.kind == "put" and r.text == "/tmp/sparkctl-planted" for r in extra), extra
    assert all(r.node == "spark-b" and r.text in ("true", "/tmp/sparkctl-planted") for r in extra), extra
    with pytest.raises(AssertionError, match="ran outside the plan"):
        _strict(plans, log, writes=0)
    assert real_put_all is executor.TransportBackend.put_all


def _sets(sets: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for x in sets for a in ("--set", x))


def test_simulated_stacks_and_the_gateway_run_only_their_printed_plans(ring: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stacks (each `up` locks only its own nodes; `down --stack` only that stack's), then
    the real gateway: its install, start, register and drain steps are the only commands run, and
    a rolling switch's (plain and supervised) too."""
    t0 = time.monotonic()
    for name, sets in STACKS.items():
        printed = _printed(ring, "up", "tensorfold-tp2", *_sets(sets), *WAIVE)
        plans, log, out = _operation(ring, "up", "tensorfold-tp2", sets=sets)
        assert out.action == "started", out
        _strict(plans, log, writes=4)
        assert _shape(_main(plans)) == _shape(printed)
        lock = _main(plans)["steps"][0]
        # its own nodes, and the claim of the name it serves (tensorfold-tp2's, or the one it sets)
        served = next((x.split("=", 1)[1] for x in sets if x.startswith("model.served_name=")), "dsv41-flash")
        assert lock["kind"] == "lock" and lock["params"]["nodes"] == [*sets[0][16:-1].split(", "),
                                                                      f"name:{served}"], lock
        assert any(s["params"].get("path", "").endswith(f"stacks/{name}.json")
                   for s in _main(plans)["steps"] if s["kind"] == "record")
    printed = _printed(ring, "down", "--stack", "right")
    plans, log, out = _operation(ring, "down", stack="right")
    _strict(plans, log, writes=1)
    assert _shape(_main(plans)) == _shape(printed)
    assert set(out.stopped) == {"spark-c", "spark-d"} and _main(plans)["steps"][0]["params"]["nodes"] == [
        "spark-c", "spark-d"]
    plans, log, _ = _operation(ring, "down")
    _strict(plans, log, writes=1)

    (ring.inventory.parent / "profiles").mkdir(exist_ok=True)
    (ring.inventory.parent / "profiles" / f"{GATEWAY}.yaml").write_text(GATEWAY_TEXT)
    ring.env["SPARKCTL_GW_TEST_KEY"] = "gw-test-key"
    monkeypatch.setenv("SPARKCTL_GW_TEST_KEY", "gw-test-key")
    printed = _printed(ring, "up", GATEWAY, *WAIVE)
    plans, log, out = _operation(ring, "up", GATEWAY)
    assert out.action == "started", out
    _strict(plans, log, writes=4)
    ids = [s["id"] for s in _main(plans)["steps"]]
    assert {"gateway-wheels", "gateway-install", "gateway-push", "gateway-start", "gateway-register"} <= set(ids), ids
    assert _shape(_main(plans)) == _shape(printed)
    # the rolling switch (issue 20): its per-replica drain, stop, start, ready and register steps
    # are the only commands run; supervised, the runner on the head runs the printed head plan
    (ring.inventory.parent / "profiles" / f"{GATEWAY_NEXT}.yaml").write_text(GATEWAY_NEXT_TEXT)
    printed = _printed(ring, "switch", GATEWAY_NEXT, *WAIVE)
    plans, log, out = _operation(ring, "switch", GATEWAY_NEXT)
    assert out.switched, out
    _strict(plans, log, writes=4)
    ids = [s["id"] for s in _main(plans)["steps"]]
    assert {"r1-gateway-drain", "r1-ready", "r2-gateway-register"} <= set(ids) and "rollback-2" in _main(plans)[
        "branches"], ids
    assert _shape(_main(plans)) == _shape(printed)
    printed = _printed(ring, "switch", GATEWAY, "--supervise", *WAIVE)
    plans, log, out = _operation(ring, "supervise", GATEWAY)
    assert out.phase == "done", out.events[-3:]
    _strict(plans, log, writes=6)
    doc = json.loads(ring.ssh("spark-a", "cat /var/lib/sparkctl/supervisor-plan.json").stdout)
    assert _shape(doc["plan"]) == _shape(printed["head"]) and "r2-gateway-register" in [
        s["id"] for s in doc["plan"]["steps"]]
    printed = _printed(ring, "down")
    plans, log, _ = _operation(ring, "down")
    _strict(plans, log, writes=1)
    assert "gateway-drain" in [s["id"] for s in _main(plans)["steps"]]
    assert _shape(_main(plans)) == _shape(printed)
    # `gateway down` (nothing serves through it now): its lock and its stop, nothing else
    printed = _printed(ring, "gateway-down")
    plans, log, out = _operation(ring, "gateway down")
    _strict(plans, log, writes=0)
    assert [s["id"] for s in _main(plans)["steps"]] == ["lock", "gateway-stop"] and out["node"] == "spark-a"
    assert _shape(_main(plans)) == _shape(printed)
    print(f"two stacks, down --stack, the gateway up and down: {time.monotonic() - t0:.0f} s")
