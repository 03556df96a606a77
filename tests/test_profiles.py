"""Profiles: schema, extends chains, overlays, --set, provenance, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.errors import ConfigError, ProfileError
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots

BASE = """\
description: a test base
engine: {name: vllm, version: "1", image: img:1}
model:
  id: m
  served_name: served
  weights_path: /srv/m
  weights_format: fp8
  context_len_tokens: 4096
topology: {tp_size: 2, layout: pair}
laws:
  clock_cap_mhz: 2000
"""


def write(root: Path, name: str, text: str) -> Path:
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    p = root / "profiles" / f"{name}.yaml"
    p.write_text(text)
    return p


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    write(tmp_path, "base", BASE)
    return Roots.make(root=str(tmp_path), env={})


def test_every_bundled_profile_resolves(repo: Path) -> None:
    roots = Roots.make(env={})
    names = set(roots.all_profiles())
    assert {"ds41f-tp4-ring", "tensorfold-tp4-ring", "tensorfold-tp2", "vllm-tp2-fallback", "sglang-tp2",
            "llamacpp-1box", "tiny-llamacpp"} <= names
    for name in names:
        res = resolve(name, roots)
        assert res.profile.model.served_name


def test_bundled_figures_match_the_field_reports() -> None:
    roots = Roots.make(env={})
    ds = resolve("ds41f-tp4-ring", roots).profile
    assert (ds.topology.tp_size, ds.topology.layout, ds.laws.clock_cap_mhz) == (4, "ring", 2000)
    assert ds.laws.page_size_kib == 64 and ds.laws.memory_saver and ds.model.context_len_tokens == 1048576
    tf2 = resolve("tensorfold-tp2", roots).profile
    assert tf2.laws.clock_cap_mhz == 2100 and tf2.model.weights_format == "exl3-2.9bpw"
    assert tf2.thinking.request_fields == {"reasoning_effort": "high"}
    # fp8: vLLM 0.11.2, the pinned release, refuses nvfp4_ds_mla (its contract; tests/test_contracts.py)
    assert resolve("vllm-tp2-fallback", roots).profile.engine.args == ["--kv-cache-dtype", "fp8"]
    assert ds.laws.kernels.bad == {} and ds.laws.kernels.good == []  # the bundled kernels.yaml holds the lists


def test_extends_chain_and_explain(tmp_path: Path, roots: Roots) -> None:
    write(tmp_path, "mid", "extends: base\nlaws: {clock_cap_mhz: 2100}\nengine: {env: {A: '1'}}\n")
    write(tmp_path, "leaf", "extends: mid\nengine: {env: {B: '2'}}\n")
    res = resolve("leaf", roots, ["laws.clock_cap_mhz=2200"])
    assert res.profile.laws.clock_cap_mhz == 2200
    assert res.profile.engine.env == {"A": "1", "B": "2"}  # env merges key by key
    chain = res.explain("laws.clock_cap_mhz")
    assert [s.value for s in chain] == [2000, 2000, 2100, 2200]
    assert [s.source.kind for s in chain] == ["default", "parent", "parent", "cli"]
    assert chain[1].source.file.endswith("base.yaml") and chain[1].source.line == 11
    assert chain[2].source.file.endswith("mid.yaml") and chain[2].source.line == 2


def test_node_overlay_applies_to_one_node(tmp_path: Path, roots: Roots) -> None:
    write(tmp_path, "ov", "extends: base\nnodes:\n  spark-b:\n    engine: {args: ['--x']}\n    laws: {clock_cap_mhz: 2100}\n")
    res = resolve("ov", roots)
    assert res.profile.engine.args == []
    assert res.for_node("spark-b").engine.args == ["--x"]
    assert res.for_node("spark-b").laws.clock_cap_mhz == 2100
    assert res.explain("laws.clock_cap_mhz", node="spark-b")[-1].source.kind == "node"


BAD = [
    ("unknown key", "extends: base\nlaws:\n  clock_cap_mz: 2000\n", 3, "unknown key 'clock_cap_mz'", "clock_cap_mhz"),
    ("bad type", "extends: base\nlaws:\n  clock_cap_mhz: fast\n", 3, "valid integer", None),
    ("over-commit", "extends: base\nlaws: {gpu_memory_utilization: 0.95}\n", 2, "less than or equal to 0.92", None),
    ("bad engine", "extends: base\nengine: {name: tgi}\n", 2, "'tgi'", None),
    ("unknown overlay key", "extends: base\nnodes:\n  a:\n    model: {id: x}\n", 4, "unknown key 'model'", None),
    ("layout vs tp", "extends: base\ntopology: {tp_size: 4}\n", 2, "tp_size must be 2", None),
    ("cycle", "extends: cyc\n", 1, "cycle", None),
    ("relative weights", "extends: base\nmodel: {weights_path: srv/m}\n", 2, "absolute path", None),
    ("bad env name", "extends: base\nengine: {env: {'A B': x}}\n", 2, "not a valid shell name", None),
]


@pytest.mark.parametrize("name,text,line,words,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_profile_names_file_line_key(tmp_path: Path, roots: Roots, name: str, text: str, line: int,
                                         words: str, hint: str | None, sparkctl) -> None:
    path = write(tmp_path, "cyc" if name == "cycle" else "bad", text)
    prof = path.stem
    with pytest.raises(ProfileError) as exc:
        resolve(prof, roots)
    assert words in exc.value.message
    assert exc.value.ref.file == str(path) and exc.value.ref.line == line
    if hint:
        assert hint in (exc.value.hint or "")
    r = sparkctl("--root", str(tmp_path), "show", prof)
    assert r.code == 2 and "Traceback" not in r.err
    assert r.err.startswith(f"error: {path}:{line}: ") and len(r.err.strip().splitlines()) == 1


def test_set_errors_point_at_the_command_line(roots: Roots) -> None:
    with pytest.raises(ProfileError) as exc:
        resolve("base", roots, ["laws.clock_cap_mhz=999999"])
    assert exc.value.ref.key == "--set laws.clock_cap_mhz"
    with pytest.raises(ProfileError, match="unknown key 'nope'"):
        resolve("base", roots, ["laws.nope=1"])
    with pytest.raises(ProfileError, match="KEY=VALUE"):
        resolve("base", roots, ["laws.clock_cap_mhz"])


def test_user_profiles_override_bundled_ones(tmp_path: Path) -> None:
    write(tmp_path, "ds41f-tp4-ring", BASE.replace("a test base", "mine"))
    roots = Roots.make(root=str(tmp_path), env={})
    assert resolve("ds41f-tp4-ring", roots).profile.description == "mine"
    assert roots.all_profiles()["tensorfold-tp4-ring"].parent.parent != tmp_path  # the rest stay bundled


def test_unknown_profile_names_the_search_path(roots: Roots) -> None:
    with pytest.raises(ConfigError, match="no profile named 'nope'"):
        resolve("nope", roots)
    with pytest.raises(ConfigError, match="not valid"):
        resolve("../etc/passwd", roots)


def test_explain_cli(sparkctl) -> None:
    r = sparkctl("explain", "ds41f-tp4-ring-uncapped", "laws.clock_cap_mhz")
    assert r.code == 0
    assert r.out.splitlines()[-1].startswith("=> null  (profile ds41f-tp4-ring-uncapped ")
    r = sparkctl("explain", "ds41f-tp4-ring", "laws.clock_cap_mz")
    assert r.code == 2 and "did you mean 'laws.clock_cap_mhz'" in r.err


def test_schema_doc_is_generated_from_the_schema(repo: Path) -> None:
    from sparkctl.model.schemadoc import schema_markdown

    assert (repo / "docs" / "profile-schema.md").read_text() == schema_markdown(), \
        "docs/profile-schema.md is stale: run `sparkctl schema --markdown > docs/profile-schema.md`"
