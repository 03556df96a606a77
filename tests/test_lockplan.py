"""The node locks as plan steps (sparkctl.plan.lockplan), run by the executor's ``lock`` kind
through a real local shell: taken, refused while held, a dead holder broken, released only by its run.
Its scripts and the supervised launch pass shellcheck."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sparkctl.errors import LockHeld
from sparkctl.model.inventory import loads_inventory
from sparkctl.ops import executor
from sparkctl.ops.lock import holder_info, take
from sparkctl.plan import lockplan, supervised
from sparkctl.plan.steps import Plan, calls
from sparkctl.transport.fake import LocalTransport


def _inv(tmp_path: Path) -> Any:
    nodes = "".join(f"  - {{name: spark-{x}, host: 192.168.1.10{i}, prefix: {tmp_path / 'nodes' / x}, sudo: false}}\n"
                    for i, x in enumerate("ab"))
    return loads_inventory(f"nodes:\n{nodes}cables:\n  - [spark-a:p0, spark-b:p0]\n", str(tmp_path / "inv.yaml"))


def _holder_file(inv: Any, node: str = "spark-a") -> Path:
    return Path(lockplan.lock_dirs(inv)[node]) / "holder"


def test_the_lock_steps_take_refuse_break_and_release(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    with LocalTransport(nodes=inv.names, sudo=False) as t:
        mine = holder_info("up x")
        assert take(inv, t, lockplan.lock_step(inv, mine).to_dict()) == "acquired"
        assert f'"run": "{mine["run"]}"' in _holder_file(inv).read_text()
        other = holder_info("down")
        with pytest.raises(LockHeld, match="locked by"):  # this process is alive: its lock stands
            take(inv, t, lockplan.lock_step(inv, other).to_dict())
        # the release of another run is a no-op; this run's removes the lock
        say: Any = lambda *_: None  # noqa: E731
        executor.release_lock(inv, t, "down", other, say)
        assert _holder_file(inv).exists()
        executor.release_lock(inv, t, "up x", mine, say)
        assert not _holder_file(inv).exists() and not _holder_file(inv, "spark-b").exists()
        # a holder on this machine whose pid is gone is broken by the next acquirer, once
        dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout.strip()
        gone = {**holder_info("up y"), "pid": int(dead)}
        assert take(inv, t, lockplan.lock_step(inv, gone).to_dict()) == "acquired"
        assert take(inv, t, lockplan.lock_step(inv, mine).to_dict()) == "acquired"
        assert f'"run": "{mine["run"]}"' in _holder_file(inv).read_text()


def test_every_lock_command_is_listed_in_its_step(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    step = lockplan.lock_step(inv, holder_info("up"))
    listed = {c.source for c in calls(step)}
    assert listed == {"commands", "holder_alive", "break_stale"}
    plan = lockplan.with_lock(Plan("up", "p", ()), inv, holder_info("up"))
    assert [s.id for s in plan.steps] == ["lock"] and [s.id for s in plan.branches["finally"]] == ["unlock"]
    assert plan.noop  # a plan of nothing but the lock does nothing


@pytest.mark.skipif(not any(os.access(os.path.join(d, "shellcheck"), os.X_OK)
                            for d in os.environ.get("PATH", "").split(os.pathsep)), reason="no shellcheck")
def test_the_lock_scripts_and_the_launch_pass_shellcheck(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    holder = holder_info("switch --supervise x")
    scripts = {"acquire": lockplan.lock_step(inv, holder).commands["spark-a"],
               "release": lockplan.unlock_step(inv, "t").commands["spark-a"],
               "alive": lockplan.HOLDER_ALIVE_SCRIPT, "break": lockplan.BREAK_SCRIPT.format(dirs="/x /y"),
               "launch": supervised.launch_command(inv, "spark-a", holder, ["spark-a", "spark-b"])}
    for name, text in scripts.items():
        f = tmp_path / f"{name}.sh"
        f.write_text("#!/bin/sh\n" + text + "\n")
        r = subprocess.run(["shellcheck", "-s", "sh", "-e", "SC2016", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stdout)


def test_nodes_with_and_without_sudo_in_one_step_are_one_fan_out(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    with LocalTransport(nodes=inv.names, sudo=False) as t:
        fan_outs: list[Any] = []
        real = t.run_all

        def run_all(commands: Any, **kw: Any) -> Any:
            fan_outs.append((dict(commands), kw.get("sudo")))
            return real(commands, **kw)

        t.run_all = run_all  # type: ignore[method-assign]
        res = executor.TransportBackend(inv, t, lambda *_: None).run_all(
            {"spark-a": "echo a", "spark-b": "echo b"}, {"spark-a": True, "spark-b": False}, 10)
    assert [r["stdout"].strip() for r in res.values()] == ["a", "b"]
    assert fan_outs == [({"spark-a": "echo a", "spark-b": "echo b"}, {"spark-a": True, "spark-b": False})]


def test_a_supervisor_holder_is_judged_by_its_pid_on_the_head_and_only_its_locks_break(tmp_path: Path) -> None:
    """The holder-alive script reads the holder line on stdin (its pid): a runner that still runs
    keeps its locks (negative control); one that is gone loses exactly its own, all or none."""
    inv = _inv(tmp_path)
    with LocalTransport(nodes=inv.names, sudo=False) as t:
        runner = subprocess.Popen(["python3", "-c", "import time; time.sleep(60)", "planrun"])
        try:
            alive = {**holder_info("switch --supervise x"), "host": "spark-a", "pid": runner.pid}
            assert take(inv, t, lockplan.lock_step(inv, alive).to_dict()) == "acquired"
            with pytest.raises(LockHeld, match="the cluster is locked"):
                take(inv, t, lockplan.lock_step(inv, holder_info("up y")).to_dict())
            assert _holder_file(inv).exists() and _holder_file(inv, "spark-b").exists()
        finally:
            runner.kill()
            runner.wait()
        mine = holder_info("up y")
        assert take(inv, t, lockplan.lock_step(inv, mine).to_dict()) == "acquired"  # the runner is gone
        assert all(f'"run": "{mine["run"]}"' in _holder_file(inv, n).read_text() for n in inv.names)
