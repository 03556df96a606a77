"""Command lines and environment of the simulated engines -> EngineConfig.

Owns: the exact flags of docs/engines.md per engine, the EXTRA flags the
simulator understands (anything else is refused, exit 2, like the real
argparse-based tools), the rank / world-size consistency rules, and the
``NCCL_IB_HCA`` selection against the node's RoCE devices. Pure apart from
reading a directory listing of sysfs; never starts anything.

Consistency rules (all exit 2 with ``PROG: error: ...`` on stderr):

* one GPU per node: the TP size must equal the node count
  (``--tp``/``--nnodes`` for ds41f and SGLang, ``--tensor-parallel-size``/
  ``--nnodes`` for vLLM, ``--tp``/``--world`` for TensorFold);
* ``WORLD_SIZE`` in the environment, when set, must equal that world size,
  and ``NODE_RANK``, when set, the rank flag;
* the rank is required (ds41f ``--node-rank``, TensorFold ``--rank``; vLLM
  and SGLang ``--node-rank`` whenever ``--nnodes`` > 1) and 0 <= rank < world;
* vLLM: ``--headless`` exactly on ranks > 0; SGLang/vLLM/ds41f need a master
  address when the world is larger than one node.

Flags of vLLM and SGLang come from the contract of the release the bundled
profiles pin (``sparkctl/plan/contracts/``, extracted from vLLM 0.11.2's
``engine/arg_utils.py`` and SGLang 0.5.4's ``srt/server_args.py`` by
``tools/engine_contracts.py``): every flag the release has is accepted (those the
simulator does not model have no effect), a flag it lacks is refused, and a value
outside the release's choices (``--kv-cache-dtype nvfp4_ds_mla`` on vLLM 0.11.2)
is refused with argparse's own ``invalid choice`` message, as the real parser
does. ds41f and TensorFold are not public: their EXTRA flags are the simulator's.

``NCCL_IB_HCA`` (exit 1, an NCCL WARN line): the syntax of NCCL itself: an
optional ``^`` (exclude), an optional ``=`` (exact names; without it each
entry is a name prefix), then ``dev[:port]`` entries separated by commas. An
include list whose entry matches no RoCE device of this node, or names a port
the device lacks, is refused. Devices are the entries of
``$SPARKCTL_SYSFS_ROOT/class/infiniband/`` (default ``/sys``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.plan import contracts

ENGINES = ("ds41f", "tensorfold", "vllm", "sglang")

# The model the field reports serve; only used for realistic log lines.
ARCHITECTURE = "DeepseekV4ForCausalLM"

# GiB one GB10 can give an engine: gpu_memory_utilization is a fraction of it
# (``free -h`` shows 119Gi total on a Spark, docs/reference/spark-facts.md §5.4).
GB10_VISIBLE_GIB = 119.0

VERSIONS = {
    "ds41f": "ds41f spark-ds41f-1023 (SIMULATED)",
    "tensorfold": "tensorfold 0.9.3-zig (SIMULATED)",
    "vllm": "0.11.2 (SIMULATED)",
    "sglang": "0.5.4 (SIMULATED)",
}

# The release each simulated engine stands for: (engine, profile engine.version)
# of its contract. Its flags and endpoints are that release's.
CONTRACT_OF = {"vllm": ("vllm", "v0.11.2-sm121"), "sglang": ("sglang", "v0.5.4-sm121")}


def contract(engine: str) -> contracts.Contract | None:
    key = CONTRACT_OF.get(engine)
    return contracts.load(*key) if key else None


class HcaError(ValueError):
    """NCCL_IB_HCA names a device or port this node does not have."""


@dataclass(frozen=True)
class IbDevice:
    name: str
    port: int


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine process needs, parsed and validated."""

    engine: str
    model_path: str
    served_names: tuple[str, ...]
    tp: int
    world_size: int
    rank: int
    master_addr: str | None
    master_port: int | None
    host: str
    port: int
    max_model_len: int
    mem_fraction: float
    prefix_caching: bool = True
    extra: Mapping[str, object] = field(default_factory=dict)
    argv: tuple[str, ...] = ()  # the arguments as given (the contract decides what they enable)

    @property
    def served_name(self) -> str:
        return self.served_names[0]

    @property
    def mem_gib(self) -> float:
        return round(self.mem_fraction * GB10_VISIBLE_GIB, 3)


class UsageError(Exception):
    """Raised instead of exiting so the runtime owns exit codes (2 = usage)."""

    def __init__(self, prog: str, usage: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.usage = usage
        self.message = message

    def render(self) -> str:
        return f"{self.usage}{self.prog}: error: {self.message}\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(self.prog, self.format_usage(), message)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        # --help / --version: let argparse print, then stop without sys.exit
        if message:
            self._print_message(message)
        raise ParserExit(status)


class ParserExit(Exception):
    """--help was printed; exit with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class VersionRequested(Exception):
    """``--version``: the runtime prints VERSIONS[engine] and exits 0."""


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {v}")
    return v


def _addr_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}")
    return int(text)


# --- parsers ----------------------------------------------------------------


def _ds41f_parser() -> _Parser:
    p = _Parser(prog="ds41f serve", description="ds41f OpenAI-compatible server (SIMULATED)")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=_port)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=_port, default=8000)
    # the API key, as vLLM/SGLang take it (the simulator's own engines have no contract)
    p.add_argument("--api-key", dest="contract_api_key")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=0.85)
    p.add_argument("--memory-saver", action="store_true")
    # EXTRA flags understood by the simulator (accepted, no effect on timing)
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--no-prefix-cache", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def _tensorfold_parser() -> _Parser:
    p = _Parser(prog="tensorfold serve", description="TensorFold server (SIMULATED)")
    p.add_argument("--weights", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--rendezvous", type=_addr_port)
    p.add_argument("--listen", type=_addr_port, default=("0.0.0.0", 8080))
    p.add_argument("--api-key", dest="contract_api_key")
    p.add_argument("--ctx", type=int, default=131072)
    p.add_argument("--mem-fraction", type=_fraction, default=0.85)
    p.add_argument("--draft", choices=["dspark"])
    p.add_argument("--engram-dir")
    # EXTRA flags understood by the simulator
    p.add_argument("--max-batch", type=int)
    p.add_argument("--kv-bits", type=int, choices=[4, 8, 16])
    return p


def _vllm_parser() -> _Parser:
    p = _Parser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    p.add_argument("model_tag")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=_port)
    p.add_argument("--headless", action="store_true")
    p.add_argument(
        "--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"]
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9)
    # EXTRA flags understood by the simulator
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--dtype")
    p.add_argument("--quantization", "-q")
    p.add_argument("--load-format")
    p.add_argument("--tokenizer-mode")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--speculative-config")
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--enable-expert-parallel", action="store_true")
    return p


def _sglang_parser() -> _Parser:
    p = _Parser(prog="launch_server.py")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int)
    p.add_argument("--dist-init-addr", type=_addr_port)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=30000)
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--mem-fraction-static", type=_fraction, default=0.85)
    # EXTRA flags understood by the simulator
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--quantization")
    p.add_argument("--attention-backend")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--page-size", type=int)
    p.add_argument("--disable-radix-cache", action="store_true")
    return p


def _apply_contract(p: _Parser, engine: str) -> None:
    """Give the parser the release's flags and choices (no-op for ds41f and TensorFold)."""
    c = contract(engine)
    if c is None:
        return
    have = {o: a for a in p._actions for o in a.option_strings}
    for opt, f in c.flags.items():
        a = have.get(opt)
        if a is not None:
            if f.choices is not None and a.choices is None and a.type is None:
                a.choices = list(f.choices)
            continue
        dest = "contract_" + opt.lstrip("-").replace("-", "_")
        if not f.takes_value:
            p.add_argument(opt, dest=dest, action="store_true")
        else:
            p.add_argument(opt, dest=dest, nargs=f.nargs, choices=list(f.choices) if f.choices else None)
    # Flags the simulator once invented that the release does not have are refused, as the release refuses them.
    for opt in list(have):
        if opt not in c.flags and opt not in ("-h", "--help") and not _abbreviates(c, opt):
            raise AssertionError(f"simulated {engine} accepts {opt}, which {c.name} does not have")


def _abbreviates(c: contracts.Contract, opt: str) -> bool:
    """A simulator alias that is a unique prefix of a real long flag (argparse accepts it too)."""
    return c.abbrev and opt.startswith("--") and len([f for f in c.flags if f.startswith(opt)]) == 1


# --- top level ----------------------------------------------------------------


def _subcommand(engine: str, argv: Sequence[str]) -> list[str]:
    """ds41f/tensorfold/vllm take a ``serve`` subcommand; SGLang takes none."""
    if engine == "sglang":
        return list(argv)
    if argv and argv[0] in ("--version", "-v", "version"):
        raise VersionRequested()
    if not argv or argv[0] != "serve":
        got = argv[0] if argv else "nothing"
        usage = f"usage: {engine} {{serve}} ...\n"
        raise UsageError(engine, usage, f"argument subcommand: invalid choice: {got!r} (choose from 'serve')")
    return list(argv[1:])


def parse(engine: str, argv: Sequence[str], env: Mapping[str, str]) -> EngineConfig:
    """Parse one engine command line.

    Raises UsageError (exit 2), ParserExit (--help) or VersionRequested.
    """
    if engine not in ENGINES:
        raise UsageError("sparkctl_sim.engine", "", f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    args_list = _subcommand(engine, argv)
    if engine == "sglang" and "--version" in args_list:
        raise VersionRequested()
    parser = {
        "ds41f": _ds41f_parser,
        "tensorfold": _tensorfold_parser,
        "vllm": _vllm_parser,
        "sglang": _sglang_parser,
    }[engine]()
    _apply_contract(parser, engine)
    a = parser.parse_args(args_list)
    err = parser.error

    prefix_caching = True
    if engine == "ds41f":
        model, names = a.model, (a.served_model_name or a.model,)
        tp, world, rank = a.tp, a.nnodes, a.node_rank
        world_flags = "--tp and --nnodes"
        maddr, mport = a.master_addr, a.master_port
        host, port, ctx, frac = a.host, a.port, a.max_model_len, a.gpu_memory_utilization
        prefix_caching = not a.no_prefix_cache
    elif engine == "tensorfold":
        model, names = a.weights, (a.name,)
        tp, world, rank = a.tp, a.world, a.rank
        world_flags = "--tp and --world"
        maddr, mport = a.rendezvous if a.rendezvous else (None, None)
        (host, port), ctx, frac = a.listen, a.ctx, a.mem_fraction
    elif engine == "vllm":
        model, names = a.model_tag, tuple(a.served_model_name or [a.model_tag])
        tp, world, rank = a.tensor_parallel_size, a.nnodes, a.node_rank
        world_flags = "--tensor-parallel-size and --nnodes"
        maddr, mport = a.master_addr, a.master_port
        host, port, ctx, frac = a.host, a.port, a.max_model_len, a.gpu_memory_utilization
        prefix_caching = a.enable_prefix_caching
        if world > 1 and rank is None:
            err("--node-rank is required when --nnodes > 1")
        if rank is not None and rank > 0 and not a.headless:
            err(f"--node-rank {rank} > 0 runs no API server: pass --headless")
        if (rank or 0) == 0 and a.headless:
            err("--headless on node rank 0: the head serves the API")
        if world > 1 and a.distributed_executor_backend not in (None, "mp"):
            err(
                f"--distributed-executor-backend {a.distributed_executor_backend}: "
                "multi-node without Ray needs 'mp' (Ray is not installed)"
            )
    else:  # sglang
        model, names = a.model_path, (a.served_model_name or a.model_path,)
        tp, world, rank = a.tp, a.nnodes, a.node_rank
        world_flags = "--tp and --nnodes"
        maddr, mport = a.dist_init_addr if a.dist_init_addr else (None, None)
        host, port, ctx, frac = a.host, a.port, a.context_length, a.mem_fraction_static
        prefix_caching = not a.disable_radix_cache
        if world > 1 and rank is None:
            err("--node-rank is required when --nnodes > 1")

    rank = 0 if rank is None else rank
    if tp < 1 or world < 1:
        err(f"{world_flags} must be >= 1")
    if tp != world:
        err(f"{world_flags} differ ({tp} vs {world}): a DGX Spark has one GPU, TP size must equal the node count")
    env_world = env.get("WORLD_SIZE", "")
    if env_world and env_world != str(world):
        err(f"WORLD_SIZE={env_world} in the environment but {world_flags} say {world}")
    env_rank = env.get("NODE_RANK", "")
    if env_rank and env_rank != str(rank):
        err(f"NODE_RANK={env_rank} in the environment but the rank flag says {rank}")
    if not 0 <= rank < world:
        err(f"rank {rank} out of range for a world of {world} (0..{world - 1})")
    if world > 1:
        maddr = maddr or env.get("MASTER_ADDR") or None
        if mport is None and env.get("MASTER_PORT", "").isdigit():
            mport = int(env["MASTER_PORT"])
        if not maddr or not mport:
            err(f"a world of {world} needs the master address and port")
    if ctx < 1:
        err("the context length must be >= 1")
    extra = {k: v for k, v in vars(a).items() if v not in (None, False)}
    return EngineConfig(
        engine=engine,
        model_path=model,
        served_names=tuple(names),
        tp=tp,
        world_size=world,
        rank=rank,
        master_addr=maddr,
        master_port=mport,
        host=host,
        port=port,
        max_model_len=ctx,
        mem_fraction=frac,
        prefix_caching=prefix_caching,
        extra=extra,
        argv=tuple(args_list),
    )


# --- NCCL_IB_HCA ----------------------------------------------------------------


def sysfs_root(env: Mapping[str, str]) -> Path:
    return Path(env.get("SPARKCTL_SYSFS_ROOT") or "/sys")


def known_ib_devices(root: Path) -> dict[str, tuple[int, ...]]:
    """RoCE devices of this node and their ports (port 1 when sysfs has no ports dir)."""
    base = root / "class" / "infiniband"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for name in names:
        try:
            ports = tuple(sorted(int(p) for p in os.listdir(base / name / "ports") if p.isdigit()))
        except OSError:
            ports = ()
        out[name] = ports or (1,)
    return out


def read_gid(root: Path, dev: str, port: int, index: int) -> tuple[str, str] | None:
    """(type, gid) of one GID slot as sysfs shows it, None for an empty slot.

    NCCL reads the GID at NCCL_IB_GID_INDEX with ibv_query_gid and its type with
    ibv_query_gid_type (NVIDIA/nccl src/transport/net_ib.cc, ncclIbGetGidIndex /
    ncclIbGetGid); the kernel fails the type read of an empty slot, which reads
    as zeros (docs/reference/spark-facts.md §2.4).
    """
    base = root / "class" / "infiniband" / dev / "ports" / str(port)
    try:
        gid = (base / "gids" / str(index)).read_text().strip()
        kind = (base / "gid_attrs" / "types" / str(index)).read_text().strip()
    except OSError:
        return None
    return (kind, gid) if gid.strip("0:") else None


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``...:ffff:c0a8:640a``), else None."""
    groups = gid.split(":")
    if len(groups) != 8 or groups[:6] != ["0000"] * 5 + ["ffff"]:
        return None
    a, b = int(groups[6], 16), int(groups[7], 16)
    return f"{a >> 8}.{a & 0xFF}.{b >> 8}.{b & 0xFF}"


def select_ib_devices(spec: str | None, known: Mapping[str, Sequence[int]]) -> list[IbDevice]:
    """NCCL's device selection from ``NCCL_IB_HCA``; raises HcaError (see module doc)."""
    spec = (spec or "").strip()
    all_devs = [IbDevice(n, p) for n, ports in known.items() for p in ports[:1]]
    if not spec:
        return all_devs
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    entries: list[tuple[str, int | None]] = []
    for raw in spec.split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, _, port = raw.partition(":")
        if port and not port.isdigit():
            raise HcaError(f"NCCL_IB_HCA entry {raw!r}: port must be a number")
        entries.append((name, int(port) if port else None))

    def matches(dev: str, name: str) -> bool:
        return dev == name if exact else dev.startswith(name)

    if exclude:
        return [d for d in all_devs if not any(matches(d.name, n) for n, _ in entries)]
    have = ", ".join(known) or "none"
    chosen: list[IbDevice] = []
    for name, port in entries:
        hits = [d for d in known if matches(d, name)]
        if not hits:
            raise HcaError(f"NCCL_IB_HCA names {name!r} but this node has no such RoCE device (have: {have})")
        for dev in hits:
            p = port if port is not None else known[dev][0]
            if p not in known[dev]:
                raise HcaError(f"NCCL_IB_HCA names {dev}:{p} but {dev} has no port {p}")
            if IbDevice(dev, p) not in chosen:
                chosen.append(IbDevice(dev, p))
    return chosen
