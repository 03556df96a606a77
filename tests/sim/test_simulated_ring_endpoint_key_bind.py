"""E2E on the SIMULATED ring: serve.api_key_env with serve.bind: fabric, through every client.

One profile with both: the head's engine listens only on its fabric address and
refuses /v1 without the key (HTTP 401, as vLLM's AuthenticationMiddleware does;
the simulated engines, sparkctl_sim/engines/server.py). ``up``'s readiness, ``status``
and ``bench`` go through an SSH forward over the head and send the key from the
operator's variable; without the variable, status says "needs key" and bench
refuses in one line. The key is printed nowhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sim.helpers import WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

KEY = "sk-sim-h16-5e0c9a"
VAR = "SIM_H16_KEY"
PROFILE = "keyed-fabric"


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / f"{PROFILE}.yaml").write_text(
        "description: ds41f on the ring, its endpoint on the head's fabric address, behind a key\n"
        f"extends: ds41f-tp4-ring\nserve:\n  bind: fabric\n  api_key_env: {VAR}\n")
    return root


def test_simulated_ring_keyed_fabric_endpoint_serves_and_status_and_bench_send_the_key(sim_ring, tmp_path) -> None:
    sim, inv = sim_ring, str(sim_ring.inventory)
    base = ("--root", str(_root(tmp_path)), "-i", inv)
    sim.env[VAR] = KEY
    said = ""
    try:
        r = sim.sparkctl(*base, "up", PROFILE, *WAIVE, "--json", timeout=300)
        said += r.stdout + r.stderr
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # readiness through the head, with the key

        r = sim.sparkctl(*base, "status", "--json", timeout=120)
        said += r.stdout + r.stderr
        st = json.loads(r.stdout)
        fabric_ip = st["record"]["listen"]["spark-a"]
        mgmt = next(n for n in sim_inventory_hosts(sim) if n[0] == "spark-a")[1]
        assert fabric_ip != mgmt and st["record"]["api_key_env"] == VAR
        ep = st["endpoint"]["spark-a"]
        assert (ep["state"], ep["via"], ep["url"]) == ("serving", "spark-a", f"http://{fabric_ip}:8000"), ep
        assert st["drift"] == [], st["drift"]
        head = next(n for n in st["nodes"] if n["node"] == "spark-a")
        assert head["served_models"] == ["deepseek-v4.1-flash"]  # the on-node fact: bound address, key from the env file
        # the engine listens on the fabric address only: the management address does not answer
        code = sim.ssh("spark-a", f"curl -s -o /dev/null -w '%{{http_code}}' -m 3 http://{mgmt}:8000/health").stdout
        assert code == "000", code

        out = tmp_path / "bench"
        r = sim.sparkctl(*base, "bench", PROFILE, "--suite", "decode", "--repeats", "2", "--decode-tokens", "8",
                         "--out", str(out), "--force", timeout=300)
        said += r.stdout + r.stderr
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        rows = (out / "results.csv").read_text()
        said += rows + "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
        assert "decode" in rows

        del sim.env[VAR]
        r = sim.sparkctl(*base, "status", "--json", timeout=120)
        st = json.loads(r.stdout)
        assert st["endpoint"]["spark-a"]["state"] == "needs key", st["endpoint"]
        assert any(f"needs key: set ${VAR}" in d for d in st["drift"]), st["drift"]
        r = sim.sparkctl(*base, "bench", PROFILE, "--suite", "decode", "--repeats", "2", "--decode-tokens", "8",
                         "--out", str(tmp_path / "bench-nokey"), "--force", timeout=300)
        assert r.returncode != 0 and f"needs key: set ${VAR}" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
    finally:
        sim.env[VAR] = KEY
        r = sim.sparkctl(*base, "down", timeout=300)
        said += r.stdout + r.stderr
        sim.env.pop(VAR, None)
    assert KEY not in said
    assert KEY not in sim.ssh("spark-a", "ps -eo args").stdout


def sim_inventory_hosts(sim) -> list[tuple[str, str]]:
    import yaml

    doc = yaml.safe_load(Path(sim.inventory).read_text())
    return [(n["name"], n["host"]) for n in doc["nodes"]]
