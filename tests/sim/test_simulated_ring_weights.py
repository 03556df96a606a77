"""End-to-end on the SIMULATED 4-node ring: the weights law through the CLI over real SSH.

One node (spark-a) downloads from an HTTP server on the host's side of the
management bridge (the stand-in for the internet); `weights sync` then gives
the other three the files over the fabric veths only, the node across
(spark-c) through its neighbour. Checked: identical manifests on all four,
bytes counted on the fabric interfaces and not on the management one, a
re-run that moves nothing, and a corrupted copy found and repaired chunk by
chunk.

Simulated: the cluster (namespaces, veth cables, real sshd). Real: the agent,
its HTTP transfers, the hashing, the transport and the CLI.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.model.inventory import load_inventory
from sparkctl.remote import weights_agent as agent
from sparkctl_sim.cluster import MGMT_IFNAME
from sparkctl_sim.spec import ClusterSpec
from tests.sim.helpers import RING, WAIVE

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tensorfold-tp4-ring"
WEIGHTS = "/srv/models/DeepSeek-V4.1-Flash-1017"  # the profile's model.weights_path
MIB = 1 << 20
SIZE = 8 * MIB + 12345  # nine 1 MiB chunks, the last one short


def _blob(size: int) -> bytes:
    out, block = bytearray(), b"sparkctl"
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 128
    return bytes(out[:size])


@pytest.fixture(scope="module")
def internet(sim_ring, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The files on an HTTP server bound to the host's end of the management bridge."""
    root = tmp_path_factory.mktemp("internet")
    (root / "model.safetensors").write_bytes(_blob(SIZE))
    (root / "config.json").write_text('{"layers": 61}\n')
    host = str(ipaddress.ip_interface(ClusterSpec.__dataclass_fields__["mgmt_cidr"].default).ip)
    emit = agent.Emitter(open(os.devnull, "w"))
    server = agent.WeightsServer(str(root), host, 0, emit=emit)
    stop = threading.Event()
    t = threading.Thread(target=agent.serve, args=(server, 600.0, emit, stop), daemon=True)
    t.start()
    yield f"http://{host}:{server.server_address[1]}/"
    stop.set()
    t.join(5)


def _on_node(sim, node: str, path: str) -> Path:
    return sim.root / "nodes" / node / "fs" / path.lstrip("/")


def _manifest(sim, node: str) -> dict:
    r = sim.ssh(node, f"python3 -S /opt/sparkctl/weights_agent.py manifest --dir {WEIGHTS} --chunk-mb 1")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.splitlines()[-1])["manifest"]


def _rx_bytes(sim, node: str) -> dict[str, int]:
    r = sim.ssh(node, "ip -s -j link show")
    assert r.returncode == 0, r.stderr
    return {link["ifname"]: int(link["stats64"]["rx"]["bytes"]) for link in json.loads(r.stdout)}


def _sync(sim, *extra: str) -> dict:
    r = sim.sparkctl("-i", str(sim.inventory), "weights", "sync", PROFILE, "--from", "spark-a", "--chunk-mb", "1",
                     "--connections", "3", "--json", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _files_verdicts(sim) -> tuple[set[str], dict[str, dict]]:
    """(laws that fail, the weights law's per-node verdicts on the files: what each node's hash cache vouches for)."""
    r = sim.sparkctl("-i", str(sim.inventory), "check", PROFILE, "--json", "--bandwidth", "0", *WAIVE)
    assert r.stdout, r.stderr
    vs = json.loads(r.stdout)["verdicts"]
    return ({v["law"] for v in vs if v["status"] == "fail"},
            {v["node"]: v for v in vs if v["law"] == "weights" and v.get("subject") == "files"})


def _rehash(sim, node: str) -> None:
    """What a fetch or pull on ``node`` leaves: its hash cache vouching for the files as they are."""
    r = sim.ssh(node, f"python3 -S /opt/sparkctl/weights_agent.py manifest --dir {WEIGHTS} --chunk-mb 1 "
                      "--hash-cache /opt/sparkctl/weights/hash-cache.json")
    assert r.returncode == 0, r.stdout + r.stderr


def test_simulated_ring_weights_fetch_on_one_node_then_sync_over_the_fabric(sim_ring, internet: str) -> None:
    inv = load_inventory(sim_ring.inventory)
    want = hashlib.sha256(_blob(SIZE)).hexdigest()
    for name, sha in (("model.safetensors", want), ("config.json", None)):
        args = ["-i", str(sim_ring.inventory), "weights", "fetch", PROFILE, "--node", "spark-a",
                "--url", internet + name, "--json"] + (["--sha256", sha] if sha else [])
        r = sim_ring.sparkctl(*args)
        assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got["node"] == "spark-a" and got["dest"] == f"{WEIGHTS}/config.json"
    assert _on_node(sim_ring, "spark-a", f"{WEIGHTS}/model.safetensors").read_bytes() == _blob(SIZE)
    for n in RING[1:]:  # the download law: only the one node touched the internet
        assert not _on_node(sim_ring, n, WEIGHTS).exists()

    before = {n: _rx_bytes(sim_ring, n) for n in RING[1:]}
    rep = _sync(sim_ring)
    after = {n: _rx_bytes(sim_ring, n) for n in RING[1:]}
    assert rep["files"] == 2 and set(rep["nodes"]) == set(RING[1:])
    total = rep["total_bytes"]
    fabric = {ep.address for n in RING for ep in inv.endpoints(n)}
    mgmt = {node.host for node in inv.nodes}
    for n, ns in rep["nodes"].items():
        assert ns["verified"] and ns["bytes"] == total, ns
        assert ns["address"] in fabric and ns["address"] not in mgmt
        link = inv.link_between(ns["sender"], n, twin=0)
        assert link is not None and ns["address"] == link.end(ns["sender"]).address  # cabled to the receiver
        # the bytes came in on the cable from the sender, and not over the management network
        rx = {dev: after[n][dev] - before[n].get(dev, 0) for dev in after[n]}
        assert rx[link.end(n).netdev] >= total, rx
        assert rx[MGMT_IFNAME] < total // 4, rx  # SSH only: the agent, the manifest, the polls
    assert rep["nodes"]["spark-c"]["sender"] in ("spark-b", "spark-d")  # across the ring: via a neighbour

    manifests = {n: _manifest(sim_ring, n) for n in RING}
    assert manifests["spark-a"]["files"]["model.safetensors"]["sha256"] == want
    assert all(m == manifests["spark-a"] for m in manifests.values())
    # and the check's weights law sees the same files on all four, from the hash caches alone
    failed, files = _files_verdicts(sim_ring)
    assert "weights" not in failed and set(files) == set(RING), files
    assert all(v["status"] == "ok" and "as on 3 other nodes" in v["observed"] for v in files.values()), files


def test_simulated_ring_weights_rerun_is_a_no_op(sim_ring, internet: str) -> None:
    rep = _sync(sim_ring)
    for ns in rep["nodes"].values():
        assert ns["verified"] and ns["bytes"] == 0 and ns["skipped_files"] == 2, ns


def test_simulated_ring_weights_corrupted_copy_is_detected_and_repaired(sim_ring, internet: str) -> None:
    victim = _on_node(sim_ring, "spark-d", f"{WEIGHTS}/model.safetensors")
    data = bytearray(victim.read_bytes())
    data[5 * MIB + 77] ^= 0x20  # one bit in chunk 5; the write changes mtime, as any real edit would
    victim.write_bytes(bytes(data))
    assert _manifest(sim_ring, "spark-d") != _manifest(sim_ring, "spark-a")
    # the check sees the edit without hashing (size/mtime moved) and, once spark-d's
    # cache vouches for the changed bytes, that its files differ from the three others
    failed, files = _files_verdicts(sim_ring)
    assert files["spark-d"]["status"] == "warn" and "model.safetensors" in files["spark-d"]["observed"], files
    _rehash(sim_ring, "spark-d")
    failed, files = _files_verdicts(sim_ring)
    assert "weights" in failed and files["spark-d"]["status"] == "fail", files
    assert "--from spark-a" in files["spark-d"]["fix"] and files["spark-a"]["status"] == "ok"

    rep = _sync(sim_ring)
    d = rep["nodes"]["spark-d"]
    assert d["verified"] and d["bytes"] == MIB, d  # only the bad chunk travelled
    assert all(ns["bytes"] == 0 for n, ns in rep["nodes"].items() if n != "spark-d")
    assert victim.read_bytes() == _blob(SIZE)
    manifests = {n: _manifest(sim_ring, n) for n in RING}
    assert all(m == manifests["spark-a"] for m in manifests.values())
    failed, files = _files_verdicts(sim_ring)
    assert "weights" not in failed and all(v["status"] == "ok" for v in files.values()), files
