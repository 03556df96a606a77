"""Input fuzzing strategies for tests/test_fuzz_inputs.py (run at scale by tools/fuzz.py).

Random and mutated YAML for profiles and inventories; the property is that
loading them raises only :class:`sparkctl.errors.SparkctlError`, never
anything else. Imports hypothesis lazily: it is a test dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def strategies() -> Any:
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
        st.text(max_size=30), st.sampled_from(["p0", "p1", "a:p0", "switch", "$(touch x)", "../..", "\x00", "ring"]),
    )
    keys = st.one_of(st.text(max_size=12), st.sampled_from(
        ["engine", "model", "topology", "laws", "serve", "nodes", "cables", "name", "host", "tp_size", "layout",
         "extends", "clock_cap_mhz", "env", "args", "served_name", "cluster", "defaults", "ports"]))
    tree = st.recursive(scalars, lambda ch: st.one_of(st.lists(ch, max_size=4), st.dictionaries(keys, ch, max_size=5)),
                        max_leaves=25)
    return scalars, keys, tree


def mutate(doc: Any, path: list[Any], value: Any) -> Any:
    """Replace the node at ``path`` (indices taken modulo the container size) with ``value``."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict) and doc:
        keys = sorted(doc, key=str)
        k = keys[head % len(keys)] if isinstance(head, int) else head
        out = dict(doc)
        out[k] = mutate(doc.get(k), rest, value)
        return out
    if isinstance(doc, list) and doc:
        i = head % len(doc) if isinstance(head, int) else 0
        out2 = list(doc)
        out2[i] = mutate(doc[i], rest, value)
        return out2
    return value


def dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return repr(doc)


def load_example(repo: Path, name: str) -> Any:
    return yaml.safe_load((repo / name).read_text())
