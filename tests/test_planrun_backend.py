"""planrun's two backends keep to its typed Backend protocol, and a run's state is a RunState."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from sparkctl.ops.executor import TransportBackend
from sparkctl.remote import planrun

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


class _Fake:
    """A backend that runs nothing: every command succeeds, every probe says serving."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.t = 0.0

    def emit(self, node: str, phase: str, message: str) -> None:
        pass

    def now(self) -> str:
        return "2026-01-01T00:00:00+00:00"

    def monotonic(self) -> float:
        self.t += 0.1
        return self.t

    def sleep(self, seconds: float) -> None:
        pass

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool,
              api_key: Any = None, via: str | None = None) -> tuple[bool, str]:
        return True, "serving"

    def run_all(self, commands: Any, sudo: Any, timeout_s: float | None, stdin: Any = None) -> dict[str, Any]:
        fail = {n for n, c in commands.items() if c == "false"}
        return {n: {"ok": n not in fail, "exit_code": 1 if n in fail else 0, "stdout": "", "stderr": "boom",
                    "error": ""} for n in commands}

    def put_all(self, files: Any, sudo: Any) -> dict[str, Any]:
        return {n: {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "error": ""} for n in files}

    def write_record(self, node: str, path: str, data: Any, sudo: bool, remove_on_failure: Any) -> dict[str, Any]:
        self.records.append(dict(data))
        return {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "error": ""}

    def leaks(self, results: Any) -> dict[str, float]:
        return {}

    def check(self, step: Any) -> str:
        return "laws hold"

    def lock(self, step: Any) -> str:
        return "acquired"


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
