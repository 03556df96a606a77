"""serve.persist: the rendered unit's restart guard, the up plan's enable step, down's disable step,
and the engine-unit fact that `status` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.errors import SparkctlError
from sparkctl.facts import services
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import planner
from sparkctl.plan.render import render

REPO = Path(__file__).resolve().parent.parent


def _setup(sets: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    roots = Roots.make(root=str(REPO), env={})
    inv = load_inventory(REPO / "inventory.yaml")
    res = resolve("ds41f-tp4-ring", roots, sets)
    return res, inv, render(res, inv, roots, secrets={})


def _unit(rendering, node: str = "spark-b") -> str:  # type: ignore[no-untyped-def]
    return next(f.text for f in rendering.files[node].values() if f.path.endswith("sparkctl-engine.service"))


def test_without_persist_the_unit_never_restarts_and_up_enables_nothing() -> None:
    res, inv, rendering = _setup()
    unit = _unit(rendering)
    assert "Restart=no" in unit and "StartLimitBurst" not in unit
    plan = planner.plan_up(res, inv, rendering, planner.UpFacts())
    persist = [s for s in plan.steps if s.phase == "persist"]
    # only the guarded disable of an earlier run's enable: nothing is enabled
    assert [s.id for s in persist] == ["unpersist"] and persist[0].on_fail == "continue"
    assert all("systemctl disable sparkctl-engine.service" in c and "enable " not in c.replace("is-enabled", "")
               for c in persist[0].commands.values())
    assert all("reset-failed" not in c for s in plan.steps for c in s.commands.values())


def test_persist_renders_restart_on_failure_with_a_start_limit() -> None:
    _res, _inv, rendering = _setup(("serve.persist=true", "serve.restart_burst=4", "serve.restart_interval_s=900",
                                    "serve.restart_delay_s=20", "serve.fabric_wait_s=120"))
    unit = _unit(rendering)
    head, service = unit.split("[Service]")
    assert "StartLimitIntervalSec=900\n" in head and "StartLimitBurst=4\n" in head  # [Unit] keys
    assert "Restart=on-failure\n" in service and "RestartSec=20\n" in service and "Restart=no" not in unit


def test_persist_up_enables_engine_and_clock_units_after_ready_and_undoes_it_on_failure() -> None:
    res, inv, rendering = _setup(("serve.persist=true",))
    plan = planner.plan_up(res, inv, rendering, planner.UpFacts())
    phases = [s.phase for s in plan.steps]
    assert phases.index("persist") == phases.index("ready") + 1 and phases[-1] == "record"
    step = next(s for s in plan.steps if s.phase == "persist")
    assert set(step.nodes) == {"spark-a", "spark-b", "spark-c", "spark-d"} and all(step.sudo.values())
    assert set(step.commands.values()) == {"systemctl enable sparkctl-engine.service sparkctl-clock-cap.service"}
    assert step.on_fail == "stop"
    starts = [c for s in plan.steps if s.phase == "start" for c in s.commands.values()]
    assert starts and all(c.startswith("systemctl reset-failed sparkctl-engine.service") for c in starts)
    branch = plan.branches["stop"]
    assert branch[0].id == "disable-started" and "systemctl disable" in next(iter(branch[0].commands.values()))


def test_down_disables_the_unit_before_it_stops_anything() -> None:
    _res, inv, _r = _setup()
    plan = planner.plan_down(inv, None)
    ids = [s.id for s in plan.steps]
    assert ids.index("disable") < ids.index("stop")
    assert all("systemctl disable sparkctl-engine.service" in c for c in plan.steps[ids.index("disable")].commands.values())


def test_a_window_shorter_than_the_pauses_is_refused() -> None:
    with pytest.raises(SparkctlError, match="restart_interval_s"):
        _setup(("serve.persist=true", "serve.restart_burst=5", "serve.restart_delay_s=60", "serve.restart_interval_s=120"))


def test_the_engine_unit_fact_parses_systemctl_show() -> None:
    u = services.parse_engine_unit("LoadState=loaded\nUnitFileState=enabled\nActiveState=failed\n"
                                   "Result=start-limit-hit\nNRestarts=2\n")
    assert (u.result, u.n_restarts, u.unit_file_state, u.active_state) == ("start-limit-hit", 2, "enabled", "failed")
    with pytest.raises(SparkctlError):
        services.parse_engine_unit("LoadState=loaded\n")
    with pytest.raises(SparkctlError):
        services.parse_engine_unit("LoadState=loaded\nActiveState=x\nResult=y\nNRestarts=-1\n")
