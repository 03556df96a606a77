"""End-to-end on the SIMULATED ring: the REAL gateway (smg 1.13.0, from its pinned wheels) in front of
the REAL llama.cpp engine (llama-cpp-python serving the tiny GGUF), two replicas on spark-a and spark-b.

The stack is keyed (serve.api_key_env): the gateway requires the engines' key. `up` installs the
gateway from wheels the operator's side fetched (the node has no index), starts
its unit, and registers each replica only after the ready step; /v1/models and a streamed chat
completion go through the gateway; an unknown model gets the gateway's 404; the gateway killed is
restarted by its unit and rebuilds its backends from the run record; `status` shows the gateway, its
backends per model and the stack's laws, and `gateway down` is refused while the stack serves through
it, then stops it once nothing does; a gateway on a third node (spark-c) rebuilds from the record copy
its record steps keep beside it; a change to one replica's files
restarts that replica alone, drained first while the other serves every request; `down` drains
(removes, then waits for the engine to report idle) before it stops anything. One cluster for the module.

Simulated: the GB10 tools, systemd (the systemctl shim runs the rendered unit, ExecStartPost
included). Real: smg, llama-cpp-python (with llama-server's /health and /slots added,
sparkctl_sim/llamacpp_routes), OpenSSH, HTTP, SSE.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.node import headstate
from sparkctl.node.metrics import gateway_families
from tests.sim.helpers import GW_PORT, Sim, make_sim, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tiny-gateway"
# Beside the simulated cluster's inventory, where sparkctl looks for profiles (sparkctl.model.resources).
PROFILE_TEXT = """\
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
KEY = "gw-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    for sim in make_sim(tmp_path_factory.mktemp("gwring"), 4, load_images=False):
        (sim.inventory.parent / "profiles").mkdir(exist_ok=True)
        (sim.inventory.parent / "profiles" / f"{PROFILE}.yaml").write_text(PROFILE_TEXT)
        sim.env["SPARKCTL_GW_TEST_KEY"] = KEY
        yield sim


def _hosts(sim: Sim) -> tuple[str, str]:
    inv = load_inventory(sim.inventory)
    return inv.node("spark-a").host, inv.node("spark-b").host


def _models(url: str) -> tuple[int, list[str]]:
    r = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=5)
    return r.status_code, [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []


def _workers(url: str) -> list[dict]:
    return httpx.get(f"{url}/workers", headers=AUTH, timeout=5).json()["workers"]


def test_simulated_gateway_serves_the_ready_replicas_rebuilds_and_drains(ring: Sim, tmp_path: Path) -> None:
    inv = str(ring.inventory)
    a, b = _hosts(ring)
    gw = f"http://{a}:{GW_PORT}"

    # While `up` runs, watch the gateway and the engines: the gateway must not list the model
    # before an engine answers /v1/models (a replica still loading gets no request).
    seen: list[tuple[float, bool, bool]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                listed = "tiny-llama" in _models(gw)[1]
            except (httpx.HTTPError, ValueError):
                listed = False
            engine = False
            for host in (a, b):
                try:
                    engine = engine or _models(f"http://{host}:8080")[0] == 200
                except (httpx.HTTPError, ValueError):
                    pass
            seen.append((t, listed, engine))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    r = ring.sparkctl("-i", inv, "up", PROFILE, "--json", timeout=400)
    stop.set()
    watcher.join()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [s["id"] for s in json.loads(r.stdout)["steps"]]
    assert ids.index("ready") < ids.index("gateway-install") < ids.index("gateway-start") \
        < ids.index("gateway-register") < ids.index("record"), ids
    first_listed = next((t for t, listed, _ in seen if listed), None)
    first_engine = next((t for t, _, engine in seen if engine), None)
    assert first_engine is not None and (first_listed is None or first_listed >= first_engine), seen[:5]

    # One endpoint for both replicas: the model listed once, both workers ready, routing by name.
    assert _models(gw) == (200, ["tiny-llama"])
    urls = sorted(w["url"] for w in _workers(gw))
    assert urls == sorted(["http://127.0.0.1:8080", f"http://{b}:8080"]), urls
    assert {w["model_id"] for w in _workers(gw)} == {"tiny-llama"}
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
            "stream": True, "temperature": 0}
    # keyed like the engines (smg's /v1/models is one of its public routes: server.rs, public_routes)
    assert httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=30).status_code == 401
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as s:
        assert s.status_code == 200
        frames = [ln for ln in s.iter_lines() if ln.startswith("data:")]
    assert frames[-1] == "data: [DONE]" and len(frames) >= 3, frames[-3:]
    unknown = httpx.post(f"{gw}/v1/chat/completions", json={**body, "model": "no-such-model", "stream": False},
                         headers=AUTH, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found", unknown.text

    # status sees the gateway (one round trip to its node, the operator's key on stdin): where, its port,
    # up, the backends per model as smg lists them; and the stack's laws' verdicts
    st = _status(ring)
    (g,) = st["gateways"]
    assert (g["node"], g["port"], g["up"], g["state"]) == ("spark-a", GW_PORT, True, "up"), g
    assert sorted((b["url"], b["status"], b["healthy"]) for b in g["backends"]["tiny-llama"]) == \
        [(u, "ready", True) for u in urls], g
    assert not [d for d in st["drift"] if "gateway" in d], st["drift"]
    assert st["stacks"][0]["laws"]["verdicts"] and st["laws"] == st["stacks"][0]["laws"]
    # the head exporter's reader of the gateway (sparkctl.node.headstate) against the real smg's /workers
    rec = json.loads(ring.ssh("spark-a", "cat /var/lib/sparkctl/record.json").stdout)
    gws = headstate.read_gateways({"default": rec}, "elsewhere", {"spark-a": a}, KEY)
    samples = {(x.name, x.labels.get("url"), x.labels.get("status")): x.value for m in gateway_families(gws)
               for x in m.samples}
    assert samples[("sparkctl_gateway_up", None, None)] == 1.0, samples
    assert all(samples.get(("sparkctl_gateway_backend", u, "ready")) == 1.0 for u in urls), samples
    assert all(samples.get(("sparkctl_gateway_backend_healthy", u, None)) == 1.0 for u in urls), samples
    # the gateway is not stopped while a stack serves through it
    refused = ring.sparkctl("-i", inv, "gateway", "down", timeout=120)
    assert refused.returncode != 0 and "still serves default" in refused.stderr, refused.stderr

    # The bench through the gateway (the cluster's endpoint) records where it went.
    out = tmp_path / "bench-gw"
    r = ring.sparkctl("-i", inv, "bench", PROFILE, "--suite", "prefill", "--lengths", "32", "--repeats", "2",
                      "--endpoint", "gateway", "--out", str(out), "--force", "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["endpoint"]["through"] == "gateway" and meta["config"]["endpoint"]["url"] == gw

    # One replica's files change (a node overlay for spark-b): `up` restarts that replica alone.
    # It is drained first, the other keeps serving every request through the gateway, and the
    # restarted one gets none of the gateway's requests before its ready step passed.
    profile = ring.inventory.parent / "profiles" / f"{PROFILE}.yaml"
    profile.write_text(PROFILE_TEXT + "nodes:\n  spark-b:\n    engine:\n      env: {SPARKCTL_TEST_ROLL: '1'}\n")
    results: list[int] = []
    stop = threading.Event()

    def load() -> None:
        plain = {**body, "stream": False, "max_tokens": 4}
        while not stop.is_set():
            try:
                results.append(httpx.post(f"{gw}/v1/chat/completions", json=plain, headers=AUTH,
                                          timeout=30).status_code)
            except httpx.HTTPError:
                results.append(-1)
    client = threading.Thread(target=load, daemon=True)
    client.start()
    r = ring.sparkctl("-i", inv, "up", PROFILE, "--json", timeout=300)
    stop.set()
    client.join()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    done = json.loads(r.stdout)
    ids = [s["id"] for s in done["steps"]]
    assert done["action"] == "restarted" and ids.index("gateway-drain") < ids.index("stop-stale"), ids
    assert results and set(results) == {200}, sorted(set(results))
    log_b = ring.ssh("spark-b", "cat /var/log/sparkctl/engine.log").stdout
    first_ready = log_b.find("POST /v1/completions")  # the ready step's 1-token completion
    first_chat = log_b.find("POST /v1/chat/completions")  # the gateway's traffic
    assert first_ready >= 0 and (first_chat < 0 or first_chat > first_ready), log_b[-2000:]
    assert wait_until(lambda: len(_safe(lambda: _workers(gw)) or []) == 2, 30)

    # The gateway killed: its unit restarts it and the ExecStartPost rebuild registers the
    # record's backends; /v1/models lists exactly the live stack again.
    pid = ring.ssh("spark-a", "systemctl show -p MainPID --value sparkctl-gateway").stdout.strip()
    assert pid.isdigit() and int(pid) > 0, pid
    assert ring.ssh("spark-a", f"pkill -KILL -P {pid}; kill -KILL {pid}").returncode in (0, 1)
    assert wait_until(lambda: _safe(lambda: _models(gw)) == (200, ["tiny-llama"]), 90), _safe(lambda: _models(gw))
    assert wait_until(lambda: len(_safe(lambda: _workers(gw)) or []) == 2, 60)
    new_pid = ring.ssh("spark-a", "systemctl show -p MainPID --value sparkctl-gateway").stdout.strip()
    assert new_pid != pid
    log = ring.ssh("spark-a", "cat /var/log/sparkctl/gateway.log").stdout
    assert "rebuilt 2 backend(s) from the record" in log, log[-2000:]
    assert KEY not in log and KEY not in ring.ssh("spark-a", "cat /etc/sparkctl/gateway.json").stdout

    # down drains before it stops: removed from the gateway, the engines idle, then the stop;
    # the gateway stays up and answers (no refused connection), serving nothing.
    r = ring.sparkctl("-i", inv, "down", "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    steps = json.loads(r.stdout)["steps"]
    order = [s["id"] for s in steps]
    assert order.index("gateway-drain") < order.index("stop"), order
    assert next(s for s in steps if s["id"] == "gateway-drain")["ok"], steps
    assert wait_until(lambda: _safe(lambda: _workers(gw)) == [], 30)
    status, listed = _models(gw)
    assert (status, listed) == (503, []), (status, listed)

    # nothing serves through it now: `gateway down` is a plan (printed first), then it runs
    r = ring.sparkctl("-i", inv, "plan", "gateway-down", timeout=120)
    assert r.returncode == 0 and "systemctl disable --now sparkctl-gateway.service" in r.stdout, r.stdout + r.stderr
    r = ring.sparkctl("-i", inv, "gateway", "down", "--json", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [s["id"] for s in json.loads(r.stdout)["steps"]] == ["lock", "gateway-stop", "unlock"]
    assert ring.ssh("spark-a", "systemctl is-active sparkctl-gateway").stdout.strip() != "active"
    (g,) = _status(ring)["gateways"]
    assert not g["up"] and not g["active"], g


def test_simulated_gateway_on_another_node_rebuilds_from_its_record_copy(ring: Sim) -> None:
    """serve.gateway.node names spark-c, neither the state node nor a stack node: every record step writes
    the record's copy beside the gateway, from which its unit's rebuild registers after a kill."""
    inv = str(ring.inventory)
    c = load_inventory(ring.inventory).node("spark-c").host
    gw = f"http://{c}:{GW_PORT}"
    r = ring.sparkctl("-i", inv, "up", PROFILE, "--set", "serve.gateway.node=spark-c", "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    try:
        assert _models(gw) == (200, ["tiny-llama"])
        copy = json.loads(ring.ssh("spark-c", "cat /var/lib/sparkctl/gateway-records/default.json").stdout)
        assert copy["state"] == "serving" and copy["gateway"]["node"] == "spark-c"
        assert ring.ssh("spark-c", "test -e /var/lib/sparkctl/record.json").returncode != 0  # only the copy there
        pid = ring.ssh("spark-c", "systemctl show -p MainPID --value sparkctl-gateway").stdout.strip()
        assert pid.isdigit() and int(pid) > 0, pid
        assert ring.ssh("spark-c", f"pkill -KILL -P {pid}; kill -KILL {pid}").returncode in (0, 1)
        assert wait_until(lambda: len(_safe(lambda: _workers(gw)) or []) == 2, 90), _safe(lambda: _workers(gw))
        log = ring.ssh("spark-c", "cat /var/log/sparkctl/gateway.log").stdout
        assert "rebuilt 2 backend(s) from the record" in log, log[-2000:]
        (g,) = [g for g in _status(ring)["gateways"] if g["node"] == "spark-c"]
        assert g["up"] and len(g["backends"]["tiny-llama"]) == 2, g
    finally:
        r = ring.sparkctl("-i", inv, "down", "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # down's "stopped" record reached the copy too: a restart now registers nothing
    assert json.loads(ring.ssh("spark-c", "cat /var/lib/sparkctl/gateway-records/default.json").stdout)["state"] \
        == "stopped"


def _status(sim: Sim) -> dict:
    r = sim.sparkctl("-i", str(sim.inventory), "status", "--json", timeout=180)
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


def _safe(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except (httpx.HTTPError, ValueError, KeyError):
        return None
