"""End-to-end on the SIMULATED 4-node ring: an engine image whose NCCL predates 2.30.7.

The rendered ring environment sets NCCL_IB_SUBNET_AWARE_ROUTING=1, which an NCCL
older than 2.30.7 ignores silently (issue #13). Every node gets such a build of the
ds41f image (`sparkctl sim image load all --nccl 2.28.9`: another image ID, ENV
NCCL_VERSION=2.28.9; the same on every node, so image_identity stays green). Then:
`check` fails nccl_version naming the version, 2.30.7 and the fix; `up` refuses in
phase check; with the law waived the ring's first collective times out (the
simulated runtime's watchdog line) and `up` fails at readiness naming the rank; a
good build loaded on one node and `image sync --from` it makes the law green again.
The per-image-ID NCCL cache on the nodes never hides a change: a new image ID is
read afresh.

Simulated: the image store, the container's torch (its NCCL from the image's
NCCL_VERSION), the engine. Real: ssh, the nccl fact's command and cache, the laws,
the plan, the executor and `image sync` over the fabric.
"""

from __future__ import annotations

import json
import re

import pytest

from sparkctl.model.paths import NCCL_CACHE_DIR
from tests.sim.helpers import WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "ds41f-tp4-ring"
IMAGE = "ghcr.io/ds41f/ds41f-spark:1029"
OLD = "spark-c"


def check(sim, *args: str) -> tuple[int, list[dict]]:
    r = sim.sparkctl("-i", str(sim.inventory), "check", PROFILE, "--json", "--bandwidth", "0", *args)
    assert r.stdout, r.stderr
    return r.returncode, [v for v in json.loads(r.stdout)["verdicts"] if v["law"] == "nccl_version"]


def image_id(sim, node: str) -> str:
    r = sim.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def cache(sim, node: str) -> dict[str, str]:
    """The node's NCCL answers by image ID (sparkctl.facts.nccl: `ID.loaded`), as the version of the library
    each answer names."""
    r = sim.ssh(node, f"cd {NCCL_CACHE_DIR} && for f in *.loaded; do "
                      "printf '%s %s\\n' \"${f%.loaded}\" \"$(grep '^loaded ' \"$f\" | cut -d' ' -f2)\"; done")
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


@pytest.fixture(scope="module")
def ring(sim_ring):
    r = sim_ring.sparkctl("-i", str(sim_ring.inventory), "check", PROFILE, "--fix", "--bandwidth", "0", *WAIVE)
    assert r.returncode == 0, r.stdout + r.stderr  # the clock lock applied; everything else green
    return sim_ring


def test_simulated_old_nccl_image_fails_check_and_the_cache_does_not_hide_it(ring) -> None:
    code, vs = check(ring, *WAIVE)
    assert code == 0 and {v["status"] for v in vs} == {"ok"} and len(vs) == 4, vs
    assert all(v["observed"].startswith("NCCL 2.30.7 (loaded /") for v in vs), vs
    good = image_id(ring, OLD)
    assert cache(ring, OLD) == {good.removeprefix("sha256:"): "2.30.7"}  # the first check filled it

    r = ring.sparkctl("sim", "image", "load", "all", IMAGE, "--nccl", "2.28.9")
    assert r.returncode == 0 and r.stdout.count("(NCCL 2.28.9)") == 4, r.stdout + r.stderr
    old = image_id(ring, OLD)
    assert old != good  # a different build: a different image ID under the same tag

    code, vs = check(ring, *WAIVE)
    assert code == 4
    assert {v["node"] for v in vs if v["status"] == "fail"} == {"spark-a", "spark-b", "spark-c", "spark-d"}, vs
    v = next(v for v in vs if v["node"] == OLD)
    assert v["observed"].startswith("NCCL 2.28.9 (loaded /") and "2.30.7" in v["expected"], v
    assert "NCCL_IB_SUBNET_AWARE_ROUTING" in v["fix"] and "sparkctl image sync" in v["fix"], v
    # the new image ID was read afresh, not answered from the good image's cache entry
    assert cache(ring, OLD) == {good.removeprefix("sha256:"): "2.30.7", old.removeprefix("sha256:"): "2.28.9"}


def test_simulated_up_refuses_the_old_nccl_in_phase_check(ring) -> None:
    r = ring.sparkctl("-i", str(ring.inventory), "up", PROFILE, *WAIVE, timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "failed in phase check" in r.stderr and "first: nccl_version on spark-a: NCCL 2.28.9" in r.stderr, r.stderr
    assert "2.30.7" in r.stderr, r.stderr
    assert ring.ssh(OLD, "docker ps -q").stdout.strip() == ""  # nothing was started


def test_simulated_waived_old_nccl_times_out_the_first_collective_and_up_fails_at_readiness(ring) -> None:
    r = ring.sparkctl("-i", str(ring.inventory), "up", PROFILE, "--waive", "page_size", "--waive", "nccl_version",
                      "--reason", "SIMULATED: what the law prevents", timeout=400)
    try:
        assert r.returncode == 5, r.stdout + r.stderr
        err = r.stderr
        assert "phase ready" in err, err
        assert re.search(r"rank on spark-[a-d](, spark-[a-d])* exited before the endpoint was ready", err), err
        assert re.search(r"\[Rank \d\] Watchdog caught collective operation timeout", err), err
        assert "NCCL version 2.28.9" in err, err
    finally:
        ring.sparkctl("-i", str(ring.inventory), "down", timeout=300)


def test_simulated_a_good_build_synced_from_one_node_makes_nccl_version_green(ring) -> None:
    r = ring.sparkctl("sim", "image", "load", "spark-a", IMAGE, "--nccl", "2.30.7")
    assert r.returncode == 0, r.stdout + r.stderr
    good = image_id(ring, "spark-a")
    r = ring.sparkctl("-i", str(ring.inventory), "image", "sync", PROFILE, "--from", "spark-a", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "spark-b" in r.stdout and OLD in r.stdout and "spark-d" in r.stdout, r.stdout
    assert {image_id(ring, n) for n in ("spark-b", OLD, "spark-d")} == {good}
    code, vs = check(ring, *WAIVE)
    assert code == 0 and {v["status"] for v in vs} == {"ok"}, vs
    assert {v["observed"].split(" (")[0] for v in vs} == {"NCCL 2.30.7"}
    assert cache(ring, OLD)[good.removeprefix("sha256:")] == "2.30.7"  # a third ID, read afresh


def test_simulated_image_sync_again_keeps_the_verified_key_and_reprovisions_a_tampered_one(ring) -> None:
    """A second `image sync` verifies the key and known_hosts the first one put on the source instead of
    putting them again, and authorizes the key on the receivers again (a fresh expiry); a receiver whose line
    was removed gets it back, and a source whose key was removed gets it again."""
    from sparkctl.model.paths import IMAGE_SYNC_KEY, NODE_AUTHORIZED_KEYS

    inv = ("-i", str(ring.inventory))
    good = image_id(ring, "spark-a")
    assert ring.sparkctl("sim", "image", "load", OLD, IMAGE, "--nccl", "2.28.9").returncode == 0
    dry = ring.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", "--dry-run", check=True)
    assert "in place as provisioned (kept)" in dry.stdout and "put image sync's node-to-node key" not in dry.stdout, dry.stdout
    assert ring.ssh(OLD, f": > {NODE_AUTHORIZED_KEYS}").returncode == 0  # the grant is gone from spark-c
    r = ring.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", timeout=600, check=True)
    assert image_id(ring, OLD) == good, r.stdout + r.stderr

    assert ring.ssh("spark-a", f"rm -f {IMAGE_SYNC_KEY}").returncode == 0  # the key is gone from the source
    assert ring.sparkctl("sim", "image", "load", OLD, IMAGE, "--nccl", "2.28.9").returncode == 0
    dry = ring.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", "--dry-run", check=True)
    assert "to be put before the copy" in dry.stdout and "put image sync's node-to-node key" in dry.stdout, dry.stdout
    r = ring.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", timeout=600, check=True)
    assert image_id(ring, OLD) == good
    mode = ring.ssh("spark-a", f"stat -c %a {IMAGE_SYNC_KEY}; stat -c %a " + NODE_AUTHORIZED_KEYS)
    assert mode.stdout.split() == ["600"], mode.stdout  # the key 0600 on the source; spark-a has no grant file
    assert ring.ssh(OLD, "stat -c %a " + NODE_AUTHORIZED_KEYS).stdout.strip() == "600"


def test_simulated_community_image_loading_a_newer_nccl_than_torch_was_built_against_passes_and_serves(ring) -> None:
    """Issue #18 item 4: torch built against 2.27.5 whose libnccl.so.2 is a source-built 2.30.7 (the
    community's sm_121 image) passes nccl_version, naming the library it loads, and the ring serves;
    the reverse (torch built against 2.30.7 loading 2.27.5) fails."""
    r = ring.sparkctl("sim", "image", "load", "all", IMAGE, "--nccl", "2.30.7", "--torch-nccl", "2.27.5")
    assert r.returncode == 0 and r.stdout.count("torch built against 2.27.5") == 4, r.stdout + r.stderr
    code, vs = check(ring, *WAIVE)
    assert code == 0 and {v["status"] for v in vs} == {"ok"}, vs
    for v in vs:
        assert v["observed"].startswith("NCCL 2.30.7 (loaded /") and "torch built against 2.27.5" in v["observed"], v
        assert "/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7" in v["observed"], v
    r = ring.sparkctl("-i", str(ring.inventory), "up", PROFILE, *WAIVE, timeout=400)
    try:
        assert r.returncode == 0, r.stdout + r.stderr  # the engines run the 2.30.7 they load
    finally:
        ring.sparkctl("-i", str(ring.inventory), "down", timeout=300)

    r = ring.sparkctl("sim", "image", "load", OLD, IMAGE, "--nccl", "2.27.5", "--torch-nccl", "2.30.7")
    assert r.returncode == 0, r.stdout + r.stderr
    code, vs = check(ring, *WAIVE)
    assert code == 4, vs
    v = next(v for v in vs if v["node"] == OLD)
    assert v["status"] == "fail" and v["observed"].startswith("NCCL 2.27.5 (loaded /"), v
    assert "torch built against 2.30.7" in v["observed"] and "libnccl.so.2.27.5" in v["fix"], v
    assert {x["status"] for x in vs if x["node"] != OLD} == {"ok"}
