"""The node exporter without a cluster: its metrics from captured facts, judged by promtool; its
import closure (no pydantic, PyYAML, jinja2 on a node); its zip; its unit, judged by
systemd-analyze; the scrape configuration, judged by promtool; the status page's key rule."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from sparkctl.facts.nodefacts import GpuFacts, LinkFacts, NodeFacts
from sparkctl.facts.watchdog import WatchdogFacts
from sparkctl.model.inventory import load_inventory
from sparkctl.model.resources import Roots
from sparkctl.model.wheels import PROMETHEUS_CLIENT
from sparkctl.node.metrics import head_families, node_families
from sparkctl.plan import exporterplan

REPO = Path(__file__).resolve().parent.parent


def _facts(**kw: object) -> NodeFacts:
    gpu = GpuFacts(name="NVIDIA GB10", compute_cap="12.1", driver="580.95.05", sm_mhz=2405, max_sm_mhz=3003,
                   clock_lock_max_mhz=None, event_reasons=("sw_power_cap",), power_w=None, temp_c=41)
    links = {"enp1s0f0np0": LinkFacts("enp1s0f0np0", "rocep1s0f0", "up", 9000, "10.20.0.1/24", 200000, True, 3),
             "enP2p1s0f0np0": LinkFacts("enP2p1s0f0np0", "roceP2p1s0f0", "down", 9000, None, None, False, None)}
    base = dict(node="spark-a", boot_id="b1", mem_total_kib=127600816, mem_available_kib=40174336,
                mem_free_kib=3139656, mem_cached_kib=37694160, gpu=gpu, links=links, engines=[],
                watchdog=WatchdogFacts(True, "enabled", "active", ("-m", "5")), clock_lock_record=("b1", 2400))
    base.update(kw)
    return NodeFacts(**base)  # type: ignore[arg-type]


class _C:
    def __init__(self, fams: list) -> None:  # type: ignore[type-arg]
        self.fams = fams

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.fams)


def _text(facts: NodeFacts, head: bool = False) -> str:
    reg = CollectorRegistry(auto_describe=False)
    fams = list(node_families(facts, 2, 0.0123))
    if head:
        rec = {"profile": "p", "engine": "vllm", "served_name": "m", "state": "serving",
               "nodes": {"spark-a": {"rank": 0, "replica": 0}, "spark-b": {"rank": 1, "replica": 0}}}
        laws = {"verdicts": [{"law": "kernel_pin", "node": "spark-a", "status": "ok"},
                             {"law": "fabric_mtu", "node": "spark-a", "subject": "enp1s0f0np0", "status": "fail"}]}
        fams += list(head_families(rec, laws, 1.7e9, ["spark-b: rank 1 is not running"]))
    reg.register(_C(fams))
    return generate_latest(reg).decode()


def test_metrics_from_facts_values_and_absences() -> None:
    text = _text(_facts())
    assert "sparkctl_memory_available_bytes 4.1138520064e+10" in text
    assert "sparkctl_memory_page_cache_bytes" in text
    assert "sparkctl_clock_lock_hertz 2.4e+09" in text
    assert 'sparkctl_gpu_clock_event_reason{reason="sw_power_cap"} 1.0' in text
    assert 'sparkctl_gpu_clock_event_reason{reason="gpu_idle"} 0.0' in text
    assert 'sparkctl_fabric_link_up{netdev="enP2p1s0f0np0",rdma="roceP2p1s0f0"} 0.0' in text
    assert 'sparkctl_fabric_rocev2_gid_index{netdev="enp1s0f0np0",rdma="rocep1s0f0"} 3.0' in text
    assert "sparkctl_earlyoom_kills_total 2.0" in text and "sparkctl_engine_alive 0.0" in text
    # N/A on GB10 (power here; memory in nvidia-smi always): absent, never NaN or 0
    assert "sparkctl_gpu_power_watts" not in text
    assert 'sparkctl_fabric_speed_bytes_per_second{netdev="enP2p1s0f0np0"' not in text
    assert not [ln for ln in text.splitlines() if ln and not ln.startswith("#") and math.isnan(float(ln.split()[-1]))]


def test_a_clock_lock_of_another_boot_is_absent() -> None:
    assert "sparkctl_clock_lock_hertz" not in _text(_facts(clock_lock_record=("old-boot", 2400)))


@pytest.mark.parametrize("head", [False, True])
def test_promtool_check_metrics_accepts_the_output(head: bool) -> None:
    if not shutil.which("promtool"):
        pytest.fail("promtool missing: Debian's prometheus (Makefile APT_PACKAGES)")
    r = subprocess.run(["promtool", "check", "metrics"], input=_text(_facts(), head), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_check_metrics_can_fail() -> None:  # the negative control
    r = subprocess.run(["promtool", "check", "metrics"], input="# TYPE x_total counter\nx_total{a=\"1\"} 1\n"
                       "x_total{a=\"1\"} 2\nbad name 1\n", capture_output=True, text=True)
    assert r.returncode != 0


def test_the_exporter_imports_from_its_zip_and_the_wheel_alone(tmp_path: Path) -> None:
    """What a node has: python3 without any site package (-S), sparkctl's zip, the pinned wheel."""
    from sparkctl.ops.wheelhouse import default_cache, fetch_wheel

    z = tmp_path / "sparkctl.zip"
    z.write_bytes(exporterplan.bundle())
    wheel = fetch_wheel(PROMETHEUS_CLIENT, default_cache())
    code = ("import sys, sparkctl, prometheus_client, sparkctl.node.exporter, sparkctl.node.statuspage, "
            "sparkctl.node.pageserve; assert sparkctl.__file__.startswith(sys.argv[1]), sparkctl.__file__; "
            "assert prometheus_client.__file__.startswith(sys.argv[2]); print('ok')")
    env = {"PYTHONPATH": f"{z}:{wheel}"}
    r = subprocess.run([sys.executable, "-S", "-c", code, str(z), str(wheel)], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert r.stdout.strip() == "ok", r.stderr
    # the control: what needs pydantic cannot be imported there
    r = subprocess.run([sys.executable, "-S", "-c", "import sparkctl.model.inventory"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert "No module named 'pydantic'" in r.stderr, r.stderr


def test_the_zip_is_reproducible_and_holds_only_code() -> None:
    a, b = exporterplan.bundle(), exporterplan.bundle()
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    names = zipfile.ZipFile(io.BytesIO(a)).namelist()
    assert "sparkctl/facts/batch.py" in names and "sparkctl/node/exporter.py" in names
    assert not [n for n in names if n.startswith(("sparkctl/ops/", "sparkctl/cli/", "sparkctl/transport/"))]


def test_the_pinned_wheel_is_verified(tmp_path: Path) -> None:
    from sparkctl.errors import ConfigError
    from sparkctl.model.wheels import PinnedWheel
    from sparkctl.ops import wheelhouse

    bad = PinnedWheel(PROMETHEUS_CLIENT.name, PROMETHEUS_CLIENT.version, PROMETHEUS_CLIENT.filename, "0" * 64)
    (tmp_path / bad.filename).write_bytes(b"not the wheel")
    with pytest.raises(ConfigError):
        wheelhouse.fetch_wheel(bad, tmp_path)  # the cached file is not it, and pip's is not "0"*64 either


def _files(node: str = "spark-a") -> dict[str, exporterplan.ExporterFile]:
    inv = load_inventory(REPO / "inventory.yaml")
    from sparkctl.ops.fabric import exporters_of

    files = exporters_of(inv, Roots.make(env={}))
    return {Path(f.path).name: f for f in files.files[node]}


def test_the_config_binds_the_management_address_and_only_the_head_serves_the_page() -> None:
    a, b = (json.loads(_files(n)["exporter.json"].data or b"") for n in ("spark-a", "spark-b"))
    assert a["listen"] == "192.168.1.101" and a["port"] == exporterplan.EXPORTER_PORT
    assert a["head"]["peers"]["spark-b"] == "192.168.1.102:9478" and b["head"] is None
    assert "sec meminfo;" in a["script"] and "sec watchdog.kills;" in a["script"]


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    from tests.test_real_tools import _verify

    base = tmp_path / "base"
    shutil.copytree("/usr/lib/systemd/system", base / "usr/lib/systemd/system", symlinks=True)
    unit = _files()["sparkctl-exporter.service"]
    r = _verify(base, [("sparkctl-exporter.service", (unit.data or b"").decode())], tmp_path)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), r.stdout + r.stderr


def test_the_scrape_configuration_passes_promtool(tmp_path: Path) -> None:
    from sparkctl.model.profiles import resolve
    from sparkctl.plan.render import render

    inv = load_inventory(REPO / "inventory.yaml")
    roots = Roots.make(env={})
    res = resolve("ds41f-tp4-ring", roots)
    text = exporterplan.scrape_config(inv, exporterplan.engine_targets(res, inv, render(res, inv, roots, {})))
    (tmp_path / "p.yml").write_text(text)
    r = subprocess.run(["promtool", "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "192.168.1.104:9478" in text and "192.168.1.101:8000" in text


def test_the_page_wants_the_endpoint_key_when_the_record_names_one(tmp_path: Path) -> None:
    from sparkctl.node.statuspage import Head

    (tmp_path / "record.json").write_text(json.dumps({"api_key_env": "SPARK_KEY", "listen": {}}))
    (tmp_path / "engine.env").write_text("SPARKCTL_API_KEY='s3cr3t'\n")
    exp = type("E", (), {"node": "spark-a", "config": {"listen": "127.0.0.1"}})()
    h = Head(exp, {"record": str(tmp_path / "record.json"), "laws": str(tmp_path / "laws.json"),
                   "env_file": str(tmp_path / "engine.env"), "key_var": "SPARKCTL_API_KEY", "page_port": 0})
    assert h.authorized("Bearer s3cr3t")
    assert h.authorized("Basic " + base64.b64encode(b"any:s3cr3t").decode())
    assert not h.authorized(None) and not h.authorized("Bearer nope")
    (tmp_path / "record.json").write_text(json.dumps({"listen": {"spark-a": "10.20.0.1"}}))
    assert h.authorized(None) and h.page_address() == "10.20.0.1"  # no key named: open, where the engine listens


def _sudo_head_inventory() -> Any:
    from sparkctl.model.inventory import loads_inventory

    return loads_inventory("nodes:\n  - {name: spark-a, host: 192.168.1.100, sudo: true}\n"
                           "  - {name: spark-b, host: 192.168.1.101, sudo: false}\n"
                           "cables:\n  - [spark-a:p0, spark-b:p0]\n")


@pytest.mark.parametrize("listed", [True, False])
def test_the_check_step_writes_the_verdicts_only_where_it_lists_them(listed: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The laws' verdicts are a write of the check step (``params["verdicts"]``: the head, its path, the
    inventory's sudo for it, not the probes'): ``calls`` lists it, the step writes exactly that; a check
    step that lists none writes nothing (the negative control)."""
    from sparkctl.ops import check, executor
    from sparkctl.plan import planner
    from sparkctl.plan.laws.base import Verdict
    from sparkctl.plan.steps import Plan, Step, calls, describe
    from tests.fakenodes import fake_for

    inv = _sudo_head_inventory()
    verdict = Verdict("kernel_pin", "spark-b", "ok", "6.11", "6.11")
    monkeypatch.setattr(executor, "run_check", lambda res, *_a, **_k: check.CheckReport(res.name, ("spark-b",),
                                                                                          (verdict,), {}))
    params: dict[str, Any] = {"profile": "tiny-llamacpp", "ignore": []}
    if listed:
        params["verdicts"] = planner.verdicts_target(inv)
    step = Step("check", "check", "check", ("spark-b",), "judge the laws", params=params)
    promised = [(c.node, c.kind, c.text, c.sudo) for c in calls(step) if c.kind == "put"]
    t = fake_for(inv)
    executor.check_step(inv, t, Roots.make(None, None), lambda *_: None)(step.to_dict())
    writes = [(c.node, "put", c.command[4:], c.sudo) for c in t.calls if c.command.startswith("put ")]
    assert writes == promised
    if listed:
        assert writes == [("spark-a", "put", "/var/lib/sparkctl/laws.json", True)]
        body = json.loads(next(c.stdin for c in t.calls if c.command.startswith("put ")) or b"{}")
        assert body["profile"] == "tiny-llamacpp" and body["verdicts"][0]["law"] == "kernel_pin"
        text = "\n".join(describe(Plan("up", "tiny-llamacpp", (step,))))
        assert "spark-a# write /var/lib/sparkctl/laws.json" in text
    else:
        assert writes == []


def test_the_exporter_push_carries_the_inventorys_sudo() -> None:
    inv = _sudo_head_inventory()
    files = exporterplan.render_exporters(inv, Roots.make(None, None), {n.name: "true" for n in inv.nodes})
    push = next(s for s in exporterplan.exporter_steps(inv, files) if s.kind == "put")
    assert dict(push.sudo) == {"spark-a": True, "spark-b": False}
