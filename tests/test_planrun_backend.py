"""planrun's two backends keep to its typed Backend protocol, and a run's state is a RunState."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from sparkctl.ops.executor import TransportBackend
from sparkctl.remote import planrun

from helpers import StubBackend

METHODS = sorted(n for n, v in vars(planrun.Backend).items() if callable(v) and not n.startswith("_"))


def _params(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize("backend", [TransportBackend, planrun.HeadBackend], ids=lambda b: b.__name__)
def test_each_backend_has_every_method_of_the_protocol_with_its_parameters(backend: type) -> None:
    assert {"emit", "probe", "run_all", "put_all", "write_record", "check", "lock", "monotonic",
            "sleep"} <= set(METHODS)
    for name in METHODS:
        want = _params(getattr(planrun.Backend, name))
        got = getattr(backend, name)
        if inspect.isbuiltin(got):  # time.monotonic / time.sleep as static methods: no Python signature
            assert name in ("monotonic", "sleep"), (backend.__name__, name)
            continue
        assert _params(got) == want, (backend.__name__, name)


class _Fake(StubBackend):
    """A backend that runs nothing: every command succeeds (save ``false``), every probe says serving."""

    def __init__(self) -> None:
        super().__init__("nowhere")

    def monotonic(self) -> float:
        self.t += 0.1
        return self.t

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool,
              api_key: Any = None, via: str | None = None) -> tuple[bool, str]:
        return True, "serving"

    def run_all(self, commands: Any, sudo: Any, timeout_s: float | None, stdin: Any = None) -> dict[str, Any]:
        fail = {n for n, c in commands.items() if c == "false"}
        return {n: {"ok": n not in fail, "exit_code": 1 if n in fail else 0, "stdout": "", "stderr": "boom",
                    "error": ""} for n in commands}


def _step(sid: str, command: str, on_fail: str = "stop") -> dict[str, Any]:
    return {"id": sid, "phase": sid, "kind": "run", "nodes": ["a"], "summary": sid, "commands": {"a": command},
            "sudo": {}, "on_fail": on_fail}


def test_a_failed_step_leads_to_its_branch_and_the_state_says_so() -> None:
    record = {"id": "rec", "phase": "record", "kind": "record", "nodes": ["a"], "summary": "record",
              "params": {"record": {"state": "failed"}, "path": "/r.json", "note_from_failure": True}}
    plan = {"op": "up", "profile": "p", "steps": [_step("one", "true"), _step("two", "false")],
            "branches": {"stop": [_step("halt", "true"), record]}}
    backend = _Fake()
    state = planrun.execute(plan, backend)
    assert isinstance(state, planrun.RunState)
    assert (state.result, state.branches, state.completed) == ("failed", ["stop"], ["stop"])
    assert state.failed is not None and state.failure == {"step": "two", "phase": "two", "node": "a",
                                                          "detail": "two failed on a: boom"}
    assert [(o["id"], o["ok"]) for o in state.outcomes] == [("one", True), ("two", False), ("halt", True),
                                                           ("rec", True)]
    assert backend.records[-1]["note"] == "up p failed in phase two: two failed on a: boom"
    assert state.record == backend.records[-1]


class _Warming(_Fake):
    """The endpoint never serves within the test; the liveness check answers from a script per node."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__()
        self.answers = answers

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool,
              api_key: Any = None, via: str | None = None) -> tuple[bool, str]:
        return False, "connection refused"

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def run_all(self, commands: Any, sudo: Any, timeout_s: float | None, stdin: Any = None) -> dict[str, Any]:
        out = {}
        for n, c in commands.items():
            if c == "alive?":
                seq = self.answers[n]
                out[n] = seq.pop(0) if len(seq) > 1 else seq[0]
            else:
                out[n] = {"ok": True, "exit_code": 0, "stdout": "log line", "stderr": "", "error": ""}
        return out


ALIVE = {"ok": True, "exit_code": 0, "stdout": "alive\n", "stderr": "", "error": ""}
DEAD = {"ok": True, "exit_code": 0, "stdout": "dead\n", "stderr": "", "error": ""}
NO_ANSWER = {"ok": False, "exit_code": None, "stdout": "", "stderr": "",
             "error": "Error reading SSH protocol banner[Errno 104] Connection reset by peer"}


def _ready_step(deadline_s: float = 30.0) -> dict[str, Any]:
    return {"id": "ready", "phase": "ready", "kind": "ready", "nodes": ["a", "b"], "summary": "ready",
            "params": {"endpoints": {"a": "http://a:8000"}, "served_name": "m", "deadline_s": deadline_s,
                       "watch": {"a": "alive?", "b": "alive?"},
                       "tail_on_failure": {"a": "tail", "b": "tail"}, "profile": "p"}}


def _ready_failure(answers: dict[str, list[dict[str, Any]]], deadline_s: float = 30.0) -> str:
    state = planrun.execute({"op": "up", "profile": "p", "steps": [_ready_step(deadline_s)], "branches": {}},
                            _Warming(answers))
    assert state.failure is not None
    return str(state.failure["detail"])


def test_a_liveness_check_that_got_no_answer_is_not_a_dead_rank() -> None:
    # a rank still loading, whose node's SSH session was reset once under load: the wait goes on to its deadline
    detail = _ready_failure({"a": [ALIVE], "b": [NO_ANSWER, ALIVE]})
    assert "not ready within 30 s" in detail and "exited" not in detail


def test_one_dead_answer_between_two_execs_is_not_a_dead_rank() -> None:
    detail = _ready_failure({"a": [ALIVE], "b": [DEAD, ALIVE]})
    assert "not ready within 30 s" in detail


def test_the_watch_reads_liveness_from_its_first_line_and_shows_the_log_line_after_it() -> None:
    """One round trip per rank and look: "alive"/"dead", then the log's last line (which may say anything)."""
    dead_but_says_alive = {**DEAD, "stdout": "dead\nworker alive, waiting for rank 0\n"}
    logging = {**ALIVE, "stdout": "alive\nloading shard 3/8\n"}
    backend = _Warming({"a": [logging], "b": [dead_but_says_alive]})
    waiting: list[tuple[str, str]] = []
    backend.emit = lambda node, phase, message: waiting.append((node, message)) if phase == "waiting" else None
    state = planrun.execute({"op": "up", "profile": "p", "steps": [_ready_step(600)], "branches": {}}, backend)
    assert state.failure is not None
    assert state.failure["detail"] == "p did not become ready: rank on b exited before the endpoint was ready"
    assert waiting and all(m.endswith("s  loading shard 3/8") for n, m in waiting if n == "a"), waiting
    assert all(m.endswith("s  worker alive, waiting for rank 0") for n, m in waiting if n == "b"), waiting


def test_a_rank_that_answers_dead_twice_fails_the_wait_at_once_naming_its_node() -> None:
    detail = _ready_failure({"a": [ALIVE], "b": [DEAD, DEAD]}, deadline_s=600)
    assert detail == "p did not become ready: rank on b exited before the endpoint was ready"


def test_a_node_that_never_answers_is_named_at_the_deadline() -> None:
    detail = _ready_failure({"a": [ALIVE], "b": [NO_ANSWER]})
    assert "b did not answer the liveness check: Error reading SSH protocol banner" in detail


def test_the_head_writes_a_peers_files_in_one_session_as_the_operators_transport_does(tmp_path: Path) -> None:
    """planrun.py as pushed (with endpoint_probe.py and putfiles.py beside it, no sparkctl package):
    a peer's files in one session, each with its bytes and mode; the record too. The "ssh" to the peer
    is ``sh -c`` here (the command is its last word, as with ssh)."""
    import base64
    import hashlib
    import json
    import shutil
    import subprocess
    import sys

    opt = tmp_path / "opt"
    opt.mkdir()
    remote = Path(planrun.__file__).parent
    for f in ("planrun.py", "endpoint_probe.py", "putfiles.py"):
        shutil.copy(remote / f, opt / f)
    blobs = {b"K=secret\n" * 300: "600", b"": "644", bytes(range(256)): "755"}
    files = [{"path": str(tmp_path / "peer" / f"f{i} $(touch canary)"), "mode": mode,
              "sha256": hashlib.sha256(data).hexdigest()} for i, (data, mode) in enumerate(blobs.items())]
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import planrun\n"
            "assert 'sparkctl' not in sys.modules\n"
            "b = planrun.HeadBackend({'peer': {'ssh': ['sh', '-c']}}, json.loads(sys.argv[2]), '/dev/null')\n"
            "sent = []\n"
            "one = b._one\n"
            "b._one = lambda *a, **k: sent.append(a[1]) or one(*a, **k)\n"
            "r = b.put_all({'peer': json.loads(sys.argv[3])}, {})\n"
            "w = b.write_record('peer', sys.argv[4], {'state': 'serving'}, False, None)\n"
            "print(json.dumps([r, w, len(sent)]))")
    b64 = {hashlib.sha256(d).hexdigest(): base64.b64encode(d).decode() for d in blobs}
    out = subprocess.run([sys.executable, "-S", "-c", code, str(opt), json.dumps(b64), json.dumps(files),
                          str(tmp_path / "peer" / "record.json")], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    put, record, sessions = json.loads(out.stdout)
    assert put["peer"]["ok"] and record["ok"] and sessions == 2, out.stdout
    for f, (data, mode) in zip(files, blobs.items(), strict=True):
        p = Path(f["path"])
        assert p.read_bytes() == data and oct(p.stat().st_mode & 0o777)[2:] == mode
    assert json.loads((tmp_path / "peer" / "record.json").read_text()) == {"state": "serving"}
    assert sorted(p.name for p in (tmp_path / "peer").iterdir()) == sorted(
        [Path(f["path"]).name for f in files] + ["record.json"])  # no temporary file left, no canary
    assert not list(tmp_path.rglob("canary"))
