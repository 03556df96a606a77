"""End-to-end on the SIMULATED 4-node ring: a model by its hub id, from the local hub to serving.

The local hub (sparkctl_sim/hub.py) listens on the host's end of the
management bridge (the stand-in for the internet) and serves the tiny GGUF as
the repository sparkctl/tiny-llama. `weights fetch tiny-llamacpp` downloads it
on spark-a only; an interrupted fetch (SIGINT to sparkctl; a connection the
hub kills) resumes without fetching complete files again; a corrupted file is
named, deleted and fetched again; `weights sync` gives the other nodes the
tree over the fabric; `check` says the same files and the same commit are
everywhere; `up` serves it with the real llama.cpp engine.

Simulated: the cluster and the hub. Real: the agent, its HTTP, the hashing,
the transport, the CLI and the engine.
"""

from __future__ import annotations

import ipaddress
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sparkctl_sim.hub import LocalHub, http_date, make_repo, tiny_repo
from sparkctl_sim.spec import ClusterSpec
from tests.sim.helpers import RING

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PROFILE = "tiny-llamacpp"
LOCAL_DIR = "/srv/models/tiny-llama"  # the profile's model.local_dir


@pytest.fixture(scope="module")
def hub(sim_ring) -> Iterator[LocalHub]:
    pytest.importorskip("gguf")
    host = str(ipaddress.ip_interface(ClusterSpec.__dataclass_fields__["mgmt_cidr"].default).ip)
    tiny = tiny_repo()
    # shaped so an interruption lands mid-file: ~0.6 MB at 1 MB/s per connection
    with LocalHub([tiny], host, per_conn_Bps=1e6 / 4) as h:
        yield h


def _run(sim, hub: LocalHub, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**sim.env, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(sim.root / "operator-hf-home")}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "sparkctl.cli.main", "-i", str(sim.inventory), *args], env=env,
                       capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _on(sim, node: str, rel: str = ""):  # type: ignore[no-untyped-def]
    return sim.root / "nodes" / node / "fs" / (LOCAL_DIR.lstrip("/") + ("/" + rel if rel else ""))


def test_simulated_ring_model_by_hub_id_fetch_resume_sync_check_up(sim_ring, hub: LocalHub) -> None:
    import shutil

    tiny = hub.repos["sparkctl/tiny-llama"]
    for n in RING:  # `sim up` placed the model everywhere; start from nothing
        shutil.rmtree(_on(sim_ring, n), ignore_errors=True)

    dry = _run(sim_ring, hub, "weights", "fetch", PROFILE, "--dry-run")
    assert "3 files" in dry.stdout and "free on spark-a" in dry.stdout and tiny.commit in dry.stdout

    # SIGINT to sparkctl mid-download: it stops the node's job and exits 130; the rerun resumes
    env = {**sim_ring.env, "HF_ENDPOINT": hub.endpoint}
    proc = subprocess.Popen([sys.executable, "-m", "sparkctl.cli.main", "-i", str(sim_ring.inventory), "weights",
                             "fetch", PROFILE, "--chunk-mb", "0.0625", "--connections", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    gguf = tiny.files["tiny-llama.gguf"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(hub.storage_gets(gguf.sha256)) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    n_before = len(hub.storage_gets(gguf.sha256))

    r = _run(sim_ring, hub, "weights", "fetch", PROFILE, "--chunk-mb", "0.0625", "--connections", "2", "--json")
    rep = json.loads(r.stdout)
    assert rep["commit"] == tiny.commit and rep["files"] == 3
    n_chunks = -(-len(gguf.data) // (64 * 1024))
    assert len(hub.storage_gets(gguf.sha256)) - n_before <= n_chunks  # resumed: not every chunk again
    assert _on(sim_ring, "spark-a", "tiny-llama.gguf").read_bytes() == gguf.data
    for n in RING[1:]:  # the download law: one node faces the internet
        assert not _on(sim_ring, n).exists()

    # a rerun fetches nothing; a corrupted file is named, deleted and fetched again
    again = json.loads(_run(sim_ring, hub, "weights", "fetch", PROFILE, "--json").stdout)
    assert again["fetched"] == 0 and again["skipped"] == 3
    p = _on(sim_ring, "spark-a", "tiny-llama.gguf")
    data = bytearray(p.read_bytes())
    data[4096] ^= 0x5A
    p.write_bytes(bytes(data))
    fixed = json.loads(_run(sim_ring, hub, "weights", "fetch", PROFILE, "--json").stdout)
    assert fixed["corrupt"] == ["tiny-llama.gguf"] and fixed["fetched"] == 1
    assert p.read_bytes() == gguf.data

    to = [a for n in RING for a in ("--to", n)]
    sync = json.loads(_run(sim_ring, hub, "weights", "sync", PROFILE, "--from", "spark-a", *to, "--json").stdout)
    assert set(sync["nodes"]) == set(RING[1:])
    assert all(ns["verified"] for ns in sync["nodes"].values())
    for n in RING:
        assert _on(sim_ring, n, "tiny-llama.gguf").read_bytes() == gguf.data
        assert json.loads(_on(sim_ring, n, ".sparkctl/hub-manifest.json").read_text())["commit"] == tiny.commit

    # what check's probe reads on each node (the tiny profile's check covers its one node)
    summaries = {}
    for n in RING:
        s = sim_ring.ssh(n, f"python3 -S /opt/sparkctl/weights_agent.py summary --dir {LOCAL_DIR} "
                            "--hash-cache /opt/sparkctl/weights/hash-cache.json")
        summaries[n] = json.loads(s.stdout.splitlines()[-1])
    assert {(x["digest"], x["hub_commit"], x["n_hub_differ"]) for x in summaries.values()} == \
        {(summaries["spark-a"]["digest"], tiny.commit, 0)} and summaries["spark-a"]["digest"]
    r = _run(sim_ring, hub, "check", PROFILE, "--json", "--bandwidth", "0", check=False)
    vs = json.loads(r.stdout)["verdicts"]
    files = {v["node"]: v for v in vs if v["law"] == "weights" and v.get("subject") == "files"}
    assert files and all(v["status"] == "ok" and tiny.commit[:12] in v["observed"] for v in files.values()), files

    up = _run(sim_ring, hub, "up", PROFILE, "--json", check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    _run(sim_ring, hub, "down", PROFILE, check=False)


def test_simulated_ring_hub_refusals_are_one_line(sim_ring, hub: LocalHub) -> None:
    with LocalHub([make_repo("other/repo", {"a.gguf": b"x"})], hub.endpoint.split("//")[1].split(":")[0]) as empty:
        r = _run(sim_ring, empty, "weights", "fetch", PROFILE, check=False)
    assert r.returncode != 0 and "repository sparkctl/tiny-llama not found" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


# each fault of a real network, as the local hub serves it (sparkctl_sim/hub.py cites the real ones)
FAULTS = {
    "a body cut mid-chunk": lambda h, sha: h.cut_body(40_000, times=3, path=sha),
    "the 1-byte probe cut": lambda h, sha: h.cut_body(0, times=1, path=sha),
    "429 with Retry-After in seconds": lambda h, sha: h.refuse(429, 2, retry_after=1, path=sha),
    "503 with Retry-After as an HTTP-date": lambda h, sha: h.refuse(503, 1, retry_after=http_date(1), path=sha),
    "503 without Retry-After": lambda h, sha: h.refuse(503, 2, path=sha),
    "the Hub's 503 on /resolve/": lambda h, sha: h.refuse(503, 1, server="hub", path="/resolve/"),
}


def test_simulated_ring_weights_fetch_through_each_hub_fault_is_byte_identical(sim_ring, hub: LocalHub) -> None:
    import shutil

    tiny = hub.repos["sparkctl/tiny-llama"]
    gguf = tiny.files["tiny-llama.gguf"]
    for name, fault in FAULTS.items():
        shutil.rmtree(_on(sim_ring, "spark-a"), ignore_errors=True)
        hub.clear_faults()
        served = len(hub.faults_served)
        fault(hub, gguf.sha256)
        r = _run(sim_ring, hub, "weights", "fetch", PROFILE, "--chunk-mb", "0.0625", "--connections", "2",
                 check=False)
        assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, (name, r.stdout + r.stderr)
        assert len(hub.faults_served) > served, f"{name}: never served"
        assert _on(sim_ring, "spark-a", "tiny-llama.gguf").read_bytes() == gguf.data, name
        if "cut" not in name:
            assert "wait:" in r.stderr, (name, r.stderr)  # the operator saw the wait as it happened


def test_simulated_ring_weights_fetch_resolves_an_expired_storage_url(sim_ring, hub: LocalHub) -> None:
    import shutil

    gguf = hub.repos["sparkctl/tiny-llama"].files["tiny-llama.gguf"]
    host = hub.endpoint.split("//")[1].split(":")[0]
    # URLs good for 1 to 2 s; at 100 kB/s the gguf's chunks after the first 200 kB start past that
    with LocalHub([hub.repos["sparkctl/tiny-llama"]], host, url_ttl_s=1, rate_Bps=100_000) as slow:
        shutil.rmtree(_on(sim_ring, "spark-a"), ignore_errors=True)
        r = _run(sim_ring, slow, "weights", "fetch", PROFILE, "--chunk-mb", "0.0625", "--connections", "2",
                 "--json", check=False)
        assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
        assert slow.expired and json.loads(r.stdout)["resolved"] >= 1
    assert _on(sim_ring, "spark-a", "tiny-llama.gguf").read_bytes() == gguf.data


def test_simulated_ring_a_fault_that_never_passes_names_the_file_without_a_traceback(sim_ring, hub: LocalHub) -> None:
    import shutil

    gguf = hub.repos["sparkctl/tiny-llama"].files["tiny-llama.gguf"]
    shutil.rmtree(_on(sim_ring, "spark-a"), ignore_errors=True)
    hub.clear_faults()
    hub.refuse(503, times=1000, path=gguf.sha256)
    try:
        r = _run(sim_ring, hub, "weights", "fetch", PROFILE, check=False)
    finally:
        hub.clear_faults()
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr
    assert "tiny-llama.gguf: HTTP 503 Service Unavailable (gave up after" in r.stderr + r.stdout, r.stderr
