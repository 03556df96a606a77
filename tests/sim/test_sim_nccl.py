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
    assert old.returncode == 0 and nccl.parse_nccl(old.stdout) == (2, 28, 9), old.stderr
    assert new.returncode == 0 and nccl.parse_nccl(new.stdout) == (2, 30, 7), new.stderr
    assert gone.returncode == nccl.NO_IMAGE_RC


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
