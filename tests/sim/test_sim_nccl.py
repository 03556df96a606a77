"""The simulated NCCL per image: sparkctl's nccl fact read through the simulated docker, and
the simulated engine on a ring with an NCCL older than 2.30.7 (subnet-aware routing ignored)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.facts import nccl
from sparkctl.facts.engine import EngineProbe
from sparkctl.facts.registry import ScriptContext
from sparkctl.model.inventory import load_inventory
from sparkctl_sim import dockerimages
from sparkctl_sim.engines import runtime

REPO = Path(__file__).resolve().parents[2]
NODE = load_inventory(REPO / "inventory.yaml").nodes[0]


def fact(root: Path, ref: str) -> subprocess.CompletedProcess[str]:
    """The nccl fact's own command, with `docker` the simulated one on node a."""
    body = nccl.NCCL.command(ScriptContext(NODE, engine=EngineProbe("docker", ref)), "")
    shell = ('have() { command -v "$1" >/dev/null 2>&1; }; '
             f'docker() {{ {sys.executable} -m sparkctl_sim.procshims docker "$@"; }}; ' + body)
    env = {**os.environ, "SPARKCTL_SIM_RUN_DIR": str(root / "nodes" / "a" / "run")}
    return subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True, timeout=120)


def test_the_fact_reads_each_images_nccl_through_the_simulated_docker(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "a" / "run").mkdir(parents=True)
    store = dockerimages.Images(tmp_path / "nodes" / "a" / "docker-images")
    store.add(dockerimages.make_image("old:1", config={"Env": ["NCCL_VERSION=2.28.9"]}, layer_bytes=1 << 16))
    store.add(dockerimages.make_image("new:1", layer_bytes=1 << 16))
    old, new, gone = fact(tmp_path, "old:1"), fact(tmp_path, "new:1"), fact(tmp_path, "absent:1")
    assert old.returncode == 0 and nccl.parse_nccl(old.stdout).version == (2, 28, 9), old.stderr
    assert new.returncode == 0 and nccl.parse_nccl(new.stdout).version == (2, 30, 7), new.stderr
    assert gone.returncode == nccl.NO_IMAGE_RC


def test_the_fact_reads_the_library_the_process_maps_not_what_torch_was_built_against(tmp_path: Path) -> None:
    """SIMULATED community-style image (torch built against 2.27.5, torch's libnccl.so.2 a symlink to a
    source-built 2.30.7) and the reverse; the simulated engine runs what it loads, too."""
    (tmp_path / "nodes" / "a" / "run").mkdir(parents=True)
    dockerimages.load_on_node(tmp_path, "a", "community:1", layer_bytes=1 << 16, nccl="2.30.7", torch_nccl="2.27.5")
    dockerimages.load_on_node(tmp_path, "a", "reverse:1", layer_bytes=1 << 16, nccl="2.27.5", torch_nccl="2.30.7")
    community, reverse = fact(tmp_path, "community:1"), fact(tmp_path, "reverse:1")
    c, r = nccl.parse_nccl(community.stdout), nccl.parse_nccl(reverse.stdout)
    assert (c.version, c.torch) == ((2, 30, 7), (2, 27, 5)), community.stdout + community.stderr
    assert c.library is not None and c.library.endswith("/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7")
    assert (r.version, r.torch) == ((2, 27, 5), (2, 30, 7)), reverse.stdout + reverse.stderr
    assert r.library is not None and r.library.endswith("/libnccl.so.2.27.5")


class _Cfg:
    def __init__(self, world: int) -> None:
        self.world_size = world


@pytest.mark.parametrize("world,version,ignored", [
    (4, "2.28.9", True), (4, "2.30.7", False), (4, None, False), (2, "2.28.9", False),
])
def test_old_nccl_on_a_ring_ignores_the_variable(world: int, version: str | None, ignored: bool) -> None:
    env = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1", **({"NCCL_VERSION": version} if version else {})}
    assert runtime.subnet_routing_ignored(_Cfg(world), env) is ignored  # type: ignore[arg-type]
    assert not runtime.subnet_routing_ignored(_Cfg(4), {"NCCL_VERSION": "2.28.9"})  # type: ignore[arg-type]


def test_the_simulated_engine_runs_the_nccl_its_torch_loaded(tmp_path: Path) -> None:
    """NCCL prints its own version ("NCCL version 2.30.7+cuda13.0"): the library mapped, not the image's env."""
    from sparkctl_sim import imagefs

    site = imagefs.site_packages(tmp_path, "sha256:" + "d" * 64, {"nccl": "2.30.7", "torch_nccl": "2.27.5"}, {})
    code = "from sparkctl_sim.engines import runtime; print(runtime.image_nccl({'NCCL_VERSION': '2.27.5'}))"
    pkgs = str(REPO)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{pkgs}"})
    assert r.returncode == 0 and r.stdout.strip() == "2.30.7", r.stdout + r.stderr
