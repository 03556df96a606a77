"""The nccl fact (parser on fixture files, the command's shape) and the nccl_version law."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.facts import nccl
from sparkctl.facts.probes import ProbeParseError
from sparkctl.facts.registry import ScriptContext
from sparkctl.facts.engine import EngineProbe
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws

from test_laws import DS, INV, ctx, healthy

FIX = Path(__file__).resolve().parent / "fixtures" / "spark"


@pytest.mark.parametrize("name,want", [
    ("nccl-torch-2.28.9-constructed.txt", (2, 28, 9)),
    ("nccl-torch-2.30.7-constructed.txt", (2, 30, 7)),
    ("nccl-libname-2.29.7-constructed.txt", (2, 29, 7)),
])
def test_parser_reads_the_fixtures(name: str, want: tuple[int, int, int]) -> None:
    assert nccl.parse_nccl((FIX / name).read_text()) == want


@pytest.mark.parametrize("text", ["2.30.7\n", "torch 2.30\n", "torch (2, 30, 7)\n", "", "torch 2.30.7\ntorch 2.28.9\n"])
def test_parser_refuses_what_it_does_not_know(text: str) -> None:
    with pytest.raises(ProbeParseError):
        nccl.parse_nccl(text)


def test_docker_command_asks_torch_in_the_image_quoted() -> None:
    img = "reg:5000/x/vllm:0.1;touch /tmp/pwn"
    cmd = nccl.NCCL.command(ScriptContext(INV.nodes[0], engine=EngineProbe("docker", img)), "")
    assert shlex.quote(img) in cmd and "--entrypoint python3" in cmd and "torch.cuda.nccl.version()" in cmd
    assert "--network none" in cmd and "libnccl.so.2" in cmd
    # a llama.cpp native binary has no interpreter to ask: the fact is not in the batch
    assert not nccl.NCCL.when(ScriptContext(INV.nodes[0], engine=EngineProbe("native", "/usr/bin/llama-server")))
    assert nccl.NCCL.when(ScriptContext(INV.nodes[0], engine=EngineProbe("native", "/opt/venv/bin/python3", "vllm")))


def verdicts(c: laws.Context) -> dict[str, laws.Verdict]:
    return {v.node: v for v in laws.judge(c) if v.law == "nccl_version"}


def ring_facts(version: tuple[int, ...] | None) -> dict:
    return {n: replace(healthy(n), nccl_version=version) for n in INV.names}


def test_ring_with_old_nccl_fails_and_names_the_variable() -> None:
    facts = ring_facts((2, 30, 7))
    facts["spark-c"] = replace(facts["spark-c"], nccl_version=(2, 28, 9))
    v = verdicts(ctx(facts=facts))
    assert v["spark-c"].failed and "NCCL_IB_SUBNET_AWARE_ROUTING" in v["spark-c"].fix and "2.30.7" in v["spark-c"].fix
    assert all(v[n].status == "ok" for n in INV.names if n != "spark-c")


@pytest.mark.parametrize("version,status", [((2, 31, 2), "ok"), ((2, 30, 6), "fail"), ((), "warn"), (None, "warn")])
def test_boundaries_and_unreadable(version: tuple[int, ...] | None, status: str) -> None:
    assert {v.status for v in verdicts(ctx(facts=ring_facts(version))).values()} == {status}


def test_a_pair_does_not_need_subnet_aware_routing() -> None:
    pair = resolve("vllm-tp2-fallback", Roots.make(env={})).profile
    assert pair.topology.layout != "ring"
    assert {v.status for v in verdicts(ctx(profile=pair, facts=ring_facts((2, 28, 9)))).values()} == {"ok"}


def test_a_waiver_marks_the_old_nccl_waived_and_only_the_old_one() -> None:
    facts = ring_facts((2, 30, 7))
    facts["spark-c"] = replace(facts["spark-c"], nccl_version=(2, 28, 9))
    v = verdicts(ctx(facts=facts, waivers={"nccl_version": laws.Waiver("nccl_version", "testing the hang")}))
    assert v["spark-c"].status == "waived" and "testing the hang" in v["spark-c"].fix
    assert all(v[n].status == "ok" for n in INV.names if n != "spark-c")
