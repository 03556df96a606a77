"""The nccl fact (parser on fixture files, the command's shape) and the nccl_version law."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.facts import nccl
from sparkctl.facts.engine import EngineProbe
from sparkctl.facts.registry import ProbeParseError, ScriptContext
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws

from helpers import INV, ctx, healthy

FIX = Path(__file__).resolve().parent / "fixtures" / "spark"


@pytest.mark.parametrize("name,want", [
    ("nccl-torch-2.28.9-constructed.txt", (2, 28, 9)),
    ("nccl-torch-2.30.7-constructed.txt", (2, 30, 7)),
    ("nccl-libname-2.29.7-constructed.txt", (2, 29, 7)),
])
def test_parser_reads_the_fixtures(name: str, want: tuple[int, int, int]) -> None:
    assert nccl.parse_nccl((FIX / name).read_text()).version == want


@pytest.mark.parametrize("name,version,torch,library", [
    ("nccl-loaded-2.30.7-torch-2.27.5-constructed.txt", (2, 30, 7), (2, 27, 5),
     "/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7"),
    ("nccl-loaded-2.27.5-torch-2.30.7-constructed.txt", (2, 27, 5), (2, 30, 7),
     "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"),
])
def test_the_loaded_library_wins_over_what_torch_was_built_against(name: str, version: tuple, torch: tuple,
                                                                   library: str) -> None:
    r = nccl.parse_nccl((FIX / name).read_text())
    assert (r.version, r.torch, r.library, r.how) == (version, torch, library, "loaded")


def test_two_mapped_libraries_count_the_older_and_a_silent_one_is_unreadable() -> None:
    r = nccl.parse_nccl("torch 2.30.7\nloaded 2.30.7 /a/libnccl.so.2\nloaded 2.28.9 /b/libnccl.so.2.28.9\n")
    assert (r.version, r.library) == ((2, 28, 9), "/b/libnccl.so.2.28.9")
    with pytest.raises(ProbeParseError, match="does not answer"):
        nccl.parse_nccl("torch 2.30.7\nloaded unknown /a/libnccl.so.2\n")
    assert nccl.parse_nccl("torch 2.30.7\n").how == "torch"  # nothing mapped: a static NCCL


@pytest.mark.parametrize("text", ["2.30.7\n", "torch 2.30\n", "torch (2, 30, 7)\n", "", "torch 2.30.7\ntorch 2.28.9\n",
                                  "torch 2.30.7\nloaded 2.30.7 relative/libnccl.so.2\n", "lib 2.30.7\nlib 2.28.9\n"])
def test_parser_refuses_what_it_does_not_know(text: str) -> None:
    with pytest.raises(ProbeParseError):
        nccl.parse_nccl(text)


def test_docker_command_asks_torch_in_the_image_quoted() -> None:
    img = "reg:5000/x/vllm:0.1;touch /tmp/pwn"
    cmd = nccl.NCCL.command(ScriptContext(INV.nodes[0], engine=EngineProbe("docker", img)), "")
    assert shlex.quote(img) in cmd and "--entrypoint python3" in cmd and "torch.cuda.nccl.version()" in cmd
    assert "--network none" in cmd and "libnccl.so.2" in cmd
    assert "/proc/self/maps" in cmd and "ncclGetVersion" in cmd and "\\" not in nccl.TORCH_CALL
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


def test_the_verdict_names_the_loaded_library_and_what_torch_was_built_against() -> None:
    """The community-style image: torch built against 2.27.5, the process loads 2.30.7 (passes); the reverse fails."""
    facts = {n: replace(healthy(n), nccl_version=(2, 30, 7), nccl_torch=(2, 27, 5),
                        nccl_library="/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7") for n in INV.names}
    facts["spark-c"] = replace(facts["spark-c"], nccl_version=(2, 27, 5), nccl_torch=(2, 30, 7),
                               nccl_library="/opt/venv/nvidia/nccl/lib/libnccl.so.2")
    v = verdicts(ctx(facts=facts))
    assert v["spark-a"].status == "ok" and v["spark-a"].observed == (
        "NCCL 2.30.7 (loaded /usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7; torch built against 2.27.5)")
    assert v["spark-c"].failed and "/opt/venv/nvidia/nccl/lib/libnccl.so.2" in v["spark-c"].observed
    assert "torch built against 2.30.7" in v["spark-c"].observed and "NCCL_IB_SUBNET_AWARE_ROUTING" in v["spark-c"].fix


def test_the_python_runs_and_reads_the_library_it_mapped(tmp_path: Path) -> None:
    """TORCH_CALL itself, with a real Python, a stand-in torch and a real shared object (SIMULATED image fs)."""
    import subprocess
    import sys

    from sparkctl_sim import imagefs

    site = imagefs.site_packages(tmp_path, "sha256:" + "c" * 64, {"nccl": "2.30.7", "torch_nccl": "2.27.5"}, {})
    r = subprocess.run([sys.executable, "-c", nccl.TORCH_CALL], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    got = nccl.parse_nccl(r.stdout)
    assert (got.version, got.torch) == ((2, 30, 7), (2, 27, 5)), r.stdout
    assert got.library is not None and got.library.endswith("usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7")
