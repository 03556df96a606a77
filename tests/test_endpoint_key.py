"""serve.api_key_env and serve.bind: the key only in the 0600 env file (masked unless revealed),
never in launch.sh or a plan; the engine's --host from serve.bind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.errors import SparkctlError
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import planner
from sparkctl.plan.render import MASK, render

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-test-0123456789"


def _render(sets: tuple[str, ...], reveal: bool, profile: str = "ds41f-tp4-ring"):  # type: ignore[no-untyped-def]
    roots = Roots.make(root=str(REPO), env={})
    inv = load_inventory(REPO / "inventory.yaml")
    res = resolve(profile, roots, sets)
    return res, inv, render(res, inv, roots, secrets={"MY_KEY": KEY}, reveal_secrets=reveal)


def _file(rendering, node: str, suffix: str) -> str:  # type: ignore[no-untyped-def]
    return next(f.text for f in rendering.files[node].values() if f.path.endswith(suffix))


def test_the_key_is_in_the_env_file_only_and_launch_passes_it_by_name() -> None:
    _res, _inv, shown = _render(("serve.api_key_env=MY_KEY",), reveal=True)
    env = _file(shown, "spark-a", "engine.env")
    assert f"SPARKCTL_API_KEY={KEY}" in env
    launch = _file(shown, "spark-a", "launch.sh")
    assert KEY not in launch and launch.rstrip().endswith('--api-key "$SPARKCTL_API_KEY"')
    assert all(KEY not in f.text for f in shown.files["spark-a"].values() if not f.path.endswith("engine.env"))


def test_masked_render_and_plan_never_carry_the_key() -> None:
    res, inv, masked = _render(("serve.api_key_env=MY_KEY",), reveal=False)
    assert f"SPARKCTL_API_KEY={MASK}" in _file(masked, "spark-a", "engine.env").replace("'", "")
    plan = planner.plan_up(res, inv, masked, planner.UpFacts())
    text = json.dumps(plan.to_dict())
    assert KEY not in text
    ready = next(s for s in plan.steps if s.kind == "ready")
    assert ready.params["api_key"] == {"env": "MY_KEY", "var": "SPARKCTL_API_KEY", "file": "/etc/sparkctl/engine.env"}


def test_a_missing_key_variable_is_refused_by_name() -> None:
    roots = Roots.make(root=str(REPO), env={})
    inv = load_inventory(REPO / "inventory.yaml")
    res = resolve("ds41f-tp4-ring", roots, ("serve.api_key_env=MY_KEY",))
    with pytest.raises(SparkctlError, match="MY_KEY is not set"):
        render(res, inv, roots, secrets={})


def test_bind_sets_the_engines_host() -> None:
    _r, inv, all_ = _render((), reveal=False)
    assert "--host 0.0.0.0" in " ".join(all_.argv["spark-a"])
    _r, _i, fabric = _render(("serve.bind=fabric",), reveal=False)
    argv = fabric.argv["spark-a"]
    assert argv[argv.index("--host") + 1] == fabric.layout.ranks[0].host_ip
    _r, _i, mgmt = _render(("serve.bind=management",), reveal=False)
    argv = mgmt.argv["spark-a"]
    assert argv[argv.index("--host") + 1] == inv.node("spark-a").host
