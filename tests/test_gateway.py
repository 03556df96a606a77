"""serve.gateway without a cluster: pinned wheels, the refusals, the rendered files, the node-side ctl.

The ctl (sparkctl/remote/gateway_ctl.py) is driven against a stand-in of smg's worker API and of an
engine's gauges, in-process on loopback; the real smg and the real engine are the e2e module's
(tests/sim/test_simulated_ring_gateway.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparkctl.errors import ConfigError, ProfileError, RenderError, SparkctlError
from sparkctl.model import wheels
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops import wheelhouse
from sparkctl.plan import gatewayplan
from sparkctl.remote import gateway_ctl

REPO = Path(__file__).resolve().parent.parent
SPARK = wheels.NodePlatform("aarch64", "3.12", "cpython", "2.39")
GW = ("serve.gateway.enabled=true",)


def _res(*sets: str) -> Any:
    return resolve("tiny-llamacpp", Roots.make(env={}), (*GW, *sets))


def _inv() -> Any:
    return load_inventory(REPO / "inventory.yaml")


# --------------------------------------------------------------------------- wheels and refusals


def test_platform_is_read_from_the_interpreter_and_picks_one_wheel_per_package() -> None:
    text = "machine=aarch64\npython=3.12\nimpl=cpython\nglibc=2.39\n"
    assert wheels.parse_platform(text) == SPARK
    assert wheels.parse_platform("sh: python3: not found\n") is None
    setup = gatewayplan.render_gateway(_res(), _inv(), Roots.make(env={}), {}, SPARK)
    assert [(w.name, w.machine, w.abi) for w in setup.wheels] == [("smg", "aarch64", "abi3"),
                                                                  ("setproctitle", "aarch64", "cp312")]
    x86 = gatewayplan.render_gateway(_res(), _inv(), Roots.make(env={}), {},
                                     wheels.NodePlatform("x86_64", "3.11", "cpython", "2.36"))
    assert [w.filename.split("-")[2] for w in x86.wheels] == ["cp38", "cp311"]


@pytest.mark.parametrize(("plat", "why"), [
    (wheels.NodePlatform("aarch64", "3.10", "cpython", "2.39"), "no pinned setproctitle wheel"),
    (wheels.NodePlatform("riscv64", "3.12", "cpython", "2.39"), "no pinned smg wheel"),
    (wheels.NodePlatform("aarch64", "3.12", "cpython", "2.17"), "no pinned smg wheel"),  # manylinux_2_28
    (wheels.NodePlatform("aarch64", "3.12", "cpython", ""), "no pinned smg wheel"),  # musl
])
def test_a_node_whose_interpreter_no_pin_fits_is_refused_in_one_line(plat: wheels.NodePlatform, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        gatewayplan.render_gateway(_res(), _inv(), Roots.make(env={}), {}, plat)
    assert why in e.value.message and "spark-a" in e.value.message and "\n" not in e.value.message


def test_a_node_short_of_disk_is_refused_unless_the_gateway_is_there_already() -> None:
    setup = gatewayplan.render_gateway(_res(), _inv(), Roots.make(env={}), {}, SPARK)
    short = gatewayplan.GatewayFacts(SPARK, 50 * 1024, {}, {}, False)
    why = gatewayplan.refusal(setup, short)
    assert why and why.startswith("the gateway cannot be installed on spark-a: 50 MiB free")
    installed = gatewayplan.GatewayFacts(SPARK, 50 * 1024, {setup.site: setup.marker.replace("\n", " ").strip()},
                                         {}, True)
    assert gatewayplan.refusal(setup, installed) is None
    assert gatewayplan.refusal(setup, gatewayplan.GatewayFacts(SPARK, 10 * 1024 * 1024, {}, {}, False)) is None


def test_facts_parse_what_the_node_printed() -> None:
    text = ("machine=aarch64\npython=3.12\nimpl=cpython\nglibc=2.39\nfree_kib=1234567\n"
            "installed=/opt/sparkctl/gateway/smg-1.13.0-aarch64-py3.12|abc  smg.whl def  s.whl \n"
            "active=active\nfile=0123  /etc/sparkctl/gateway.json\n")
    f = gatewayplan.parse_facts(text)
    assert (f.platform, f.free_kib, f.active) == (SPARK, 1234567, True)
    assert f.installed == {"/opt/sparkctl/gateway/smg-1.13.0-aarch64-py3.12": "abc  smg.whl def  s.whl"}
    assert f.files == {"/etc/sparkctl/gateway.json": "0123"}


def test_fetch_keeps_only_the_pinned_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import subprocess

    good = b"the pinned bytes"
    pin = wheels.PinnedWheel("demo", "1.0", "demo-1.0-py3-none-any.whl", hashlib.sha256(good).hexdigest(), 16,
                             "x86_64", "any", "none")
    served = {"bytes": b"other bytes"}

    def fake_pip(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv[argv.index("--platform") + 1] == "any" and "--no-deps" in argv and argv[-1] == "demo==1.0"
        dest = Path(argv[argv.index("-d") + 1])
        (dest / pin.filename).write_bytes(served["bytes"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_pip)
    with pytest.raises(ConfigError) as e:
        wheelhouse.fetch_wheel(pin, tmp_path)
    assert "is not the pinned" in e.value.message and not (tmp_path / pin.filename).exists()
    served["bytes"] = good
    assert wheelhouse.fetch_wheel(pin, tmp_path).read_bytes() == good
    monkeypatch.setattr(wheelhouse.subprocess, "run", None)  # cached: pip is not asked again
    assert wheelhouse.fetch_wheel(pin, tmp_path) == tmp_path / pin.filename


# --------------------------------------------------------------------------- keys and rendering


def test_a_gateway_key_without_its_variable_is_one_clear_error() -> None:
    res = _res("serve.api_key_env=GW_TEST_KEY")
    with pytest.raises(RenderError) as e:
        gatewayplan.render_gateway(res, _inv(), Roots.make(env={}), {}, SPARK)
    assert "GW_TEST_KEY" in e.value.message and "gateway" in e.value.message
    assert e.value.ref and e.value.ref.key == "serve.api_key_env"


def test_the_key_reaches_only_the_0600_env_file_and_is_masked_unless_revealed() -> None:
    res = _res("serve.api_key_env=GW_TEST_KEY")
    setup = gatewayplan.render_gateway(res, _inv(), Roots.make(env={}), {"GW_TEST_KEY": "s3cret"}, SPARK)
    env = next(f for f in setup.files.values() if f.path.endswith("gateway.env"))
    launch = next(f for f in setup.files.values() if f.path.endswith("gateway-launch.sh"))
    assert env.mode == 0o600 and "SPARKCTL_API_KEY='***'" in env.text
    assert '--api-key "$SPARKCTL_API_KEY"' in launch.text
    assert all("s3cret" not in f.text for f in setup.files.values())
    shown = gatewayplan.render_gateway(res, _inv(), Roots.make(env={}), {"GW_TEST_KEY": "s3cret"}, SPARK,
                                       reveal_secrets=True)
    assert "SPARKCTL_API_KEY=s3cret" in next(f for f in shown.files.values() if f.path.endswith("gateway.env")).text


def test_the_gateway_is_bound_like_the_engines() -> None:
    for bind, host in (("all", "0.0.0.0"), ("management", "192.168.1.101"), ("fabric", "10.20.")):
        setup = gatewayplan.render_gateway(_res(f"serve.bind={bind}"), _inv(), Roots.make(env={}), {}, SPARK)
        launch = next(f for f in setup.files.values() if f.path.endswith("gateway-launch.sh")).text
        assert f"--host {host}" in launch and f"--prometheus-host {host}" in launch, (bind, launch)


def test_gateway_ports_must_not_collide_with_the_engines() -> None:
    with pytest.raises(ProfileError):
        _res("serve.gateway.port=8080")


def test_the_gateway_stays_out_of_the_engines_digest() -> None:
    assert _res("serve.gateway.port=31000").digest() == resolve("tiny-llamacpp", Roots.make(env={})).digest()


# --------------------------------------------------------------------------- the ctl against stand-ins


class _Stub:
    """smg's worker API (POST/GET/DELETE /workers) and an engine's /metrics, as sparkctl reads them."""

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}
        self.served = "m"  # what a registered backend turns out to serve
        self.in_flight = [0.0]  # successive gauge reads (the last repeats)
        self.deleted: list[str] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
                raw = (json.dumps(body) if ctype == "application/json" else body).encode()
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/workers":
                    self._send(200, {"workers": list(stub.workers.values())})
                elif self.path == "/metrics":
                    v = stub.in_flight.pop(0) if len(stub.in_flight) > 1 else stub.in_flight[0]
                    self._send(200, f"# HELP x\ne:running{{a=\"1\"}} {v}\ne:waiting 0\n", "text/plain")
                else:
                    self._send(404, {})

            def do_POST(self) -> None:
                spec = json.loads(self.rfile.read(int(self.headers["content-length"])))
                wid = f"w{len(stub.workers) + len(stub.deleted)}"
                stub.workers[wid] = {"id": wid, "url": spec["url"], "model_id": stub.served, "status": "ready",
                                     "is_healthy": True}
                self._send(202, {"worker_id": wid})

            def do_DELETE(self) -> None:
                wid = self.path.rsplit("/", 1)[-1]
                stub.workers.pop(wid, None)
                stub.deleted.append(wid)
                self._send(202, {"worker_id": wid})
        return H


@pytest.fixture
def stub() -> Iterator[tuple[_Stub, str]]:
    s = _Stub()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), s.handler())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield s, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_register_is_idempotent_and_refuses_a_backend_serving_another_name(stub: tuple[_Stub, str]) -> None:
    s, url = stub
    assert "registered" in gateway_ctl.register(url, None, "http://10.0.0.1:8000", "m", 5)
    assert "registered" in gateway_ctl.register(url, None, "http://10.0.0.1:8000", "m", 5)  # the rebuild did it
    assert len(s.workers) == 1
    s.served = "other"
    with pytest.raises(gateway_ctl.Failed, match="serves 'other', not 'm': removed"):
        gateway_ctl.register(url, None, "http://10.0.0.2:8000", "m", 5)
    assert [w["url"] for w in s.workers.values()] == ["http://10.0.0.1:8000"]


def test_register_waits_for_a_restarting_gateway_within_its_timeout() -> None:
    """A gateway killed mid-switch is back within seconds (its unit's Restart=): the register step waits for
    it rather than fail (which would roll the switch back); one that never comes back fails in time."""
    s = _Stub()
    with socket.socket() as sock:  # a port nothing listens on yet
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    srv = ThreadingHTTPServer(("127.0.0.1", port), s.handler(), bind_and_activate=False)
    srv.allow_reuse_address = True
    serving = threading.Event()

    def restart() -> None:
        time.sleep(1.0)
        srv.server_bind()
        srv.server_activate()
        serving.set()
        srv.serve_forever()

    threading.Thread(target=restart, daemon=True).start()
    try:
        assert "registered" in gateway_ctl.register(f"http://127.0.0.1:{port}", None, "http://10.0.0.1:8000", "m", 10)
    finally:
        if serving.is_set():
            srv.shutdown()
        srv.server_close()
    with pytest.raises(gateway_ctl.Failed, match="did not answer within 1 s"):
        gateway_ctl.register(f"http://127.0.0.1:{port}", None, "http://10.0.0.1:8000", "m", 1)


def test_drain_waits_for_two_idle_reads_of_the_engines_own_gauge(stub: tuple[_Stub, str], monkeypatch) -> None:
    s, url = stub
    monkeypatch.setattr(gateway_ctl, "POLL_S", 0.01)
    gateway_ctl.register(url, None, url, "m", 5)  # the stub is both gateway and engine
    s.in_flight = [2.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # idle once, busy again, then idle twice
    msg = gateway_ctl.drain(url, None, [url], ["e:running", "e:waiting"], False, 5)
    assert "nothing in flight" in msg and s.workers == {} and s.in_flight == [0.0]
    # negative control: an engine that never goes idle holds the drain until its deadline
    s.in_flight = [1.0]
    with pytest.raises(gateway_ctl.Failed, match="still in flight"):
        gateway_ctl.drain(url, None, [url], ["e:running"], False, 0.2)


def test_an_engine_that_does_not_answer_has_nothing_in_flight() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert gateway_ctl.in_flight(f"http://127.0.0.1:{port}", None, ["x"], False) == 0.0


def test_rebuild_registers_only_stacks_recorded_serving_or_degraded(stub: tuple[_Stub, str], tmp_path: Path) -> None:
    s, url = stub
    for name, state, backend in (("a", "serving", "http://10.0.0.1:8000"), ("b", "stopped", "http://10.0.0.2:8000"),
                                 ("c", "starting", "http://10.0.0.3:8000"), ("d", "degraded", "http://10.0.0.4:8000")):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "state": state, "served_name": "m", "gateway": {"backends": [{"url": backend, "model": "m"}]}}))
    cfg = {"url": url, "records": [str(tmp_path / "*.json")]}
    # a degraded record's backends are the replicas left serving: a restarted gateway routes to them
    assert gateway_ctl.rebuild(cfg, None, 5) == "rebuilt 2 backend(s) from the record"
    assert sorted(w["url"] for w in s.workers.values()) == ["http://10.0.0.1:8000", "http://10.0.0.4:8000"]
    # a rolling switch under way: its record is "starting" and names what serves meanwhile
    (tmp_path / "c.json").write_text(json.dumps({
        "state": "starting", "served_name": "m", "gateway": {
            "backends": [{"url": "http://10.0.0.3:8000", "model": "m"}, {"url": "http://10.0.0.5:8000", "model": "m"}],
            "serving": [{"url": "http://10.0.0.5:8000", "model": "m"}]}}))
    assert gateway_ctl.rebuild(cfg, None, 5) == "rebuilt 3 backend(s) from the record"
    assert sorted(w["url"] for w in s.workers.values()) == ["http://10.0.0.1:8000", "http://10.0.0.4:8000",
                                                           "http://10.0.0.5:8000"]


def test_the_gateway_and_the_head_agree_on_which_records_serve() -> None:
    from sparkctl.model.record import LIVE_STATES, SERVING_STATES

    assert gateway_ctl.SERVING_STATES == SERVING_STATES and set(SERVING_STATES) <= set(LIVE_STATES)


def test_the_key_is_read_from_the_env_file_and_never_printed(tmp_path: Path, capsys, stub) -> None:
    env = tmp_path / "gateway.env"
    env.write_text("SPARKCTL_API_KEY='k3y w1th space'\n")
    cfg = tmp_path / "gateway.json"
    cfg.write_text(json.dumps({"url": "http://127.0.0.1:9", "env_file": str(env), "key_var": "SPARKCTL_API_KEY"}))
    assert gateway_ctl.api_key(json.loads(cfg.read_text())) == "k3y w1th space"
    assert gateway_ctl.main(["wait", "--config", str(cfg), "--timeout", "0.3"]) == 3
    assert "k3y" not in capsys.readouterr().err


# --------------------------------------------------------------------------- the bench's endpoint


def test_bench_goes_through_the_gateway_or_to_a_replica() -> None:
    from sparkctl.bench.cluster_hooks import prepare

    class Ctx:
        def __init__(self, *sets: str) -> None:
            self.sets = sets

        def resolve(self, name: str) -> Any:
            return resolve(name, Roots.make(env={}), self.sets)

        def inventory(self) -> Any:
            return _inv()

    url, _, config, _ = prepare(Ctx(*GW), "tiny-llamacpp", False)
    assert url == "http://192.168.1.101:30000" and config["endpoint"]["through"] == "gateway"
    url, _, config, _ = prepare(Ctx(*GW), "tiny-llamacpp", False, endpoint="replica")
    assert url == "http://192.168.1.101:8080" and config["endpoint"]["through"] == "replica"
    with pytest.raises(SparkctlError, match="runs no gateway"):
        prepare(Ctx(), "tiny-llamacpp", False, endpoint="gateway")
