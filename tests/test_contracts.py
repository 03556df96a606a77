"""Every bundled profile's engine command line against the contract of the release it pins.

The contracts (sparkctl/plan/contracts/*.json) are extracted from the releases'
own source by tools/engine_contracts.py; this test never reads third-party code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import contracts
from sparkctl.plan.render import render

from helpers import INVENTORY_FOR

# Not public projects: no source to take a contract from, so they render with the warning.
NO_CONTRACT = {"ds41f", "tensorfold"}


def refusals(profile: str, roots: Roots, repo: Path) -> list[str]:
    """'profile: node: flag: message' for everything the pinned release would refuse."""
    res = resolve(profile, roots)
    rendering = render(res, load_inventory(repo / INVENTORY_FOR.get(profile, "inventory.yaml")), roots, secrets={})
    out = []
    for node, argv in rendering.argv.items():
        e = res.for_node(node).engine
        c = contracts.load(e.name, e.version)
        assert c is not None, f"{profile}: {e.name} {e.version} has no contract"
        out += [f"{profile}: node {node}: {p.flag}: {p.message}" for p in contracts.validate(c, argv)]
    return out


def test_the_profile_table_covers_every_bundled_profile() -> None:
    assert set(Roots.make(env={}).all_profiles()) == set(INVENTORY_FOR)


@pytest.mark.parametrize("profile", sorted(INVENTORY_FOR))
def test_every_bundled_profile_passes_its_engines_contract(profile: str, repo: Path) -> None:
    roots = Roots.make(env={})
    res = resolve(profile, roots)
    rendering = render(res, load_inventory(repo / INVENTORY_FOR[profile]), roots, secrets={})
    name = next(iter(rendering.argv))
    engine = res.for_node(name).engine
    if engine.name in NO_CONTRACT:
        assert contracts.load(engine.name, engine.version) is None
        assert any("not validated against" in w and engine.version in w for w in rendering.warnings)
        return
    problems = refusals(profile, roots, repo)
    assert problems == [], "\n".join(problems)
    assert rendering.warnings == ()


@pytest.mark.parametrize("base,args,flag,message", [
    ("vllm-tp2-fallback", ["--kv-cache-dtype", "nvfp4_ds_mla"], "--kv-cache-dtype",
     "invalid choice 'nvfp4_ds_mla' for --kv-cache-dtype; vLLM 0.11.2 accepts: auto, bfloat16, fp8, fp8_ds_mla, "
     "fp8_e4m3, fp8_e5m2, fp8_inc"),
    ("sglang-tp2", ["--kv-cache-dtype", "fp8"], "--kv-cache-dtype",
     "invalid choice 'fp8' for --kv-cache-dtype; SGLang 0.5.4 accepts: auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16"),
    ("llamacpp-1box", ["--kv-unifed"], "--kv-unifed", "unrecognized argument --kv-unifed: llama.cpp b6500 has no such flag"),
    ("tiny-llamacpp", ["--n-ctx", "64"], "--n-ctx", "unrecognized argument --n-ctx"),
])
def test_a_refused_flag_or_value_fails_with_profile_node_flag_and_message(
        base: str, args: list[str], flag: str, message: str, repo: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "refused.yaml").write_text(f"extends: {base}\nengine:\n  args: {json.dumps(args)}\n")
    roots = Roots.make(root=str(root), env={})
    res = resolve("refused", roots)
    rendering = render(res, load_inventory(repo / INVENTORY_FOR[base]), roots, secrets={})
    got = []
    for node, argv in rendering.argv.items():
        e = res.for_node(node).engine
        c = contracts.load(e.name, e.version)
        assert c is not None
        got += [f"refused: node {node}: {p.flag}: {p.message}" for p in contracts.validate(c, argv)]
    assert got, "the contract accepted a flag/value the release refuses"
    first_node = next(iter(rendering.argv))
    assert any(g.startswith(f"refused: node {first_node}: {flag}: {message}") for g in got), got
    assert any(message in w for w in rendering.warnings)  # render/plan/check print it too


def test_readiness_asks_only_for_what_the_rendered_flags_serve(repo: Path) -> None:
    roots = Roots.make(env={})
    for profile, metric in (("sglang-tp2", "sglang:generation_tokens_total"),
                            ("vllm-tp2-fallback", "vllm:generation_tokens_total")):
        res = resolve(profile, roots)
        rendering = render(res, load_inventory(repo / INVENTORY_FOR[profile]), roots, secrets={})
        head = next(iter(rendering.argv))
        e = res.for_node(head).engine
        assert contracts.readiness_metric(e.name, e.version, rendering.argv[head]) == metric
    sg = [a for a in rendering_argv("sglang-tp2", repo) if a != "--enable-metrics"]
    assert contracts.readiness_metric("sglang", "v0.5.4-sm121", sg) is None  # no /metrics without the flag
    c = contracts.load("sglang", "v0.5.4-sm121")
    assert c is not None and not contracts.serves_endpoint(c, "/metrics", sg)
    assert contracts.serves_endpoint(c, "/v1/models", sg) and contracts.serves_endpoint(c, "/health", sg)
    assert contracts.readiness_metric("llamacpp", "b6500", ["--metrics"]) == "llamacpp:tokens_predicted_total"
    assert contracts.readiness_metric("llamacpp", "b6500", []) is None
    assert contracts.readiness_metric("ds41f", "spark-ds41f-1023", []) == "ds41f_generation_tokens_total"


def rendering_argv(profile: str, repo: Path) -> list[str]:
    roots = Roots.make(env={})
    rendering = render(resolve(profile, roots), load_inventory(repo / INVENTORY_FOR[profile]), roots, secrets={})
    return list(next(iter(rendering.argv.values())))


@pytest.mark.parametrize("argv,want", [
    (["serve", "/m", "--kv_cache_dtype", "fp8"], []),  # FlexibleArgumentParser: _ is -
    (["serve", "/m", "--kv-cache-dtype=fp9"], ["invalid choice 'fp9'"]),
    (["serve", "/m", "--headless=1"], ["ignored explicit argument"]),
    (["serve", "/m", "--max-model-len"], ["expected a value"]),
    (["serve", "/m", "--served-model-name", "a", "b", "--port", "1"], []),  # nargs="+"
    (["serve", "/m", "extra"], ["unrecognized arguments: extra"]),
    (["/m"], ["expected the subcommand 'serve'"]),
    (["serve", "/m", "--kv-cache"], ["ambiguous option --kv-cache"]),  # argparse's allow_abbrev (default True)
    (["serve", "/m", "--kv-nope"], ["unrecognized argument --kv-nope"]),
    (["serve", "/m", "--no-enable-prefix-caching"], []),
])
def test_vllm_parser_rules(argv: list[str], want: list[str]) -> None:
    c = contracts.load("vllm", "v0.11.2-sm121")
    assert c is not None
    got = [p.message for p in contracts.validate(c, argv)]
    assert len(got) == len(want) and all(w in g for w, g in zip(want, got)), got


def test_sglang_abbreviations_follow_argparse() -> None:
    c = contracts.load("sglang", "v0.5.4-sm121")
    assert c is not None
    assert contracts.validate(c, ["--model-path", "m", "--tp", "2"]) == []  # unique prefix of --tp-size
    amb = contracts.validate(c, ["--model-path", "m", "--enable"])
    assert len(amb) == 1 and "ambiguous option --enable" in amb[0].message


def test_contracts_record_their_sources_and_every_mapping_has_one() -> None:
    for path in sorted(contracts.DATA.glob("*-*.json")):
        raw = json.loads(path.read_text())
        assert path.name == f"{raw['engine']}-{raw['version']}.json"
        assert raw["sources"], path.name
        for s in raw["sources"]:
            assert re.fullmatch(r"[0-9a-f]{64}", s["sha256"]) and s["file"] and s["archive"], s
        assert {"/health", "/v1/models"} <= set(raw["endpoints"]) or raw["engine"] == "llamacpp", path.name
    for (engine, version), m in contracts.version_map().items():
        assert m.reason and contracts.load(engine, version) is not None, (engine, version)


def test_engines_doc_lists_every_validated_version(repo: Path) -> None:
    doc = (repo / "docs" / "engines.md").read_text()
    for engine, version, upstream in contracts.validated_versions():
        assert f"`{version}`" in doc and upstream in doc, (engine, version)
