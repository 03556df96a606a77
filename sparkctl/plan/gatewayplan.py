"""The gateway (serve.gateway): its files, its installation and its backends as plan steps. Pure.

smg (Shepherd Model Gateway, docs/gateway.md) runs on one node as the unit
``sparkctl-gateway``, unpacked from pinned wheels (``sparkctl.model.wheels``)
that the operator's machine fetched and the plan pushes. Its backends are the
replicas' heads: a replica is registered once the ``ready`` step said it serves
its name (the one readiness verdict, ``remote/endpoint_probe.py``), and
drained before anything stops it: removed from the gateway, then the engine's
own in-flight gauges must read idle twice in a row (``remote/gateway_ctl.py``).
Every one of these is a step whose command ``sparkctl plan`` prints.

The run record keeps what ``down`` and the unit's rebuild need without the
profile (:func:`record_entry`): the gateway's node, its URL as the node asks
it, the backends (URL as the gateway reaches it, served name) and the gauge.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from sparkctl import __version__
from sparkctl.errors import ConfigError, Ref, RenderError
from sparkctl.model import paths, wheels
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    GATEWAY_CONFIG,
    GATEWAY_CTL,
    GATEWAY_DIR,
    GATEWAY_ENV,
    GATEWAY_LAUNCH,
    GATEWAY_LOG,
    GATEWAY_RECORDS,
    GATEWAY_UNIT,
    RECORD,
    STACKS_DIR,
    under,
)
from sparkctl.model.profiles import Resolved
from sparkctl.model.record import WILDCARD, on_node_host
from sparkctl.model.resources import Roots
from sparkctl.model.wheels import NodePlatform, PinnedWheel
from sparkctl.plan.render import API_KEY_VAR, MASK, RenderedFile, Rendering, bind_host, profile_node_ref, template_env
from sparkctl.plan.steps import FileRef, Step

UNIT_NAME = "sparkctl-gateway.service"
# What a DGX Spark's interpreter is (DGX OS 7 = Ubuntu 24.04: CPython 3.12, glibc 2.39), assumed
# only where the plan is made without reading the node (`sparkctl plan --assume-fresh`).
SPARK_PLATFORM = wheels.NodePlatform("aarch64", "3.12", "cpython", "2.39")

# The engine's own in-flight gauges (running + waiting), read on its endpoint by the drain:
# vLLM 0.11.2 vllm/v1/metrics/loggers.py (num_requests_running, num_requests_waiting); SGLang
# 0.5.4 python/sglang/srt/metrics/collector.py (num_running_reqs, num_queue_reqs; /metrics
# needs --enable-metrics); llama-server tools/server/server-task.cpp (requests_processing,
# requests_deferred with --metrics) else /slots' is_processing (on by default, common.h
# endpoint_slots). ds41f and TensorFold are not public: the names their simulated servers use.
INFLIGHT = {
    "vllm": (("vllm:num_requests_running", "vllm:num_requests_waiting"), False),
    "sglang": (("sglang:num_running_reqs", "sglang:num_queue_reqs"), False),
    "llamacpp": (("llamacpp:requests_processing", "llamacpp:requests_deferred"), True),
    "ds41f": (("ds41f_requests_running",), False),
    "tensorfold": (("tensorfold_active_sequences",), False),
}


def gateway_node(res: Resolved, inv: Inventory) -> str:
    """serve.gateway.node, else the inventory's first node (where the run record lives)."""
    g = res.profile.serve.gateway
    if g.node is None:
        return inv.nodes[0].name
    if g.node not in inv.names:
        raise ConfigError(f"serve.gateway.node {g.node!r} is not in the inventory",
                          profile_node_ref(res, "serve.gateway.node", None),
                          hint=f"one of {', '.join(inv.names)}")
    return g.node


def listen_address(res: Resolved, inv: Inventory, node: str) -> str:
    """serve.bind for the gateway: all = 0.0.0.0, management = the node's host, fabric = its fabric address."""
    bind = res.profile.serve.bind
    if bind == "management":
        return inv.node(node).host
    if bind == "fabric":
        return inv.primary_address(node) or inv.node(node).host
    return WILDCARD


def backend_url(inv: Inventory, gw_node: str, head: str, listen: str, port: int) -> str:
    """A head's endpoint as the gateway's node reaches it."""
    if head == gw_node:
        return f"http://{on_node_host(listen)}:{port}"
    host = inv.node(head).host if listen in ("", WILDCARD) else listen
    return f"http://{host}:{port}"


def backends(res: Resolved, inv: Inventory, rendering: Rendering) -> list[dict[str, Any]]:
    """Every replica's head as a gateway backend: url, served name, head, replica."""
    gw = gateway_node(res, inv)
    p = res.profile
    out = []
    for h in rendering.layout.heads():
        listen = bind_host(res.for_node(h.node), h, inv.node(h.node).host)
        out.append({"url": backend_url(inv, gw, h.node, listen, p.serve.port), "model": p.model.served_name,
                    "head": h.node, "replica": h.replica})
    return out


@dataclass(frozen=True)
class GatewaySetup:
    """The gateway as rendered for one node and platform."""

    node: str
    files: dict[str, RenderedFile]  # path -> file
    wheels: tuple[PinnedWheel, ...]
    site: str  # where the wheels are unpacked
    url: str  # the gateway as its own node asks it (the ctl)
    listen: str
    port: int
    platform: NodePlatform

    @property
    def marker(self) -> str:
        """What the installed site records: one line per wheel, sha256 and file name."""
        return "".join(f"{w.sha256}  {w.filename}\n" for w in self.wheels)

    def files_hash(self) -> dict[str, str]:
        return {p: f.sha256 for p, f in sorted(self.files.items())}


def _wheels_for(plat: wheels.NodePlatform, version: str, node: str) -> tuple[wheels.PinnedWheel, ...]:
    out = []
    for all_pins in (wheels.SMG, wheels.SETPROCTITLE):
        pins = tuple(p for p in all_pins if p.name != "smg" or p.version == version)
        pin = wheels.select(pins, plat)
        if pin is None:
            raise ConfigError(f"the gateway cannot be installed on {node}: no pinned {pins[0].name} wheel for "
                              f"{plat.describe()}", Ref(node=node, key="serve.gateway"),
                              hint=f"pinned: {wheels.platforms(pins)}; or serve.gateway.node names another node")
        out.append(pin)
    return tuple(out)


def render_gateway(res: Resolved, inv: Inventory, roots: Roots, secrets: Mapping[str, str],
                   plat: wheels.NodePlatform | None, reveal_secrets: bool = False) -> GatewaySetup:
    p = res.profile
    g = p.serve.gateway
    node = gateway_node(res, inv)
    plat = plat or SPARK_PLATFORM
    pins = _wheels_for(plat, g.version, node)
    prefix = inv.node(node).prefix
    site = under(prefix, f"{GATEWAY_DIR}/smg-{g.version}-{plat.machine}-py{plat.python}")
    listen = listen_address(res, inv, node)
    secret_values: dict[str, str] = {}
    if p.serve.api_key_env:
        key = secrets.get(p.serve.api_key_env)
        if not key:
            raise RenderError(f"the gateway's API key variable {p.serve.api_key_env} is not set in your environment",
                              profile_node_ref(res, "serve.api_key_env", node),
                              hint=f"export {p.serve.api_key_env}=... before running (serve.gateway is keyed like "
                              "the engines; the key is never printed)")
        if any(c in key for c in "\n\r\x00"):
            raise RenderError(f"secret {p.serve.api_key_env} contains a newline", Ref(key=p.serve.api_key_env))
        secret_values[API_KEY_VAR] = key if reveal_secrets else MASK
    fpaths = {"env": under(prefix, GATEWAY_ENV), "launch": under(prefix, GATEWAY_LAUNCH),
              "unit": under(prefix, GATEWAY_UNIT), "config": under(prefix, GATEWAY_CONFIG),
              "ctl": under(prefix, GATEWAY_CTL), "log": under(prefix, GATEWAY_LOG)}
    argv = ["--host", listen, "--port", str(g.port), "--prometheus-host", listen,
            "--prometheus-port", str(g.metrics_port), "--log-level", "info"]
    ctx = dict(version=__version__, node=node, g=g, site=site, argv=argv, paths=fpaths,
               api_key=bool(p.serve.api_key_env), api_key_var=API_KEY_VAR, secrets=secret_values)
    env = template_env(roots)
    files: dict[str, RenderedFile] = {}
    for key, tmpl, mode in (("env", "gateway.env.j2", 0o600), ("launch", "gateway-launch.sh.j2", 0o755),
                            ("unit", "sparkctl-gateway.service.j2", 0o644)):
        try:
            text = env.get_template(tmpl).render(**ctx)
        except jinja2.TemplateNotFound as exc:
            raise RenderError(f"template {exc.name} not found", hint=f"searched {roots.template_dirs()}") from None
        files[fpaths[key]] = RenderedFile(fpaths[key], text, mode, "gateway")
    url = f"http://{on_node_host(listen)}:{g.port}"
    config = {"url": url, "env_file": fpaths["env"], "key_var": API_KEY_VAR, "node": node,
              # the records the unit's rebuild reads (gateway_ctl.read_records): every stack's on the state
              # node; elsewhere the copies the record steps write beside the gateway (planner.record_step)
              "records": record_globs(inv, node)}
    files[fpaths["config"]] = RenderedFile(fpaths["config"], json.dumps(config, indent=2, sort_keys=True) + "\n",
                                           0o644, "gateway")
    files[fpaths["ctl"]] = RenderedFile(fpaths["ctl"], ctl_source(), 0o755, "gateway")
    return GatewaySetup(node, files, pins, site, url, listen, g.port, plat)


def record_globs(inv: Inventory, node: str) -> list[str]:
    """Where the gateway's rebuild finds the records on its node: the records themselves on the state
    node (the inventory's first), else the copies of the records of the stacks it serves."""
    prefix = inv.node(node).prefix
    if node == inv.nodes[0].name:
        return [under(prefix, RECORD), under(prefix, STACKS_DIR) + "/*.json"]
    return [under(prefix, GATEWAY_RECORDS) + "/*.json"]


def ctl_source() -> str:
    from importlib import resources

    return resources.files("sparkctl.remote").joinpath("gateway_ctl.py").read_text()


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class GatewayFacts:
    """What planning reads on the gateway's node (it changes nothing)."""

    platform: wheels.NodePlatform | None  # None: no python3 answered
    free_kib: int | None  # where the wheels go
    installed: Mapping[str, str]  # site directory -> its marker (one line)
    files: Mapping[str, str]  # path -> sha256 of the gateway files there now
    active: bool

    def has(self, setup: GatewaySetup) -> bool:
        return self.installed.get(setup.site) == setup.marker.replace("\n", " ").strip()


def facts_command(inv: Inventory, node: str) -> str:
    prefix = inv.node(node).prefix
    opt = under(prefix, paths.OPT_DIR)
    gdir = under(prefix, GATEWAY_DIR)
    files = " ".join(shlex.quote(under(prefix, x)) for x in (GATEWAY_ENV, GATEWAY_LAUNCH, GATEWAY_UNIT,
                                                              GATEWAY_CONFIG, GATEWAY_CTL))
    return "\n".join([
        wheels.PLATFORM_COMMAND + " 2>/dev/null || true",
        f"d={shlex.quote(opt)}; while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done",
        "echo \"free_kib=$(df -Pk \"$d\" 2>/dev/null | awk 'NR==2 {print $4}')\"",
        f"for m in {shlex.quote(gdir)}/*/.sparkctl-wheels; do [ -e \"$m\" ] && "
        "echo \"installed=$(dirname \"$m\")|$(tr '\\n' ' ' < \"$m\")\"; done",
        f"echo \"active=$(systemctl is-active {UNIT_NAME} 2>/dev/null || true)\"",
        f"for f in {files}; do [ -e \"$f\" ] && echo \"file=$(sha256sum \"$f\")\"; done; true",
    ])


def parse_facts(text: str) -> GatewayFacts:
    kv: dict[str, str] = {}
    files: dict[str, str] = {}
    installed: dict[str, str] = {}
    for line in text.splitlines():
        k, eq, v = line.partition("=")
        if not eq:
            continue
        if k == "file":
            digest, _, path = v.partition("  ")
            files[path.strip()] = digest.strip()
        elif k == "installed":
            site, _, marker = v.partition("|")
            installed[site] = marker.strip()
        else:
            kv[k] = v
    free = kv.get("free_kib", "").strip()
    return GatewayFacts(wheels.parse_platform(text), int(free) if free.isdigit() else None,
                        installed, files, kv.get("active", "").strip() == "active")


def refusal(setup: GatewaySetup, facts: GatewayFacts) -> str | None:
    """Why the gateway's node cannot take it (disk), None when it can. Checked before any step runs."""
    if facts.has(setup):
        return None
    need_kib = sum(w.size_bytes * 2 + w.unpacked_bytes for w in setup.wheels) // 1024  # the wheel, its copy, unpacked
    if facts.free_kib is not None and facts.free_kib < need_kib:
        return (f"the gateway cannot be installed on {setup.node}: {facts.free_kib // 1024} MiB free under "
                f"{paths.OPT_DIR}, {need_kib // 1024} MiB needed")
    return None


# --------------------------------------------------------------------------- steps


def _ctl(prefix: str) -> str:
    return f"python3 {shlex.quote(under(prefix, GATEWAY_CTL))} "


def _cfg(prefix: str) -> str:
    return f"--config {shlex.quote(under(prefix, GATEWAY_CONFIG))}"


def install_command(setup: GatewaySetup, prefix: str) -> str:
    wdir = under(prefix, f"{GATEWAY_DIR}/wheels")
    site = setup.site
    lines = ["set -eu", f"w={shlex.quote(wdir)}; d={shlex.quote(site)}",
             # verified again on the node: what was pushed is what was pinned
             "cd \"$w\" && printf '%s' " + shlex.quote(setup.marker) + " | sha256sum -c --quiet -",
             "rm -rf \"$d.new\" && mkdir -p \"$d.new\""]
    for w in setup.wheels:
        lines.append(f"python3 -m zipfile -e \"$w\"/{shlex.quote(w.filename)} \"$d.new\"")
    lines += ["printf '%s' " + shlex.quote(setup.marker) + " > \"$d.new/.sparkctl-wheels\"",
              "rm -rf \"$d\" && mv \"$d.new\" \"$d\"", "rm -rf \"$w\""]
    return "\n".join(lines)


def ensure_steps(setup: GatewaySetup, facts: GatewayFacts, inv: Inventory, persist: bool,
                 on_fail: str) -> list[Step]:
    """Install (when the site lacks these wheels), push the files, (re)start when they changed."""
    node = setup.node
    prefix = inv.node(node).prefix
    sudo = {node: inv.node(node).sudo}
    steps: list[Step] = []
    installed = facts.has(setup)
    if not installed:
        wdir = under(prefix, f"{GATEWAY_DIR}/wheels")
        refs = tuple(FileRef(f"{wdir}/{w.filename}", 0o644, w.sha256) for w in setup.wheels)
        steps.append(Step("gateway-wheels", "gateway", "put", (node,),
                          f"push the pinned wheels ({', '.join(f'{w.name} {w.version}' for w in setup.wheels)}, "
                          f"{setup.platform.describe()})", changes=f"{wdir}", files={node: refs}, sudo=sudo,
                          on_fail=on_fail))
        cmd = install_command(setup, prefix)
        steps.append(Step("gateway-install", "gateway", "run", (node,),
                          f"verify their SHA-256 and unpack them into {setup.site}",
                          changes="the gateway's site directory", commands={node: cmd}, sudo=sudo,
                          timeout_s=300, on_fail=on_fail))
    changed = not installed or not facts.active or any(facts.files.get(p) != f.sha256
                                                       for p, f in setup.files.items())
    refs = tuple(FileRef(f.path, f.mode, f.sha256) for f in sorted(setup.files.values(), key=lambda f: f.path))
    steps.append(Step("gateway-push", "gateway", "put", (node,), f"write the gateway's {len(refs)} files atomically",
                      changes="the gateway's unit, launch script, env file, config and ctl", files={node: refs},
                      sudo=sudo, on_fail=on_fail))
    verb = "restart" if changed else "start"
    start = (f"systemctl daemon-reload && systemctl {verb} {UNIT_NAME}"
             + (f" && systemctl enable {UNIT_NAME}" if persist else "")
             + f" && {_ctl(prefix)}wait {_cfg(prefix)} --timeout 60")
    steps.append(Step("gateway-start", "gateway", "run", (node,),
                      f"{verb} the gateway on {setup.listen}:{setup.port}"
                      + (" (its files changed: streams through it end)" if changed and facts.active else
                         " (already running with these files: a no-op)" if not changed else ""),
                      changes="sparkctl-gateway running", commands={node: start}, sudo=sudo, timeout_s=150,
                      on_fail=on_fail))
    return steps


def register_step(gw: Mapping[str, Any], inv: Inventory, sid: str, phase: str, on_fail: str,
                  timeout_s: int = 120) -> list[Step]:
    """Register the record entry's backends: after the ready step, never before."""
    if not gw or not gw.get("backends"):
        return []
    node = gw["node"]
    prefix = inv.node(node).prefix
    cmd = " && ".join(f"{_ctl(prefix)}register {_cfg(prefix)} --backend {shlex.quote(b['url'])} "
                      f"--model {shlex.quote(b['model'])} --timeout {int(timeout_s)}" for b in gw["backends"])
    return [Step(sid, phase, "run", (node,),
                 "register " + ", ".join(b["url"] for b in gw["backends"]) + " with the gateway (they are ready)",
                 changes="the gateway routes to them", commands={node: cmd}, sudo={node: inv.node(node).sudo},
                 timeout_s=timeout_s * len(gw["backends"]) + 30, on_fail=on_fail)]


def drain_step(gw: Mapping[str, Any], inv: Inventory, sid: str, phase: str, on_fail: str = "continue",
               heads: Sequence[str] | None = None, wait: bool = True) -> list[Step]:
    """Before a stop: remove the backends from the gateway, then wait until each engine reports idle twice."""
    chosen = [b for b in (gw or {}).get("backends", []) if heads is None or b["head"] in heads]
    if not chosen:
        return []
    node = gw["node"]
    if node not in inv.names:
        return []
    prefix = inv.node(node).prefix
    metrics, slots = gw.get("gauge", {}).get("metrics", []), gw.get("gauge", {}).get("slots", False)
    timeout_s = int(gw.get("drain_timeout_s", 600))
    gauge = "".join(f" --metric {shlex.quote(m)}" for m in metrics) + (" --slots" if slots else "")
    urls = "".join(f" --backend {shlex.quote(b['url'])}" for b in chosen)
    if wait:
        cmd = f"{_ctl(prefix)}drain {_cfg(prefix)}{urls}{gauge} --timeout {timeout_s}"
        summary = ("drain " + ", ".join(b["url"] for b in chosen) + ": remove from the gateway, then wait until "
                   f"the engine reports nothing in flight twice (up to {timeout_s} s)")
    else:
        cmd = f"{_ctl(prefix)}deregister {_cfg(prefix)}{urls}"
        summary = "remove " + ", ".join(b["url"] for b in chosen) + " from the gateway"
    # guarded: a node where the gateway was never installed has nothing to drain
    ctl = shlex.quote(under(prefix, GATEWAY_CTL))
    cmd = f"if [ -e {ctl} ]; then {cmd}; fi"
    return [Step(sid, phase, "run", (node,), summary, changes="the gateway no longer routes to them",
                 commands={node: cmd}, sudo={node: inv.node(node).sudo},
                 timeout_s=timeout_s + 60 if wait else 60, on_fail=on_fail)]


def record_entry(res: Resolved, inv: Inventory, rendering: Rendering, setup: GatewaySetup) -> dict[str, Any]:
    """What the run record keeps of the gateway (down, the unit's rebuild and status read it)."""
    g = res.profile.serve.gateway
    metrics, slots = INFLIGHT[res.profile.engine.name]
    return {"node": setup.node, "url": setup.url, "listen": setup.listen, "port": g.port, "metrics_port": g.metrics_port,
            "backends": backends(res, inv, rendering), "gauge": {"metrics": list(metrics), "slots": slots},
            "drain_timeout_s": g.drain_timeout_s}


def hold_step(gw: Mapping[str, Any], inv: Inventory, sid: str, phase: str, models: Sequence[str], settle_s: int,
              on_fail: str = "continue") -> list[Step]:
    """Where no replica stays up: keep ``models`` registered-but-draining at the gateway (a stand-in
    worker, ``gateway_ctl.py hold``) so requests get 503 + Retry-After, never 404, until released."""
    if not gw or gw.get("node") not in inv.names or not models:
        return []
    node = gw["node"]
    prefix = inv.node(node).prefix
    ctl = shlex.quote(under(prefix, GATEWAY_CTL))
    names = "".join(f" --model {shlex.quote(m)}" for m in models)
    cmd = f"if [ -e {ctl} ]; then {_ctl(prefix)}hold {_cfg(prefix)}{names} --settle {int(settle_s)} --timeout 60; fi"
    return [Step(sid, phase, "run", (node,),
                 f"hold {', '.join(repr(m) for m in models)} at the gateway: 503 with Retry-After until released "
                 f"(up to {int(settle_s)} s), never 404, while no replica serves",
                 changes="a stand-in worker per name, draining at the gateway", commands={node: cmd},
                 sudo={node: inv.node(node).sudo}, timeout_s=90 * len(models), on_fail=on_fail)]


def release_step(gw: Mapping[str, Any], inv: Inventory, sid: str, phase: str, models: Sequence[str],
                 on_fail: str = "continue") -> list[Step]:
    """Remove the stand-ins of :func:`hold_step`: the registered replicas serve the names from here."""
    if not gw or gw.get("node") not in inv.names or not models:
        return []
    node = gw["node"]
    prefix = inv.node(node).prefix
    ctl = shlex.quote(under(prefix, GATEWAY_CTL))
    names = "".join(f" --model {shlex.quote(m)}" for m in models)
    return [Step(sid, phase, "run", (node,), f"release the gateway's hold on {', '.join(repr(m) for m in models)}",
                 changes="the stand-in workers removed from the gateway",
                 commands={node: f"if [ -e {ctl} ]; then {_ctl(prefix)}release {_cfg(prefix)}{names}; fi"},
                 sudo={node: inv.node(node).sudo}, timeout_s=60, on_fail=on_fail)]
