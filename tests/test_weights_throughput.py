"""What the weights throughput work relies on, as behaviour (no timed assertion):

* the agent keeps its N connections busy across file boundaries (a repository
  of many files is not downloaded one file at a time);
* a file's failure stops that file only; the job's stop stops all;
* a fetch leaves each chunk's SHA-256 in the hash cache, so a manifest after it
  reads no byte;
* the manifest starts and reports its end in one command (``--linger-s``);
* the agent reaches every node through the transport's fan-out
  (``put_all``), and a node that refuses it is named (``FanOut.raise_for``);
* the listen backlog holds a burst of simultaneous connects (no SYN retried a
  second later).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.model.inventory import loads_inventory
from sparkctl.ops import weights
from sparkctl.remote import weights_agent as agent
from sparkctl.transport import FakeTransport, LocalTransport, reply

KIB = 1024
CHUNK = 64 * KIB


def _blob(size: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 64
    return (block * (size // len(block) + 1))[:size]


def _quiet() -> agent.Emitter:
    return agent.Emitter(open(os.devnull, "w"))


class _Busy(agent.WeightsServer):
    """Counts requests in flight at once; each answer is held a little so that concurrent ones overlap."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.in_flight = 0
        self.most = 0
        self.lock = threading.Lock()

    def touch(self, delta: int) -> None:
        with self.lock:
            self.in_flight += delta
            self.most = max(self.most, self.in_flight)
        super().touch(delta)
        if delta > 0:
            time.sleep(0.05)


class _CountedSlots(agent.Slots):
    """The job's connection budget, counting its holders: the client's own count, so a request the
    server is still finishing (its ``touch(-1)`` comes after the body) is not taken for one more
    connection; the server's count bounds the overlap from below only."""

    most = 0
    holders = 0
    lock = threading.Lock()

    def acquire(self, stop: threading.Event | agent.StopScope) -> bool:
        if not super().acquire(stop):
            return False
        with _CountedSlots.lock:
            _CountedSlots.holders += 1
            _CountedSlots.most = max(_CountedSlots.most, _CountedSlots.holders)
        return True

    def release(self) -> None:
        with _CountedSlots.lock:
            _CountedSlots.holders -= 1
        super().release()


@pytest.fixture
def counted_slots(monkeypatch: pytest.MonkeyPatch) -> type[_CountedSlots]:
    _CountedSlots.most = _CountedSlots.holders = 0
    monkeypatch.setattr(agent, "Slots", _CountedSlots)
    return _CountedSlots


@pytest.fixture
def many_small(tmp_path: Path) -> Iterator[tuple[_Busy, str, dict]]:
    root = tmp_path / "src"
    root.mkdir()
    for i in range(8):  # eight files of one chunk each
        (root / f"f{i}.bin").write_bytes(_blob(CHUNK - 100 * i, i))
    server = _Busy(str(root), "127.0.0.1", 0, emit=_quiet())
    stop = threading.Event()
    t = threading.Thread(target=agent.serve, args=(server, 30.0, _quiet(), stop), daemon=True)
    t.start()
    manifest = agent.build_manifest(str(root), emit=_quiet(), chunk_bytes=CHUNK)
    yield server, f"http://127.0.0.1:{server.server_address[1]}/", manifest
    stop.set()
    t.join(5)


def test_a_pull_of_many_one_chunk_files_keeps_several_connections_busy(
    many_small, counted_slots: type[_CountedSlots], tmp_path: Path,
) -> None:
    server, base, manifest = many_small
    res = agent.pull(base, manifest, str(tmp_path / "dst"), emit=_quiet(), connections=4, chunk_bytes=CHUNK)
    assert res["fetched"] == 8 and res["verified"]
    # one file at a time would never have had more than its one chunk in flight
    assert server.most >= 2
    assert 2 <= counted_slots.most <= 4


def test_the_connection_budget_is_shared_by_every_file(
    many_small, counted_slots: type[_CountedSlots], tmp_path: Path,
) -> None:
    server, base, manifest = many_small
    agent.pull(base, manifest, str(tmp_path / "dst"), emit=_quiet(), connections=2, chunk_bytes=CHUNK)
    assert counted_slots.most == 2


def test_each_file_a_failure_stops_the_others_and_is_raised_first() -> None:
    seen: list[str] = []

    def bad(scope: agent.StopScope, drained: threading.Event) -> None:
        raise agent.AgentError("the first file broke")

    def later(scope: agent.StopScope, drained: threading.Event) -> None:
        seen.append("started")  # never: the job stopped before it was due

    with pytest.raises(agent.AgentError, match="the first file broke"):
        agent.each_file(iter([bad, later]), threading.Event(), 4)
    assert seen == []


def test_a_file_scope_stops_itself_only_and_the_job_stops_every_file() -> None:
    job = threading.Event()
    a, b = agent.StopScope(job), agent.StopScope(job)
    a.set()
    assert a.is_set() and not b.is_set() and not job.is_set()
    job.set()
    assert b.is_set()


def test_a_fetch_leaves_chunk_hashes_so_the_manifest_reads_nothing(many_small, tmp_path: Path) -> None:
    _, base, _ = many_small
    big = tmp_path / "big.bin"
    data = _blob(5 * CHUNK + 7, 42)
    (tmp_path / "src" / "big.bin").write_bytes(data)
    cache = agent.HashCache(str(tmp_path / "cache.json"))
    agent.fetch_file(base + "big.bin", str(big), emit=_quiet(), connections=3, chunk_bytes=CHUNK,
                     sha256=hashlib.sha256(data).hexdigest(), cache=cache)
    hit = cache.get_chunks(str(big), CHUNK)
    assert hit is not None
    assert hit == (hashlib.sha256(data).hexdigest(), agent.hash_chunks(str(big), CHUNK)[1])
    # a manifest of that file now comes from the cache: no byte is read (the meter counts none)
    meter = agent.Meter(_quiet(), 100.0)
    assert agent.file_digests(str(big), CHUNK, meter, cache) == hit and meter.session_bytes == 0


class _Counting(LocalTransport):
    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.labels: list[tuple[str, str]] = []

    def _run(self, node: str, cmd: str, *, label: str, **kw: object):  # type: ignore[no-untyped-def]
        self.labels.append((node, label))
        return super()._run(node, cmd, label=label, **kw)  # type: ignore[arg-type]


def test_a_warm_sync_asks_the_source_for_its_manifest_in_one_command(tmp_path: Path) -> None:
    inv = loads_inventory(
        "cluster: {name: t, fabric_pool: 127.20.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
        f"  - {{name: a, host: 192.0.2.1, prefix: {tmp_path / 'a'}}}\n"
        f"  - {{name: b, host: 192.0.2.2, prefix: {tmp_path / 'b'}}}\ncables: [[a:p0, b:p0]]\n")
    (tmp_path / "a" / "models").mkdir(parents=True)
    (tmp_path / "a" / "models" / "w.bin").write_bytes(_blob(3 * CHUNK, 7))
    tr = _Counting(inv.names, sudo=False)
    first = weights.sync(inv, tr, "/models", "a", chunk_mb=CHUNK / 2**20)
    assert first.ok
    tr.labels.clear()
    again = weights.sync(inv, tr, "/models", "a", chunk_mb=CHUNK / 2**20)
    assert again.ok
    on_a = [label.split()[3] if label.startswith("python3") else label.split()[0] for n, label in tr.labels if n == "a"]
    # the agent, the manifest (started and ended in one command), the server, its stop: no poll of the source
    assert on_a == ["put", "manifest", "serve", "stop"]


def test_push_agents_goes_through_put_all_and_names_every_refusing_node(tmp_path: Path) -> None:
    inv = loads_inventory(
        "cluster: {name: t, fabric_pool: 127.20.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
        + "".join(f"  - {{name: {n}, host: 192.0.2.{i + 1}, prefix: {tmp_path / n}}}\n" for i, n in enumerate("abc"))
        + "cables: [[a:p0, b:p1], [b:p0, c:p1], [c:p0, a:p1]]\n")
    path = {n: weights.agent_path(inv, n) for n in "abc"}
    fake = FakeTransport({("b", f"put {path['b']}"): reply(exit_code=1, stderr="mkdir: Permission denied"),
                          ("c", f"put {path['c']}"): reply(exit_code=1, stderr="No space left on device")},
                         nodes=["a", "b", "c"], accept_puts=True)
    with pytest.raises(weights.WeightsError) as e:
        weights.push_agents(inv, fake, ["a", "b", "c"])
    assert "installing the weights agent failed on b, c" in str(e.value) and "Permission denied" in str(e.value)
    assert e.value.ref.node == "b" and e.value.hint
    assert fake.files[("a", path["a"])] == (weights.agent_source(), 0o755)  # the node that could, got it


def test_put_all_keeps_each_nodes_order_and_stops_a_node_at_its_first_failure() -> None:
    fake = FakeTransport({("y", "put /etc/2"): reply(exit_code=1, stderr="read-only file system")},
                         nodes=["x", "y"], accept_puts=True)
    res = fake.put_all({"x": [("/etc/1", b"one", 0o644), ("/etc/2", b"two", 0o600)],
                        "y": [("/etc/1", b"one", 0o644), ("/etc/2", b"two", 0o600), ("/etc/3", b"3", 0o644)]},
                       sudo={"x": True, "y": False})
    assert res["x"].ok and not res["y"].ok and list(res.failed) == ["y"]
    assert [c.command for c in fake.calls if c.node == "y"] == ["put /etc/1", "put /etc/2"]  # /etc/3 never tried
    assert {c.sudo for c in fake.calls if c.node == "x"} == {True} and fake.files[("x", "/etc/2")] == (b"two", 0o600)
    with pytest.raises(AssertionError):  # the fake still refuses what it was not told
        FakeTransport(nodes=["x"]).put_all({"x": [("/etc/1", b"", 0o644)]})


def test_the_servers_hold_a_burst_of_connects_beyond_socketservers_default_backlog() -> None:
    from sparkctl_sim.hub import _Server

    assert agent.WeightsServer.request_queue_size >= 64 and _Server.request_queue_size >= 64
    # a listening socket that accepts nothing still completes this many handshakes (the backlog)
    server = agent.WeightsServer(os.devnull, "127.0.0.1", 0, emit=_quiet())
    try:
        socks = []
        for _ in range(16):
            s = socket.create_connection(server.server_address[:2], timeout=0.5)
            socks.append(s)
        assert len(socks) == 16
    finally:
        for s in socks:
            s.close()
        server.server_close()
