"""E2E on the SIMULATED pair: engine_present before up, image_identity, and image sync over the fabric.

Nodes start with NO engine image (a real Spark has none until its operator builds
or pulls one). Real: OpenSSH between the nodes, sparkctl's CLI, the plan runner.
Simulated: docker's image store (sparkctl_sim.dockerimages).
"""

from __future__ import annotations

import pytest

PROFILE = "tensorfold-tp2"
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:zig-2026.10"

pytestmark = pytest.mark.e2e


def test_missing_then_different_then_synced(sim_pair_bare) -> None:  # type: ignore[no-untyped-def]
    sim = sim_pair_bare
    inv = ["-i", str(sim.inventory)]
    r = sim.sparkctl(*inv, "up", PROFILE)
    assert r.returncode != 0
    assert "failed in phase check" in r.stderr and "engine_present" in r.stderr, r.stderr
    assert "build-and-copy.sh" in r.stderr and "docker pull" in r.stderr

    # SIMULATION: the operator built the image on each node, on different days (two builds of one tag)
    sim.sparkctl("sim", "image", "load", "spark-a", IMAGE, "--size-mib", "16", check=True)
    sim.sparkctl("sim", "image", "load", "spark-b", IMAGE, "--variant", "rebuilt", check=True)
    r = sim.sparkctl(*inv, "check", PROFILE, "--json")
    import json

    vs = [v for v in json.loads(r.stdout)["verdicts"] if v["law"] == "image_identity"]
    assert {v["node"]: v["status"] for v in vs} == {"spark-a": "ok", "spark-b": "fail"}
    assert "sparkctl image sync tensorfold-tp2 --from spark-a" in next(v["fix"] for v in vs if v["status"] == "fail")

    dry = sim.sparkctl(*inv, "image", "sync", PROFILE, "--dry-run", check=True)
    assert "docker save" in dry.stdout and "'docker load >&2 && c=$(docker image inspect" in dry.stdout and "@10.20." in dry.stdout
    before = sim.ssh("spark-b", f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout
    assert before == sim.ssh("spark-b", f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout
    r = sim.sparkctl(*inv, "image", "sync", PROFILE, check=True)
    assert "copied from spark-a to spark-b, verified by content digest" in r.stdout
    ids = {n: sim.ssh(n, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout.strip()
           for n in ("spark-a", "spark-b")}
    assert ids["spark-a"] == ids["spark-b"] != before.strip()
    r = sim.sparkctl(*inv, "check", PROFILE, "--json")
    vs = [v for v in json.loads(r.stdout)["verdicts"] if v["law"] in ("image_identity", "engine_present")]
    assert vs and all(v["status"] == "ok" for v in vs)
    again = sim.sparkctl(*inv, "image", "sync", PROFILE, check=True)
    assert "already has" in again.stdout
