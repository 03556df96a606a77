"""E2E on the SIMULATED ring: the exporters, a real Prometheus, the head's status page in a real browser.

`fabric apply` installs every node's exporter (sparkctl's zip + the pinned prometheus_client
wheel, a unit bound to the management address); Debian's `prometheus` scrapes the ring with
the configuration `sparkctl metrics config` prints; PromQL answers what `status --json`
says; `sim fault` (a port down, an engine killed) shows within two scrapes; `promtool check
metrics` accepts every exporter's output; Debian's chromium, driven by Playwright, opens the
head's status page: no console error, no request leaving the machine, the numbers of
`status --json`. `fabric restore` removes the exporters.

SIMULATED: the GB10 tools are the simulator's shims; Prometheus, promtool, chromium, systemd's
unit file (judged by systemd-analyze in tests/test_exporter.py) and the HTTP are real.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.helpers import Sim, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "ds41f-tp4-ring"
WAIVE = ("--waive", "page_size", "--reason", "stock 4 KiB kernel")
NODES = ("spark-a", "spark-b", "spark-c", "spark-d")
SCRAPE_S = 10  # a simulated node's probe runs a dozen Python shims: seconds on a shared 2-core box
EXPORTER_PORT, PAGE_PORT = 9478, 9479
CHROMIUM = "/usr/bin/chromium"
GIB = 1024 ** 3


def _get(url: str, timeout: float = 5.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.read()


class Prom:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, q: str) -> list[dict[str, Any]]:
        d = json.loads(_get(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
        assert d["status"] == "success", d
        return d["data"]["result"]

    def by_node(self, q: str) -> dict[str, float]:
        return {r["metric"].get("node", ""): float(r["value"][1]) for r in self.query(q)}

    def targets(self) -> list[dict[str, Any]]:
        return json.loads(_get(f"{self.base}/api/v1/targets"))["data"]["activeTargets"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ring(sim_ring: Sim) -> Sim:
    sim, inv = sim_ring, str(sim_ring.inventory)
    sim.sparkctl("-i", inv, "fabric", "apply", check=True, timeout=300)
    sim.sparkctl("-i", inv, "up", PROFILE, *WAIVE, check=True, timeout=300)
    return sim


@pytest.fixture(scope="module")
def prom(ring: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    if not shutil.which("prometheus"):
        pytest.fail("Debian's prometheus is not installed (Makefile APT_PACKAGES)")
    tmp = tmp_path_factory.mktemp("prometheus")
    r = ring.sparkctl("-i", str(ring.inventory), "metrics", "config", PROFILE, "--interval-s", str(SCRAPE_S), check=True)
    cfg = tmp / "prometheus.yml"
    cfg.write_text(r.stdout)
    check = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = _free_port()
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    p = Prom(port)
    try:
        assert wait_until(lambda: _ready(p), deadline_s=60), (tmp / "prometheus.log").read_text()[-2000:]
        yield p
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ready(p: Prom) -> bool:
    try:
        _get(f"{p.base}/-/ready")
        return True
    except OSError:
        return False


def _status(sim: Sim) -> dict[str, Any]:
    r = sim.sparkctl("-i", str(sim.inventory), "status", "--json", check=True)
    return json.loads(r.stdout)


def _host(sim: Sim, node: str) -> str:
    import yaml

    inv = yaml.safe_load(sim.inventory.read_text())
    return next(n["host"] for n in inv["nodes"] if n["name"] == node)


def test_simulated_ring_prometheus_scrapes_every_exporter_and_agrees_with_status(ring: Sim, prom: Prom) -> None:
    def all_up() -> bool:
        ts = [t for t in prom.targets() if t["labels"].get("job") == "sparkctl-exporter"]
        return len(ts) == 4 and all(t["health"] == "up" for t in ts)

    def engine_scraped() -> bool:  # a target Prometheus has not scraped yet says "unknown"
        eng = [t for t in prom.targets() if t["labels"].get("job") == "sparkctl-engine"]
        return bool(eng) and all(t["health"] != "unknown" for t in eng)

    assert wait_until(all_up, deadline_s=60), prom.targets()
    assert wait_until(engine_scraped, deadline_s=60), prom.targets()
    eng = [t for t in prom.targets() if t["labels"].get("job") == "sparkctl-engine"]
    assert all(t["health"] == "up" for t in eng), eng  # ds41f serves /metrics on the head
    assert prom.by_node("up") == {n: 1.0 for n in NODES} | ({"spark-a": 1.0})

    def agrees() -> tuple[bool, str]:
        st = _status(ring)
        rows = {r["node"]: r for r in st["nodes"]}
        mem = prom.by_node("sparkctl_memory_available_bytes")
        lock = prom.by_node("sparkctl_clock_lock_hertz")
        eo = prom.by_node("sparkctl_earlyoom_active")
        alive = prom.by_node("sparkctl_engine_alive")
        up = prom.by_node('up{job="sparkctl-exporter"}')
        bad = [f"{n} not up" for n in NODES if up.get(n) != 1.0]  # a scrape that timed out leaves stale series
        for n in NODES:
            r = rows[n]
            if abs(round(mem.get(n, -1) / GIB, 1) - r["mem_available_gib"]) > 0.11:
                bad.append(f"{n} mem {mem.get(n)} vs {r['mem_available_gib']}")
            want_lock = r["clock_lock"] * 1e6 if r["clock_lock"] is not None else None
            if lock.get(n) != want_lock:
                bad.append(f"{n} lock {lock.get(n)} vs {want_lock}")
            if eo.get(n) != (1.0 if r["watchdog"] == "active" else 0.0):
                bad.append(f"{n} earlyoom {eo.get(n)} vs {r['watchdog']}")
            if alive.get(n) != (1.0 if r["alive"] else 0.0):
                bad.append(f"{n} alive {alive.get(n)} vs {r['alive']}")
        state = {r["metric"]["state"] for r in prom.query("sparkctl_record_state == 1")}
        if state != {st["record"]["state"]}:
            bad.append(f"state {state} vs {st['record']['state']}")
        return not bad, "; ".join(bad)

    assert wait_until(lambda: agrees()[0], deadline_s=60), agrees()[1]
    # every cabled port up, at MTU 9000, with its own RoCE v2 GID (the fabric law's facts)
    ports = prom.query("sparkctl_fabric_link_up")
    assert len(ports) == 16 and all(p["value"][1] == "1" for p in ports), ports
    assert {p["value"][1] for p in prom.query("sparkctl_fabric_mtu_bytes")} == {"9000"}
    assert all(p["value"][1] == "1" for p in prom.query("sparkctl_fabric_rocev2_gid_present"))
    # the head's own state: the record and the laws' last verdicts (up's check step kept them)
    assert prom.query(f'sparkctl_record_info{{profile="{PROFILE}"}}')
    assert prom.query('sparkctl_law_verdict{law="memory_watchdog",status="ok"} == 1')
    # GB10 reports no memory through nvidia-smi: nothing here is NaN, and nothing is a made-up 0
    every = prom.query('{__name__=~"sparkctl_.+"}')
    assert len(every) > 100 and not [s for s in every if s["value"][1].lower() == "nan"]


def test_simulated_ring_promtool_accepts_every_exporter_and_no_nan(ring: Sim) -> None:
    for n in NODES:
        text = _get(f"http://{_host(ring, n)}:{EXPORTER_PORT}/metrics", timeout=15).decode()
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, (n, r.stdout, r.stderr)
        values = [ln.rsplit(None, 1)[-1] for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert values and not [v for v in values if math.isnan(float(v))], n
        assert "sparkctl_gpu_power_watts" in text and "sparkctl_memory_page_cache_bytes" in text


def test_simulated_ring_status_page_in_a_real_browser(ring: Sim, tmp_path: Path) -> None:
    pw = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed (Makefile APT_PACKAGES)")
    head = _host(ring, "spark-a")
    url = f"http://{head}:{PAGE_PORT}/"
    st = _status(ring)
    # the page samples every 5 s: wait until it has the same rows status shows now
    want = {r["node"]: r for r in st["nodes"]}

    def page_doc() -> dict[str, Any]:
        return json.loads(_get(url + "status.json"))

    assert wait_until(lambda: {r["node"]: r.get("alive") for r in page_doc().get("nodes", [])}
                      == {n: r["alive"] for n, r in want.items()}, deadline_s=60), page_doc()
    requests: list[str] = []
    errors: list[str] = []
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="load")
            page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
            text = page.inner_text("body")
            cells = {(c.get_attribute("data-node"), c.get_attribute("data-field")): c.inner_text()
                     for c in page.query_selector_all("#nodes td[data-field]")}
            record = {c.get_attribute("data-field"): c.inner_text() for c in page.query_selector_all("#record td")}
        finally:
            browser.close()
    assert not errors, errors
    assert requests and all(urllib.parse.urlsplit(u).hostname == head for u in requests), requests
    assert (tmp_path / "status-page.png").stat().st_size > 1000
    assert "nodes and ranks" in text and "laws" in text and "memory_watchdog" in text
    assert record["profile"] == st["record"]["profile"] and record["state"] == st["record"]["state"]
    doc = page_doc()
    for n, r in want.items():
        for field in ("rank", "alive", "sm_mhz", "clock_lock", "watchdog", "mem_available_gib", "power_w"):
            shown = cells[(n, field)]
            exp = r.get(field)
            exp_text = "n/a" if exp is None else ("yes" if exp is True else "no" if exp is False else str(exp))
            if field == "mem_available_gib" and exp is not None:
                assert abs(float(shown) - float(exp)) <= 0.11, (n, field, shown, exp)
            elif field in ("power_w", "sm_mhz") and exp is not None:  # readings of their moment: they move
                assert abs(float(shown) - float(exp)) <= 0.5 * float(exp) + 2, (n, field, shown, exp)
            else:
                assert shown == exp_text, (n, field, shown, exp_text, doc)


def _within_two_scrapes(pred: Any) -> bool:
    return wait_until(pred, deadline_s=2 * SCRAPE_S + 3, every_s=0.25)


def test_simulated_ring_faults_show_in_prometheus_within_two_scrapes(ring: Sim, prom: Prom) -> None:
    # the engine alone is SIGKILLed (as earlyoom or the kernel would) first, while the stack surely runs: a
    # link held down for longer than the simulated ranks' heartbeat timeout (10 s, on a loaded CI box the
    # two scrapes below can take that long) loses the ring its peers, as a real communicator would
    # (`sim fault kill-engine` kills every process of the node but sshd, the exporter with it)
    from sparkctl.model.engines import ENGINE_REGEX

    r = ring.ssh("spark-c", f"ps -eo pid,args | grep -E {shlex.quote(ENGINE_REGEX)} | grep -v grep")
    pids = [ln.split()[0] for ln in r.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert pids, r.stdout + r.stderr
    ring.ssh("spark-c", "kill -9 " + " ".join(pids))
    # a sample of 0 scraped in the last two intervals (a scrape that timed out on the loaded box leaves
    # a stale marker, which min_over_time skips)
    assert prom.by_node('up{job="sparkctl-exporter"}').get("spark-c") == 1.0  # its exporter lives on
    dead = f'min_over_time(sparkctl_engine_alive{{node="spark-c"}}[{2 * SCRAPE_S}s])'
    assert _within_two_scrapes(lambda: prom.by_node(dead).get("spark-c") == 0.0), prom.by_node(dead)
    # (the ring's other ranks die with it, as a real TP4 communicator does: not asserted here)
    # the head sees the drift (rank not running) too
    assert wait_until(lambda: prom.by_node("sparkctl_drift_lines").get("spark-a", 0) >= 1, deadline_s=20)

    # a fabric port goes down: that port's gauge only, within two scrapes, and back
    q_port = 'sparkctl_fabric_link_up{node="spark-b",netdev="enp1s0f0np0"}'
    assert prom.query(q_port)[0]["value"][1] == "1"
    ring.sparkctl("sim", "fault", "spark-b", "link-down", "--iface", "enp1s0f0np0", check=True)
    try:
        t0 = time.monotonic()
        assert _within_two_scrapes(lambda: prom.query(q_port)[0]["value"][1] == "0"), prom.query(q_port)
        print(f"link down seen after {time.monotonic() - t0:.1f} s")
        other = prom.by_node('sparkctl_fabric_link_up{netdev="enP2p1s0f0np0"}')
        assert other["spark-b"] == 1.0  # only that port
    finally:
        ring.sparkctl("sim", "fault", "spark-b", "link-up", "--iface", "enp1s0f0np0", check=True)
    assert _within_two_scrapes(lambda: prom.query(q_port)[0]["value"][1] == "1")


def test_simulated_ring_fabric_restore_removes_the_exporters(ring: Sim) -> None:
    ring.sparkctl("-i", str(ring.inventory), "down", check=True, timeout=180)
    ring.sparkctl("-i", str(ring.inventory), "fabric", "restore", check=True, timeout=300)
    for n in NODES:
        r = ring.ssh(n, "systemctl is-active sparkctl-exporter.service; ls /opt/sparkctl/exporter 2>&1; "
                        "ls /etc/systemd/system/sparkctl-exporter.service 2>&1")
        assert "No such file" in r.stdout and not r.stdout.startswith("active"), (n, r.stdout)
    with pytest.raises(OSError):
        _get(f"http://{_host(ring, 'spark-b')}:{EXPORTER_PORT}/metrics", timeout=3)
