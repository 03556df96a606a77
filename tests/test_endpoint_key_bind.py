"""serve.api_key_env and serve.bind end to end, without a cluster.

* the record keeps the variable's NAME and each head's listen address, never the key;
* where a probe asks (operator side: direct, or an SSH forward through the head for
  bind=fabric; on the head: the bound address);
* the ``models`` fact sends the key read on the node from the 0600 env file, and the key
  is on no command line while it runs (a server that scans every process's argv while
  the request is in flight); HTTP 401 is "needs key";
* ``status`` and ``bench`` send the key from the operator's variable, say
  "needs key: set $VAR" when it is unset, and print the key nowhere (--json included);
* a real sshd forwards the probe (transport/forward.py).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.facts.batch import build_script, parse_batch, remote_command
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.model.inventory import Node
from sparkctl.model.record import RunRecord, on_node_host, operator_route
from sparkctl.ops import readiness
from sparkctl.ops.readiness import operator_key
from sparkctl.ops.status import endpoint_status
from sparkctl.remote import endpoint_probe
from sparkctl.transport import FakeTransport
from sparkctl.transport.base import TransportSettings
from sparkctl.transport.connection import SSHTransport
from sparkctl.transport.forward import forward

from sshd_fixture import sshd_available, start_sshd

KEY = "sk-h16-9c1e7d2b"


class _Server(http.server.ThreadingHTTPServer):
    requests: list[str]
    leaked: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    """vLLM's AuthenticationMiddleware in miniature: /v1 needs ``Bearer KEY`` (else 401
    {"error": "Unauthorized"}); /metrics is open. While answering it scans every process's
    command line for the key (the fact's curl is alive then)."""

    server: _Server

    def _scan(self) -> None:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if KEY in argv:
                    self.server.leaked.append(argv.replace("\0", " "))

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        self._scan()
        if self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {KEY}":
            self._send(401, {"error": "Unauthorized"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m1", "object": "model"}]})
        elif self.path == "/metrics":
            self._send(200, None, b"vllm:generation_tokens_total 7\n")
        else:
            self._send(404, {"error": "not found"})

    def _send(self, code: int, doc: object, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.requests, srv.leaked = [], []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _node(tmp_path: Path) -> Node:
    return Node("spark-a", 0, "127.0.0.1", "root", 22, None, False, None, "/", str(tmp_path / "sys"), "/proc",
                "eth0", {})


def _record(**kw: object) -> RunRecord:
    base: dict[str, object] = {"profile": "p", "sets": (), "digest": "d", "engine": "vllm", "engine_version": "v",
                               "served_name": "m1", "port": 8000, "heads": ("spark-a",), "nodes": {},
                               "state": "serving", "started_at": "t", "updated_at": "t"}
    return RunRecord(**{**base, **kw})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the record


def test_the_record_keeps_the_variable_name_and_listen_addresses_and_reads_old_records() -> None:
    rec = _record(api_key_env="MY_KEY", listen={"spark-a": "10.20.0.1"})
    back = RunRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back.api_key_env == "MY_KEY" and back.listen == {"spark-a": "10.20.0.1"}
    old = rec.to_dict()
    del old["api_key_env"], old["listen"]  # a record written before these fields
    assert RunRecord.from_dict(old).api_key_env is None and RunRecord.from_dict(old).listen == {}


def test_a_planned_record_names_the_variable_never_the_key(tmp_path: Path, sparkctl,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H16_KEY", KEY)
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - {name: spark-a, host: 10.201.0.101}\n  - {name: spark-b, host: 10.201.0.102}\n"
                   "cables:\n  - [spark-a:p0, spark-b:p0]\n")
    r = sparkctl("-i", str(inv), "plan", "up", "tensorfold-tp2", "--assume-fresh", "--json",
                 "--set", "serve.api_key_env=H16_KEY", "--set", "serve.bind=fabric")
    assert r.code == 0, r.err
    assert KEY not in r.out + r.err
    plan = json.loads(r.out)
    records = [s["params"]["record"] for s in plan["steps"] if s["kind"] == "record"]
    assert records and all(rec["api_key_env"] == "H16_KEY" for rec in records)
    ready = next(s for s in plan["steps"] if s["kind"] == "ready")
    fabric_ip = records[0]["listen"]["spark-a"]
    assert fabric_ip not in ("0.0.0.0", "10.201.0.101")  # bound to the head's fabric address
    assert ready["params"]["endpoints"] == {"spark-a": f"http://{fabric_ip}:8000"}
    assert ready["params"]["via"] == {"spark-a": "spark-a"}  # the operator goes through the head's SSH
    assert ready["params"]["api_key"]["env"] == "H16_KEY"


# --------------------------------------------------------------------------- where a probe asks


@pytest.mark.parametrize(("listen", "want"), [
    (None, ("10.201.0.101", None)),  # a record written before listen was kept: 0.0.0.0
    ("0.0.0.0", ("10.201.0.101", None)),  # bind: all
    ("10.201.0.101", ("10.201.0.101", None)),  # bind: management
    ("10.20.0.1", ("10.20.0.1", "spark-a")),  # bind: fabric: only the head reaches it
])
def test_operator_route_follows_the_bind(listen: str | None, want: tuple[str, str | None]) -> None:
    r = operator_route("spark-a", "10.201.0.101", listen, 8000)
    assert (r.host, r.via) == want and r.url == f"http://{want[0]}:8000"


def test_on_node_probes_ask_the_bound_address() -> None:
    assert on_node_host(None) == on_node_host("0.0.0.0") == "127.0.0.1"
    assert on_node_host("10.20.0.1") == "10.20.0.1"


def test_operator_key_names_the_variable_and_hides_the_key() -> None:
    assert operator_key("H16_KEY", {}).problem == "needs key: set $H16_KEY"
    k = operator_key("H16_KEY", {"H16_KEY": KEY})
    assert k.problem is None and k.key == KEY and KEY not in repr(k)
    assert operator_key(None, {}).problem is None
    assert endpoint_probe.auth_headers(k.key) == {"Authorization": f"Bearer {KEY}"}


# --------------------------------------------------------------------------- the models fact


def _models_fact(tmp_path: Path, port: int, key_file: Path | None, no_curl: bool = False) -> NodeFacts:
    script = build_script(_node(tmp_path), endpoint_port=port, endpoint_host="127.0.0.1",
                          endpoint_key=(str(key_file), "SPARKCTL_API_KEY") if key_file else None)
    assert KEY not in script
    if no_curl:  # the python3 branch
        script = script.replace("have curl", "have no-such-curl-h16")
    r = subprocess.run(remote_command(script), shell=True, capture_output=True, text=True, timeout=30,
                       check=False)
    return parse_batch("spark-a", r.stdout)


@pytest.mark.parametrize("no_curl", [False, True], ids=["curl", "python3"])
def test_models_fact_sends_the_key_from_the_env_file_and_never_on_a_command_line(
        tmp_path: Path, server: _Server, no_curl: bool) -> None:
    env = tmp_path / "engine.env"
    env.write_text(f"# rendered\nSPARKCTL_NODE='spark-a'\nSPARKCTL_API_KEY='{KEY}'\n")
    env.chmod(0o600)
    f = _models_fact(tmp_path, server.server_address[1], env, no_curl)
    assert f.served_models == ["m1"], f.unreadable
    assert "/v1/models" in server.requests
    assert server.leaked == [], "the key was on a command line while the fact ran"


@pytest.mark.parametrize("no_curl", [False, True], ids=["curl", "python3"])
def test_models_fact_reads_401_as_needs_key(tmp_path: Path, server: _Server, no_curl: bool) -> None:
    for key_file in (None, tmp_path / "missing.env"):
        f = _models_fact(tmp_path, server.server_address[1], key_file, no_curl)
        assert f.served_models is None
        assert "needs key" in f.unreadable["models"] and "401" in f.unreadable["models"]


# --------------------------------------------------------------------------- status


def test_status_sends_the_key_and_says_needs_key_when_the_variable_is_unset(server: _Server) -> None:
    route = operator_route("spark-a", "127.0.0.1", None, server.server_address[1])
    t = FakeTransport(nodes=["spark-a"])
    unset = endpoint_status(t, route, "m1", "vllm:generation_tokens_total", operator_key("H16_KEY", {}))
    assert unset["state"] == "needs key" and unset["error"] == "needs key: set $H16_KEY"
    assert server.requests == []  # nothing asked without the key
    ok = endpoint_status(t, route, "m1", "vllm:generation_tokens_total", operator_key("H16_KEY", {"H16_KEY": KEY}))
    assert ok["state"] == "serving" and ok["serves_record"] and ok["tokens_generated"] == 7
    wrong = endpoint_status(t, route, "m1", None, operator_key("H16_KEY", {"H16_KEY": "sk-wrong"}))
    assert wrong["state"] == "key refused" and "sk-wrong" not in json.dumps(wrong)
    assert KEY not in json.dumps([unset, ok, wrong])


def test_status_json_never_holds_the_key(tmp_path: Path, server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """cluster_status as `status --json` prints it, with a record that names the variable."""
    from sparkctl.model.inventory import loads_inventory
    from sparkctl.ops.status import cluster_status
    from sparkctl.transport import reply

    port = server.server_address[1]
    inv = loads_inventory("nodes:\n  - {name: spark-a, host: 127.0.0.1}\n", "inv.yaml")
    rec = _record(api_key_env="H16_KEY", port=port, listen={"spark-a": "0.0.0.0"})
    t = FakeTransport(nodes=["spark-a"])
    t.add("*", re.compile(r"cat .*record\.json.*", re.DOTALL), reply(json.dumps(rec.to_dict())))
    # every stack's record in one round trip (sparkctl.ops.lock.read_records)
    t.add("*", re.compile(r"for f in .*sparkctl-record.*", re.DOTALL),
          reply("\n==> sparkctl-record /var/lib/sparkctl/record.json\n" + json.dumps(rec.to_dict())))
    t.add("*", re.compile(r"cat .*laws\.json.*", re.DOTALL), reply(""))  # no verdicts kept yet
    t.add("*", re.compile(r"\[ -e .*supervisor.*", re.DOTALL), reply(""))
    t.add("*", re.compile(r"sh -c .*", re.DOTALL), reply(""))
    monkeypatch.setenv("H16_KEY", KEY)
    st = cluster_status(inv, t)
    assert st["endpoint"]["spark-a"]["state"] == "serving", st["endpoint"]
    assert KEY not in json.dumps(st)
    assert all(KEY not in c for c in t.commands())
    # the head's models fact reads the key on the node (the env file), not from here
    batch = next(c for c in t.commands() if "@@sparkctl:" in c)
    assert "/etc/sparkctl/engine.env" in batch and "SPARKCTL_API_KEY" in batch
    monkeypatch.delenv("H16_KEY")
    st = cluster_status(inv, t)
    assert st["endpoint"]["spark-a"]["state"] == "needs key"
    assert any("needs key: set $H16_KEY" in d for d in st["drift"])
    assert not any("does not serve" in d for d in st["drift"])


# --------------------------------------------------------------------------- bench


def test_bench_sends_the_key_and_an_unset_variable_is_one_clear_line(tmp_path: Path, server: _Server, sparkctl,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkctl.bench.options import RunOptions
    from sparkctl.bench.runner import Runner
    from sparkctl.errors import TransportError

    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.delenv("H16_KEY", raising=False)
    r = sparkctl("bench", "run", "--base-url", url, "--model", "m1", "--api-key-env", "H16_KEY",
                 "--out", str(tmp_path / "run"), "--suite", "decode")
    assert r.code != 0 and "needs key: set $H16_KEY" in r.err and "Traceback" not in r.err
    assert server.requests == []
    import asyncio

    with pytest.raises(TransportError) as exc:  # no key: the preflight says 401 and what to set
        asyncio.run(Runner(url, "m1", tmp_path / "a", {}, RunOptions()).preflight())
    assert "401" in exc.value.one_line() and "api_key_env" in (exc.value.hint or "")
    runner = Runner(url, "m1", tmp_path / "b", {}, RunOptions(), api_key=KEY)
    asyncio.run(runner.preflight())  # with the key: /v1/models answers
    assert KEY not in json.dumps(runner.config)


# --------------------------------------------------------------------------- the SSH forward


def test_forward_without_ssh_is_the_address_itself() -> None:
    with forward(FakeTransport(nodes=["spark-a"]), "spark-a", "10.20.0.1", 8000) as (host, port):
        assert (host, port) == ("10.20.0.1", 8000)


@pytest.mark.skipif(not sshd_available(), reason="needs OpenSSH's sshd")
def test_the_probe_goes_through_the_heads_ssh_forward(tmp_path: Path, server: _Server) -> None:
    """bind=fabric from the operator's machine: the probe rides a direct-tcpip channel of the
    head's SSH connection to the address the head reaches (here the server on its loopback)."""
    with start_sshd(tmp_path / "sshd") as sshd:
        node = sshd.node("spark-a")
        with SSHTransport([node], TransportSettings(connect_timeout_s=5, command_timeout_s=10, deadline_s=20),
                          ssh_config=tmp_path / "no-ssh-config") as t:
            port = server.server_address[1]
            ok, detail = readiness.probe_via(t, "spark-a", f"http://127.0.0.1:{port}", "m1", None, smoke=False,
                                             api_key=KEY)
            assert ok, detail
            with forward(t, "spark-a", "127.0.0.1", port) as (host, local):
                assert local != port
                import httpx

                got = [httpx.get(f"http://{host}:{local}/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                                 timeout=5).json() for _ in range(3)]
            assert all(g["data"][0]["id"] == "m1" for g in got)
            refused = readiness.probe_via(t, "spark-a", "http://127.0.0.1:1", "m1", None, smoke=False, api_key=KEY)
            assert not refused[0] and KEY not in refused[1]
