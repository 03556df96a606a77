"""The node exporters: what `fabric apply` pushes and starts, what `fabric restore` removes,
and the Prometheus scrape configuration. Pure.

Every node gets ``sparkctl-exporter.service`` (:mod:`sparkctl.node.exporter`), bound to its
management address (the inventory's ``host``) on :data:`EXPORTER_PORT`; the inventory's first
node (the head: the record lives there) also serves the status page on :data:`PAGE_PORT`.
The code goes as ONE zip of sparkctl's own pure packages (:func:`bundle`: the exporter
imports the very fact parsers the operator runs, the AnsiballZ way), the third-party
library as a pinned wheel (:data:`sparkctl.model.wheels.PROMETHEUS_CLIENT`); the unit puts
both on ``PYTHONPATH``. The zip is byte-for-byte reproducible (fixed timestamps, sorted
names), so a re-apply pushes the same hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import shlex
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from sparkctl import __version__
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import (
    ENV_FILE,
    EXPORTER_CONFIG,
    EXPORTER_DIR,
    EXPORTER_UNIT,
    GATEWAY_ENV,
    LAWS_DIR,
    LAWS_VERDICTS,
    RECORD,
    STACKS_DIR,
    under,
)
from sparkctl.model.resources import Roots
from sparkctl.model.wheels import PROMETHEUS_CLIENT, PinnedWheel
from sparkctl.plan.render import API_KEY_VAR, TOKENS_METRIC, template_env
from sparkctl.plan.steps import FileRef, Step

EXPORTER_PORT = 9478  # the exporter's /metrics on each node's management address
PAGE_PORT = 9479  # the head's status page and /status.json, where the endpoint listens (serve.bind)
UNIT_NAME = posixpath.basename(EXPORTER_UNIT)
# a requests counter where the engine has one (vLLM's, as the simulated one reproduces it)
REQUESTS_METRIC = {"vllm": "vllm:request_success_total", "sglang": "sglang:num_requests_total"}
# sparkctl's packages the exporter needs on a node: pure, no pydantic at import (tests/test_exporter.py)
BUNDLED = ("__init__.py", "errors.py", "facts", "model", "node")
_EPOCH = (2020, 1, 1, 0, 0, 0)
START_WAIT_S = 60  # the first scrape runs every probe: seconds on a loaded box
q = shlex.quote


def bundle() -> bytes:
    """sparkctl's zip for the nodes: the packages in :data:`BUNDLED`, reproducible byte for byte."""
    root = resources.files("sparkctl")
    names: list[tuple[str, bytes]] = []

    def walk(node: Any, rel: str) -> None:
        if node.is_dir():
            if node.name == "__pycache__":
                return
            for child in node.iterdir():
                walk(child, f"{rel}/{child.name}")
        elif rel.endswith((".py", ".typed")):
            names.append((rel, node.read_bytes()))

    for entry in BUNDLED:
        walk(root.joinpath(entry), f"sparkctl/{entry}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in sorted(names):
            info = zipfile.ZipInfo(rel, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


@dataclass(frozen=True)
class ExporterFile:
    path: str  # prefix applied
    mode: int
    sha256: str
    data: bytes | None  # None: the pinned wheel, whose bytes the operator's side fetches (ops.wheelhouse)

    @classmethod
    def of(cls, path: str, mode: int, data: bytes) -> "ExporterFile":
        return cls(path, mode, hashlib.sha256(data).hexdigest(), data)


@dataclass(frozen=True)
class ExporterFiles:
    files: Mapping[str, tuple[ExporterFile, ...]]
    head: str

    def blobs(self) -> dict[str, bytes]:
        return {f.sha256: f.data for fs in self.files.values() for f in fs if f.data is not None}


def head_of(inv: Inventory) -> str:
    return inv.nodes[0].name  # sparkctl.ops.lock.head_node: the record lives on the first node


def target(inv: Inventory, node: str, port: int = EXPORTER_PORT) -> str:
    host = inv.node(node).host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def config(inv: Inventory, node: str, script: str) -> dict[str, Any]:
    """The exporter's configuration on ``node`` (JSON): where it listens, the probe script it runs
    at each scrape; on the head, where the record, the verdicts and the env file are, and its peers."""
    n = inv.node(node)
    doc: dict[str, Any] = {"version": 1, "sparkctl": __version__, "node": node, "listen": n.host,
                           "port": EXPORTER_PORT, "script": script, "head": None}
    if node == head_of(inv):
        doc["head"] = {
            "record": under(n.prefix, RECORD), "laws": under(n.prefix, LAWS_VERDICTS),
            "stacks_dir": under(n.prefix, STACKS_DIR), "laws_dir": under(n.prefix, LAWS_DIR),
            "hosts": {m.name: m.host for m in inv.nodes},
            "env_file": under(n.prefix, ENV_FILE), "gateway_env_file": under(n.prefix, GATEWAY_ENV),
            "key_var": API_KEY_VAR, "page_port": PAGE_PORT,
            "nodes": list(inv.names), "peers": {m: target(inv, m) for m in inv.names if m != node},
            "tokens_metric": {k: v for k, v in TOKENS_METRIC.items() if v}, "requests_metric": REQUESTS_METRIC,
            "interval_s": 5, "window_s": 600}
    return doc


def render_exporters(inv: Inventory, roots: Roots, scripts: Mapping[str, str],
                     pin: PinnedWheel = PROMETHEUS_CLIENT) -> ExporterFiles:
    """Every node's exporter files: the zip, the wheel (by its pinned hash), the configuration (with
    ``scripts[node]``, the probe the facts layer renders: ``sparkctl.facts.batch.fact_script``), the unit."""
    code = bundle()
    code_sha = hashlib.sha256(code).hexdigest()
    env = template_env(roots)
    out: dict[str, tuple[ExporterFile, ...]] = {}
    for n in inv.nodes:
        d = under(n.prefix, EXPORTER_DIR)
        zpath = f"{d}/sparkctl-{__version__}.zip"  # its sha256 is in the plan's put step
        wpath = f"{d}/{pin.filename}"
        cpath = under(n.prefix, EXPORTER_CONFIG)
        unit = env.get_template("sparkctl-exporter.service.j2").render(
            version=__version__, node=n.name, head=n.name == head_of(inv), listen=n.host, port=EXPORTER_PORT,
            bundle=zpath, wheel=pin, wheel_path=wpath, config=cpath)
        out[n.name] = (ExporterFile(zpath, 0o644, code_sha, code), ExporterFile(wpath, 0o644, pin.sha256, None),
                       ExporterFile.of(cpath, 0o644, (json.dumps(config(inv, n.name, scripts[n.name]), indent=1, sort_keys=True)
                                                      + "\n").encode()),
                       ExporterFile.of(under(n.prefix, EXPORTER_UNIT), 0o644, unit.encode()))
    return ExporterFiles(out, head_of(inv))


def _start(inv: Inventory, node: str, files: tuple[ExporterFile, ...]) -> str:
    """Drop an older zip, enable and restart the unit, wait until /metrics answers on the management address."""
    n = inv.node(node)
    keep = " ".join(q(posixpath.basename(f.path)) for f in files)
    d = q(under(n.prefix, EXPORTER_DIR))
    url = f"http://{target(inv, node)}/metrics"
    probe = ("import sys,urllib.request as u;"
             "u.build_opener(u.ProxyHandler({})).open(sys.argv[1],timeout=30).read()")
    return "\n".join([
        "set -e",
        f"for f in {d}/*; do case \"${{f##*/}}\" in {'|'.join(keep.split())}) ;; *) rm -f \"$f\" ;; esac; done",
        "systemctl daemon-reload",
        f"systemctl enable {UNIT_NAME}",
        f"systemctl restart {UNIT_NAME}",
        f"end=$(( $(date +%s) + {START_WAIT_S} ))",
        f"until python3 -c {q(probe)} {q(url)} 2>/dev/null; do",
        f'  if [ "$(date +%s)" -ge "$end" ]; then echo "the exporter does not answer on {url} after '
        f'{START_WAIT_S} s (journalctl -u {UNIT_NAME})" >&2; exit 1; fi',
        "  sleep 0.5", "done", f"echo {q('serving ' + url)}"])


def exporter_steps(inv: Inventory, files: ExporterFiles) -> list[Step]:
    nodes = tuple(n.name for n in inv.nodes)
    put = {n: tuple(FileRef(f.path, f.mode, f.sha256) for f in files.files[n]) for n in nodes}
    start = {n: _start(inv, n, files.files[n]) for n in nodes}
    return [
        Step("exporter-push", "exporter", "put", nodes, f"push the exporter: sparkctl's zip ({__version__}), the pinned "
             f"{PROMETHEUS_CLIENT.filename} (sha256 {PROMETHEUS_CLIENT.sha256[:12]}...), its configuration, its unit",
             changes=f"{EXPORTER_DIR}, {EXPORTER_CONFIG}, {UNIT_NAME}", files=put,
             sudo={n: inv.node(n).sudo for n in nodes}),
        Step("exporter", "exporter", "run", nodes, f"enable and restart {UNIT_NAME} (port {EXPORTER_PORT} on the "
             f"management address; the status page on {files.head}, port {PAGE_PORT}), wait for /metrics",
             changes=f"{UNIT_NAME} enabled and running", commands=start,
             sudo={n: inv.node(n).sudo for n in nodes}, timeout_s=START_WAIT_S + 30)]


def remove_command(prefix: str) -> str:
    """What `fabric restore` runs for the exporter: the unit stopped and gone, its files removed."""
    paths = " ".join(q(under(prefix, p)) for p in (EXPORTER_UNIT, EXPORTER_CONFIG))
    return (f"systemctl disable --now {UNIT_NAME} >/dev/null 2>&1 || true; rm -f {paths}; "
            f"rm -rf {q(under(prefix, EXPORTER_DIR))}")


# --------------------------------------------------------------------------- the scrape configuration


def scrape_config(inv: Inventory, engines: Mapping[str, tuple[str, str, str | None]] | None = None,
                  interval_s: int = 15, gateway: tuple[str, str, str | None] | None = None) -> str:
    """A Prometheus configuration (its ``scrape_configs``) for the exporters, the engines and the gateway.

    ``engines``: head -> (engine name, "host:port" of its /metrics, why it is left out or None),
    from the profile's rendered flags (:func:`engine_targets`); ``gateway``: (its node, "host:port"
    of smg's Prometheus endpoint, why it is left out or None), :func:`gateway_target`."""
    nodes = [{"targets": [target(inv, n)], "labels": {"node": n}} for n in inv.names]
    jobs: list[dict[str, Any]] = [{"job_name": "sparkctl-exporter", "scrape_interval": f"{interval_s}s",
                                   "scrape_timeout": f"{min(interval_s, 10)}s", "static_configs": nodes}]
    notes: list[str] = []
    serving = {h: e for h, e in (engines or {}).items() if e[2] is None}
    for h, (eng, _, why) in sorted((engines or {}).items()):
        if why:
            notes.append(f"# {h}: the {eng} engine's /metrics is not scraped: {why}")
    if serving:
        jobs.append({"job_name": "sparkctl-engine", "scrape_interval": f"{interval_s}s",
                     "static_configs": [{"targets": [addr], "labels": {"node": h, "engine": eng}}
                                        for h, (eng, addr, _) in sorted(serving.items())]})
    if gateway is not None and gateway[2]:
        notes.append(f"# the gateway on {gateway[0]}: its /metrics is not scraped: {gateway[2]}")
    elif gateway is not None:
        jobs.append({"job_name": "sparkctl-gateway", "scrape_interval": f"{interval_s}s",
                     "static_configs": [{"targets": [gateway[1]], "labels": {"node": gateway[0]}}]})
    head = [f"# Rendered by sparkctl {__version__} for the inventory's {len(inv.names)} nodes.",
            "# Each node's sparkctl exporter (installed by `sparkctl fabric apply`), and each head's engine",
            "# where its rendered flags serve /metrics, and the gateway's (serve.gateway).",
            "# Put these jobs under scrape_configs: of your prometheus.yml",
            "# (docs/observability.md).", *notes]
    return "\n".join(head) + "\n" + yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False)


# Where an engine's release serves /metrics (the engine contracts, docs/engines.md): vLLM always; SGLang
# only with --enable-metrics; llama-server only with --metrics; ds41f and TensorFold always.
METRICS_FLAG = {"sglang": "--enable-metrics", "llamacpp": "--metrics"}


def engine_targets(res: Any, inv: Inventory, rendering: Any) -> dict[str, tuple[str, str, str | None]]:
    """head -> (engine, "host:port" of its /metrics, why it is not scraped or None), from the rendered flags."""
    from sparkctl.plan.planner import head_listen

    eng = res.profile.engine.name
    port = res.profile.serve.port
    out: dict[str, tuple[str, str, str | None]] = {}
    for h, listen in head_listen(res, rendering, inv).items():
        host = inv.node(h).host if listen == "0.0.0.0" else listen
        addr = f"{host}:{port}"
        text = "\n".join(f.text for f in rendering.files.get(h, {}).values())
        flag = METRICS_FLAG.get(eng)
        why = None
        if flag and flag not in text.split():
            why = f"its rendered flags have no {flag} (the release serves no /metrics without it)"
        elif listen != "0.0.0.0" and listen != inv.node(h).host:
            why = (f"serve.bind: fabric listens on {listen}, the head's fabric address, which Prometheus on the "
                   "management network cannot reach (bind: management serves it there)")
        out[h] = (eng, addr, why)
    return out


def gateway_target(res: Any, inv: Inventory) -> tuple[str, str, str | None] | None:
    """(the gateway's node, "host:port" of smg's Prometheus endpoint, why it is not scraped or None);
    None when the profile has no gateway. smg binds it where the gateway listens (``--prometheus-host``:
    serve.bind, docs/gateway.md) on ``serve.gateway.metrics_port``."""
    from sparkctl.plan.gatewayplan import gateway_node, listen_address

    g = res.profile.serve.gateway
    if not g.enabled:
        return None
    node = gateway_node(res, inv)
    listen = listen_address(res, inv, node)
    host = inv.node(node).host if listen == "0.0.0.0" else listen
    addr = f"[{host}]:{g.metrics_port}" if ":" in host else f"{host}:{g.metrics_port}"
    why = None
    if listen not in ("0.0.0.0", inv.node(node).host):
        why = (f"serve.bind: fabric binds it to {listen}, the node's fabric address, which Prometheus on the "
               "management network cannot reach")
    return node, addr, why
