"""E2E on the SIMULATED pair: a GX10-style node's two-lane root port (pcie_link), and two nodes on
different docker image stores (image_identity, image sync).

Issue #18 items 5 and 10. Simulated: lspci (the CX-7 functions and their root ports; a GX10-style
node has `pcie.root_ports.0002.width=2`, NVIDIA developer forum thread 367853) and docker's two image
stores (the containerd store reports the manifest digest as the image ID, moby
daemon/containerd/image.go). Real: ssh, the probe batch and its shell, the laws, `image sync`'s plan,
its node-to-node copy over the fabric and its verification on the receiver.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

PROFILE = "tensorfold-tp2"
IMAGE = "ghcr.io/tensorfold/tensorfold-spark:zig-2026.10"


def verdicts(sim, law: str) -> dict[tuple[str, str], dict]:  # type: ignore[no-untyped-def]
    r = sim.sparkctl("-i", str(sim.inventory), "check", PROFILE, "--json", "--bandwidth", "0")
    assert r.stdout, r.stderr
    return {(v["node"], v.get("subject") or ""): v for v in json.loads(r.stdout)["verdicts"] if v["law"] == law}


def image_id(sim, node: str) -> str:  # type: ignore[no-untyped-def]
    r = sim.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_simulated_gx10_two_lane_root_port_passes_and_a_real_downgrade_still_fails(sim_pair_bare) -> None:  # type: ignore[no-untyped-def]
    sim = sim_pair_bare
    sim.sparkctl("sim", "set", "spark-b", "pcie.root_ports.0002.width=2", check=True)
    vs = verdicts(sim, "pcie_link")
    b = {bdf: v for (n, bdf), v in vs.items() if n == "spark-b"}
    assert {v["status"] for v in b.values()} == {"ok"}, b
    for bdf in ("0002:01:00.0", "0002:01:00.1"):
        assert b[bdf]["observed"] == "32 GT/s x2" and "upstream port 0002:00:00.0" in b[bdf]["expected"], b[bdf]
    assert b["0000:01:00.0"]["observed"] == "32 GT/s x4"
    # the GX10's function really shows pciutils' mark (what sparkctl failed before)
    lnk = sim.ssh("spark-b", "lspci -vv -s 0002:01:00.0 | grep LnkSta:").stdout
    assert "Width x2 (downgraded)" in lnk, lnk

    # a real downgrade: spark-a's slots give x4, its functions train at x2
    sim.sparkctl("sim", "set", "spark-a", "pcie.width=2", check=True)
    vs = verdicts(sim, "pcie_link")
    a = {bdf: v for (n, bdf), v in vs.items() if n == "spark-a"}
    assert {v["status"] for v in a.values()} == {"fail"}, a
    assert a["0000:01:00.0"]["expected"].startswith("32 GT/s x4") and "AC" in a["0000:01:00.0"]["fix"]
    assert {v["status"] for (n, _), v in vs.items() if n == "spark-b"} == {"ok"}
    sim.sparkctl("sim", "set", "spark-a", "pcie.width=4", check=True)


def test_simulated_nodes_on_two_image_stores_agree_on_one_build_and_image_sync_verifies_by_content(  # type: ignore[no-untyped-def]
        sim_pair_bare) -> None:
    sim = sim_pair_bare
    inv = ("-i", str(sim.inventory))
    sim.sparkctl("sim", "set", "spark-b", "docker_store=containerd", check=True)
    assert "io.containerd.snapshotter.v1" in sim.ssh("spark-b", "docker info").stdout
    # SIMULATION: the operator built the same image on both nodes
    sim.sparkctl("sim", "image", "load", "all", IMAGE, check=True)
    assert image_id(sim, "spark-a") != image_id(sim, "spark-b")  # config digest vs manifest digest
    vs = verdicts(sim, "image_identity")
    assert {v["status"] for v in vs.values()} == {"ok"}, vs
    assert "containerd store" in vs[("spark-b", IMAGE)]["observed"], vs

    # another build on the containerd node: a different image, whatever the IDs say
    sim.sparkctl("sim", "image", "load", "spark-b", IMAGE, "--variant", "rebuilt", check=True)
    vs = verdicts(sim, "image_identity")
    assert (vs[("spark-a", IMAGE)]["status"], vs[("spark-b", IMAGE)]["status"]) == ("ok", "fail"), vs
    assert f"sparkctl image sync {PROFILE} --from spark-a" in vs[("spark-b", IMAGE)]["fix"]

    r = sim.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "copied from spark-a to spark-b, verified by content digest" in r.stdout, r.stdout
    assert image_id(sim, "spark-b").startswith("sha256:") and image_id(sim, "spark-b") != image_id(sim, "spark-a")
    vs = verdicts(sim, "image_identity")
    assert {v["status"] for v in vs.values()} == {"ok"}, vs
    again = sim.sparkctl(*inv, "image", "sync", PROFILE, check=True)
    assert "already has" in again.stdout, again.stdout
