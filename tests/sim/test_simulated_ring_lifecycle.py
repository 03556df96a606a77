"""End-to-end on the SIMULATED 4-node ring: up, status, switch with rollback,
down, crash recovery, the lock, Ctrl-C, and the REAL llama.cpp engine.

Simulated: the ds41f/TensorFold engines and the GB10 tools. Real: OpenSSH,
the rendered env files, launch scripts and systemd units (run by the docker and
systemctl shims), the TCP rendezvous over the fabric addresses, HTTP.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import ENGINE_PS, WAIVE, WAIVE_REASON, served, status

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]


def engines_on(sim, node: str) -> str:
    return sim.ssh(node, ENGINE_PS).stdout.strip()


def test_simulated_tp4_world_with_three_ranks_never_serves_then_four_do(sim_ring) -> None:
    r = sim_ring.sparkctl("-i", str(sim_ring.inventory), "up", "ds41f-tp4-ring", *WAIVE)
    assert r.returncode == 0, r.stdout + r.stderr
    sim_ring.sparkctl("-i", str(sim_ring.inventory), "down", check=True)
    for n in ("spark-b", "spark-c", "spark-a"):  # the rendered units, started by hand: rank 3 missing
        assert sim_ring.ssh(n, "systemctl start sparkctl-engine").returncode == 0
    inv = load_inventory(sim_ring.inventory)
    url = f"http://{inv.node('spark-a').host}:8000/v1/models"
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=1)
        time.sleep(0.5)
    assert sim_ring.ssh("spark-d", "systemctl start sparkctl-engine").returncode == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).json()["data"][0]["id"] == "deepseek-v4.1-flash":
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        pytest.fail("four ranks did not serve")
    sim_ring.sparkctl("-i", str(sim_ring.inventory), "down", check=True)


def test_simulated_up_status_switch_rollback_down(sim_ring, tmp_path) -> None:
    inv = str(sim_ring.inventory)
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "started"
    assert served(sim_ring) == ["deepseek-v4.1-flash"]
    st = status(sim_ring)
    assert [(n["node"], n["rank"], n["alive"]) for n in st["nodes"]] == [
        ("spark-a", 0, True), ("spark-b", 1, True), ("spark-c", 2, True), ("spark-d", 3, True)]
    assert st["record"]["waivers"] == {"page_size": WAIVE_REASON}
    assert st["drift"] == []
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json")  # same files: a no-op
    assert json.loads(r.stdout)["action"] == "noop"

    r = sim_ring.sparkctl("-i", inv, "switch", "tensorfold-tp4-ring", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["serving"] == "tensorfold-tp4-ring"
    assert served(sim_ring) == ["dsv41-flash-tensorfold"]
    # the served-model law: port 8000 answers, but with another stack's model
    r = sim_ring.sparkctl("-i", inv, "check", "ds41f-tp4-ring", *WAIVE, "--json", "--bandwidth", "0")
    bad = [v for v in json.loads(r.stdout)["verdicts"] if v["status"] == "fail"]
    assert r.returncode == 4 and [(v["law"], v["node"]) for v in bad] == [("served_model", "spark-a")], bad
    assert "dsv41-flash-tensorfold" in bad[0]["observed"]

    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "broken.yaml").write_text(
        "description: an engine that refuses its flags\nextends: ds41f-tp4-ring\nengine:\n  args: [--no-such-flag]\n")
    r = sim_ring.sparkctl("--root", str(root), "-i", inv, "switch", "broken", *WAIVE, "--json")
    assert r.returncode == 5
    res = json.loads(r.stdout)
    assert res["rolled_back"] and res["serving"] == "tensorfold-tp4-ring" and "broken" in res["error"]
    assert served(sim_ring) == ["dsv41-flash-tensorfold"]

    r = sim_ring.sparkctl("-i", inv, "down", "--json")
    assert r.returncode == 0, r.stderr
    for n in ("spark-a", "spark-b", "spark-c", "spark-d"):
        assert engines_on(sim_ring, n) == ""
    assert status(sim_ring)["record"]["state"] == "stopped"
    assert sim_ring.sparkctl("-i", inv, "down").returncode == 0  # idempotent


def test_simulated_killed_rank_shows_in_status_and_up_cleans_stale_ranks(sim_ring) -> None:
    inv = str(sim_ring.inventory)
    sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, check=True)
    assert "ds41f serve" in engines_on(sim_ring, "spark-c")
    t0 = time.monotonic()
    sim_ring.sparkctl("sim", "fault", "spark-c", "kill-engine", check=True)  # SIGKILL the rank (and its wrappers)
    while True:  # the wrappers (docker, launch.sh) exit right after the engine
        st = status(sim_ring)
        if any("spark-c" in d and "not running" in d for d in st["drift"]) or time.monotonic() - t0 > 15:
            break
        time.sleep(0.5)
    assert any("spark-c" in d and "not running" in d for d in st["drift"]), st["drift"]
    assert time.monotonic() - t0 < 15
    r = sim_ring.sparkctl("-i", inv, "up", "ds41f-tp4-ring", *WAIVE, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "started"
    assert status(sim_ring)["drift"] == []
    sim_ring.sparkctl("-i", inv, "down", check=True)


def test_simulated_two_concurrent_ups_one_is_refused_by_the_lock(sim_ring) -> None:
    inv = str(sim_ring.inventory)
    cmd = [sys.executable, "-m", "sparkctl.cli", "-i", inv, "up", "tensorfold-tp4-ring"]
    a = subprocess.Popen(cmd, env=sim_ring.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    b = subprocess.run(cmd, env=sim_ring.env, capture_output=True, text=True, timeout=120)
    a_out, a_err = a.communicate(timeout=180)
    assert a.returncode == 0, a_err
    assert b.returncode == 6 and "locked by" in b.stderr and "since" in b.stderr
    sim_ring.sparkctl("-i", inv, "down", check=True)


def test_simulated_ctrl_c_during_up_leaves_everything_stopped_and_recorded(sim_ring) -> None:
    inv = str(sim_ring.inventory)
    env = {**sim_ring.env, "SPARKCTL_SIM_LOAD_S": "60"}  # a slow load: interrupt while waiting for readiness
    p = subprocess.Popen([sys.executable, "-m", "sparkctl.cli", "-i", inv, "up", "tensorfold-tp4-ring"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "waiting" not in p.stderr.readline():
        pass
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=120)
    assert p.returncode == 130
    for n in ("spark-a", "spark-b", "spark-c", "spark-d"):
        assert engines_on(sim_ring, n) == ""
    assert status(sim_ring)["record"]["state"] == "stopped"


def test_real_llamacpp_engine_up_switch_down_on_a_simulated_node(sim_ring) -> None:
    inv = str(sim_ring.inventory)
    r = sim_ring.sparkctl("-i", inv, "up", "tiny-llamacpp", "--json")
    assert r.returncode == 0, r.stderr
    host = load_inventory(sim_ring.inventory).node("spark-a").host
    body = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 8, "temperature": 0,
            "logit_bias": {"2": -100}}
    resp = httpx.post(f"http://{host}:8080/v1/completions", json=body, timeout=60).json()
    assert resp["usage"]["prompt_tokens"] > 0 and resp["usage"]["completion_tokens"] >= 1
    r = sim_ring.sparkctl("-i", inv, "switch", "tensorfold-tp4-ring", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["serving"] == "tensorfold-tp4-ring", r.stderr
    assert "llama_cpp" not in engines_on(sim_ring, "spark-a")
    r = sim_ring.sparkctl("-i", inv, "switch", "tiny-llamacpp", "--json")
    assert r.returncode == 0, r.stderr
    assert served(sim_ring, 8080) == ["tiny-llama"]
    sim_ring.sparkctl("-i", inv, "down", check=True)
    assert engines_on(sim_ring, "spark-a") == ""
