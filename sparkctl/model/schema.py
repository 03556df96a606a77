"""The one schema module: every key of a profile and of an inventory.

Each field carries its type, its default and a one-line description; units are
in the names (``clock_cap_mhz``, ``ready_timeout_s``). Unknown keys are errors
(``extra="forbid"``). ``docs/profile-schema.md`` is generated from these models
by ``sparkctl schema --markdown`` and a test keeps the two from drifting apart.

Pure: no I/O. Loading, ``extends:`` chains and provenance live in
``sparkctl.model.profiles``; topology derivation in ``sparkctl.model.inventory``.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# Names that end up in file names, unit names, hostnames or shell words. A
# conservative pattern: anything else is refused at load time, long before
# quoting would have to save us.
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# Host names / IPv4 / IPv6 literals for the management address.
HOST_RE = r"^[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}$"
# Interface names (Linux IFNAMSIZ is 16 including the NUL).
IFNAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Paths that end up in unit files, scripts and file names on the node: absolute,
# no spaces, quotes, '$', '%' (a systemd specifier) or control characters.
SAFE_PATH_RE = r"^/[A-Za-z0-9._@+=/-]{0,1023}$"
# Engine release tags and container images: shown in comments and unit
# descriptions, passed to docker; never start with '-' (an option to docker).
VERSION_RE = r"^[A-Za-z0-9][A-Za-z0-9._+:~-]{0,127}$"
# Image references by docker's grammar (distribution/reference regexp.go): an
# optional registry host[:port]/, lower-case path components, an optional :tag,
# an optional @sha256:<64 hex> digest (pinned: every node runs the same bits).
_IMG_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMG_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
IMAGE_RE = (rf"^(?:{_IMG_HOST}/)?{_IMG_COMPONENT}(?:/{_IMG_COMPONENT})*"
            r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
# Debian package names (policy 5.6.1) and kernel releases (`uname -r`): they
# appear in printed remedies that an operator may paste into a shell.
PACKAGE_RE = r"^[a-z0-9][a-z0-9+.-]{0,127}$"
KERNEL_RE = r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}$"
# Prometheus metric names.
METRIC_RE = r"^[A-Za-z_:][A-Za-z0-9_:]{0,199}$"
SERVED_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
SSH_USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"

# What each pattern allows, for error messages (sparkctl.model.yamlsrc).
PATTERN_HINTS = {
    NAME_RE: "letters, digits, '.', '_', '-'; starts with a letter or digit; at most 63",
    HOST_RE: "a host name or an IP address",
    IFNAME_RE: "an interface name: letters, digits, '.', '_', '-'; at most 15",
    ENV_NAME_RE: "a shell variable name: letters, digits and '_'",
    SAFE_PATH_RE: "an absolute path of letters, digits and . _ @ + = / -",
    VERSION_RE: "letters, digits and . _ + : ~ -; starts with a letter or digit",
    IMAGE_RE: "an image reference: [registry[:port]/]name[:tag][@sha256:<64 hex digits>], name in lower case",
    PACKAGE_RE: "a Debian package name (lower case letters, digits, + . -)",
    KERNEL_RE: "a kernel release as `uname -r` prints it",
    METRIC_RE: "a Prometheus metric name",
    SERVED_NAME_RE: "letters, digits and . _ : / -; starts with a letter or digit",
    SSH_USER_RE: "a login name: lower case letters, digits, '_', '-'",
}

# Environment names that hold credentials. Their values belong in secret_env
# (read from the operator's environment, masked in every output), never in a
# profile, which `show`, `render` and the run record print.
SECRET_NAME_RE = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|API_?KEY|ACCESS_KEY|PRIVATE_KEY|AUTH)(_|$)")
# Engine flags whose value is a credential (vLLM/SGLang --api-key, HF tokens):
# on a command line they are visible in `ps` and in the 0755 launch script.
SECRET_FLAGS = ("--api-key", "--api_key", "--hf-token", "--hf_token", "--token", "--admin-api-key")

Name = Annotated[str, Field(pattern=NAME_RE)]
IfName = Annotated[str, Field(pattern=IFNAME_RE)]
SafePath = Annotated[str, Field(pattern=SAFE_PATH_RE)]


def no_dotdot(v: str | None) -> str | None:
    if v is not None and "/../" in v + "/":
        raise ValueError("must not contain '..' components")
    return v


def no_control(v: str | None) -> str | None:
    """Free text that is printed or used locally: no control characters (a newline forges output lines)."""
    if v is not None and any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError("control characters (newline, CR, NUL, ...) are not allowed")
    return v


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_RE.search(name.upper()))

ENGINES = ("ds41f", "tensorfold", "vllm", "sglang", "llamacpp")

# docs/reference/spark-facts.md: the meta-packages that would pull a new kernel.
DEFAULT_HOLD_PACKAGES = ["linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04"]


def _env_key(key: str) -> str:
    # fullmatch: re.match with '$' would let a trailing newline through
    if not re.fullmatch(ENV_NAME_RE[1:-1], key):
        raise ValueError(f"environment variable name {key!r} is not a valid shell name")
    if is_secret_name(key):
        raise ValueError(f"{key} looks like a credential: list its name in engine.secret_env and export "
                         "it before running sparkctl (a value in a profile is printed by show and render)")
    return key


def _env_value(value: str) -> str:
    if any(c in value for c in "\n\r\x00"):
        raise ValueError("environment values cannot contain newlines, CR or NUL (one line per variable)")
    return value


EnvKey = Annotated[str, AfterValidator(_env_key)]
EnvValue = Annotated[str, AfterValidator(_env_value)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- profile


class EngineSpec(_Strict):
    """Which serving engine runs, and how it is started."""

    name: Literal["ds41f", "tensorfold", "vllm", "sglang", "llamacpp"] = Field(
        description="serving engine: ds41f, tensorfold, vllm, sglang or llamacpp"
    )
    version: str = Field(pattern=VERSION_RE, description="engine release tag, recorded in every benchmark row")
    image: str | None = Field(None, pattern=IMAGE_RE, max_length=255,
                              description="container image (runtime: docker); name@sha256:<digest> pins the "
                              "exact build (recommended: the image_identity law)")
    binary: str | None = Field(
        None,
        description="engine executable for runtime: native; the engine's usual command when unset",
    )
    args: list[str] = Field(default_factory=list, description="extra engine arguments, appended verbatim (quoted)")
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict, description="extra environment for every rank")
    secret_env: list[Annotated[str, Field(pattern=ENV_NAME_RE)]] = Field(
        default_factory=list,
        description="names of secrets (e.g. HF_TOKEN) copied from the operator's environment into the "
        "0600 env file; never printed",
    )
    docker_args: list[str] = Field(default_factory=list, description="extra `docker run` flags (quoted)")

    @field_validator("binary")
    @classmethod
    def _binary(cls, v: str | None) -> str | None:
        if v is None:
            return v
        no_control(v)
        try:
            words = shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"cannot split it into words like a shell: {exc}") from None
        if not words or words[0].startswith("-"):
            raise ValueError("must start with a command (not empty, not an option)")
        return v

    @field_validator("args", "docker_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        for i, a in enumerate(v):
            if "\x00" in a:
                raise ValueError(f"argument {i} contains a NUL byte (a command line cannot carry one)")
            flag = a.split("=", 1)[0]
            if flag in SECRET_FLAGS:
                raise ValueError(f"{flag} takes a credential, which would be visible in `ps` and in launch.sh: "
                                 "pass it through engine.secret_env (e.g. VLLM_API_KEY) instead")
        return v


# What a safetensors checkpoint needs to load: the shards and their index, the configs,
# the tokenizer (json, sentencepiece .model, tiktoken), the chat template and any
# remote code; not the duplicate formats (.bin, .pt, .msgpack, .h5, .onnx) nor the
# original/ consolidated checkpoints some repositories also carry (Llama, Mistral).
DEFAULT_MODEL_INCLUDE = ("*.safetensors", "*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py")
DEFAULT_MODEL_EXCLUDE = ("original/", "consolidated*")
GLOB_RE = r"^[^\x00-\x1f\x7f]{1,200}$"


class ModelFiles(_Strict):
    """Which files of the model's Hub repository `sparkctl weights fetch` downloads."""

    include: list[Annotated[str, Field(pattern=GLOB_RE)]] = Field(
        default_factory=lambda: list(DEFAULT_MODEL_INCLUDE),
        description="glob patterns (fnmatch on the repository path, as huggingface_hub's allow_patterns; "
        "a trailing / means everything under it)",
    )
    exclude: list[Annotated[str, Field(pattern=GLOB_RE)]] = Field(
        default_factory=lambda: list(DEFAULT_MODEL_EXCLUDE),
        description="glob patterns left out even when included (huggingface_hub's ignore_patterns)",
    )


class ModelSpec(_Strict):
    """The model served."""

    id: str = Field(description="model id (e.g. the Hugging Face repo)")
    served_name: str = Field(
        pattern=SERVED_NAME_RE,
        description="the name /v1/models must list; every health verdict checks it",
    )
    weights_path: str = Field(description="absolute path of the weights on every node")
    weights_format: str = Field(description="weights format, e.g. fp8, exl3-2.9bpw, gguf")
    context_len_tokens: int = Field(gt=0, le=4_194_304, description="maximum context length")
    revision: str = Field(
        "main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$",
        description="Hub branch, tag or commit that `weights fetch` resolves (the commit is recorded)",
    )
    files: ModelFiles = Field(default_factory=ModelFiles, description="which repository files `weights fetch` takes")
    local_dir: str | None = Field(
        None, description="where the repository is laid out (as `hf download --local-dir`), synced and checked; "
        "default weights_path; set it when weights_path names one file of the repository (a GGUF); "
        "ignored when weights_path does not lie under it",
    )

    @field_validator("id", "weights_format")
    @classmethod
    def _text(cls, v: str) -> str:
        return no_control(v) or v

    @field_validator("weights_path", "local_dir")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/") or "\x00" in v or "\n" in v or "/../" in v + "/":
            raise ValueError("must be an absolute path without '..' components or newlines")
        return v


class TopologySpec(_Strict):
    """Which nodes serve, and how the ranks are laid out."""

    tp_size: int = Field(ge=1, le=8, description="tensor-parallel size: ranks per replica (one GPU per node)")
    pp_size: int = Field(1, ge=1, le=8, description="pipeline stages per replica, each of tp_size nodes (vLLM "
                         "--pipeline-parallel-size, SGLang --pp-size; layout switch only): a replica is "
                         "tp_size x pp_size nodes")
    nodes: list[Name] | None = Field(
        None, description="inventory nodes to use, in any order; all nodes when unset (ranks follow the ring)"
    )
    layout: Literal["single", "pair", "ring", "switch"] = Field(
        description="single box, a cabled pair, the ring, or any nodes behind the switch (TP2/TP4/TP8 replicas)")
    replicas: int = Field(1, ge=1, le=8, description="independent replicas (e.g. two TP2 replicas on a ring's halves, "
                          "two TP4 replicas behind a switch)")
    start_order: Literal["workers-first", "head-first"] = Field(
        "workers-first", description="which ranks start first (real stacks disagree)"
    )
    stack: Name | None = Field(
        None, description="the stack this profile runs as: a name for its node set. Stacks on disjoint nodes "
        "live side by side, each with its own run record, lock, `status --stack` and `down --stack`; `up` or "
        "`switch` of a profile replaces what its own stack ran and refuses nodes another live stack uses; "
        "unset: the stack `default`"
    )
    shared_name: bool = Field(
        False, description="a declared replica: another live stack may already serve this model.served_name if "
        "it serves the same model (model.id and model.revision); the gateway balances between them. Unset, `up` "
        "refuses a served name another live stack serves"
    )


    @model_validator(mode="after")
    def _layout_vs_tp(self) -> "TopologySpec":
        if self.layout == "single" and self.tp_size != 1:
            raise ValueError("layout single runs one rank per replica: tp_size must be 1")
        if self.layout == "pair" and self.tp_size != 2:
            raise ValueError("layout pair runs two ranks per replica: tp_size must be 2")
        if self.layout == "ring" and self.tp_size < 3:
            raise ValueError("layout ring needs tp_size >= 3 (use layout pair for two nodes)")
        if self.pp_size > 1 and self.layout != "switch":
            raise ValueError("pp_size > 1 needs layout switch (pipeline stages across any nodes behind a switch)")
        if self.layout == "switch" and self.tp_size * self.pp_size < 2:
            raise ValueError("layout switch runs two or more ranks per replica: tp_size >= 2 (layout single for one)")
        return self


KernelRelease = Annotated[str, Field(pattern=KERNEL_RE)]


class KernelList(_Strict):
    """Kernel releases known bad or good, added to the bundled list (the kernel_pin law)."""

    bad: dict[KernelRelease, str] = Field(
        default_factory=dict, description="releases refused, each with the reason and where it was seen"
    )
    good: list[KernelRelease] = Field(default_factory=list, description="releases qualified for this stack")

    @field_validator("bad")
    @classmethod
    def _reasons(cls, v: dict[str, str]) -> dict[str, str]:
        for why in v.values():
            no_control(why)
        return v


class LawsSpec(_Strict):
    """The operational laws this stack is held to (docs/LAWS.md)."""

    clock_cap_mhz: int | None = Field(
        2000, ge=300, le=3003, description="GPU SM clock cap (nvidia-smi -lgc 0,CAP); null = uncapped"
    )
    kernels: KernelList = Field(
        default_factory=lambda: KernelList(),
        description="kernel releases added to sparkctl's data file (sparkctl/plan/laws/kernels.yaml)",
    )
    kernel_hold_packages: list[Annotated[str, Field(pattern=PACKAGE_RE)]] = Field(
        default_factory=lambda: list(DEFAULT_HOLD_PACKAGES),
        description="kernel meta-packages that must be held (apt-mark hold)",
    )
    page_size_kib: Literal[4, 64] | None = Field(None, description="kernel page size the stack requires; null = any")
    memory_saver: bool = Field(False, description="ask the engine for its memory saver mode")
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=0.92,
        description="engine memory utilization; <= 0.92 (UVM over-commit is a livelock, not an OOM)",
    )
    min_free_gib: float = Field(12.0, ge=10.0, le=64.0, description="MemAvailable floor per node (10-15 GiB advised)")
    ac_cycle: bool = Field(True, description="enforce the AC-cycle law after a recorded cable/PCIe change")


class GatewaySpec(_Strict):
    """The cluster's one OpenAI endpoint: smg (Shepherd Model Gateway) in front of the replicas (docs/gateway.md)."""

    enabled: bool = Field(False, description="run the gateway and register every ready replica with it")
    node: Name | None = Field(
        None, description="inventory node the gateway runs on; the inventory's first node (where the run record is) "
        "when unset")
    port: int = Field(30000, ge=1024, le=65535, description="HTTP port of the gateway's OpenAI endpoint")
    metrics_port: int = Field(29000, ge=1024, le=65535, description="the gateway's Prometheus port (bound like "
                              "the endpoint, serve.bind)")
    version: Literal["1.13.0"] = Field("1.13.0", description="smg release: the pinned wheels sparkctl installs "
                                       "(sparkctl/model/wheels.py)")
    drain_timeout_s: int = Field(
        600, ge=1, le=7200, description="after a replica is removed from the gateway, how long to wait for its "
        "engine to report nothing in flight (twice in a row) before it is stopped anyway")

    @model_validator(mode="after")
    def _ports(self) -> "GatewaySpec":
        if self.port == self.metrics_port:
            raise ValueError("port and metrics_port must differ")
        return self


class ServeSpec(_Strict):
    """Ports and readiness."""

    port: int = Field(8000, ge=1024, le=65535, description="HTTP port of the OpenAI-compatible endpoint (head rank)")
    master_port: int = Field(29500, ge=1024, le=65535, description="rendezvous port on the head's fabric address")
    ready_timeout_s: int = Field(900, ge=5, le=7200, description="deadline for the endpoint to become ready")
    stop_timeout_s: int = Field(30, ge=1, le=600, description="grace period before a rank is killed")
    smoke_request: bool = Field(True, description="readiness includes a 1-token completion")
    tokens_metric: str | None = Field(
        None, pattern=METRIC_RE, description="Prometheus counter of generated tokens; the engine's usual name when unset"
    )
    persist: bool = Field(
        False, description="enable the engine units (and the clock-cap unit) so the stack comes back after a reboot; "
        "`up --persist` sets it"
    )
    restart_burst: int = Field(
        3, ge=1, le=20, description="persist: a rank started this many times within restart_interval_s stays down "
        "(the unit's StartLimitBurst=)"
    )
    restart_interval_s: int = Field(
        1800, ge=10, le=86400, description="persist: the window of restart_burst (the unit's StartLimitIntervalSec=)"
    )
    restart_delay_s: int = Field(
        15, ge=1, le=600, description="persist: the pause before a failed rank restarts (the unit's RestartSec=)"
    )
    fabric_wait_s: int = Field(
        300, ge=0, le=3600, description="multi-node, with persist: how long a rank's launch waits at each start for "
        "the RoCE v2 GIDs of its fabric addresses (a port gets its address only once the neighbour's end has "
        "carrier, so a neighbour that boots minutes later is waited for, not counted against restart_burst); then "
        "it exits 78; 0 = no wait. Without persist (an up or switch the operator watches) the launch does not "
        "wait: a rank without its GIDs fails at once, naming its node"
    )
    bind: Literal["fabric", "management", "all"] = Field(
        "all", description="what address the head's endpoint listens on: its fabric address, its management "
        "address (the inventory's host), or all (0.0.0.0)"
    )
    api_key_env: str | None = Field(
        None, pattern=ENV_NAME_RE, description="name of the operator's environment variable holding the endpoint's "
        "API key: the engine requires it (Authorization: Bearer), readiness, status and bench send it; never printed"
    )
    gateway: GatewaySpec = Field(default_factory=GatewaySpec, description="the gateway in front of the replicas")

    @model_validator(mode="after")
    def _gateway_ports(self) -> "ServeSpec":
        g = self.gateway
        if g.enabled and {g.port, g.metrics_port} & {self.port, self.master_port}:
            raise ValueError(f"gateway.port ({g.port}) and gateway.metrics_port ({g.metrics_port}) must differ from "
                             f"port ({self.port}) and master_port ({self.master_port}): the gateway may share a node "
                             "with a head")
        return self

    @model_validator(mode="after")
    def _restart_window(self) -> "ServeSpec":
        # Restart pauses alone must not outlast the window, or the limit never trips and a
        # failing rank restarts forever (systemd.unit(5), StartLimitIntervalSec=).
        if self.persist and self.restart_burst * self.restart_delay_s >= self.restart_interval_s:
            raise ValueError(f"restart_interval_s ({self.restart_interval_s}) must exceed restart_burst x "
                             f"restart_delay_s ({self.restart_burst} x {self.restart_delay_s}): otherwise the "
                             "restart limit never trips and a failing rank restarts forever")
        return self


class ThinkingSpec(_Strict):
    """The per-request thinking knob."""

    request_fields: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description='fields added to a request when thinking is on, e.g. {reasoning_effort: "high"}',
    )
    default_on: bool = Field(False, description="thinking on by default in benchmarks")


class BenchSpec(_Strict):
    """Benchmark defaults for this stack."""

    suites: list[Name] = Field(default_factory=lambda: ["prefill", "decode", "concurrency"], description="default suites")
    prefill_lengths_tokens: list[int] = Field(
        default_factory=lambda: [2048, 8192, 32768, 131072], description="prefill prompt lengths"
    )
    decode_tokens: int = Field(256, ge=1, description="tokens generated in the decode suite")
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16], description="concurrency levels")
    repeats: int = Field(2, ge=1, le=20, description="repeats per point (3 with --record)")


class NodeOverlay(_Strict):
    """Per-node overrides (profile key ``nodes: {NAME: {...}}``)."""

    engine: dict[str, Any] = Field(default_factory=dict, description="engine keys for this node (args, env, ...)")
    laws: dict[str, Any] = Field(default_factory=dict, description="law keys for this node")


class Profile(_Strict):
    """A serving stack."""

    description: str = Field("", description="one line shown by `sparkctl profiles`")
    extends: str | None = Field(None, description="parent profile name; its values are the defaults here")
    engine: EngineSpec
    runtime: Literal["docker", "native"] = Field("docker", description="docker container or native binary")
    supervisor: Literal["systemd", "detached"] = Field(
        "systemd", description="systemd unit, or a detached process with pid and log files"
    )
    model: ModelSpec
    topology: TopologySpec
    laws: LawsSpec = Field(default_factory=LawsSpec)
    serve: ServeSpec = Field(default_factory=ServeSpec)
    thinking: ThinkingSpec = Field(default_factory=ThinkingSpec)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    nodes: dict[Name, NodeOverlay] = Field(default_factory=dict, description="per-node overlays")

    @model_validator(mode="after")
    def _runtime_needs(self) -> "Profile":
        if self.runtime == "docker" and not self.engine.image:
            raise ValueError("engine.image is required when runtime is docker")
        if self.topology.pp_size > 1 and self.engine.name not in PP_ENGINES:
            raise ValueError(f"topology.pp_size > 1: engine {self.engine.name} runs no pipeline stages across "
                             f"nodes (those that do: {', '.join(PP_ENGINES)})")
        return self


# Engines whose multi-node runtime runs pipeline stages (their contracts accept the flag:
# vLLM --pipeline-parallel-size, SGLang --pp-size, sparkctl/plan/contracts/*.json).
PP_ENGINES = ("vllm", "sglang")


# Keys of dict-typed fields are merged one by one across layers (an overlay can
# add one env var without restating the others); everything else is replaced.
MERGED_DICTS = {("engine", "env"), ("laws", "kernels", "bad"), ("thinking", "request_fields")}


# --------------------------------------------------------------------------- inventory


class PortSpec(_Strict):
    """One QSFP cage: its two PCIe twin functions."""

    netdevs: tuple[IfName, IfName] = Field(description="the two twin netdevs of this cage")
    rdma: tuple[IfName, IfName] = Field(description="their RoCE devices, same order")


def default_ports() -> dict[str, PortSpec]:
    # docs/reference/spark-facts.md: p0 = enp1s0f0np0/rocep1s0f0 + enP2p1s0f0np0/roceP2p1s0f0, p1 likewise.
    return {
        "p0": PortSpec(netdevs=("enp1s0f0np0", "enP2p1s0f0np0"), rdma=("rocep1s0f0", "roceP2p1s0f0")),
        "p1": PortSpec(netdevs=("enp1s0f1np1", "enP2p1s0f1np1"), rdma=("rocep1s0f1", "roceP2p1s0f1")),
    }


class _NodeFields(_Strict):
    """The checks shared by the defaults and each node: node paths have no '..', local paths no control characters."""

    @field_validator("prefix", "sysfs_root", "proc_root", check_fields=False)
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return no_dotdot(v)

    @field_validator("ssh_identity", "known_hosts", check_fields=False)
    @classmethod
    def _local_paths(cls, v: str | None) -> str | None:
        return no_control(v)


class NodeDefaults(_NodeFields):
    """Values every node gets unless it says otherwise."""

    ssh_user: str = Field("nvidia", pattern=SSH_USER_RE, description="ssh login")
    ssh_port: int = Field(22, ge=1, le=65535, description="ssh port")
    ssh_identity: str | None = Field(None, description="private key file; ~/.ssh/config applies when unset")
    sudo: bool = Field(True, description="run privileged commands with sudo -n")
    known_hosts: str | None = Field(None, description="known_hosts file; ~/.ssh/known_hosts when unset")
    prefix: SafePath = Field("/", description="root under which rendered files are placed (simulated rootless nodes)")
    sysfs_root: SafePath = Field("/sys", description="where sysfs is read (simulated rootless nodes)")
    proc_root: SafePath = Field("/proc", description="where procfs is read (simulated rootless nodes)")
    mgmt_iface: IfName = Field("enP7s7", description="management interface")


class NodeSpec(_NodeFields):
    """One DGX Spark."""

    name: Name = Field(description="node name (used in messages, files and units)")
    host: str = Field(pattern=HOST_RE, description="management address or host name for ssh")
    ssh_user: str | None = Field(None, pattern=SSH_USER_RE, description="overrides defaults")
    ssh_port: int | None = Field(None, ge=1, le=65535, description="overrides defaults")
    ssh_identity: str | None = Field(None, description="overrides defaults")
    sudo: bool | None = Field(None, description="overrides defaults")
    known_hosts: str | None = Field(None, description="overrides defaults")
    prefix: SafePath | None = Field(None, description="overrides defaults")
    sysfs_root: SafePath | None = Field(None, description="overrides defaults")
    proc_root: SafePath | None = Field(None, description="overrides defaults")
    mgmt_iface: IfName | None = Field(None, description="overrides defaults")
    ports: dict[Literal["p0", "p1"], PortSpec] | None = Field(None, description="QSFP cage names; Spark defaults")


class ClusterSpec(_Strict):
    """Cluster-wide fabric settings."""

    name: Name = Field("spark", description="cluster name")
    fabric_pool: str = Field("10.20.0.0/16", description="pool for one /24 per twin per cable")
    fabric_mtu_bytes: int = Field(9000, ge=1280, le=9216, description="MTU of every fabric twin")


class RoceSpec(_Strict):
    """The RoCE class the switch keeps lossless (PFC/ECN live on the switch and NICs): NCCL marks its RDMA
    traffic with NCCL_IB_TC (the GRH traffic class, for RoCE v2 the IP TOS byte whose top six bits are the
    DSCP: dscp * 4) and NCCL_IB_SL (the service level); github.com/NVIDIA/nccl src/transport/net_ib.cc,
    ``NCCL_PARAM(IbTc, "IB_TC", ...)`` and ``NCCL_PARAM(IbSl, "IB_SL", ...)``. Unset: no marking."""

    dscp: int | None = Field(None, ge=0, le=63, description="the DSCP the switch maps to its lossless queue "
                             "(NCCL_IB_TC = dscp * 4)")
    priority: int | None = Field(None, ge=0, le=7, description="the 802.1p priority of that queue, as NCCL_IB_SL")


class SwitchSpec(_Strict):
    """The switch the fabric ports run to (NVIDIA's playbook "Connect Multiple DGX Spark through a Switch").

    Each port group (the same cage's same twin on every node) is one subnet: every node's
    p0 twin 0 on one /24, p0 twin 1 on the next, and so on; no relay, no static route.
    """

    name: Name = Field("switch", description="the switch's name, in messages")
    mtu_bytes: int = Field(9216, ge=1280, le=9216, description="the MTU the switch ports carry; the fabric MTU must fit in it")
    subnets: dict[Literal["p0", "p1"], tuple[str, str]] | None = Field(
        None, description="each cage's two twin subnets (/24 each); consecutive /24s of fabric_pool when unset")
    roce: RoceSpec = Field(default_factory=lambda: RoceSpec(),
                           description="the RoCE class NCCL marks its traffic with (NCCL_IB_TC, NCCL_IB_SL)")


class InventoryLaws(_Strict):
    """Site-wide law data: what this fleet has learned about kernels."""

    kernels: KernelList = Field(default_factory=lambda: KernelList(), description="added to sparkctl's kernel data")


class InventoryFile(_Strict):
    """An inventory: the boxes and how the cables run."""

    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    defaults: NodeDefaults = Field(default_factory=NodeDefaults)
    nodes: list[NodeSpec] = Field(min_length=1, description="the boxes, head first")
    cables: list[tuple[str, str]] = Field(
        default_factory=list, description='each cable joins "node:port" to "node:port" (port p0 or p1), or "switch"'
    )
    switch: SwitchSpec | None = Field(None, description="the switch of a switched cluster (cables to \"switch\")")
    laws: InventoryLaws = Field(default_factory=lambda: InventoryLaws(), description="site-wide law data")
