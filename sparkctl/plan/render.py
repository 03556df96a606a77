"""Pure rendering: (profile, inventory) -> {node: {remote path: RenderedFile}}.

Templates are jinja2 with StrictUndefined (a missing variable is an error, not
an empty string). Every value that reaches a shell goes through the ``sh``
filter (``shlex.quote``), including the values of the env file, so that
``set -a; . engine.env`` (launch.sh) sets them and runs nothing: a value such
as ``$(touch canary)`` stays inert. Unit files get ``systemd_quote`` (one
argument: quotes, ``$$`` and ``%%`` escaped) or ``systemd_path``. The schema
refuses what no quoting can carry (newlines in env values, unsafe prefixes).
Secrets arrive as an argument (the CLI reads them from the operator's
environment) and are masked unless ``reveal_secrets``.

No I/O besides reading templates; no SSH library.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

import jinja2

from sparkctl import __version__
from sparkctl.errors import ProfileError, Ref, RenderError
from sparkctl.model import clocklock
from sparkctl.model.engines import ENGINE_CONTAINER
from sparkctl.model.inventory import Inventory
from sparkctl.model.layout import Layout, Rank, bind

# Where each file lands on a node (under the node's prefix, normally "/"): sparkctl.model.paths.
from sparkctl.model.paths import (
    CLOCK_UNIT,
    DETACHED,
    ENV_FILE,
    LAUNCH,
    LOG_DIR,
    MANIFEST,
    NETPLAN,
    STATE_DIR,
    SYSCTL,
    UNIT,
    under,
)
from sparkctl.model.profiles import Resolved
from sparkctl.model.resources import Roots
from sparkctl.model.schema import Profile
from sparkctl.plan import contracts

MASK = "***"

DEFAULT_BINARY = {
    "ds41f": "ds41f",
    "tensorfold": "tensorfold",
    "vllm": "vllm",
    "sglang": "python3 -m sglang.launch_server",
    "llamacpp": "llama-server",
}
TOKENS_METRIC = {
    "ds41f": "ds41f_generation_tokens_total",
    "tensorfold": "tensorfold_generated_tokens_total",
    "vllm": "vllm:generation_tokens_total",
    "sglang": "sglang:generation_tokens_total",
    "llamacpp": None,
}


# The endpoint's API key (serve.api_key_env): always SPARKCTL_API_KEY in the 0600 env file;
# engines that read a variable get it under their own name, so the key is never on a
# command line: vLLM 0.11.2 reads VLLM_API_KEY (vllm/entrypoints/openai/api_server.py,
# build_app: `args.api_key or [envs.VLLM_API_KEY]`), llama-server LLAMA_API_KEY
# (common/arg.cpp: --api-key ... .set_env("LLAMA_API_KEY")). SGLang 0.5.4 has only the
# flag (server_args.py --api-key), and so do the simulator's ds41f and tensorfold:
# launch.sh passes `--api-key "$SPARKCTL_API_KEY"`, expanded at exec, never rendered.
API_KEY_VAR = "SPARKCTL_API_KEY"
API_KEY_ENGINE_ENV = {"vllm": "VLLM_API_KEY", "llamacpp": "LLAMA_API_KEY"}


def api_key_flag(p: Profile) -> str | None:
    """The flag launch.sh adds for the key, or None (no key, or the engine reads a variable)."""
    if not p.serve.api_key_env or p.engine.name in API_KEY_ENGINE_ENV:
        return None
    return "--api-key"


def bind_host(p: Profile, r: Rank, node_host: str) -> str:
    """The address the engine's --host gets (serve.bind)."""
    if p.serve.bind == "fabric" and r.world_size > 1:
        return r.host_ip
    if p.serve.bind in ("fabric", "management"):
        return node_host
    return "0.0.0.0"


@dataclass(frozen=True)
class RenderedFile:
    path: str  # absolute, prefix applied
    text: str
    mode: int  # e.g. 0o600
    role: str  # env | launch | supervisor | fabric | clock | manifest

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


NodeFiles = dict[str, RenderedFile]


@dataclass(frozen=True)
class Rendering:
    layout: Layout
    files: dict[str, NodeFiles]  # node -> path -> file
    # "not validated against vLLM X" when the engine version has no contract, and
    # what the contract says the real release would refuse (render, plan and check print them).
    warnings: tuple[str, ...] = ()
    argv: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> engine arguments
    # Files pushed beside the stack's but outside its node hashes (a change restarts no engine):
    # the gateway's (sparkctl.plan.gatewayplan). node -> path -> file.
    aux: dict[str, NodeFiles] = field(default_factory=dict)

    def node_hash(self, node: str) -> str:
        """Stable hash of what a node receives (path, mode and text of every file)."""
        h = hashlib.sha256()
        for path in sorted(self.files[node]):
            f = self.files[node][path]
            h.update(f"{path}\0{f.mode:o}\0".encode())
            h.update(f.text.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]


def template_env(roots: Roots) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(roots.template_dirs()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    env.filters["shjoin"] = lambda vs: " ".join(shlex.quote(str(v)) for v in vs)
    env.filters["systemd_quote"] = _systemd_quote
    env.filters["systemd_path"] = _systemd_path
    return env


def _systemd_quote(v: object) -> str:
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{s}"'


def _systemd_path(v: object) -> str:
    """A path for a unit setting that takes no quotes (``StandardOutput=append:PATH``)."""
    s = str(v)
    if not s.startswith("/") or any(c.isspace() or c in "\"'\\;" or ord(c) < 32 for c in s):
        raise RenderError(f"path {s!r} cannot be written into a systemd unit", hint="use a prefix without spaces or quotes")
    return s.replace("%", "%%")


def env_value_ok(v: str) -> bool:
    return "\n" not in v and "\x00" not in v and "\r" not in v


def engine_argv(p: Profile, r: Rank, weights: str, host: str = "0.0.0.0") -> list[str]:
    """The engine's command line for one rank (docs/engines.md); ``host`` from serve.bind (bind_host)."""
    e, m, law = p.engine, p.model, p.laws
    n, port = r.world_size, r.http_port
    util = f"{law.gpu_memory_utilization:g}"
    if e.name == "ds41f":
        argv = ["serve", "--model", weights, "--served-model-name", m.served_name, "--tp", str(n),
                "--nnodes", str(n), "--node-rank", str(r.rank), "--master-addr", r.master_addr,
                "--master-port", str(r.master_port), "--host", host, "--port", str(port),
                "--max-model-len", str(m.context_len_tokens), "--gpu-memory-utilization", util]
        if law.memory_saver:
            argv.append("--memory-saver")
    elif e.name == "tensorfold":
        argv = ["serve", "--weights", weights, "--name", m.served_name, "--tp", str(n), "--world", str(n),
                "--rank", str(r.rank), "--rendezvous", f"{r.master_addr}:{r.master_port}",
                "--listen", f"{host}:{port}", "--ctx", str(m.context_len_tokens), "--mem-fraction", util]
    elif e.name == "vllm":
        # pipeline stages: --pipeline-parallel-size, the world tp x pp nodes (vllm/config/parallel.py)
        tp, pp = p.topology.tp_size, p.topology.pp_size
        argv = ["serve", weights, "--served-model-name", m.served_name, "--tensor-parallel-size",
                str(tp if pp > 1 else n), *(["--pipeline-parallel-size", str(pp)] if pp > 1 else []),
                "--nnodes", str(n), "--node-rank", str(r.rank), "--master-addr", r.master_addr,
                "--master-port", str(r.master_port)]
        if r.rank > 0:
            argv.append("--headless")
        argv += ["--distributed-executor-backend", "mp", "--host", host, "--port", str(port),
                 "--max-model-len", str(m.context_len_tokens), "--gpu-memory-utilization", util]
    elif e.name == "sglang":
        # --tp-size, not the abbreviation --tp that argparse happens to accept today.
        # --enable-metrics: SGLang 0.5.4 serves /metrics only with it (server_args.py
        # enable_metrics=False; http_server.py mounts the prometheus app only then), and
        # readiness waits for sglang:generation_tokens_total there.
        tp, pp = p.topology.tp_size, p.topology.pp_size
        argv = ["--model-path", weights, "--served-model-name", m.served_name, "--tp-size",
                str(tp if pp > 1 else n), *(["--pp-size", str(pp)] if pp > 1 else []),
                "--nnodes", str(n), "--node-rank", str(r.rank), "--dist-init-addr",
                f"{r.master_addr}:{r.master_port}", "--host", host, "--port", str(port),
                "--context-length", str(m.context_len_tokens), "--mem-fraction-static", util, "--enable-metrics"]
    else:  # llamacpp: llama-server, or llama-cpp-python's server (its flags differ)
        binary = e.binary or DEFAULT_BINARY["llamacpp"]
        if "llama_cpp.server" in binary:
            argv = ["--model", weights, "--model_alias", m.served_name, "--host", host,
                    "--port", str(port), "--n_ctx", str(m.context_len_tokens)]
        else:
            # --kv-unified: one KV buffer shared by all slots, so each request may use the whole
            # --ctx-size; without it llama-server gives every slot ctx-size / parallel tokens
            # (common/arg.cpp "-kvu, --kv-unified"; issue #12: 131072 / 8 = 16384 per slot).
            argv = ["--model", weights, "--alias", m.served_name, "--host", host, "--port", str(port),
                    "--ctx-size", str(m.context_len_tokens), "--kv-unified"]
    return argv + list(e.args)


def engine_warnings(res: Resolved, inv: Inventory) -> tuple[str, ...]:
    """The contract warnings of ``render`` without rendering files (no templates, no secrets)."""
    layout = bind(res, inv)
    argvs: dict[str, list[str]] = {}
    for r in layout.ranks:
        p = res.for_node(r.node)
        argvs[r.node] = engine_argv(p, r, under(inv.node(r.node).prefix, p.model.weights_path),
                                    bind_host(p, r, inv.node(r.node).host))
    head = res.for_node(layout.ranks[0].node).engine
    return contracts.warnings(head.name, head.version, argvs)


def profile_node_ref(res: Resolved, key: str, node: str | None) -> Ref:
    chain = res.explain(key, node)
    s = chain[-1].source if chain else None
    return Ref(file=s.file if s else res.files[0], line=s.line if s else None, key=key)


def _check_fabric_wait(res: Resolved, p: Profile, node: str) -> None:
    """A persisted multi-node rank whose GIDs never come must still hit its start limit.

    Each start of such a rank lasts up to serve.fabric_wait_s (launch.sh waits for its GIDs),
    then restart_delay_s passes: burst starts must fit in the window, or the limit never
    trips and the rank restarts forever (systemd.unit(5), StartLimitIntervalSec=).
    """
    s = p.serve
    if s.persist and s.restart_burst * (s.restart_delay_s + s.fabric_wait_s) >= s.restart_interval_s:
        raise ProfileError(
            f"restart_interval_s ({s.restart_interval_s}) must exceed restart_burst x (restart_delay_s + "
            f"fabric_wait_s) ({s.restart_burst} x ({s.restart_delay_s} + {s.fabric_wait_s})): a rank whose "
            "fabric GIDs never appear would restart forever instead of stopping at its start limit",
            profile_node_ref(res, "serve.fabric_wait_s", node),
            hint="lower serve.fabric_wait_s or raise serve.restart_interval_s")


def render(
    res: Resolved,
    inv: Inventory,
    roots: Roots,
    secrets: Mapping[str, str] | None = None,
    reveal_secrets: bool = False,
) -> Rendering:
    """Render every file every node of the profile receives. Pure."""
    layout = bind(res, inv)
    env = template_env(roots)
    secrets = secrets or {}
    out: dict[str, NodeFiles] = {}
    argvs: dict[str, tuple[str, ...]] = {}
    for r in layout.ranks:
        p = res.for_node(r.node)
        node = inv.node(r.node)
        for k, v in p.engine.env.items():
            if not env_value_ok(v):
                raise ProfileError("environment values cannot contain newlines or NUL",
                                   profile_node_ref(res, f"engine.env.{k}", r.node))
        secret_values = {}
        for name in p.engine.secret_env:
            if name not in secrets:
                raise RenderError(
                    f"secret {name} is not set in your environment", profile_node_ref(res, "engine.secret_env", r.node),
                    hint=f"export {name}=... before running (it is never printed)",
                )
            if not env_value_ok(secrets[name]):
                raise RenderError(f"secret {name} contains a newline", Ref(key=name))
            secret_values[name] = secrets[name] if reveal_secrets else MASK
        key_env = p.serve.api_key_env
        if key_env:
            key = secrets.get(key_env)
            if not key:
                raise RenderError(f"the endpoint's API key variable {key_env} is not set in your environment",
                                  profile_node_ref(res, "serve.api_key_env", r.node),
                                  hint=f"export {key_env}=... before running (it is never printed)")
            if not env_value_ok(key):
                raise RenderError(f"secret {key_env} contains a newline", Ref(key=key_env))
            shown = key if reveal_secrets else MASK
            secret_values[API_KEY_VAR] = shown
            if p.engine.name in API_KEY_ENGINE_ENV:
                secret_values[API_KEY_ENGINE_ENV[p.engine.name]] = shown
        if r.world_size > 1:
            _check_fabric_wait(res, p, r.node)
        weights = under(node.prefix, p.model.weights_path)
        binary = shlex.split(p.engine.binary or DEFAULT_BINARY[p.engine.name])
        ring = layout.layout == "ring"
        argv = engine_argv(p, r, weights, bind_host(p, r, node.host))
        ctx = dict(
            version=__version__, profile=res.name, profile_digest=res.digest(), p=p, r=r, node=node, inv=inv,
            layout=layout, ring=ring, pair=layout.layout == "pair", multi=r.world_size > 1,
            binary=binary, argv=argv, weights=weights,
            api_key_flag=api_key_flag(p), api_key_var=API_KEY_VAR, container=ENGINE_CONTAINER,
            weights_dir=posixpath.dirname(weights.rstrip('/')) or '/', secrets=secret_values,
            paths=dict(
                env=under(node.prefix, ENV_FILE), launch=under(node.prefix, LAUNCH),
                detached=under(node.prefix, DETACHED), state=under(node.prefix, STATE_DIR),
                log=under(node.prefix, LOG_DIR), unit=under(node.prefix, UNIT),
            ),
            sysfs_root=node.sysfs_root,
            # The clock-cap unit records the lock with this boot's id (read by `sparkctl check`).
            clock_record_sh=clocklock.unit_record_command(int(p.laws.clock_cap_mhz or 0), node.prefix),
            links=inv.node_links(r.node), routes=inv.routes_for(r.node),
            mtu=inv.mtu, relay=ring and bool(inv.routes_for(r.node)),
            tokens_metric=p.serve.tokens_metric or TOKENS_METRIC[p.engine.name],
        )
        files: list[tuple[str, str, int, str]] = [
            (ENV_FILE, "engine.env.j2", 0o600, "env"),
            (LAUNCH, "launch.sh.j2", 0o755, "launch"),
        ]
        if p.supervisor == "systemd":
            files.append((UNIT, "sparkctl-engine.service.j2", 0o644, "supervisor"))
        else:
            files.append((DETACHED, "run-detached.sh.j2", 0o755, "supervisor"))
        if inv.node_links(r.node):
            files.append((NETPLAN, "fabric-netplan.yaml.j2", 0o600, "fabric"))
        if ctx["relay"]:
            files.append((SYSCTL, "sysctl-forward.conf.j2", 0o644, "fabric"))
        if p.laws.clock_cap_mhz is not None:
            files.append((CLOCK_UNIT, "sparkctl-clock-cap.service.j2", 0o644, "clock"))
        nf: NodeFiles = {}
        for path, tmpl, mode, role in files:
            try:
                text = env.get_template(tmpl).render(**ctx)
            except jinja2.TemplateNotFound as exc:
                raise RenderError(f"template {exc.name} not found", hint=f"searched {roots.template_dirs()}") from None
            except jinja2.UndefinedError as exc:
                raise RenderError(f"template {tmpl}: {exc.message}", hint="a user template uses an unknown variable") from None
            full = under(node.prefix, path)
            nf[full] = RenderedFile(full, text, mode, role)
        manifest = {
            "sparkctl": __version__, "profile": res.name, "profile_digest": res.digest(),
            "node": r.node, "rank": r.rank, "replica": r.replica,
            "files": {k: {"sha256": f.sha256, "mode": f"{f.mode:o}"} for k, f in sorted(nf.items())},
        }
        mpath = under(node.prefix, MANIFEST)
        nf[mpath] = RenderedFile(mpath, json.dumps(manifest, indent=2, sort_keys=True) + "\n", 0o644, "manifest")
        out[r.node] = nf
        argvs[r.node] = tuple(argv)
    head = res.for_node(layout.ranks[0].node).engine
    return Rendering(layout, out, contracts.warnings(head.name, head.version, argvs), argvs)
