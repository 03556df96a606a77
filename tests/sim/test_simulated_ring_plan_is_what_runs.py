"""End-to-end on the SIMULATED 4-node ring: `sparkctl plan` is what `up`, `switch` and `down` run.

For each operation: print the plan with the CLI (`plan ... --json`, through real
SSH), then run the operation in this process over a recording transport (real
SSH underneath) and compare step for step: the same step ids in the same order,
and inside each step exactly the plan's commands on the plan's nodes and the
plan's files (path and SHA-256). Only the reads that planning itself does
(the record, which engines run, the lock) come before the first step.
Real: OpenSSH, the rendered files, the stop/start scripts; simulated: engines, GB10 tools.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops import executor
from sparkctl.plan.laws import Waiver
from sparkctl.transport import SSHTransport, TransportSettings
from tests.sim.helpers import WAIVE, WAIVE_REASON

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


class Recorder:
    """Every command and put, between the step markers the interpreter emits."""

    def __init__(self, transport: SSHTransport) -> None:
        self.log: list[tuple[str, ...]] = []
        inner = transport._run

        def run(node: str, cmd: str, *, label: str, sudo: bool, timeout_s: float, stdin: bytes | None,
                cancel: Any) -> Any:
            if label.startswith("put "):
                self.log.append(("put", node, label[4:], hashlib.sha256(stdin or b"").hexdigest()))
            else:
                self.log.append(("run", node, cmd, str(bool(sudo))))
            return inner(node, cmd, label=label, sudo=sudo, timeout_s=timeout_s, stdin=stdin, cancel=cancel)

        transport._run = run  # type: ignore[method-assign]

    def progress(self, node: str, phase: str, message: str) -> None:
        if node == "*":
            self.log.append(("step", phase, message))

    def segments(self) -> list[tuple[tuple[str, str], list[tuple[str, ...]]]]:
        out: list[tuple[tuple[str, str], list[tuple[str, ...]]]] = []
        for e in self.log:
            if e[0] == "step":
                out.append(((e[1], e[2]), []))
            elif out:
                out[-1][1].append(e)
        return out


def _plan(sim: Any, *args: str) -> dict[str, Any]:
    r = sim.sparkctl("-i", str(sim.inventory), "plan", *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _compare(plan: dict[str, Any], rec: Recorder) -> int:
    segs = [s for s in rec.segments() if s[0][1] in {st["summary"] for st in plan["steps"]}]
    assert [s[0] for s in segs] == [(st["phase"], st["summary"]) for st in plan["steps"]], "steps differ"
    compared = 0
    for step, (_, calls) in zip(plan["steps"], segs):
        if step["kind"] in ("run", "stop"):
            ran = sorted((c[1], c[2], c[3]) for c in calls if c[0] == "run")
            want = sorted((n, cmd, str(bool(step["sudo"].get(n)))) for n, cmd in step["commands"].items())
            assert ran == want, (step["id"], ran, want)
            compared += 1
        if step["kind"] == "put":
            put = sorted((c[1], c[2], c[3]) for c in calls if c[0] == "put")
            want = sorted((n, f["path"], f["sha256"]) for n, fs in step["files"].items() for f in fs)
            assert put == want, step["id"]
            compared += 1
    return compared


@pytest.fixture
def inproc(sim_ring: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in sim_ring.env.items():
        if k.startswith(("SPARKCTL_", "XDG_")):
            monkeypatch.setenv(k, v)
    return sim_ring


def _run(sim: Any, op: str, profile: str | None = None) -> Recorder:
    inv = load_inventory(sim.inventory)
    roots = Roots.make(env={})
    waivers = {"page_size": Waiver("page_size", WAIVE_REASON)}
    with SSHTransport(inv.nodes, TransportSettings(5, 60, 120)) as tr:
        rec = Recorder(tr)
        if op == "down":
            executor.down(inv, tr, progress=rec.progress)
        elif op == "up":
            executor.up(resolve(profile, roots), inv, tr, roots, waivers=waivers, progress=rec.progress)
        else:
            executor.switch(resolve(profile, roots), inv, tr, roots, waivers=waivers, progress=rec.progress)
    return rec


def test_simulated_plan_up_switch_down_is_exactly_what_runs(inproc: Any) -> None:
    sim = inproc
    plan = _plan(sim, "up", "ds41f-tp4-ring", *WAIVE)
    assert plan["steps"] and plan["steps"][0]["phase"] == "check"
    rec = _run(sim, "up", "ds41f-tp4-ring")
    assert _compare(plan, rec) >= 7  # clock, stop-stale, push, logs, reload, two start groups
    # the comparison can fail: a plan that says one thing more than what ran
    import copy

    other = copy.deepcopy(plan)
    step = next(s for s in other["steps"] if s["phase"] == "start")
    step["commands"] = {n: c + " --extra" for n, c in step["commands"].items()}
    with pytest.raises(AssertionError):
        _compare(other, rec)
    noop = _plan(sim, "up", "ds41f-tp4-ring", *WAIVE)
    assert noop["steps"] == [] and "already serving" in noop["note"]
    rec = _run(sim, "up", "ds41f-tp4-ring")
    assert not [c for c in rec.log if c[0] == "put"], "a no-op up wrote files"
    plan = _plan(sim, "switch", "tensorfold-tp4-ring", *WAIVE)
    assert "rollback" in plan["branches"]
    assert _compare(plan, _run(sim, "switch", "tensorfold-tp4-ring")) >= 7
    plan = _plan(sim, "down")
    assert _compare(plan, _run(sim, "down")) >= 2
    assert os.environ.get("SPARKCTL_SIM_DIR")
