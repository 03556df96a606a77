"""End-to-end on the SIMULATED ring: the rolling switch through the REAL gateway (smg 1.13.0) in front of
the REAL llama.cpp engine (llama-cpp-python, the tiny GGUF), two single-node replicas on spark-a and spark-b.

An open-loop load (a new streaming request every LOAD_PERIOD_S, whatever the earlier ones do) runs
through the gateway while:

* `switch` replaces the two replicas one at a time (drain, idle twice, stop, start, ready, register),
  the streams lasting about 5 s and five of them over a minute (the engine's decode is paced, a
  SIMULATED speed): no request fails, every stream ends whole (a finish_reason, [DONE], no error frame:
  smg ends a stream its backend cut with an error frame and [DONE]; one completion id: one backend start
  to end), each answered by the served name, and both the old and the new engines answered some of them;
* the new replica 2 is killed while it loads (SIGKILL, by a watch loop on spark-b): the switch
  rolls back replica by replica while the untouched old replica serves; no request fails and the
  record says the old profile serves, with a note;
* the same switch with its way back failing too (both engines killed while they load on spark-b): the
  record says "degraded", spark-a serves; the same switch again resumes (spark-a kept, spark-b started),
  no request fails;
* the gateway killed once replica 1 is recorded replaced: the rebuild registers what that record says
  serves (never the replica drained next), the switch goes on;
* Ctrl-C while replica 2 stops: one stable "degraded" state that `status` describes, resumed by the same
  switch again, no request failing;
* the negative control: the same switch stopping each replica a second after the gateway removed it
  (drain_timeout_s: 1, stop_timeout_s: 1) makes the same load count failures, so the zeros above can fail;
* a switch where no replica can stay up (two replicas to one): the gateway answers 503 with
  Retry-After during the stated outage, never 404 and never a refused connection, then serves again.

Simulated: the GB10 tools, systemd. Real: smg, llama-cpp-python, OpenSSH, HTTP, SSE. One cluster.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import GW_PORT, LONG_S, Load, Sim, make_sim, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

BASE = """\
description: the tiny real engine, two replicas behind the gateway (a SIMULATED-ring test)
extends: tiny-llamacpp
engine:
  binary: python3 -m sparkctl_sim.llamacpp_routes.llama_cpp.server
  env:
    SPARKCTL_SIM_DECODE_MS: "1000"
topology:
  nodes: [spark-a, spark-b]
  replicas: 2
serve:
  ready_timeout_s: 90
  gateway:
    enabled: true
"""
# roll-new: another engine setting, which `ps` shows (the fault watcher tells the two apart by it)
PROFILES = {
    "roll-old": BASE,
    "roll-new": BASE.replace("llama_cpp.server\n", "llama_cpp.server\n"
                             "  args: [\"--interrupt_requests\", \"False\", \"--n_threads\", \"1\"]\n", 1),
    "roll-one": BASE.replace("nodes: [spark-a, spark-b]\n  replicas: 2", "nodes: [spark-a]\n  replicas: 1"),
}
# the negative control: roll-new whose replicas a switch stops as soon as the gateway has removed them: no wait
# for its streams, and a second's grace for the engine's own (uvicorn lets the requests in flight end on
# SIGTERM, for up to the unit's TimeoutStopSec=)
PROFILES["roll-nodrain"] = PROFILES["roll-new"].replace("  ready_timeout_s: 90\n", "  ready_timeout_s: 90\n"
                                                        "  stop_timeout_s: 1\n", 1).replace(
    "    enabled: true\n", "    enabled: true\n    drain_timeout_s: 1\n", 1)
NEW_MARK = "--n_threads 1"
WATCHER = "sparkctl-test-load-watcher"  # the name ($0) of the watch loop on spark-b
LONG = frozenset({2, 6, 10, 14, 18})  # the long requests among the load's: 0.5 s to 4.5 s after it starts


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    for sim in make_sim(tmp_path_factory.mktemp("rollring"), 4, load_images=False):
        d = sim.inventory.parent / "profiles"
        d.mkdir(exist_ok=True)
        for name, text in PROFILES.items():
            (d / f"{name}.yaml").write_text(text)
        yield sim


def _gw(sim: Sim) -> str:
    return f"http://{load_inventory(sim.inventory).node('spark-a').host}:{GW_PORT}"


def _record(sim: Sim) -> dict[str, Any]:
    return json.loads(sim.ssh("spark-a", "cat /var/lib/sparkctl/record.json").stdout)


def _chats(sim: Sim, node: str, log: str) -> int:
    out = sim.ssh(node, f"grep -c 'POST /v1/chat/completions' /var/log/sparkctl/{log} || true").stdout.strip()
    return int(out) if out.isdigit() else 0


@contextlib.contextmanager
def _killing_on_spark_b(ring: Sim, new: list[bool]) -> Iterator[list[str]]:
    """Once roll-new's engine on spark-b is gone (its replica's stop), SIGKILL spark-b's engines as they load
    (a crash while loading), one per entry of ``new``: roll-new's (it has NEW_MARK) where True, roll-old's where
    False. The watch runs on spark-b itself, one sh loop over the node's own ``ps`` every 20 ms: a watch that
    opened a new SSH session per look (0.2 s or more on a loaded machine) could miss an engine that loads in
    0.7 s. Yields the ``ps`` lines of the engines killed, filled in when the block ends, which ends the watch."""
    from sparkctl_sim import cluster

    killed: list[str] = []
    script = f"""MARK={shlex.quote(NEW_MARK)}; gone=
for w in {" ".join("T" if x else "F" for x in new)}; do
  while :; do
    line=$(ps -eo pid,args | grep 'llama_cpp[.]server' | head -n 1)
    case "$line" in "") is= ;; *"$MARK"*) is=T ;; *) is=F ;; esac
    [ "$is" = T ] || gone=1
    if [ -n "$gone" ] && [ "$is" = "$w" ]; then set -- $line; kill -KILL "$1"; echo "$line"; break; fi
    sleep 0.02
  done
done"""
    watch = subprocess.Popen([*cluster.ssh_argv(ring.root, "spark-b"),
                              f"exec timeout 900 sh -c {shlex.quote(script)} {WATCHER}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        yield killed
    finally:
        ring.ssh("spark-b", f"pkill -KILL -f '{WATCHER[:-1]}[{WATCHER[-1]}]' || true")  # not this shell itself
        out, _ = watch.communicate(timeout=30)
        killed.extend(line for line in out.splitlines() if line.strip())


def test_simulated_rolling_switch_fails_no_request(ring: Sim) -> None:
    inv = str(ring.inventory)
    gw = _gw(ring)
    r = ring.sparkctl("-i", inv, "up", "roll-old", "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert wait_until(lambda: len(httpx.get(f"{gw}/workers", timeout=5).json()["workers"]) == 2, 30)

    # the plan says what runs: per replica, drain, stop, start, ready, register; no outage
    r = ring.sparkctl("-i", inv, "plan", "switch", "roll-new", "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    ids = [s["id"] for s in plan["steps"]]
    for k in (1, 2):
        assert [f"r{k}-gateway-drain", f"r{k}-stop", f"r{k}-start-1", f"r{k}-ready", f"r{k}-gateway-register"] \
            == [i for i in ids if i.startswith(f"r{k}-") and i.split("-", 1)[1] in
                ("gateway-drain", "stop", "start-1", "ready", "gateway-register")], ids
    assert plan["outage"].startswith("none expected")

    # streams of about 5 s, and five of over a minute started around the switch's start: a drain must wait
    # for the ones on its replica (smg's default policy keeps one prompt on one worker: all on one replica)
    with Load(gw, long=LONG) as load:
        time.sleep(2)
        r = ring.sparkctl("-i", inv, "switch", "roll-new", "--json", timeout=600)
        time.sleep(2)
    print(f"rolling switch: {load.summary()}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["switched"]
    rec = _record(ring)
    assert (rec["profile"], rec["state"]) == ("roll-new", "serving")
    ran = [s["id"] for s in rec["steps"]]
    assert ran.index("r1-gateway-register") < ran.index("r2-gateway-drain"), ran
    assert len(load.results) > 20
    assert load.failed() == [], load.failed()[:5]
    longs = [x for x in load.results if x["long"]]
    assert len(longs) == len(LONG) and all(x["seconds"] >= LONG_S for x in longs), longs
    drains = {x["id"]: x.get("seconds") for x in rec["steps"] if x["id"].endswith("-gateway-drain")}
    print(f"rolling switch: {len(longs)} streams of {min(x['seconds'] for x in longs):.0f} s or more, whole; "
          f"drain steps {drains}")
    # a drain waited out the minute-long streams in flight on its replica (the streams above are whole)
    assert max(v or 0 for v in drains.values()) >= LONG_S / 2, drains
    assert {x["model"] for x in load.results} == {"tiny-llama"}
    # both stacks answered: the old engine's log (kept as engine.log.1) and the new one's
    old = sum(_chats(ring, n, "engine.log.1") for n in ("spark-a", "spark-b"))
    new = sum(_chats(ring, n, "engine.log") for n in ("spark-a", "spark-b"))
    print(f"rolling switch: chat completions answered by the old engines {old}, by the new {new}")
    assert old > 0 and new > 0, (old, new)


def test_simulated_rolling_switch_whose_new_replica_never_gets_ready_rolls_back_serving(ring: Sim) -> None:
    """roll-new serves; the switch back to roll-old replaces spark-a, then roll-old's replica on spark-b is
    killed while it loads: both nodes get roll-new back, spark-b's first, while the other replica serves."""
    inv = str(ring.inventory)
    gw = _gw(ring)
    with Load(gw) as load:
        with _killing_on_spark_b(ring, [False]) as killed:  # roll-old's replica, while it loads
            r = ring.sparkctl("-i", inv, "switch", "roll-old", "--json", timeout=500)
        time.sleep(2)
    print(f"rolled back: {load.summary()}")
    assert killed, "the new replica was never seen loading"
    out = json.loads(r.stdout)
    assert r.returncode != 0 and out["rolled_back"] and not out["switched"], r.stdout[-2000:]
    rec = _record(ring)
    assert (rec["profile"], rec["state"]) == ("roll-new", "serving") and "did not come up" in rec["note"], rec
    ran = [s["id"] for s in rec["steps"]]
    assert "rb2-ready" in ran and "rb2-r1-gateway-register" in ran, ran
    assert load.failed() == [], load.failed()[:5]
    assert wait_until(lambda: sorted(w["status"] for w in httpx.get(f"{gw}/workers", timeout=5).json()["workers"])
                      == ["ready", "ready"], 30)


def test_simulated_degraded_switch_then_the_same_switch_resumes_and_fails_no_request(ring: Sim) -> None:
    """roll-new serves; the switch to roll-old replaces spark-a, then roll-old's replica on spark-b is killed
    while it loads, and so is roll-new's given back there: the way back fails, spark-b is left stopped and
    the record "degraded" (exit 8), spark-a serving roll-old. The same switch again resumes: spark-a is
    kept (never drained, never stopped), spark-b started. No request through the gateway fails."""
    inv = str(ring.inventory)
    gw = _gw(ring)
    with Load(gw) as load:
        with _killing_on_spark_b(ring, [False, True]) as killed:  # roll-old loading, then roll-new given back
            r = ring.sparkctl("-i", inv, "switch", "roll-old", timeout=500)
        time.sleep(1)
        degraded = _record(ring)
        r2 = ring.sparkctl("-i", inv, "plan", "switch", "roll-old", "--json", timeout=120)
        again = ring.sparkctl("-i", inv, "switch", "roll-old", "--json", timeout=400)
        time.sleep(2)
    print(f"degraded, then resumed: {load.summary()}")
    assert len(killed) == 2, killed
    assert r.returncode == 8, r.stdout[-2000:] + r.stderr[-2000:]
    assert "left degraded" in r.stderr + r.stdout
    assert degraded["state"] == "degraded" and set(degraded["replicas"]) == {"spark-a"}, degraded
    assert degraded["replicas"]["spark-a"]["profile"] == "roll-old"
    plan = json.loads(r2.stdout)
    assert "spark-a: keep" in plan["note"] and "spark-b: start" in plan["note"], plan["note"]
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rec = _record(ring)
    assert (rec["profile"], rec["state"]) == ("roll-old", "serving"), rec
    ran = [s["id"] for s in rec["steps"]]
    assert "r1-ready" in ran and not [i for i in ran if i.startswith("r2-")], ran  # one replica to start: spark-b
    assert load.failed() == [], load.failed()[:5]
    assert wait_until(lambda: sorted(w["status"] for w in httpx.get(f"{gw}/workers", timeout=5).json()["workers"])
                      == ["ready", "ready"], 30)


def _ready_urls(gw: str) -> list[str] | None:
    """The URLs of the workers smg lists ready; None while it does not answer."""
    try:
        return sorted(w["url"] for w in httpx.get(f"{gw}/workers", timeout=2).json()["workers"]
                      if w.get("status") == "ready")
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def test_simulated_gateway_killed_mid_roll_rebuilds_what_serves(ring: Sim) -> None:
    """roll-old serves; during the switch to roll-new the gateway is killed once replica 1 (spark-a) is recorded
    replaced. Its unit restarts it and the rebuild registers what that record says serves: the new replica on
    spark-a, never the old one on spark-b, drained next. The switch goes on (its register waits for the gateway)
    and ends with both new replicas registered; every request sent once the gateway routes again succeeds."""
    inv, gw = str(ring.inventory), _gw(ring)
    urls = {b["head"]: b["url"] for b in _record(ring)["gateway"]["backends"]}
    log_before = len(ring.ssh("spark-a", "cat /var/log/sparkctl/gateway.log").stdout)
    seen: dict[str, Any] = {}
    stop = threading.Event()

    def kill_after_replica_1() -> None:
        while not stop.is_set():
            with contextlib.suppress(ValueError):
                if "spark-a serve roll-new" in _record(ring).get("note", ""):
                    break
            time.sleep(0.1)
        else:
            return
        pid = ring.ssh("spark-a", "systemctl show -p MainPID --value sparkctl-gateway").stdout.strip()
        ring.ssh("spark-a", f"pkill -KILL -P {pid}; kill -KILL {pid}")
        seen["killed"] = time.monotonic()
        while not stop.is_set() and not _ready_urls(gw):  # smg back, and the rebuild registered something
            time.sleep(0.05)
        seen["routing"], seen["workers"] = time.monotonic(), _ready_urls(gw)

    killer = threading.Thread(target=kill_after_replica_1, daemon=True)
    with Load(gw) as load:
        killer.start()
        r = ring.sparkctl("-i", inv, "switch", "roll-new", "--json", timeout=500)
        time.sleep(2)
    stop.set()
    killer.join(10)
    print(f"gateway killed mid-roll: {load.summary()}; down for {seen.get('routing', 0) - seen.get('killed', 0):.1f} s")
    assert "killed" in seen and "routing" in seen, seen
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = _record(ring)
    assert (rec["profile"], rec["state"]) == ("roll-new", "serving") and "serving" not in rec["gateway"], rec
    log = ring.ssh("spark-a", "cat /var/log/sparkctl/gateway.log").stdout[log_before:]
    rebuilt = [ln for ln in log.splitlines() if "backend(s) from the record" in ln]
    assert rebuilt, log[-2000:]
    # rebuilt from replica 1's record (1: spark-a's new replica) or from the serving one (2); before the
    # records named what serves mid-roll, a starting record rebuilt nothing (0) and clients got 503s
    assert rebuilt[0].split()[:2] in (["rebuilt", "1"], ["rebuilt", "2"]), rebuilt
    assert urls["spark-a"] in (seen["workers"] or []), seen
    after = [x for x in load.results if x["t"] > seen["routing"]]
    assert after and [x for x in after if not load.whole(x)] == [], after[:5]
    assert wait_until(lambda: _ready_urls(gw) == sorted(urls.values()), 30), _ready_urls(gw)


def test_simulated_ctrl_c_mid_roll_leaves_one_stable_state_then_the_switch_resumes(ring: Sim) -> None:
    """roll-new serves; the switch to roll-old is interrupted (SIGINT, as Ctrl-C) while replica 2 (spark-b)
    stops, after replica 1 (spark-a) was registered: spark-b is stopped, spark-a serves roll-old, the record
    says "degraded" and `status --json` describes it; the same switch again resumes. No request fails."""
    inv, gw = str(ring.inventory), _gw(ring)
    events = ring.inventory.parent / "ctrl-c-events.jsonl"
    events.unlink(missing_ok=True)
    env = {**ring.env, "SPARKCTL_PROGRESS_JSONL": str(events)}
    with Load(gw) as load:
        p = subprocess.Popen([sys.executable, "-m", "sparkctl.cli", "-i", inv, "switch", "roll-old"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def replica_2_stops() -> bool:
            lines = events.read_text().splitlines() if events.exists() else []
            # the step's own line (node "*"): "stop roll-new on spark-b (replica 2 of 2) ..."
            return any((e := json.loads(ln))["phase"] == "stop" and " on spark-b " in e["message"] for ln in lines)
        assert wait_until(replica_2_stops, 300, 0.1), events.read_text() if events.exists() else "no events"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
        time.sleep(1)
        st = json.loads(ring.sparkctl("-i", inv, "status", "--json", timeout=120).stdout)
        left_b = ring.ssh("spark-b", "ps -eo args | grep -v grep | grep -c llama_cpp.server || true").stdout.strip()
        again = ring.sparkctl("-i", inv, "switch", "roll-old", "--json", timeout=400)
        time.sleep(2)
    print(f"Ctrl-C mid-roll, then resumed: {load.summary()}")
    assert p.returncode == 130, out[-2000:] + err[-2000:]
    assert "interrupted" in err and "the other replicas serve" in err, err[-2000:]
    rec = st["record"]
    assert rec["state"] == "degraded" and set(rec["replicas"]) == {"spark-a"}, rec
    assert rec["replicas"]["spark-a"]["profile"] == "roll-old" and "interrupted (Ctrl-C)" in rec["note"], rec
    # Replica 2's stop, finished by the branch, leaves no engine on spark-b. (The "1" once seen here was
    # spark-a's engine: the simulated `ps -eo args`, with no PID column to filter by, listed every node's
    # processes; sparkctl_sim/shims/rendered.py `_ps` now lists the node's own in any format.)
    assert left_b == "0", left_b
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (_record(ring)["profile"], _record(ring)["state"]) == ("roll-old", "serving")
    assert load.failed() == [], load.failed()[:5]
    assert wait_until(lambda: len(_ready_urls(gw) or []) == 2, 30), _ready_urls(gw)


def test_simulated_negative_control_a_switch_that_stops_a_replica_once_removed_fails_requests(ring: Sim) -> None:
    """The same rolling switch under the same load, long streams included, away from a stack with
    drain_timeout_s: 1 and stop_timeout_s: 1: each replica is stopped a second after the gateway removed it
    and killed a second later, its streams in flight cut. The load counts failures, so the zeros above can fail."""
    inv, gw = str(ring.inventory), _gw(ring)
    # the serving stack's own settings drain and stop it (the record's gateway entry, its unit's TimeoutStopSec=)
    r = ring.sparkctl("-i", inv, "switch", "roll-nodrain", "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with Load(gw, long=LONG) as load:
        time.sleep(2)
        r = ring.sparkctl("-i", inv, "switch", "roll-new", "--json", timeout=600)
        time.sleep(2)
    print(f"negative control (drain_timeout_s: 1, stop_timeout_s: 1): {load.summary()}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(load.failed()) > 0, f"{len(load.results)} requests, none failed: the load test cannot fail"


def test_simulated_switch_where_no_replica_stays_up_answers_503_with_retry_after(ring: Sim) -> None:
    inv = str(ring.inventory)
    gw = _gw(ring)
    r = ring.sparkctl("-i", inv, "plan", "switch", "roll-one", "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    assert "503 with Retry-After" in plan["outage"] and "one replica" in plan["outage"], plan["outage"]
    ids = [s["id"] for s in plan["steps"]]
    assert ids.index("gateway-hold") < ids.index("stop-stale") < ids.index("gateway-register") \
        < ids.index("gateway-release")
    with Load(gw, period=0.2) as load:
        r = ring.sparkctl("-i", inv, "switch", "roll-one", "--json", timeout=400)
        time.sleep(3)
    print(f"outage (2 replicas to 1): {load.summary()}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bad = [x for x in load.results if x["status"] not in (200, 503)
           or (x["status"] == 503 and x["retry_after"] is None) or (x["status"] == 200 and not load.whole(x))]
    # only refused connections and 404s during the outage count here
    assert not [x for x in bad if x["status"] in (None, 404)], bad[:5]
    assert any(x["status"] == 503 for x in load.results), "no outage seen"
    assert load.whole(load.results[-1]), load.results[-3:]
