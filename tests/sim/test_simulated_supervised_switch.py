"""End-to-end on the SIMULATED 4-node ring: `switch --supervise`.

The operator's process returns before the new stack is ready and exits; the
supervisor on the head (spark-a) reaches its peers by ssh over the fabric
addresses with its own key, and ends "done" (TensorFold serving) or, for a
profile whose engine refuses its flags, "rolled-back" with the previous stack
serving its own name. Real: OpenSSH (operator -> head and head -> peers), the
rendered files, the supervisor script; simulated: engines and GB10 tools.
"""

from __future__ import annotations

import json
import time

import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import ENGINE_PS, WAIVE, served, status

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

FINAL = ("done", "rolled-back", "left-degraded", "failed", "aborted")


def follow(sim, timeout_s: float = 240) -> tuple[dict, list[str]]:
    """Poll `status --json` until the supervisor reports a final phase; every phase seen, in order."""
    phases: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = status(sim)
        sup = st.get("supervisor") or {}
        for e in sup.get("events", []):
            if e["phase"] not in phases:
                phases.append(e["phase"])
        if sup.get("phase") in FINAL and not sup.get("alive"):
            return st, phases
        time.sleep(1.0)
    pytest.fail(f"the supervisor did not finish; phases {phases}")


@pytest.fixture(scope="module")
def ring(sim_ring):
    inv = str(sim_ring.inventory)
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    yield sim_ring
    sim_ring.sparkctl("-i", inv, "down")


def test_supervised_switch_returns_at_once_and_ends_done(ring) -> None:
    inv = str(ring.inventory)
    assert served(ring) == ["deepseek-v4.1-flash"]
    t0 = time.monotonic()
    r = ring.sparkctl("-i", inv, "switch", "tensorfold-tp4-ring", "--supervise", "--json")
    took = time.monotonic() - t0
    returned_at = time.time()
    assert r.returncode == 0, r.stdout + r.stderr  # the operator's process has exited here
    out = json.loads(r.stdout)
    assert out["supervised"] and out["head"] == "spark-a" and out["pid"] > 0
    # returned before the new stack is ready: the supervisor is still at work
    st = status(ring)
    # the runner on the head writes the plan's records: "starting" once it began, "serving" at the end
    assert st["record"]["state"] in ("switching", "starting", "serving")
    assert st["supervisor"]["events"], st["supervisor"]
    st, phases = follow(ring)
    assert phases[0] == "started" and phases[-1] == "done", phases
    # the same plan `sparkctl plan switch --supervise` prints, run by the runner on the head
    for p in ("record-start", "stop-stale", "push", "start", "ready", "record"):
        assert p in phases, phases
    assert st["record"]["profile"] == "tensorfold-tp4-ring" and st["record"]["state"] == "serving"
    assert served(ring) == ["dsv41-flash-tensorfold"]
    assert st["drift"] == [], st["drift"]
    assert took < 60, took
    # the operator was back (and its process gone) before the new stack was ready
    done = [e for e in st["supervisor"]["events"] if e["phase"] in ("ready", "done")]
    assert done and done[0]["epoch"] >= int(returned_at), (returned_at, done)
    # the supervisor reached its peers over the fabric, not the management network
    doc = json.loads(ring.ssh("spark-a", "cat /var/lib/sparkctl/supervisor-plan.json").stdout)
    layout = load_inventory(ring.inventory)
    for n in ("spark-b", "spark-c", "spark-d"):
        addr = doc["nodes"][n]["fabric_address"]
        assert addr in {e.address for e in layout.endpoints(n)} and addr != layout.node(n).host, (n, addr)
        assert doc["nodes"][n]["ssh"][-1].endswith("@" + addr)
    assert [s["phase"] for s in doc["plan"]["steps"]][0] == "record-start" and "rollback" in doc["plan"]["branches"]
    mode = ring.ssh("spark-a", "stat -c %a /var/lib/sparkctl/supervisor-plan.json").stdout.strip()
    assert mode == "600", mode  # it carries the env files' bytes
    # the lock is free again: a plain `up` of the same profile is a no-op
    r = ring.sparkctl("-i", inv, "up", "tensorfold-tp4-ring", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["action"] == "noop", r.stdout + r.stderr


def test_supervised_switch_to_a_broken_profile_rolls_back(ring, tmp_path) -> None:
    inv = str(ring.inventory)
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "broken.yaml").write_text(
        "description: an engine that refuses its flags\nextends: ds41f-tp4-ring\nengine:\n  args: [--no-such-flag]\n")
    r = ring.sparkctl("--root", str(root), "-i", inv, "switch", "broken", *WAIVE, "--supervise", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    st, phases = follow(ring)
    assert phases[-1] == "rolled-back", (phases, st["supervisor"])
    assert "rollback" in phases
    assert st["record"]["profile"] == "tensorfold-tp4-ring" and st["record"]["state"] == "serving"
    assert st["record"]["note"] == "rolled back by supervisor"
    assert served(ring) == ["dsv41-flash-tensorfold"]
    # no orphans: one engine per node, all TensorFold
    for n in ("spark-a", "spark-b", "spark-c", "spark-d"):
        procs = ring.ssh(n, ENGINE_PS).stdout.strip().splitlines()
        assert procs and all("tensorfold" in x and "ds41f" not in x for x in procs), (n, procs)
    # the lock is free afterwards: --wait follows the next supervised switch to its end
    r = ring.sparkctl("-i", inv, "switch", "ds41f-tp4-ring", *WAIVE, "--supervise", "--wait", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["phase"] == "done" and out["events"][0]["phase"] == "started", out
    assert served(ring) == ["deepseek-v4.1-flash"]
    assert status(ring)["record"]["state"] == "serving"
    r = ring.sparkctl("-i", inv, "down", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    for n in ("spark-a", "spark-b", "spark-c", "spark-d"):
        assert ring.ssh(n, ENGINE_PS).stdout.strip() == ""
