"""engine_present and image_identity: the engine fact's command and parser, and the laws over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.facts.batch import build_script, parse_batch
from sparkctl.facts.engine import ENGINE, EngineProbe, parse_engine
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.facts.registry import ProbeParseError
from sparkctl.model.inventory import load_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws
from sparkctl.plan.laws.images import engine_target

REPO = Path(__file__).resolve().parent.parent
INV = load_inventory(REPO / "inventory.yaml")
ROOTS = Roots.make(env={})
DS = resolve("ds41f-tp4-ring", ROOTS).profile
LLAMA = resolve("llamacpp-1box", ROOTS).profile
TINY = resolve("tiny-llamacpp", ROOTS).profile
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def verdicts(law_id: str, profile, found: dict[str, str | None]) -> list[laws.Verdict]:
    facts = {n: NodeFacts(node=n, engine_found=v) for n, v in found.items()}
    ctx = laws.Context(profile=profile, inventory=INV, nodes=tuple(found), facts=facts, profile_name="P")
    law = laws.by_id(law_id)
    assert law is not None
    return law.check(ctx)


def section(stdout_body: str, rc: int) -> str:
    return (f"@@sparkctl:manifest:engine@@\n@@sparkctl:section:engine@@\n{stdout_body}\n"
            f"@@sparkctl:rc:engine:{rc}@@\n@@sparkctl:done@@\n")


def test_what_the_fact_looks_for_comes_from_the_profile() -> None:
    assert engine_target(DS) == ("docker", "ghcr.io/ds41f/ds41f-spark:1029", None)
    assert engine_target(LLAMA) == ("native", "llama-server", None)
    assert engine_target(TINY) == ("native", "python3", "llama_cpp.server")


def test_the_batch_asks_docker_for_the_image_id_quoted() -> None:
    node = INV.node(INV.names[0])
    script = build_script(node, engine=EngineProbe("docker", "x'; rm -rf /"))
    assert "docker image inspect --format '{{.Id}}' 'x'\"'\"'; rm -rf /'" in script
    assert "section:engine" not in build_script(node)  # only when asked


def test_parse_and_exit_codes() -> None:
    assert parse_engine(A + "\n") == A
    assert parse_engine("/usr/local/bin/llama-server\n") == "/usr/local/bin/llama-server"
    with pytest.raises(ProbeParseError):
        parse_engine("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
    assert parse_batch("n", section(A, 0)).engine_found == A
    assert parse_batch("n", section("", 3)).engine_found == ""  # docker: No such image
    f = parse_batch("n", section("", 127))
    assert f.engine_found is None and "engine" in f.not_available
    f = parse_batch("n", section("Cannot connect to the Docker daemon", 1))
    assert f.engine_found is None and "Docker daemon" in f.unreadable["engine"]
    assert ENGINE.key == "engine"


def test_a_missing_image_fails_with_the_build_or_copy_fix() -> None:
    vs = verdicts("engine_present", DS, {"spark-a": A, "spark-b": ""})
    assert [v.status for v in vs] == ["ok", "fail"]
    assert "sparkctl image sync P --from spark-a" in vs[1].fix
    assert "build-and-copy.sh" in vs[1].fix and "docker pull" in vs[1].fix


def test_a_missing_llama_server_says_it_is_not_packaged() -> None:
    (v,) = verdicts("engine_present", LLAMA, {"spark-a": ""})
    assert v.status == "fail" and "not packaged by Debian or DGX OS: build llama.cpp" in v.fix


def test_different_ids_for_one_tag_fail_the_odd_node_with_image_sync() -> None:
    vs = {v.node: v for v in verdicts("image_identity", DS, {"spark-a": A, "spark-b": B, "spark-c": A, "spark-d": ""})}
    assert vs["spark-a"].status == vs["spark-c"].status == "ok"
    assert vs["spark-b"].status == "fail" and "sparkctl image sync P --from spark-a" in vs["spark-b"].fix
    assert "spark-d" not in vs  # a missing image is engine_present's verdict
    assert {v.status for v in verdicts("image_identity", DS, {"spark-a": A, "spark-b": A})} == {"ok"}
    assert verdicts("image_identity", LLAMA, {"spark-a": "/usr/bin/llama-server"}) == []


def test_a_tie_takes_the_first_nodes_build() -> None:
    vs = {v.node: v.status for v in verdicts("image_identity", DS, {"spark-a": B, "spark-b": A})}
    assert vs == {"spark-a": "ok", "spark-b": "fail"}


# --- image identity across Docker's classic and containerd image stores (issue #18 item 10) ---------

C1, C2 = "content:sha256:" + "1" * 64, "content:sha256:" + "2" * 64
CLASSIC_ID, CONTAINERD_ID = A, B  # the same build: the config digest on one store, the manifest digest on the other


def identity(found: dict[str, tuple[str, str | None, str]]) -> dict[str, laws.Verdict]:
    """node -> (image ID, content digest or None, store)."""
    from sparkctl.facts.engine import ImageContent

    facts = {n: NodeFacts(node=n, engine_found=iid, image=ImageContent(c, st)) for n, (iid, c, st) in found.items()}
    ctx = laws.Context(profile=DS, inventory=INV, nodes=tuple(found), facts=facts, profile_name="P")
    law = laws.by_id("image_identity")
    assert law is not None
    return {v.node: v for v in law.check(ctx)}


def test_one_build_on_two_stores_is_the_same_image() -> None:
    vs = identity({"spark-a": (CLASSIC_ID, C1, "classic"), "spark-b": (CONTAINERD_ID, C1, "containerd")})
    assert {v.status for v in vs.values()} == {"ok"}, vs
    assert "containerd store" in vs["spark-b"].observed and "classic store" in vs["spark-a"].observed


def test_two_builds_differ_even_on_one_store_and_across_stores() -> None:
    vs = identity({"spark-a": (A, C1, "classic"), "spark-b": (A, C2, "containerd"), "spark-c": (B, C1, "classic")})
    assert (vs["spark-a"].status, vs["spark-b"].status, vs["spark-c"].status) == ("ok", "fail", "ok")
    assert "sparkctl image sync P --from spark-a" in vs["spark-b"].fix and "content digest" in vs["spark-b"].fix


def test_ids_from_two_stores_are_never_compared_the_law_refuses_naming_both() -> None:
    vs = identity({"spark-a": (A, None, "classic"), "spark-b": (B, C1, "containerd")})
    assert vs["spark-a"].observed == "classic store"
    assert {v.status for v in vs.values()} == {"fail"}
    fix = vs["spark-a"].fix
    assert "spark-a (classic store)" in fix and "spark-b (containerd store)" in fix, fix


def test_the_image_fact_reads_content_and_store_quoted() -> None:
    from sparkctl.facts.engine import IMAGE, ImageContent, parse_image

    assert parse_image(f"{C1}\nstore containerd\n") == ImageContent(C1, "containerd")
    assert parse_image("content unreadable\nstore classic\n") == ImageContent(None, "classic")
    for bad in ("", C1, f"{C1}\nstore zfs\n", "content:sha256:xyz\nstore classic\n"):
        with pytest.raises(ProbeParseError):
            parse_image(bad)
    node = INV.node(INV.names[0])
    script = build_script(node, engine=EngineProbe("docker", "x'; rm -rf /"))
    assert "sec image;" in script and "io.containerd.snapshotter.v1" in script
    assert "docker image inspect --format '{{json .RootFS.Layers}}" in script
    assert "'x'\"'\"'; rm -rf /'" in script
    assert "sec image;" not in build_script(node, engine=EngineProbe("native", "llama-server"))
    assert IMAGE.key == "image"
