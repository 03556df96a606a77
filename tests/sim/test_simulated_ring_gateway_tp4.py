"""End-to-end on the SIMULATED ring: a TP4 switch behind the REAL gateway (smg 1.13.0).

One replica spans the four nodes, so no replica can stay up while the switch replaces it: the plan
states the outage, and during it the gateway answers 503 with Retry-After for the served name
(`gateway-hold` .. `gateway-release`), never 404 and never a refused connection; after it the new
stack serves through the same endpoint. The stacks are the bundled ds41f and TensorFold TP4 profiles
with the gateway enabled and one served name (the new one takes the old one's, as an operator's
clients expect), under the open-loop streamed load of the rolling-switch test (tests/sim/helpers.py
``Load``).

Simulated: the GB10 tools, systemd, the ds41f and TensorFold engines (real processes that meet over
the fabric and stream SSE). Real: smg, OpenSSH, HTTP.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from sparkctl.model.inventory import load_inventory
from tests.sim.helpers import GW_PORT, WAIVE, Load, Sim, make_sim, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

NAME = "deepseek-v4.1-flash"
PROFILES = {
    "gw-ds41f-tp4": "extends: ds41f-tp4-ring\nserve:\n  gateway:\n    enabled: true\n",
    "gw-tensorfold-tp4": ("extends: tensorfold-tp4-ring\nmodel:\n  served_name: " + NAME
                          + "\nserve:\n  gateway:\n    enabled: true\n"),
}


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory, host_lock: None) -> Iterator[Sim]:
    for sim in make_sim(tmp_path_factory.mktemp("gwtp4"), 4):
        d = sim.inventory.parent / "profiles"
        d.mkdir(exist_ok=True)
        for name, text in PROFILES.items():
            (d / f"{name}.yaml").write_text(text)
        yield sim


def test_simulated_tp4_switch_behind_the_gateway_answers_503_with_retry_after_then_serves_the_new_stack(
        ring: Sim) -> None:
    inv = str(ring.inventory)
    gw = f"http://{load_inventory(ring.inventory).node('spark-a').host}:{GW_PORT}"
    r = ring.sparkctl("-i", inv, "up", "gw-ds41f-tp4", *WAIVE, "--json", timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert wait_until(lambda: NAME in [m["id"] for m in httpx.get(f"{gw}/v1/models", timeout=5).json()["data"]], 30)

    r = ring.sparkctl("-i", inv, "plan", "switch", "gw-tensorfold-tp4", *WAIVE, "--json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    assert "503 with Retry-After" in plan["outage"], plan["outage"]
    ids = [s["id"] for s in plan["steps"]]
    assert ids.index("gateway-hold") < ids.index("stop-stale") < ids.index("gateway-register") \
        < ids.index("gateway-release"), ids

    with Load(gw, period=0.2, max_tokens=16, model=NAME) as load:
        time.sleep(2)
        r = ring.sparkctl("-i", inv, "switch", "gw-tensorfold-tp4", *WAIVE, "--json", timeout=600)
        time.sleep(3)
    print(f"TP4 switch behind the gateway: {load.summary()}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = json.loads(ring.ssh("spark-a", "cat /var/lib/sparkctl/record.json").stdout)
    assert (rec["profile"], rec["state"]) == ("gw-tensorfold-tp4", "serving"), rec
    sent = sorted(load.results, key=lambda x: x["t"])  # in the order sent
    statuses = [x["status"] for x in sent]
    # never a refused connection (None) or a 404; every 503 says when to come back
    assert not [x for x in load.results if x["status"] in (None, 404)], \
        [x for x in load.results if x["status"] in (None, 404)][:5]
    assert [x for x in load.results if x["status"] == 503 and x["retry_after"]], statuses
    assert all(x["retry_after"] for x in load.results if x["status"] == 503)
    # every 200 ended whole: the old stack's streams before the hold, the new one's after the release
    assert all(load.whole(x) for x in load.results if x["status"] == 200), \
        [x for x in load.results if x["status"] == 200 and not load.whole(x)][:5]
    first_503 = statuses.index(503)
    last_503 = len(statuses) - 1 - statuses[::-1].index(503)
    assert 200 in statuses[:first_503] and 200 in statuses[last_503:], statuses
    assert load.whole(sent[-1]), sent[-3:]
    # the new stack serves through the same endpoint: TensorFold's engine is what runs on the head now
    assert int(ring.ssh("spark-a", "ps -eo args | grep -c '[t]ensorfold serve' || true").stdout.strip() or 0) > 0
