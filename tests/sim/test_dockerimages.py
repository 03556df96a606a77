"""The simulated docker's image store: IDs, inspect, save | load, pull, and run refusing what is not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from sparkctl_sim import dockerimages

FLAGS = ["--network", "host", "--ipc", "host", "--device", "/dev/infiniband", "--ulimit", "memlock=-1"]


def docker(root: Path, node: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "SPARKCTL_SIM_RUN_DIR": str(root / "nodes" / node / "run")}
    return subprocess.run([sys.executable, "-m", "sparkctl_sim.procshims", "docker", *args], env=env,
                          input=stdin, capture_output=True, timeout=60)


def test_ids_inspect_save_load_and_run(tmp_path: Path) -> None:
    for n in ("a", "b"):
        (tmp_path / "nodes" / n / "run").mkdir(parents=True)
    a = dockerimages.load_on_node(tmp_path, "a", "vllm-node:v0.11.2", layer_bytes=3 << 20)
    other = dockerimages.make_image("vllm-node:v0.11.2", "rebuilt", layer_bytes=3 << 20)
    assert a["Id"] != other["Id"]  # another build of the same tag: another ID
    assert a["Id"] == dockerimages.make_image("vllm-node:v0.11.2", layer_bytes=3 << 20)["Id"]

    r = docker(tmp_path, "a", "image", "inspect", "--format", "{{.Id}}", "vllm-node:v0.11.2")
    assert r.returncode == 0 and r.stdout.decode().strip() == a["Id"]
    (view,) = json.loads(docker(tmp_path, "a", "image", "inspect", "vllm-node:v0.11.2").stdout)
    assert view["RepoTags"] == ["vllm-node:v0.11.2"] and view["RepoDigests"] == [] and view["Id"] == a["Id"]
    r = docker(tmp_path, "b", "image", "inspect", "vllm-node:v0.11.2")
    assert r.returncode == 1 and b"Error response from daemon: No such image: vllm-node:v0.11.2" in r.stderr

    r = docker(tmp_path, "b", "run", "--rm", *FLAGS, "vllm-node:v0.11.2", "true")
    assert r.returncode == 125 and b"Unable to find image 'vllm-node:v0.11.2' locally" in r.stderr
    assert b"pull access denied for vllm-node" in r.stderr
    assert docker(tmp_path, "b", "pull", "vllm-node:v0.11.2").returncode == 1  # built locally: no registry

    saved = docker(tmp_path, "a", "save", "vllm-node:v0.11.2").stdout
    assert len(saved) > 3 << 20  # the layer's bytes really stream
    tar_path = tmp_path / "x.tar"
    tar_path.write_bytes(saved)
    with tarfile.open(tar_path) as t:
        assert json.loads(t.extractfile("manifest.json").read())[0]["RepoTags"] == ["vllm-node:v0.11.2"]
    r = docker(tmp_path, "b", "load", stdin=saved)
    assert r.returncode == 0 and r.stdout.decode() == "Loaded image: vllm-node:v0.11.2\n"
    r = docker(tmp_path, "b", "image", "inspect", "--format", "{{.Id}}", "vllm-node:v0.11.2")
    assert r.stdout.decode().strip() == a["Id"]
    assert docker(tmp_path, "b", "run", "--rm", *FLAGS, "vllm-node:v0.11.2", "true").returncode == 0

    corrupt = saved.replace(saved[-(2 << 20):-(2 << 20) + 16], b"x" * 16)
    r = docker(tmp_path, "b", "load", stdin=corrupt)
    assert r.returncode == 1 and b"invalid diffID" in r.stderr


def test_pull_of_a_published_digest(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "a" / "run").mkdir(parents=True)
    digest = dockerimages.publish(tmp_path, "ghcr.io/org/img:1", layer_bytes=1024)
    ref = f"ghcr.io/org/img@{digest}"
    assert docker(tmp_path, "a", "pull", ref).returncode == 0
    r = docker(tmp_path, "a", "image", "inspect", "--format", "{{.Id}}", ref)
    assert r.returncode == 0 and r.stdout.decode().startswith("sha256:")
    assert docker(tmp_path, "a", "pull", "ghcr.io/org/img@sha256:" + "0" * 64).returncode == 1
