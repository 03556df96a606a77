"""The TCP rendezvous of the simulated engines (modelled on torch.distributed).

Protocol: newline-delimited JSON over one TCP connection per non-zero rank.

* rank r > 0 connects to MASTER_ADDR:MASTER_PORT (its socket bound to its own
  fabric address, ``SPARKCTL_HOST_IP``, when set), retrying until the
  rendezvous deadline, and sends
  ``{"type": "hello", "rank", "world_size", "served_name", "host_ip", "engine", "model"}``;
* rank 0 answers ``{"type": "welcome"}`` or ``{"type": "refused", "reason"}``
  (duplicate rank, rank out of range, another world size, another served name
  or engine, or a rendezvous that is already complete). A refused rank exits
  non-zero;
* when ranks 1..N-1 have all joined, rank 0 sends ``{"type": "go"}``; every
  rank then "initialises NCCL" and "loads weights" and the joiners report
  ``{"type": "ready"}``. Rank 0 opens its HTTP port only after all are ready;
* both sides send ``{"type": "hb", "state": {...}}`` every second. A joiner's
  heartbeat carries its node's clock cap, stale-link and wedged flags, so rank
  0 can apply the slowest node to the whole collective. A connection that
  closes or stays silent past the heartbeat timeout is a lost peer: rank 0
  aborts if it happens after ``go``, a joiner aborts whenever rank 0 is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkctl_sim.engines.cli import EngineConfig
from sparkctl_sim.engines.logs import EngineLog

HELLO_TIMEOUT_S = 10.0
CONNECT_RETRY_S = 0.5


class RendezvousError(Exception):
    """Fatal for this rank: logged by the runtime, exit 1."""


class PeerLost(Exception):
    """A peer went away after the communicator formed (NCCL would abort)."""


@dataclass
class Timing:
    deadline_s: float = 120.0  # SPARKCTL_SIM_RDZV_TIMEOUT_S
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 10.0  # SPARKCTL_SIM_HEARTBEAT_TIMEOUT_S


async def _send(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    writer.write(json.dumps(msg).encode() + b"\n")
    await writer.drain()


async def _recv(reader: asyncio.StreamReader, timeout: float | None) -> dict[str, Any] | None:
    """One message, or None on EOF / timeout / garbage."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (asyncio.TimeoutError, OSError, asyncio.LimitOverrunError, ValueError):
        return None
    if not line:
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


# ---------------------------------------------------------------------------
# rank 0
# ---------------------------------------------------------------------------


@dataclass
class Peer:
    rank: int
    host_ip: str
    peer_addr: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    state: dict[str, Any] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


class Head:
    """Rank 0's side: accept, validate and watch ranks 1..N-1."""

    def __init__(
        self, cfg: EngineConfig, log: EngineLog, timing: Timing, local_state: Callable[[], dict[str, Any]]
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.timing = timing
        self.local_state = local_state
        self.peers: dict[int, Peer] = {}
        self.started = False  # "go" sent: losing a peer is now fatal
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._all_joined = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None

    async def listen(self) -> None:
        addr, port = self.cfg.master_addr, self.cfg.master_port
        try:
            self._server = await asyncio.start_server(self._handle, addr, port, reuse_address=True)
        except OSError as e:
            raise RendezvousError(
                f"cannot listen on the rendezvous address {addr}:{port} ({e.strerror or e}); "
                "MASTER_ADDR must be an address of this node and the port free"
            ) from None
        self.log.info(
            f"world_size={self.cfg.world_size} rank=0 local_rank=0 "
            f"distributed_init_method=tcp://{addr}:{port} backend=nccl",
            src="parallel_state.py:1208",
        )

    async def wait_joined(self) -> None:
        """Until every rank joined; RendezvousError at the deadline."""
        n = self.cfg.world_size - 1
        try:
            await asyncio.wait_for(self._all_joined.wait(), self.timing.deadline_s)
        except asyncio.TimeoutError:
            raise RendezvousError(
                f"torch.distributed.DistStoreError: Timed out after {self.timing.deadline_s:.0f} seconds "
                f"waiting for clients. {len(self.peers) + 1}/{n + 1} clients joined."
            ) from None

    async def start(self) -> None:
        """Send go to every rank; from now on a lost peer is fatal."""
        self.started = True
        for p in list(self.peers.values()):
            with contextlib.suppress(OSError):
                await _send(p.writer, {"type": "go"})

    async def wait_ready(self) -> None:
        await asyncio.gather(*(p.ready.wait() for p in self.peers.values()))

    def peer_states(self) -> list[dict[str, Any]]:
        return [p.state for p in self.peers.values()]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for p in list(self.peers.values()):
            for t in p.tasks:
                t.cancel()
            _close(p.writer)

    # --- connection handling ----------------------------------------------------
    def _refuse_reason(self, hello: dict[str, Any]) -> str | None:
        cfg = self.cfg
        rank = hello.get("rank")
        if hello.get("type") != "hello" or not isinstance(rank, int):
            return "malformed hello"
        if self.started:
            return "the rendezvous is already complete (a new worker joined a running head?)"
        if hello.get("engine") != cfg.engine:
            return f"engine {hello.get('engine')!r} does not match the head's {cfg.engine!r}"
        if hello.get("world_size") != cfg.world_size:
            return f"world size mismatch: rank {rank} says {hello.get('world_size')}, the head expects {cfg.world_size}"
        if not 1 <= rank < cfg.world_size:
            return f"rank {rank} out of range 1..{cfg.world_size - 1}"
        if rank in self.peers:
            return f"duplicate rank {rank} (already joined from {self.peers[rank].host_ip})"
        if hello.get("served_name") != cfg.served_name:
            return f"served name {hello.get('served_name')!r} does not match the head's {cfg.served_name!r}"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername") or ("?", 0)
        peer_addr = f"{peername[0]}<{peername[1]}>"
        hello = await _recv(reader, HELLO_TIMEOUT_S)
        if hello is None:
            _close(writer)
            return
        reason = self._refuse_reason(hello)
        if reason is not None:
            self.log.warn(f"rendezvous: refused rank {hello.get('rank')} from {peername[0]}: {reason}")
            with contextlib.suppress(OSError):
                await _send(writer, {"type": "refused", "reason": reason})
            _close(writer)
            return
        rank = hello["rank"]
        host_ip = str(hello.get("host_ip") or peername[0])
        if hello.get("host_ip") and hello["host_ip"] != peername[0]:
            self.log.warn(
                f"rendezvous: rank {rank} announced host_ip {hello['host_ip']} but connected from {peername[0]}"
            )
        if hello.get("model") != self.cfg.model_path:
            self.log.warn(f"rendezvous: rank {rank} loads {hello.get('model')!r}, the head {self.cfg.model_path!r}")
        peer = Peer(rank, host_ip, peer_addr, reader, writer)
        self.peers[rank] = peer
        try:
            await _send(writer, {"type": "welcome"})
        except OSError:
            self.peers.pop(rank, None)
            _close(writer)
            return
        self.log.info(f"rendezvous: rank {rank} joined from {peername[0]} ({len(self.peers) + 1}/{self.cfg.world_size})")
        peer.tasks = [
            asyncio.create_task(self._heartbeat(peer)),
            asyncio.create_task(self._watch(peer)),
        ]
        if len(self.peers) == self.cfg.world_size - 1:
            self._all_joined.set()

    async def _heartbeat(self, peer: Peer) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                await _send(peer.writer, {"type": "hb", "t": time.time()})
                await asyncio.sleep(self.timing.heartbeat_s)

    async def _watch(self, peer: Peer) -> None:
        while True:
            msg = await _recv(peer.reader, self.timing.heartbeat_timeout_s)
            if msg is None:
                break
            if msg.get("type") == "hb":
                peer.state = dict(msg.get("state") or {})
            elif msg.get("type") == "ready":
                peer.state = dict(msg.get("state") or peer.state)
                peer.ready.set()
        _close(peer.writer)
        for t in peer.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        if self.peers.get(peer.rank) is peer:
            del self.peers[peer.rank]
        if not self.started:
            self._all_joined.clear()
            self.log.warn(f"rendezvous: rank {peer.rank} ({peer.host_ip}) left before the rendezvous completed")
            return
        if not self.lost.done():
            self.lost.set_result(
                f"rank {peer.rank} at {peer.peer_addr}: remote process exited or there was a network error"
            )


# ---------------------------------------------------------------------------
# ranks 1..N-1
# ---------------------------------------------------------------------------


class Worker:
    """A non-zero rank's side: join, wait for go, heartbeat until rank 0 goes."""

    def __init__(
        self,
        cfg: EngineConfig,
        log: EngineLog,
        timing: Timing,
        host_ip: str | None,
        local_state: Callable[[], dict[str, Any]],
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.timing = timing
        self.host_ip = host_ip
        self.local_state = local_state
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._go = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    async def join(self) -> None:
        cfg = self.cfg
        target = f"{cfg.master_addr}:{cfg.master_port}"
        deadline = time.monotonic() + self.timing.deadline_s
        local = (self.host_ip, 0) if self.host_ip else None
        last_err = ""
        while True:
            try:
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(cfg.master_addr, cfg.master_port, local_addr=local), 5.0
                )
                break
            except (OSError, asyncio.TimeoutError) as e:
                last_err = getattr(e, "strerror", None) or str(e) or type(e).__name__
                if isinstance(e, OSError) and e.errno == 99:  # EADDRNOTAVAIL: host_ip is not ours
                    raise RendezvousError(f"cannot bind to SPARKCTL_HOST_IP {self.host_ip}: {last_err}") from None
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"torch.distributed.DistNetworkError: timed out after {self.timing.deadline_s:.0f} s "
                    f"connecting to the master at {target} ({last_err})"
                )
            await asyncio.sleep(CONNECT_RETRY_S)
        assert self.reader is not None and self.writer is not None
        await _send(
            self.writer,
            {
                "type": "hello",
                "rank": cfg.rank,
                "world_size": cfg.world_size,
                "served_name": cfg.served_name,
                "host_ip": self.host_ip or self.writer.get_extra_info("sockname")[0],
                "engine": cfg.engine,
                "model": cfg.model_path,
            },
        )
        reply = await _recv(self.reader, HELLO_TIMEOUT_S)
        if reply is None:
            raise RendezvousError(f"the master at {target} closed the connection during the handshake")
        if reply.get("type") == "refused":
            raise RendezvousError(f"the master at {target} refused rank {cfg.rank}: {reply.get('reason')}")
        self.log.info(f"rendezvous: rank {cfg.rank} joined the master at {target}")
        self._tasks = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._watch())]

    async def wait_go(self) -> None:
        go = asyncio.ensure_future(self._go.wait())
        done, _ = await asyncio.wait({go, self.lost}, return_when=asyncio.FIRST_COMPLETED)
        if self.lost in done:
            go.cancel()
            raise PeerLost(self.lost.result())

    async def ready(self) -> None:
        assert self.writer is not None
        with contextlib.suppress(OSError):
            await _send(self.writer, {"type": "ready", "state": self.local_state()})

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.writer is not None:
            _close(self.writer)

    async def _heartbeat(self) -> None:
        assert self.writer is not None
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                await _send(self.writer, {"type": "hb", "t": time.time(), "state": self.local_state()})
                await asyncio.sleep(self.timing.heartbeat_s)

    async def _watch(self) -> None:
        assert self.reader is not None
        while True:
            msg = await _recv(self.reader, self.timing.heartbeat_timeout_s)
            if msg is None:
                break
            if msg.get("type") == "go":
                self._go.set()
        if not self.lost.done():
            self.lost.set_result(
                f"master {self.cfg.master_addr}<{self.cfg.master_port}>: "
                "remote process exited or there was a network error"
            )
