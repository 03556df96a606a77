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
    assert "docker save" in dry.stdout and f"'sparkctl-image-load {IMAGE}'" in dry.stdout and "@10.20." in dry.stdout
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


def _node_to_node(sim, command: str):  # type: ignore[no-untyped-def]
    """``command`` sent from spark-a to spark-b's fabric address with image sync's key.

    The operator's copy of the key, put on spark-a for this probe: what is judged is what
    spark-b's sshd accepts, also once sparkctl took the key's files off spark-a."""
    import base64
    import hashlib
    import shlex
    from pathlib import Path

    from sparkctl.model.inventory import load_inventory
    from sparkctl.ops import nodessh

    inv = load_inventory(sim.inventory)
    tag = hashlib.sha256(str(Path(inv.file).resolve()).encode()).hexdigest()[:10]  # sparkctl.ops.localstate
    local = Path(sim.env["XDG_STATE_HOME"]) / "sparkctl" / "clusters" / f"{inv.name}-{tag}" / "id_image_sync"
    b64 = base64.b64encode(local.read_bytes()).decode()
    peer = inv.node("spark-b")
    addr = nodessh.fabric_address_from(inv, "spark-a", "spark-b")
    argv = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
            "-i", "/tmp/sparkctl-probe-key", "-p", str(peer.ssh_port), f"{peer.ssh_user}@{addr}", command]
    return sim.ssh("spark-a", f"umask 077; printf %s {b64} | base64 -d > /tmp/sparkctl-probe-key && "
                              f"{shlex.join(argv)} </dev/null; rc=$?; rm -f /tmp/sparkctl-probe-key; exit $rc")


def _accepted(r) -> bool:  # type: ignore[no-untyped-def]
    """sshd let the key in and the gate answered (it refuses everything _node_to_node sends here)."""
    if r.returncode == 255 and "Permission denied" in r.stderr:
        return False
    assert r.returncode == 126 and "sparkctl image-sync key: refused" in r.stderr, (r.returncode, r.stderr)
    return True


def test_simulated_node_key_runs_only_the_load_expires_and_is_revoked(sim_pair_bare) -> None:  # type: ignore[no-untyped-def]
    """Real OpenSSH on both nodes: image sync's key reaches spark-b's gate and nothing else; sshd refuses it
    once its expiry-time passed; `image revoke` and `fabric restore` take it away; image sync still copies."""
    sim = sim_pair_bare
    inv = ["-i", str(sim.inventory)]
    from sparkctl.model.paths import IMAGE_SYNC_KEY, NODE_AUTHORIZED_KEYS

    def resync(variant: str) -> None:
        sim.sparkctl("sim", "image", "load", "spark-b", IMAGE, "--variant", variant, check=True)
        r = sim.sparkctl(*inv, "image", "sync", PROFILE, "--from", "spark-a", "--key-hours", "2", check=True)
        assert "copied from spark-a to spark-b, verified by content digest" in r.stdout, r.stdout

    resync("again")
    line = sim.ssh("spark-b", f"grep sparkctl-image-sync@ {NODE_AUTHORIZED_KEYS}").stdout.strip().splitlines()
    assert len(line) == 1 and ',command="/opt/sparkctl/image-sync-gate.sh"' in line[0], line
    assert 'expiry-time="' in line[0] and line[0].startswith('restrict,from="10.20.'), line
    for cmd in ("id", "sh -c 'touch /tmp/sparkctl-gate-pwned'", f"docker run --rm {IMAGE} id", "docker images",
                f"docker load >&2 && docker image inspect --format '{{{{.Id}}}}' {IMAGE}",
                f"sparkctl-image-load {IMAGE}; touch /tmp/sparkctl-gate-pwned",
                "sparkctl-image-load $(touch /tmp/sparkctl-gate-pwned)"):
        assert _accepted(_node_to_node(sim, cmd)), cmd
    assert sim.ssh("spark-b", "test ! -e /tmp/sparkctl-gate-pwned").returncode == 0
    bad = sim.sparkctl(*inv, "image", "sync", PROFILE, "--key-hours", "0")
    assert bad.returncode == 2 and "--key-hours" in bad.stderr and "Traceback" not in bad.stderr

    # expired: the line as sync wrote it, with its expiry-time in the past (sshd's clock, not ours)
    assert sim.ssh("spark-b", "sed -i 's/expiry-time=\"[0-9]*Z\"/expiry-time=\"20200101Z\"/' "
                   + NODE_AUTHORIZED_KEYS).returncode == 0
    assert not _accepted(_node_to_node(sim, "id"))
    resync("renewed")  # the next sync renews the line: one line, a future expiry
    assert sim.ssh("spark-b", f"grep -c sparkctl-image-sync@ {NODE_AUTHORIZED_KEYS}").stdout.strip() == "1"
    assert _accepted(_node_to_node(sim, "id"))

    dry = sim.sparkctl(*inv, "image", "revoke", "--dry-run", check=True)
    assert "sparkctl-image-sync@" in dry.stdout and "sparkctl-supervisor@" not in dry.stdout, dry.stdout
    sim.sparkctl(*inv, "image", "revoke", check=True)
    assert not _accepted(_node_to_node(sim, "id"))
    assert sim.ssh("spark-b", f"grep -c sparkctl-image-sync@ {NODE_AUTHORIZED_KEYS}").stdout.strip() == "0"
    assert sim.ssh("spark-a", f"test ! -e {IMAGE_SYNC_KEY}").returncode == 0

    resync("after-revoke")  # granted afresh: the key and known_hosts put on spark-a again
    assert _accepted(_node_to_node(sim, "id"))
    r = sim.sparkctl(*inv, "fabric", "restore", timeout=300)  # revokes first, even with no fabric backup here
    assert not _accepted(_node_to_node(sim, "id")), r.stdout + r.stderr
    assert sim.ssh("spark-b", f"grep -c sparkctl- {NODE_AUTHORIZED_KEYS}").stdout.strip() == "0"
