"""Weights: the agent's download/serve/pull on loopback, the pure sync plan, and a local sync."""

from __future__ import annotations

import functools
import hashlib
import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.errors import ConfigError
from sparkctl.model.inventory import load_inventory, loads_inventory
from sparkctl.ops import weights
from sparkctl.remote import weights_agent as agent
from sparkctl.transport import LocalTransport

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "sparkctl" / "remote" / "weights_agent.py"
KIB = 1024
CHUNK = 256 * KIB


def _blob(size: int, seed: int = 1) -> bytes:
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Served:
    def __init__(self, server: agent.WeightsServer, root: Path) -> None:
        self.server, self.root = server, root
        host, port = server.server_address[:2]
        self.base = f"http://{host}:{port}/"

    def ranges(self) -> list[str]:
        return [r for _, r, _ in self.server.requests if r]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "model.bin").write_bytes(_blob(5 * CHUNK + 12345))
    (root / "sub" / "config.json").write_bytes(b'{"layers": 2}\n')
    (tmp_path / "secret.txt").write_text("outside the root\n")
    emit = agent.Emitter(open(os.devnull, "w"))
    server = agent.WeightsServer(str(root), "127.0.0.1", 0, emit=emit)
    stop = threading.Event()
    t = threading.Thread(target=agent.serve, args=(server, 30.0, emit, stop), daemon=True)
    t.start()
    yield Served(server, root)
    stop.set()
    t.join(5)


def _quiet() -> agent.Emitter:
    return agent.Emitter(open(os.devnull, "w"))


# --------------------------------------------------------------------------- fetch


def test_ranged_parallel_download_equals_source(served: Served, tmp_path: Path) -> None:
    src = (served.root / "model.bin").read_bytes()
    dest = tmp_path / "out" / "model.bin"
    res = agent.fetch_file(served.base + "model.bin", str(dest), emit=_quiet(), connections=4, chunk_bytes=CHUNK,
                           sha256=_sha(src))
    assert dest.read_bytes() == src
    assert res["ranged"] and res["sha256"] == _sha(src) and res["bytes"] == len(src)
    chunks = sorted(r for r in served.ranges() if r != "bytes=0-0")
    assert len(chunks) == 6  # 5 full chunks and the tail, one request each
    assert not Path(str(dest) + ".part").exists() and not Path(str(dest) + ".part.json").exists()


def test_interrupted_download_resumes_only_missing_chunks(served: Served, tmp_path: Path) -> None:
    src = (served.root / "model.bin").read_bytes()
    dest = tmp_path / "model.bin"
    # the command line, stopped as if killed after ~2.5 chunks
    run = subprocess.run(
        [sys.executable, str(AGENT), "fetch", "--url", served.base + "model.bin", "--dest", str(dest),
         "--connections", "1", "--chunk-mb", str(CHUNK / (1 << 20)), "--max-bytes", str(CHUNK * 5 // 2)],
        capture_output=True, text=True, timeout=20,
    )
    last = json.loads(run.stdout.splitlines()[-1])
    assert run.returncode == agent.EXIT_INTERRUPTED and last["event"] == "error" and last["resumable"]
    assert not dest.exists()
    side = json.loads(Path(str(dest) + ".part.json").read_text())
    done = set(side["done"])
    assert done == {0, 1}
    served.server.requests.clear()

    res = agent.fetch_file(served.base + "model.bin", str(dest), emit=_quiet(), connections=2, chunk_bytes=CHUNK)
    assert dest.read_bytes() == src
    asked = {r for r in served.ranges() if r != "bytes=0-0"}
    n = 6
    missing = {f"bytes={i * CHUNK}-{min((i + 1) * CHUNK, len(src)) - 1}" for i in range(n) if i not in done}
    assert asked == missing
    assert res["resumed_bytes"] == 2 * CHUNK and res["bytes"] == len(src) - 2 * CHUNK


def test_single_stream_fallback_without_range(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    data = _blob(3 * CHUNK + 7, seed=2)
    (root / "f.bin").write_bytes(data)
    handler = functools.partial(_SilentHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # ignores Range: answers 200
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        dest = tmp_path / "got.bin"
        res = agent.fetch_file(f"http://127.0.0.1:{server.server_address[1]}/f.bin", str(dest), emit=_quiet(),
                               connections=4, chunk_bytes=CHUNK, sha256=_sha(data))
    finally:
        server.shutdown()
        server.server_close()
    assert not res["ranged"] and dest.read_bytes() == data


class _SilentHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_sha256_mismatch_is_an_error_and_leaves_no_file(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "model.bin"
    with pytest.raises(agent.AgentError, match="sha256 mismatch"):
        agent.fetch_file(served.base + "model.bin", str(dest), emit=_quiet(), connections=2, chunk_bytes=CHUNK,
                         sha256="0" * 64)
    assert sorted(os.listdir(tmp_path)) == ["secret.txt", "src"]


def test_fetch_cli_reports_json_lines(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "cfg.json"
    run = subprocess.run([sys.executable, str(AGENT), "fetch", "--url", served.base + "sub/config.json",
                          "--dest", str(dest)], capture_output=True, text=True, timeout=20)
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert run.returncode == 0 and events[-1]["event"] == "done" and dest.read_bytes() == b'{"layers": 2}\n'
    assert any(e["event"] == "progress" and e["bytes_total"] == 14 for e in events)


# --------------------------------------------------------------------------- serve


def _status(served: Served, path: str) -> int:
    host, port = served.server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


@pytest.mark.parametrize("path", [
    "/../secret.txt", "/%2e%2e/secret.txt", "/sub/../../secret.txt", "/sub/%2E%2E/%2E%2E/secret.txt",
    "/..%2fsecret.txt", "/%00", "/", "/sub", "/nothere",
])
def test_serve_refuses_paths_outside_the_root(served: Served, path: str) -> None:
    assert _status(served, path) == 404


def test_serve_ranges_and_allowlist(served: Served) -> None:
    assert _status(served, "/sub/config.json") == 200
    host, port = served.server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/sub/config.json", headers={"Range": "bytes=1-6"})
    resp = conn.getresponse()
    assert resp.status == 206 and resp.read() == b'"layer' and resp.getheader("Content-Range") == "bytes 1-6/14"
    conn.request("GET", "/sub/config.json", headers={"Range": "bytes=99-"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 416
    served.server.allow = {"model.bin"}
    assert _status(served, "/sub/config.json") == 404


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "", "spark-a"])
def test_serve_refuses_wildcard_or_name_binds(bind: str) -> None:
    with pytest.raises(agent.AgentError):
        agent.check_bind(bind)


@pytest.mark.parametrize("header,want", [
    ("bytes=0-0", (0, 0)), ("bytes=5-", (5, 9)), ("bytes=-3", (7, 9)), ("bytes=2-100", (2, 9)),
    ("bytes=10-", "416"), ("bytes=0-1,4-5", None), ("items=0-1", None), (None, None), ("bytes=x-1", None),
])
def test_parse_range(header: str | None, want: object) -> None:
    assert agent.parse_range(header, 10) == want


# --------------------------------------------------------------------------- manifest and pull


def test_manifest_of_a_directory_and_of_one_file(served: Served) -> None:
    (served.root / "half.bin.part").write_bytes(b"x")  # a download in progress is not part of the weights
    m = agent.build_manifest(str(served.root), emit=_quiet(), chunk_bytes=CHUNK)
    data = (served.root / "model.bin").read_bytes()
    assert m["kind"] == "dir" and sorted(m["files"]) == ["model.bin", "sub/config.json"]
    pieces = [_sha(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    assert m["files"]["model.bin"] == {"size": len(data), "sha256": _sha(data), "chunk_bytes": CHUNK,
                                       "chunks": pieces}
    assert len(pieces) == 6 and m["files"]["sub/config.json"]["chunks"] == [_sha(b'{"layers": 2}\n')]
    one = agent.build_manifest(str(served.root / "model.bin"), emit=_quiet(), chunk_bytes=CHUNK)
    assert one == {"kind": "file", "files": {"model.bin": m["files"]["model.bin"]}}


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_chunk_hashes_at_the_edges(tmp_path: Path, size: int) -> None:
    f = tmp_path / "f.bin"
    data = _blob(size, seed=size + 7)
    f.write_bytes(data)
    whole, chunks = agent.hash_chunks(str(f), CHUNK)
    assert whole == _sha(data)
    assert chunks == [_sha(data[i:i + CHUNK]) for i in range(0, size, CHUNK)]
    assert len(chunks) == agent.n_chunks_of(size, CHUNK)
    cache = agent.HashCache(str(tmp_path / "cache.json"))
    assert agent.file_digests(str(f), CHUNK, cache=cache) == (whole, chunks)
    assert cache.get_chunks(str(f), CHUNK) == (whole, chunks) and cache.get_chunks(str(f), 2 * CHUNK) is None


def test_pull_verifies_and_skips_complete_files(served: Served, tmp_path: Path) -> None:
    m = agent.build_manifest(str(served.root), emit=_quiet(), chunk_bytes=CHUNK)
    dest = tmp_path / "copy"
    first = agent.pull(served.base, m, str(dest), emit=_quiet(), connections=3, chunk_bytes=CHUNK)
    assert first["fetched"] == 2 and first["verified"]
    for rel in m["files"]:
        assert (dest / rel).read_bytes() == (served.root / rel).read_bytes()
    again = agent.pull(served.base, m, str(dest), emit=_quiet(), connections=3, chunk_bytes=CHUNK)
    assert again["fetched"] == 0 and again["skipped"] == 2 and again["bytes"] == 0
    (dest / "sub" / "config.json").write_bytes(b'{"layers": 3}\n')  # same size, wrong content
    third = agent.pull(served.base, m, str(dest), emit=_quiet(), connections=3, chunk_bytes=CHUNK)
    assert third["fetched"] == 1 and (dest / "sub" / "config.json").read_bytes() == b'{"layers": 2}\n'


def test_pull_without_a_probe_verifies_each_chunk_once(served: Served, tmp_path: Path) -> None:
    m = agent.build_manifest(str(served.root), emit=_quiet(), chunk_bytes=CHUNK)
    served.server.requests.clear()
    res = agent.pull(served.base, m, str(tmp_path / "copy"), emit=_quiet(), connections=4)
    assert res["verified"] and (tmp_path / "copy" / "model.bin").read_bytes() == (served.root / "model.bin").read_bytes()
    size = m["files"]["model.bin"]["size"]
    want = {f"bytes={i * CHUNK}-{min((i + 1) * CHUNK, size) - 1}" for i in range(6)} | {"bytes=0-13"}
    assert sorted(served.ranges()) == sorted(want)  # one request per chunk, no probe, nothing twice


def test_corrupted_byte_at_the_source_is_detected_and_nothing_appears(served: Served, tmp_path: Path) -> None:
    m = agent.build_manifest(str(served.root), emit=_quiet(), chunk_bytes=CHUNK)
    model = served.root / "model.bin"
    data = bytearray(model.read_bytes())
    data[3 * CHUNK + 100] ^= 0x01  # one bit of chunk 3, after the manifest was made
    model.write_bytes(bytes(data))
    dest = tmp_path / "copy"
    with pytest.raises(agent.ChunkMismatch, match="sha256 mismatch in bytes"):
        agent.pull(served.base, m, str(dest), emit=_quiet(), connections=2)
    assert not (dest / "model.bin").exists()
    side = json.loads((dest / "model.bin.part.json").read_text())
    assert side["verified"] and 3 not in side["done"]  # only chunks that matched count as received


def test_a_corrupted_copy_is_repaired_chunk_by_chunk(served: Served, tmp_path: Path) -> None:
    m = agent.build_manifest(str(served.root), emit=_quiet(), chunk_bytes=CHUNK)
    dest = tmp_path / "copy"
    cache = agent.HashCache(str(tmp_path / "cache.json"))
    agent.pull(served.base, m, str(dest), emit=_quiet(), connections=2, cache=cache)
    got = dest / "model.bin"
    data = bytearray(got.read_bytes())
    data[4 * CHUNK + 5] ^= 0xFF  # bit rot in chunk 4 (the write changes mtime: the cache entry goes stale)
    got.write_bytes(bytes(data))
    served.server.requests.clear()
    events: list[dict] = []
    sink = _Sink(events)
    res = agent.pull(served.base, m, str(dest), emit=agent.Emitter(sink), connections=2, cache=cache)
    assert res["fetched"] == 1 and got.read_bytes() == (served.root / "model.bin").read_bytes()
    assert served.ranges() == [f"bytes={4 * CHUNK}-{5 * CHUNK - 1}"]  # only the bad chunk travelled
    assert any(e["event"] == "repair" and e["chunks_bad"] == 1 for e in events)


class _Sink:
    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def write(self, text: str) -> None:
        self.events += [json.loads(line) for line in text.splitlines() if line]

    def flush(self) -> None:
        pass


def test_relay_serves_only_verified_chunks_and_waits_for_the_rest(tmp_path: Path) -> None:
    data = _blob(3 * CHUNK + 10, seed=9)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    whole, chunks = agent.hash_chunks(str(src), CHUNK)
    files = {"m.bin": {"size": len(data), "sha256": whole, "chunk_bytes": CHUNK, "chunks": chunks}}
    relay_dir = tmp_path / "relay"
    relay_dir.mkdir()
    part = relay_dir / "m.bin.part"
    part.write_bytes(data[:CHUNK] + bytes(len(data) - CHUNK))  # chunk 0 arrived, the rest not yet
    side = relay_dir / "m.bin.part.json"
    meta = {"version": 1, "size": len(data), "chunk_bytes": CHUNK, "key": f"{whole}/{CHUNK}", "verified": True}
    side.write_text(json.dumps({**meta, "done": [0]}))
    server = agent.WeightsServer(str(relay_dir), "127.0.0.1", 0, emit=_quiet(), files=files, relay=True,
                                 relay_wait_s=0.3)
    stop = threading.Event()
    t = threading.Thread(target=agent.serve, args=(server, 30.0, _quiet(), stop), daemon=True)
    t.start()
    try:
        host, port = server.server_address[:2]

        def get(rng: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", "/m.bin", headers={"Range": rng})
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            return resp.status, body

        assert get(f"bytes=0-{CHUNK - 1}") == (206, data[:CHUNK])
        assert get(f"bytes={CHUNK}-{2 * CHUNK - 1}")[0] == 503  # not verified here: held, then refused
        side.write_text(json.dumps({**meta, "verified": False, "done": [0, 1, 2, 3]}))
        assert get(f"bytes={CHUNK}-{2 * CHUNK - 1}")[0] == 503  # a sidecar of unverified chunks is not trusted

        # a pull from the relay, while the relay's own copy completes under it
        def arrive() -> None:
            for i in (1, 2, 3):
                time.sleep(0.05)
                with open(part, "r+b") as f:
                    f.seek(i * CHUNK)
                    f.write(data[i * CHUNK:(i + 1) * CHUNK])
                side.write_text(json.dumps({**meta, "done": list(range(i + 1))}))
            os.replace(part, relay_dir / "m.bin")
            side.unlink()

        server.relay_wait_s = 20.0
        feeder = threading.Thread(target=arrive)
        feeder.start()
        res = agent.pull(f"http://{host}:{port}/", {"files": files}, str(tmp_path / "far"), emit=_quiet(),
                         connections=2)
        feeder.join()
        assert res["verified"] and (tmp_path / "far" / "m.bin").read_bytes() == data
    finally:
        stop.set()
        t.join(5)


# --------------------------------------------------------------------------- plan (pure)


def _names(plan: list[list[weights.Transfer]]) -> list[list[tuple[str, str, str]]]:
    return [[(t.receiver, t.sender, t.sender_address) for t in stage] for stage in plan]


def test_plan_ring_chains_the_far_node_through_a_neighbour() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    plan = weights.plan_sync(inv, "spark-a", inv.names)
    assert _names(plan) == [
        [("spark-b", "spark-a", "10.20.0.1"), ("spark-d", "spark-a", "10.20.6.1")],
        [("spark-c", "spark-b", "10.20.2.2")],
    ]
    for stage in plan:
        for t in stage:
            assert t.via is None
            assert t.sender_address == inv.link_between(t.sender, t.receiver, twin=0).end(t.sender).address
            assert t.sender_address not in {n.host for n in inv.nodes}  # never the management address


def test_plan_ring_from_another_source_and_relay_only_without_a_chain() -> None:
    inv = load_inventory(REPO / "inventory.yaml")
    plan = weights.plan_sync(inv, "spark-c")
    assert [[(t.receiver, t.sender) for t in s] for s in plan] == [
        [("spark-b", "spark-c"), ("spark-d", "spark-c")], [("spark-a", "spark-b")]]
    only = weights.plan_sync(inv, "spark-a", ["spark-a", "spark-c"])
    assert only == [[weights.Transfer("spark-c", "spark-a", "10.20.0.1", via="spark-b")]]


def test_plan_pair_and_errors() -> None:
    inv = loads_inventory("cluster: {fabric_pool: 10.30.0.0/16}\nnodes: [{name: a, host: h1}, {name: b, host: h2}]\n"
                          "cables: [[a:p0, b:p0], [a:p1, b:p1]]\n")
    assert _names(weights.plan_sync(inv, "a")) == [[("b", "a", "10.30.0.1")]]
    assert _names(weights.plan_sync(inv, "b")) == [[("a", "b", "10.30.0.2")]]
    assert weights.plan_sync(inv, "a", ["a"]) == []
    with pytest.raises(ConfigError):
        weights.plan_sync(inv, "z")
    with pytest.raises(ConfigError):
        weights.plan_sync(inv, "a", ["a", "q"])


# --------------------------------------------------------------------------- orchestration, locally


def _local_ring(tmp_path: Path) -> tuple:
    nodes = "\n".join(f"  - {{name: n{c}, host: 192.0.2.{i + 1}, prefix: {tmp_path / c}}}" for i, c in enumerate("abcd"))
    text = (
        "cluster: {name: t, fabric_pool: 127.20.0.0/16}\ndefaults: {sudo: false}\n"
        f"nodes:\n{nodes}\n"
        "cables:\n  - [na:p0, nb:p1]\n  - [nb:p0, nc:p1]\n  - [nc:p0, nd:p1]\n  - [nd:p0, na:p1]\n"
    )
    inv = loads_inventory(text)
    return inv, LocalTransport(inv.names, sudo=False)


def test_sync_over_a_local_ring(tmp_path: Path) -> None:
    inv, tr = _local_ring(tmp_path)
    src = tmp_path / "a" / "models" / "m"
    (src / "tok").mkdir(parents=True)
    (src / "w.safetensors").write_bytes(_blob(6 * CHUNK + 5, seed=3))
    (src / "tok" / "t.json").write_text("{}\n")
    seen: list[weights.Progress] = []
    rep = weights.sync(inv, tr, "/models/m", "na", progress=seen.append, connections=2, chunk_mb=0.25, poll_s=0.05,
                       serve_ttl_s=20)
    assert rep.ok and rep.files == 2 and set(rep.nodes) == {"nb", "nc", "nd"}
    assert rep.nodes["nc"].sender == "nb" and rep.nodes["nc"].address == "127.20.2.2"
    for c in "bcd":
        for rel in ("w.safetensors", "tok/t.json"):
            assert (tmp_path / c / "models" / "m" / rel).read_bytes() == (src / rel).read_bytes()
        assert rep.nodes[f"n{c}"].bytes == rep.total_bytes
    assert {p.node for p in seen if p.phase == "pull"} <= {"nb", "nc", "nd"}
    assert (tmp_path / "b" / "opt" / "sparkctl" / "weights_agent.py").stat().st_mode & 0o777 == 0o755

    again = weights.sync(inv, tr, "/models/m", "na", connections=2, chunk_mb=0.25, poll_s=0.05, serve_ttl_s=20)
    assert again.ok and all(n.bytes == 0 and n.skipped_files == 2 for n in again.nodes.values())
    # every server and job was stopped
    for c in "abcd":
        for log in (tmp_path / c / "opt" / "sparkctl" / "weights").glob("*.jsonl"):
            started = json.loads(log.read_text().splitlines()[0])
            assert not agent._is_agent(started["pid"])


def test_fetch_on_one_node(served: Served, tmp_path: Path) -> None:
    inv, tr = _local_ring(tmp_path)
    rep = weights.fetch(inv, tr, "na", served.base + "model.bin", "/models/x/model.bin", connections=3, chunk_mb=0.25,
                        poll_s=0.05)
    got = tmp_path / "a" / "models" / "x" / "model.bin"
    assert got.read_bytes() == (served.root / "model.bin").read_bytes()
    assert rep.dest == str(got) and rep.sha256 == _sha(got.read_bytes()) and not rep.skipped


def test_sync_of_a_single_file_to_a_pair(tmp_path: Path) -> None:
    inv = loads_inventory(
        "cluster: {name: t, fabric_pool: 127.21.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
        f"  - {{name: a, host: 192.0.2.1, prefix: {tmp_path / 'a'}}}\n"
        f"  - {{name: b, host: 192.0.2.2, prefix: {tmp_path / 'b'}}}\n"
        "cables: [[a:p0, b:p0], [a:p1, b:p1]]\n"
    )
    gguf = tmp_path / "a" / "models" / "m.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(_blob(CHUNK + 3, seed=4))
    (gguf.parent / "unrelated.txt").write_text("not part of the weights\n")
    rep = weights.sync(inv, LocalTransport(inv.names, sudo=False), "/models/m.gguf", "a", poll_s=0.05, serve_ttl_s=20)
    assert rep.ok and rep.files == 1 and rep.nodes["b"].address == "127.21.0.1"
    assert (tmp_path / "b" / "models" / "m.gguf").read_bytes() == gguf.read_bytes()
    assert not (tmp_path / "b" / "models" / "unrelated.txt").exists()


def test_tail_waits_for_the_next_event_and_not_for_a_dead_job(tmp_path: Path) -> None:
    """The long poll behind `weights sync`: a tail with --wait-s returns the event
    written while it waits (a plain tail would return nothing), and returns at once,
    saying so, when the job is gone."""
    log = tmp_path / "job.jsonl"
    log.write_text('{"event":"start"}\n')
    writer = threading.Timer(0.3, lambda: log.open("a").write('{"event":"done","ok":true}\n'))
    writer.start()
    try:
        r = subprocess.run([sys.executable, str(AGENT), "tail", "--log", str(log), "--offset",
                            str(log.stat().st_size), "--wait-s", "8"], capture_output=True, text=True, timeout=30)
    finally:
        writer.join()
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [e["event"] for e in lines] == ["done", "tail"], r.stdout + r.stderr
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    r = subprocess.run([sys.executable, str(AGENT), "tail", "--log", str(log), "--offset", str(log.stat().st_size),
                        "--pid", str(dead.pid), "--wait-s", "8"], capture_output=True, text=True, timeout=30)
    last = json.loads(r.stdout.splitlines()[-1])
    assert (last["event"], last["offset"], last["alive"]) == ("tail", log.stat().st_size, False)


def test_agent_summary_compares_nodes_by_the_hash_cache_without_reading_the_files(tmp_path: Path) -> None:
    """Two copies in different places, hashed by their own caches, have one digest; a
    different byte gives another; an edit since hashing, or a .part left over, is named."""
    from sparkctl.remote import weights_agent as agent

    def node(name: str, blob: bytes) -> tuple[Path, agent.HashCache]:
        root = tmp_path / name / "model"
        root.mkdir(parents=True)
        (root / "model.safetensors").write_bytes(blob)
        (root / "config.json").write_text("{}\n")
        cache = agent.HashCache(str(tmp_path / name / "hash-cache.json"))
        agent.build_manifest(str(root), emit=agent.Emitter(open(os.devnull, "w")), cache=cache, chunk_bytes=1024)
        return root, cache

    a, ca = node("a", b"x" * 5000)
    b, cb = node("b", b"x" * 5000)
    c, cc = node("c", b"x" * 4999 + b"y")
    sa, sb, sc = (agent.cached_summary(str(r), k) for r, k in ((a, ca), (b, cb), (c, cc)))
    assert sa["digest"] and sa["digest"] == sb["digest"] != sc["digest"]
    assert (sa["files"], sa["bytes"], sa["n_unverified"], sa["partial"]) == (2, 5003, 0, 0)
    (b / "config.json").write_text("{ }\n")  # an edit since b hashed it
    (b / "extra.bin.part").write_bytes(b"half")
    sb = agent.cached_summary(str(b), cb)
    assert sb["digest"] is None and sb["unverified"] == ["config.json"] and sb["partial"] == 1
    assert agent.cached_summary(str(tmp_path / "nowhere"), ca)["kind"] == "missing"
    # nothing is read: a file's bytes changed behind the cache's back (size and mtime kept) go unseen
    st = os.stat(a / "model.safetensors")
    (a / "model.safetensors").write_bytes(b"z" * 5000)
    os.utime(a / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert agent.cached_summary(str(a), ca)["digest"] == sa["digest"]
