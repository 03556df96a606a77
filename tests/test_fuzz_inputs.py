"""Property tests: random and mutated YAML only ever gives a sparkctl error.

A few hundred cases here (the "sparkctl" hypothesis profile); `python3 tools/fuzz.py` runs them
under the "fuzz" profile, 10,000 inputs per property.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
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


def _inventory(text: str) -> None:
    try:
        loads_inventory(text, "fuzz.yaml")
    except SparkctlError as exc:
        assert exc.one_line()


@given(st.text(max_size=300))
def test_random_text_as_inventory(text: str) -> None:
    _inventory(text)


@given(TREE)
def test_random_tree_as_inventory(doc: object) -> None:
    _inventory(dump(doc))


@given(st.lists(st.integers(0, 50), max_size=4), TREE)
def test_mutated_ring_inventory(path: list[int], value: object) -> None:
    _inventory(dump(mutate(RING, path, value)))


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
