"""What the head's exporter reads of sparkctl's own state: every stack's record, every stack's laws'
verdicts, and the gateway the records name (smg's ``GET /workers``). Standard library only.

The paths come from the exporter's configuration (:func:`sparkctl.plan.exporterplan.config`): the
default stack's record and verdicts (``record.json``, ``laws.json``: the one files before stacks)
and the directories of the others (``stacks/NAME.json``, ``laws/NAME.json``;
:func:`sparkctl.model.paths.laws_path`). A configuration written before stacks has no directories:
the default stack's files alone are read.
"""

from __future__ import annotations

import glob
import json
import os
import urllib.request
from collections.abc import Mapping
from typing import Any

from sparkctl.model.record import SERVING_STATES

DEFAULT_STACK = "default"  # sparkctl.model.paths.DEFAULT_STACK (not imported: the node has no pydantic)
WILDCARD, LOOPBACK = "0.0.0.0", "127.0.0.1"  # sparkctl.model.record
GATEWAY_TIMEOUT_S = 2.0


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _by_stack(default_path: str | None, directory: str | None, stack_key: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if default_path:
        d = read_json(default_path)
        if isinstance(d, dict):
            out[str(d.get("stack") or DEFAULT_STACK) if stack_key else DEFAULT_STACK] = d
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))) if directory else []:
        d = read_json(path)
        if isinstance(d, dict):
            out[str(d.get("stack") or os.path.basename(path)[:-5]) if stack_key else os.path.basename(path)[:-5]] = d
    return dict(sorted(out.items()))


def records(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every stack's record by stack name (as sparkctl.ops.lock.parse_state reads them)."""
    return _by_stack(cfg.get("record"), cfg.get("stacks_dir"), True)


def laws(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every stack's laws' verdicts by stack name (laws.json: the stack "default"'s)."""
    return _by_stack(cfg.get("laws"), cfg.get("laws_dir"), False)


def gateways_of(recs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """gateway node -> its latest record entry and the stacks whose records name it
    (as sparkctl.ops.gatewayops.gateways_of)."""
    out: dict[str, dict[str, Any]] = {}
    for stack, rec in sorted(recs.items(), key=lambda kv: str(kv[1].get("updated_at") or "")):
        g = rec.get("gateway") or {}
        if not g.get("node"):
            continue
        prev = out.get(str(g["node"]), {})
        out[str(g["node"])] = {**g, "stacks": [*prev.get("stacks", []), stack],
                               "keyed": bool(prev.get("keyed") or rec.get("api_key_env"))}
    return out


def gateway_url(entry: Mapping[str, Any], here: str, hosts: Mapping[str, str]) -> str:
    """The gateway as this node reaches it: its own URL on its own node, else its bound address
    (the node's management host when it binds every address)."""
    node = str(entry.get("node"))
    if node == here:
        return str(entry.get("url"))
    listen = str(entry.get("listen") or "")
    host = hosts.get(node, node) if listen in ("", WILDCARD) else listen
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{int(entry.get('port') or 0)}"


def read_gateways(recs: Mapping[str, Mapping[str, Any]], here: str, hosts: Mapping[str, str],
                  key: str | None) -> list[dict[str, Any]]:
    """Each gateway the records name: up or not, its workers as smg lists them, and the backends the
    serving records expect of it."""
    out = []
    for node, entry in sorted(gateways_of(recs).items()):
        url = gateway_url(entry, here, hosts)
        g: dict[str, Any] = {"node": node, "url": url, "port": entry.get("port"), "stacks": entry["stacks"],
                             "up": False, "workers": [], "error": None}
        g["expected"] = [{"url": str(b.get("url")), "model": str(b.get("model") or rec.get("served_name")),
                          "stack": stack}
                         for stack, rec in recs.items() if rec.get("state") in SERVING_STATES
                         and (rec.get("gateway") or {}).get("node") == node
                         for b in (rec.get("gateway") or {}).get("backends", [])]
        headers = {"Authorization": f"Bearer {key}"} if key and entry.get("keyed") else {}
        try:
            req = urllib.request.Request(f"{url}/workers", headers=headers)
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=GATEWAY_TIMEOUT_S) as r:
                body = json.loads(r.read())
            g["workers"] = [{"url": w.get("url"), "model": w.get("model_id") or "", "status": w.get("status") or "",
                             "healthy": bool(w.get("is_healthy", True))}
                            for w in body.get("workers", []) if isinstance(w, dict)]
            g["up"] = True
        except Exception as exc:  # noqa: BLE001 - a gateway that does not answer is down, never a crash
            g["error"] = "HTTP 401" if "401" in str(exc) else type(exc).__name__
        out.append(g)
    return out
