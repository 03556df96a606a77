"""SIMULATED image store: `sparkctl sim image load --nccl X.Y.Z` is another build (another image ID) whose
config carries ENV NCCL_VERSION, which the simulated container's torch and engine read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl_sim import dockerimages


def test_a_build_with_another_nccl_has_another_id_and_the_version_in_its_env(tmp_path: Path) -> None:
    plain = dockerimages.load_on_node(tmp_path, "a", "img:1", layer_bytes=1 << 16)
    old = dockerimages.load_on_node(tmp_path, "b", "img:1", layer_bytes=1 << 16, nccl="2.28.9")
    again = dockerimages.load_on_node(tmp_path, "c", "img:1", layer_bytes=1 << 16, nccl="2.28.9")
    assert plain["Id"] != old["Id"] == again["Id"]  # deterministic: the same build on two nodes is one ID
    assert json.loads(old["config_json"])["config"]["Env"] == ["NCCL_VERSION=2.28.9"]
    assert json.loads(plain["config_json"])["config"]["Env"] == []


@pytest.mark.parametrize("bad", ["2.28", "2.28.9-1", "v2.28.9", "2.28.9+cuda13.0", "$(id)"])
def test_only_plain_versions_are_accepted(bad: str) -> None:
    with pytest.raises(ValueError):
        dockerimages.nccl_config(bad)
