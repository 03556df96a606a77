"""Property tests: random and mutated YAML only ever gives a sparkctl error.

A reduced number of cases here; tools/fuzz_inputs.py runs >= 10,000.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.errors import SparkctlError
from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan.render import render
from tests.fuzzing import dump, load_example, mutate, strategies

REPO = Path(__file__).resolve().parent.parent
SCALARS, KEYS, TREE = strategies()
RING = load_example(REPO, "inventory.yaml")
PROFILE = load_example(REPO, "profiles/ds41f-tp4-ring.yaml")
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _inventory(text: str) -> None:
    try:
        loads_inventory(text, "fuzz.yaml")
    except SparkctlError as exc:
        assert exc.one_line()


@FAST
@given(st.text(max_size=300))
def test_random_text_as_inventory(text: str) -> None:
    _inventory(text)


@FAST
@given(TREE)
def test_random_tree_as_inventory(doc: object) -> None:
    _inventory(dump(doc))


@FAST
@given(st.lists(st.integers(0, 50), max_size=4), TREE)
def test_mutated_ring_inventory(path: list[int], value: object) -> None:
    _inventory(dump(mutate(RING, path, value)))


@FAST
@given(st.lists(st.integers(0, 50), max_size=4), TREE)
def test_mutated_profile_resolves_and_renders_or_errors(tmp_path_factory, path: list[int], value: object) -> None:
    root = tmp_path_factory.mktemp("fz")
    (root / "profiles").mkdir()
    (root / "profiles" / "fz.yaml").write_text(dump(mutate(PROFILE, path, value)))
    roots = Roots.make(root=str(root), env={})
    try:
        res = resolve("fz", roots)
        render(res, loads_inventory(dump(RING), "ring.yaml"), roots)
    except SparkctlError as exc:
        assert exc.one_line()
