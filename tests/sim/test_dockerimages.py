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


def test_the_containerd_store_reports_the_manifest_digest_and_shows_the_same_content(tmp_path: Path) -> None:
    """SIMULATED docker image stores: classic (ID = config digest) beside containerd (ID = manifest digest,
    moby daemon/containerd/image.go); the content digest (sparkctl.model.imageid) is equal on both, and a
    copy between the stores keeps it."""
    from sparkctl.model.imageid import content_command, store_command

    for n in ("a", "b"):
        (tmp_path / "nodes" / n / "run").mkdir(parents=True)
    (tmp_path / "nodes" / "b" / "state.json").write_text(json.dumps({"docker_store": "containerd"}))
    a = dockerimages.load_on_node(tmp_path, "a", "vllm-node:v0.11.2", layer_bytes=1 << 16)
    b = dockerimages.load_on_node(tmp_path, "b", "vllm-node:v0.11.2", layer_bytes=1 << 16)
    assert a["Id"] == b["Id"]  # the same build: the same config
    ids = {n: docker(tmp_path, n, "image", "inspect", "--format", "{{.Id}}", "vllm-node:v0.11.2").stdout.strip()
           for n in ("a", "b")}
    assert ids["a"].decode() == a["Id"] and ids["b"].decode() == dockerimages.manifest_digest(b) != a["Id"]
    assert docker(tmp_path, "b", "image", "inspect", a["Id"]).returncode == 1  # the config digest is not its ID
    assert b"io.containerd.snapshotter.v1" in docker(tmp_path, "b", "info", "--format",
                                                     "{{json .DriverStatus}}").stdout
    assert b"snapshotter" not in docker(tmp_path, "a", "info", "--format", "{{json .DriverStatus}}").stdout

    def sh(node: str, script: str) -> str:
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        (bindir / "docker").write_text(f"#!/bin/sh\nexec {sys.executable} -m sparkctl_sim.procshims docker \"$@\"\n")
        (bindir / "docker").chmod(0o755)
        env = {**os.environ, "SPARKCTL_SIM_RUN_DIR": str(tmp_path / "nodes" / node / "run"),
               "PATH": f"{bindir}:{os.environ['PATH']}"}
        r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    content = {n: sh(n, content_command("vllm-node:v0.11.2")) for n in ("a", "b")}
    assert content["a"] == content["b"] and content["a"].startswith("content:sha256:")
    assert (sh("a", store_command()), sh("b", store_command())) == ("store classic", "store containerd")
    # a copy from the classic store into the containerd store: another ID on arrival, the same content
    saved = docker(tmp_path, "a", "save", "vllm-node:v0.11.2").stdout
    dockerimages.load_on_node(tmp_path, "b", "vllm-node:v0.11.2", "rebuilt", layer_bytes=1 << 16)
    assert sh("b", content_command("vllm-node:v0.11.2")) != content["a"]
    assert docker(tmp_path, "b", "load", stdin=saved).returncode == 0
    assert sh("b", content_command("vllm-node:v0.11.2")) == content["a"]
