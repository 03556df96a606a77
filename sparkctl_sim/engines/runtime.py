"""Lifecycle of one simulated engine process; the only place that picks exit codes.

Order of events:

1. parse the command line (exit 2 on a usage error, like argparse);
2. select the RoCE devices from ``NCCL_IB_HCA`` (exit 1 with an NCCL WARN if
   it names a device this node lacks);
3. register ``gpu_memory_utilization * 119 GiB`` in the node state under this
   pid (when ``SPARKCTL_SIM_STATE`` is set);
4. rendezvous (world > 1): rank 0 listens on MASTER_ADDR:MASTER_PORT, the
   others join; then "NCCL init" lines, ``Init COMPLETE``, and a simulated
   weight load of ``SPARKCTL_SIM_LOAD_S / speedup`` seconds;
5. rank 0 opens its HTTP port once every rank is loaded and prints the
   engine's readiness line; every rank then runs until a signal or a lost peer.

Exit codes: 0 after SIGTERM/SIGINT; 1 for rendezvous, NCCL or lost-peer
failures; 2 for usage errors; 129 after SIGHUP (the session went away).
On every exit the registered memory is removed from the node state, or moved
to ``leaked_mem_gib`` when ``faults.leak_on_death`` is set (the kernel-1031
law). A SIGKILLed engine cannot clean up; the simulated cluster settles
the entries of dead pids (``sparkctl_sim.cluster``).

Environment read: SPARKCTL_SIM_STATE, SPARKCTL_SIM_SPEEDUP,
SPARKCTL_SIM_LOAD_S, SPARKCTL_SIM_RDZV_TIMEOUT_S,
SPARKCTL_SIM_HEARTBEAT_TIMEOUT_S, SPARKCTL_SYSFS_ROOT, SPARKCTL_HOST_IP
(falls back to VLLM_HOST_IP), WORLD_SIZE, NODE_RANK, MASTER_ADDR,
MASTER_PORT, NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME, NCCL_ALGO,
NCCL_IB_MERGE_NICS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkctl_sim import nodestate
from sparkctl_sim.engines import cli
from sparkctl_sim.engines.cli import EngineConfig, IbDevice
from sparkctl_sim.engines.logs import EngineLog
from sparkctl_sim.engines.rendezvous import (
    Head,
    PeerLost,
    RendezvousError,
    Timing,
    Worker,
)
from sparkctl_sim.shims.rendered import renderer  # the node's tool views, rendered as the engine changes its state

STATE_TTL_S = 0.5
NCCL_VERSION = "2.28.9+cuda13.0"
# The NCCL an image carries: its NCCL_VERSION environment variable (NVIDIA's CUDA and
# NGC framework images set ENV NCCL_VERSION; the simulated image store writes it in
# the image config, sparkctl_sim/dockerimages.py), else this default. 2.30.7 is a
# version seen on Sparks (docs/reference/spark-facts.md §6: "2.30.7+cuda13.0").
DEFAULT_IMAGE_NCCL = "2.30.7"
# NCCL_IB_SUBNET_AWARE_ROUTING exists from NCCL 2.30.7 (release notes,
# https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-30-7.html). NCCL reads
# each parameter by name (src/misc/param.cc ncclGetEnv): an older NCCL never looks
# at the variable, prints nothing about it, and a ring whose non-neighbours sit on
# other subnets hangs in its first collective until the watchdog times out
# (issue #13; the simulator makes it a prompt, explicit timeout).
SUBNET_AWARE_SINCE = (2, 30, 7)


@functools.lru_cache(maxsize=1)
def _loaded_nccl() -> str | None:
    """The NCCL this process loaded: NCCL's "NCCL version" line comes from the library itself.
    ``import torch`` (the image's, sparkctl_sim/imagefs.py) maps its libnccl; ask it ncclGetVersion."""
    try:
        import ctypes

        import torch  # noqa: F401  (the simulated image's: loads its libnccl.so.2)
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = [ln.split(None, 5)[5].strip() for ln in fh if len(ln.split(None, 5)) == 6]
        lib = next(p for p in paths if os.path.basename(p).startswith("libnccl.so"))
        code = ctypes.c_int(0)
        if ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(code)) != 0:
            return None
    except (ImportError, OSError, StopIteration, AttributeError):
        return None
    c = code.value
    div = 10000 if c >= 10000 else 1000
    return f"{c // div}.{(c % div) // 100}.{c % 100}"


def image_nccl(env: Mapping[str, str]) -> str:
    """The NCCL the engine runs: the library its torch loaded, else the image's NCCL_VERSION, else the default."""
    loaded = _loaded_nccl()
    if loaded:
        return loaded
    v = env.get("NCCL_VERSION", "").strip()
    return v if re.fullmatch(r"\d+\.\d+\.\d+", v) else DEFAULT_IMAGE_NCCL


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split("."))


def subnet_routing_ignored(cfg: "EngineConfig", env: Mapping[str, str]) -> bool:
    """A ring that relies on NCCL_IB_SUBNET_AWARE_ROUTING with an NCCL that predates it."""
    return (cfg.world_size >= 3 and bool(env.get("NCCL_IB_SUBNET_AWARE_ROUTING"))
            and _ver(image_nccl(env)) < SUBNET_AWARE_SINCE)


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise cli.UsageError("sparkctl_sim.engine", "", f"{name}={raw!r} is not a number") from None
    if v < 0:
        raise cli.UsageError("sparkctl_sim.engine", "", f"{name}={raw!r} must not be negative")
    return v


# ---------------------------------------------------------------------------
# node state
# ---------------------------------------------------------------------------


def perf_facts(state: Mapping[str, Any] | None) -> dict[str, Any]:
    """The perf-relevant facts of one node's state: clock cap, stale, wedged."""
    if not state:
        return {"clock_cap_mhz": None, "stale": False, "wedged": False}
    lock = (state.get("gpu") or {}).get("clock_lock_mhz")
    cap: float | None
    if isinstance(lock, (list, tuple)) and lock:
        cap = float(lock[-1])
    elif isinstance(lock, (int, float)) and not isinstance(lock, bool):
        cap = float(lock)
    else:
        cap = None
    links = state.get("links") or {}
    stale = any(bool(v.get("stale")) and bool(v.get("cabled")) for v in links.values() if isinstance(v, dict))
    wedged = bool((state.get("faults") or {}).get("wedged"))
    return {"clock_cap_mhz": cap, "stale": stale, "wedged": wedged}


def combine(facts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The collective runs at its slowest rank: lowest cap, any stale, any wedged."""
    caps = [f["clock_cap_mhz"] for f in facts if f.get("clock_cap_mhz") is not None]
    return {
        "clock_cap_mhz": min(caps) if caps else None,
        "stale": any(f.get("stale") for f in facts),
        "wedged": any(f.get("wedged") for f in facts),
    }


class StateReader:
    """This node's state file, re-read at most every 0.5 s."""

    def __init__(self, path: str | None, log: EngineLog) -> None:
        self.path = path
        self.log = log
        self._at = -1e9
        self._facts = perf_facts(None)

    def facts(self) -> dict[str, Any]:
        if not self.path:
            return self._facts
        now = time.monotonic()
        if now - self._at >= STATE_TTL_S:
            self._at = now
            try:
                self._facts = perf_facts(nodestate.load(self.path))
            except (OSError, ValueError) as e:
                self.log.warn(f"cannot read the simulated node state {self.path}: {e}")
        return self._facts


def free_memory_refusal(engine: str, path: str | None, utilization: float) -> str:
    """vLLM's start-up check, or "" when it passes (or there is no node state).

    vllm/v1/worker/gpu_worker.py (0.11.2) init_device: ``requested_memory =
    total_memory * gpu_memory_utilization``; ``free_memory < requested_memory``
    raises ValueError with this message. The simulated free memory is MemFree
    (the page cache is not free), which is what ``cudaMemGetInfo`` reports on
    GB10's unified memory (ollama/ollama#12283, vllm-project/vllm#35356).
    STRICTER than 0.11.2 on compute capability 12.1, which swaps in psutil's
    MemAvailable (vllm/utils/mem_utils.py MemorySnapshot.measure); releases and
    engines without that branch refuse as simulated here.
    """
    if engine != "vllm" or not path:
        return ""
    try:
        with nodestate.edit(path) as s:  # absorbs a drop_caches written since the last edit
            free_kib, total_kib = nodestate.mem_free_kib(s), int(s["mem_total_kib"])
    except (OSError, ValueError, KeyError):
        return ""
    free, total = free_kib * 1024, total_kib * 1024
    requested = total * utilization
    if free >= requested:
        return ""
    gib = 1 << 30
    return (f"ValueError: Free memory on device ({round(free / gib, 2)}/{round(total / gib, 2)} GiB) on startup "
            f"is less than desired GPU memory utilization ({utilization}, {round(requested / gib, 2)} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes.")


def register_memory(path: str | None, pid: int, gib: float, log: EngineLog) -> bool:
    if not path:
        return False
    try:
        with nodestate.edit(path, views=renderer(path)) as s:
            s.setdefault("engine_mem_gib", {})[str(pid)] = gib
    except (OSError, ValueError) as e:
        log.warn(f"cannot register memory in the simulated node state {path}: {e}")
        return False
    return True


def release_memory(path: str | None, pid: int, log: EngineLog) -> None:
    """Remove this pid's GiB; move it to leaked_mem_gib under faults.leak_on_death."""
    if not path:
        return
    try:
        with nodestate.edit(path, views=renderer(path)) as s:
            gib = float(s.setdefault("engine_mem_gib", {}).pop(str(pid), 0.0))
            if (s.get("faults") or {}).get("leak_on_death") and gib:
                s["leaked_mem_gib"] = round(float(s.get("leaked_mem_gib", 0.0)) + gib, 3)
    except (OSError, ValueError) as e:
        log.warn(f"cannot release memory in the simulated node state {path}: {e}")


# ---------------------------------------------------------------------------
# log narratives
# ---------------------------------------------------------------------------


def _banner(cfg: EngineConfig, log: EngineLog) -> None:
    if cfg.engine == "vllm":
        log.raw(f"INFO {time.strftime('%m-%d %H:%M:%S')} [__init__.py:216] Automatically detected platform cuda.")
        log.info(f"vLLM API server version {cli.VERSIONS['vllm']}", src="api_server.py:1839")
        log.info(f"non-default args: {dict(cfg.extra)}", src="utils.py:233")
        log.info(f"Resolved architecture: {cli.ARCHITECTURE}", src="model.py:547")
        log.info(f"Using max model len {cfg.max_model_len}", src="model.py:1510")
    elif cfg.engine == "sglang":
        log.info(f"server_args=ServerArgs(model_path={cfg.model_path!r}, served_model_name={cfg.served_name!r}, "
                 f"tp_size={cfg.tp}, nnodes={cfg.world_size}, node_rank={cfg.rank}, host={cfg.host!r}, "
                 f"port={cfg.port}, context_length={cfg.max_model_len}, mem_fraction_static={cfg.mem_fraction})")
    elif cfg.engine == "ds41f":
        log.info(f"{cli.VERSIONS['ds41f']} starting: model={cfg.model_path} tp={cfg.tp} "
                 f"nnodes={cfg.world_size} node_rank={cfg.rank}")
    else:
        log.info(f"{cli.VERSIONS['tensorfold']}: weights={cfg.model_path} tp={cfg.tp} "
                 f"world={cfg.world_size} rank={cfg.rank}")


def _nccl_init(cfg: EngineConfig, log: EngineLog, env: Mapping[str, str], devs: list[IbDevice],
               host_ip: str) -> None:
    """The NCCL lines a healthy communicator init prints (docs/reference/spark-facts.md §6.1)."""
    ifnames = env.get("NCCL_SOCKET_IFNAME", "")
    oob_if = ifnames.split(",")[0].lstrip("=^") if ifnames else "eth0"
    version = image_nccl(env) + "+cuda13.0"
    ignored = subnet_routing_ignored(cfg, env)
    if cfg.engine == "sglang":
        log.info("sglang is using nccl==" + version.split("+")[0], src="tp")
    log.nccl(f"Bootstrap: Using {oob_if}:{host_ip}<0>")
    if ifnames:
        log.nccl(f"NCCL_SOCKET_IFNAME set by environment to {ifnames}")
    log.nccl("cudaDriverVersion 13000")
    log.nccl(f"NCCL version {version}")
    for var in ("NCCL_IB_HCA", "NCCL_ALGO", "NCCL_IB_MERGE_NICS", "NCCL_IB_SUBNET_AWARE_ROUTING",
                "NCCL_NET_PLUGIN", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_CUMEM_ENABLE"):
        if var == "NCCL_IB_SUBNET_AWARE_ROUTING" and ignored:
            continue  # an NCCL older than 2.30.7 does not know it: silence
        if env.get(var):
            log.nccl(f"{var} set by environment to {env[var]}")
    gid = env.get("NCCL_IB_GID_INDEX")
    if gid is not None:
        if gid.strip().lstrip("-").isdigit():
            log.nccl(f"NCCL_IB_GID_INDEX set by environment to {gid.strip()}.")
        else:
            log.nccl(f"Invalid value {gid!r} for NCCL_IB_GID_INDEX, using default 0 (the link-local GID)", warn=True)
    if devs:
        for i, d in enumerate(devs):
            log.nccl(f"NET/IB: [{i}] {d.name}:uverbs{i}:{d.port}/RoCE provider=Mlx5 speed=200000 "
                     f"context=0x{random.getrandbits(48):012x} pciPath=/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0 ar=0")
        using = " ".join(f"[{i}]{d.name}:{d.port}/RoCE" for i, d in enumerate(devs))
        log.nccl(f"NET/IB : Using {using} [RO]; OOB {oob_if}:{host_ip}<0>")
        log.nccl("Initialized NET plugin IB")
        log.nccl("Using network IB")
        transport = "NET/IB"
    else:
        log.nccl("NET/IB : No device found.")
        log.nccl(f"NET/Socket : Using [0]{oob_if}:{host_ip}<0>")
        log.nccl("Using network Socket")
        transport = "NET/Socket"
    comm = f"0x{random.getrandbits(48):012x}"
    n, r = cfg.world_size, cfg.rank
    log.nccl(f"comm {comm} rank {r} nRanks {n} nNodes {n} localRanks 1 localRank 0 MNNVL 0")
    for ch in range(2):
        log.nccl(f"Channel {ch:02d}/0 : {r}[0] -> {(r + 1) % n}[0] [send] via {transport}/{ch % max(1, len(devs))}")
    log.nccl(f"ncclCommInitRankConfig comm {comm} rank {r} nranks {n} cudaDev 0 nvmlDev 0 busId f01000 "
             f"commId 0x{random.getrandbits(64):016x} - Init COMPLETE")
    if cfg.engine == "vllm":
        log.info(f"rank {r} in world size {n} is assigned as DP rank 0, PP rank 0, TP rank {r}, EP rank {r}",
                 src="parallel_state.py:1394")
    elif cfg.engine == "sglang":
        log.info("Init torch distributed ends. elapsed=0.42 s", src="tp")


def _loaded(cfg: EngineConfig, log: EngineLog, load_s: float) -> None:
    weights_gib = round(cfg.mem_gib * 0.55, 2)
    kv_gib = max(0.0, cfg.mem_gib - weights_gib - 4.0)
    kv_tokens = int(kv_gib * 1024 * 1024 * 1024 / (70 * 1024))  # ~70 KiB per token of MLA cache
    if cfg.engine == "vllm":
        log.info(f"Model loading took {weights_gib} GiB memory and {load_s:.6f} seconds", src="gpu_model_runner.py:2602")
        log.info(f"GPU KV cache size: {kv_tokens:,} tokens", src="kv_cache_utils.py:1087")
        log.info(f"Maximum concurrency for {cfg.max_model_len:,} tokens per request: "
                 f"{kv_tokens / cfg.max_model_len:.2f}x", src="kv_cache_utils.py:1091")
    elif cfg.engine == "sglang":
        log.info(f"Load weight end. elapsed={load_s:.2f} s, type={cli.ARCHITECTURE}, avail mem="
                 f"{cfg.mem_gib - weights_gib:.2f} GB, mem usage={weights_gib:.2f} GB.", src="tp")
        log.info(f"KV Cache is allocated. #tokens: {kv_tokens}, KV size: {kv_gib:.2f} GB", src="tp")
        log.info("Capture cuda graph end. Time elapsed: 0.50 s", src="tp")
    elif cfg.engine == "ds41f":
        log.info(f"weights loaded: {weights_gib} GiB in {load_s:.2f}s; kv cache {kv_tokens} tokens", src="loader")
    else:
        log.info(f"weights folded: {weights_gib} GiB in {load_s:.2f}s", src="load")


def _ready(cfg: EngineConfig, log: EngineLog, url: str) -> None:
    """The readiness lines, printed only once the port accepts connections."""
    if cfg.engine == "vllm":
        log.info(f"Starting vLLM API server 0 on {url}", src="api_server.py:1971")
        log.info("Available routes are:", src="launcher.py:36")
        for method, path in (("GET, HEAD", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/version")):
            log.info(f"Route: {path}, Methods: {method}", src="launcher.py:44")
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
    elif cfg.engine == "sglang":
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.uvicorn(f"Uvicorn running on {url} (Press CTRL+C to quit)")
        log.info("The server is fired up and ready to roll!")
    elif cfg.engine == "ds41f":
        log.info(f"server ready on {url} (model {cfg.served_name})", src="serve")
    else:
        log.info(f"ready: listening on {url} as {cfg.served_name}", src="serve")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


class _Run:
    def __init__(self, cfg: EngineConfig, env: Mapping[str, str], devs: list[IbDevice], log: EngineLog) -> None:
        self.cfg = cfg
        self.env = env
        self.devs = devs
        self.log = log
        self.speedup = _env_float(env, "SPARKCTL_SIM_SPEEDUP", 1.0)
        if self.speedup <= 0:
            raise cli.UsageError("sparkctl_sim.engine", "", "SPARKCTL_SIM_SPEEDUP must be > 0")
        self.load_s = _env_float(env, "SPARKCTL_SIM_LOAD_S", 2.0)
        self.timing = Timing(
            deadline_s=_env_float(env, "SPARKCTL_SIM_RDZV_TIMEOUT_S", 120.0),
            heartbeat_timeout_s=_env_float(env, "SPARKCTL_SIM_HEARTBEAT_TIMEOUT_S", 10.0),
        )
        self.host_ip = env.get("SPARKCTL_HOST_IP") or env.get("VLLM_HOST_IP") or None
        self.state = StateReader(env.get("SPARKCTL_SIM_STATE") or None, log)
        self.stop_signal: int | None = None

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(signum: int) -> None:
            self.stop_signal = signum
            # Give the memory back at once, as the real driver frees it when the
            # process starts tearing down (a stop that escalates to SIGKILL must
            # not look like a leak on a kernel that does not leak).
            on_stop = getattr(self, "on_stop", None)
            if on_stop is not None:
                on_stop()
            stop.set()

        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(s, on_signal, s)
        work = asyncio.create_task(self._serve())
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if work in done and self.stop_signal is None:
            stopper.cancel()
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        name = signal.Signals(self.stop_signal or signal.SIGTERM).name
        self.log.info(f"received {name}, shutting down")
        return 129 if self.stop_signal == signal.SIGHUP else 0

    async def _serve(self) -> int:
        cfg, log = self.cfg, self.log
        head: Head | None = None
        worker: Worker | None = None
        runner = None
        try:
            if cfg.world_size > 1:
                if cfg.rank == 0:
                    head = Head(cfg, log, self.timing, self.state.facts)
                    await head.listen()
                    await head.wait_joined()
                    await head.start()
                else:
                    worker = Worker(cfg, log, self.timing, self.host_ip, self.state.facts)
                    await worker.join()
                    await worker.wait_go()
                _nccl_init(cfg, log, self.env, self.devs, self.host_ip or str(cfg.master_addr))
                if subnet_routing_ignored(cfg, self.env):
                    return self._collective_timeout()
            t0 = time.monotonic()
            await asyncio.sleep(self.load_s / self.speedup)
            _loaded(cfg, log, self.load_s)
            if worker is not None:
                await worker.ready()
                return self._fatal_lost(await worker.lost)
            if head is not None:
                ready = asyncio.ensure_future(head.wait_ready())
                done, _ = await asyncio.wait({ready, head.lost}, return_when=asyncio.FIRST_COMPLETED)
                if head.lost in done:
                    ready.cancel()
                    return self._fatal_lost(head.lost.result())
            if cfg.engine == "vllm":
                log.info(f"init engine (profile, create kv cache, warmup model) took "
                         f"{(time.monotonic() - t0) * self.speedup:.2f} seconds", src="core.py:210")
            runner = await self._start_http(head)
            if head is not None:
                return self._fatal_lost(await head.lost)
            await asyncio.Event().wait()  # single node: serve until a signal
            return 0
        except RendezvousError as e:
            log.error(str(e))
            return 1
        except PeerLost as e:
            return self._fatal_lost(str(e))
        finally:
            if runner is not None:
                await runner.cleanup()
            if head is not None:
                await head.close()
            if worker is not None:
                await worker.close()

    def _collective_timeout(self) -> int:
        """The first collective across a subnet the old NCCL cannot route: torch's NCCL watchdog text
        (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: "Watchdog caught collective operation timeout")."""
        self.log.error("[Rank %d] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                       "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds "
                       "before timing out. NCCL version %s" % (self.cfg.rank, image_nccl(self.env)))
        return 1

    def _fatal_lost(self, why: str) -> int:
        self.log.nccl(f"socketProgress: Connection closed by remote peer {why}", warn=True)
        self.log.error(f"RuntimeError: NCCL error: remote process exited or there was a network error, "
                       f"NCCL version {NCCL_VERSION}")
        if self.cfg.engine == "vllm" and self.cfg.rank == 0:
            self.log.error("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.")
        return 1

    def _perf_state(self, head: Head | None) -> Any:
        from sparkctl_sim.engines.server import PerfState

        def get() -> PerfState:
            facts = [self.state.facts()] + (head.peer_states() if head is not None else [])
            c = combine(facts)
            return PerfState(c["clock_cap_mhz"], c["stale"], c["wedged"])

        return get

    async def _start_http(self, head: Head | None) -> Any:
        from aiohttp import web

        from sparkctl_sim.engines.server import Engine, build_app

        engine = Engine(self.cfg, self.log, self.speedup, self._perf_state(head))
        runner = web.AppRunner(build_app(engine), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.cfg.host, self.cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise RendezvousError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {e.strerror or e}") from None
        host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
        _ready(self.cfg, self.log, f"http://{host}:{self.cfg.port}")
        return runner


def gids_usable(root: Path, env: Mapping[str, str], devs: list[IbDevice], log: EngineLog) -> bool:
    """The GID each device's QPs would use, logged; False where NCCL's QPs could not connect.

    NCCL takes the one NCCL_IB_GID_INDEX for every device (NVIDIA/nccl
    src/transport/net_ib.cc: ncclParamIbGidIndex(), then ibv_query_gid on each
    device's port). An empty slot fails the RTR transition ("ibv_modify_qp failed
    with 61 No data available ... local GID ::", docs/reference/spark-facts.md
    §2.4); a link-local IPv4 GID (169.254/16, RFC 3927) is not the peer's fabric
    subnet, so its RoCE v2 packets are never answered and the QP ends in
    IBV_WC_RETRY_EXC_ERR(12). SIMULATION: stricter than NCCL, which would
    only fail at the first transfer, not at init. Unset: not checked (NCCL
    >= 2.21 picks a GID itself).
    """
    raw = env.get("NCCL_IB_GID_INDEX")
    if raw is None or not raw.strip().isdigit():
        return True
    index = int(raw)
    ok = True
    for d in devs:
        slot = cli.read_gid(root, d.name, d.port, index)
        if slot is None:
            log.nccl(f"Call to ibv_modify_qp failed with 61 No data available, on dev {d.name}:{d.port}, "
                     f"curr state INIT, next state RTR, local GID index {index}, local GID ::, remote GID ::",
                     warn=True)
            ok = False
            continue
        kind, gid = slot
        ip = cli.gid_ipv4(gid)
        log.nccl(f"NET/IB: {d.name}:{d.port} GID index {index} type {kind} GID {gid}"
                 + (f" IPv4 {ip}" if ip else ""))
        if ip is None or ip.startswith("169.254.") or kind != "RoCE v2":
            log.nccl(f"NET/IB : Got completion from peer with status=IBV_WC_RETRY_EXC_ERR(12) on dev "
                     f"{d.name}:{d.port} local GID index {index} ({gid}): not an address of the fabric",
                     warn=True)
            ok = False
    return ok


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``python3 -m sparkctl_sim.engine ENGINE ARGS...``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if not args or args[0] not in cli.ENGINES:
        sys.stderr.write(f"usage: python3 -m sparkctl_sim.engine {{{','.join(cli.ENGINES)}}} ARGS...\n")
        return 2
    engine, rest = args[0], args[1:]
    try:
        cfg = cli.parse(engine, rest, env)
    except cli.UsageError as e:
        sys.stderr.write(e.render())
        sys.stderr.flush()
        return 2
    except cli.ParserExit as e:
        return e.status
    except cli.VersionRequested:
        print(cli.VERSIONS[engine], flush=True)
        return 0
    log = EngineLog(engine, cfg.rank)
    try:
        devs = cli.select_ib_devices(env.get("NCCL_IB_HCA"), cli.known_ib_devices(cli.sysfs_root(env)))
    except cli.HcaError as e:
        log.nccl(f"NET/IB : {e}", warn=True)
        log.error("RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details), "
                  f"NCCL version {NCCL_VERSION}")
        return 1
    if cfg.world_size > 1 and not gids_usable(cli.sysfs_root(env), env, devs, log):
        log.error("RuntimeError: NCCL error: remote process exited or there was a network error, "
                  f"NCCL version {NCCL_VERSION}")
        return 1
    try:
        run = _Run(cfg, env, devs, log)
    except cli.UsageError as e:
        sys.stderr.write(e.render())
        return 2
    _banner(cfg, log)
    state_path = env.get("SPARKCTL_SIM_STATE") or None
    short = free_memory_refusal(engine, state_path, cfg.mem_fraction)
    if short:
        log.error(short, src="gpu_worker.py")
        return 1
    registered = register_memory(state_path, os.getpid(), cfg.mem_gib, log)
    if registered:
        run.on_stop = lambda: release_memory(state_path, os.getpid(), log)  # type: ignore[attr-defined]
    try:
        return asyncio.run(run.main())
    except KeyboardInterrupt:
        return 0
    finally:
        if registered:
            release_memory(state_path, os.getpid(), log)


__all__ = ["main", "perf_facts", "combine"]
