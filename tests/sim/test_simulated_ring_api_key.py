"""E2E on the SIMULATED ring: serve.api_key_env. Readiness passes with the key; without it /v1 is refused 401."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

KEY = "sk-sim-4f1c2a"


def test_the_endpoint_requires_the_key_and_up_sends_it(sim_ring) -> None:
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.env["SIM_ENDPOINT_KEY"] = KEY
    r = sim.sparkctl("-i", inv, "up", "ds41f-tp4-ring", "--set", "serve.api_key_env=SIM_ENDPOINT_KEY",
                     "--waive", "page_size", "--reason", "x", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # readiness sent the key
    assert KEY not in r.stdout + r.stderr
    bare = sim.ssh("spark-a", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models").stdout
    assert bare == "401"
    body = sim.ssh("spark-a", "curl -s http://127.0.0.1:8000/v1/models").stdout
    assert '"error": "Unauthorized"' in body or '"error":"Unauthorized"' in body
    ok = sim.ssh("spark-a", f"curl -s -H 'Authorization: Bearer {KEY}' http://127.0.0.1:8000/v1/models").stdout
    assert "deepseek-v4.1-flash" in ok
    assert sim.ssh("spark-a", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health").stdout == "200"
    ps = sim.ssh("spark-a", "ps -eo args").stdout
    assert "$SPARKCTL_API_KEY" not in ps
    sim.sparkctl("-i", inv, "down", check=True, timeout=300)
