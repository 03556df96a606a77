#!/usr/bin/env python3
"""The gateway's hands on its node: register, drain and rebuild smg's backends. Standard library only.

Pushed to the gateway's node (``/opt/sparkctl/gateway_ctl.py``) and run there by
plan steps (``sparkctl plan up|down`` prints each command) and by the gateway
unit's ``ExecStartPost=`` (``rebuild``). It speaks smg's worker API
(smg ``model_gateway/src/server.rs``: ``POST /workers`` answers 202 and
registers in the background; ``GET /workers`` lists id, url, model_id,
status; ``DELETE /workers/{id}`` marks the worker Draining and drops it after
a settle time, 5 s by default, without waiting for streams in flight,
``model_gateway/src/workflow/steps/local/drain_workers.rs``):

* ``register``: add the backend and wait until smg lists it ``ready`` serving
  the expected model (smg learns the name from the backend's ``/v1/models``; a
  backend that serves another name is removed again and the step fails);
  a backend already registered at that URL is left as it is (idempotent: the
  unit's rebuild may have registered it first).
* ``drain``: remove every worker at the backend's URL, then wait until the
  ENGINE reports nothing in flight twice in a row (its own gauges: the
  gateway's settle time does not wait for streams) or ``--timeout`` passes
  (exit 3). An engine that does not answer at all has nothing in flight.
* ``rebuild``: when the gateway (re)starts: wait for it to answer, read the
  run record(s) (:func:`read_records`, the one reader) and register the
  backends of every stack recorded ``serving``.
* ``wait``: until the gateway answers ``GET /workers``.
* ``list``: the workers as JSON (``--key-stdin``: with the key read from stdin,
  as ``sparkctl status`` asks it with the operator's key, no root needed).

The gateway's key (serve.api_key_env) is read from the 0600 env file rendered
for the gateway, never from the command line; it is never printed.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import shlex
import sys
import time
import urllib.error
import urllib.request
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
POLL_S = 0.5  # between two gauge reads; "idle" needs two reads in a row


class Failed(Exception):
    pass


def load_config(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        cfg: dict[str, Any] = json.load(fh)
    return cfg


def api_key(cfg: dict[str, Any]) -> str | None:
    """The key from the gateway's env file (``VAR='value'`` lines, quoted for sh)."""
    path, var = cfg.get("env_file"), cfg.get("key_var")
    if not path or not var:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                name, eq, value = line.rstrip("\n").partition("=")
                if eq and name == var:
                    words = shlex.split(value)
                    return words[0] if words else None
    except (OSError, ValueError):
        return None
    return None


def ask(url: str, key: str | None, method: str = "GET", body: Any = None,
        timeout_s: float = 5.0) -> tuple[int, Any]:
    """(status, parsed JSON or text) of one request; an HTTP error status is an answer."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with _OPENER.open(req, timeout=timeout_s) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as exc:
        with exc:
            raw, status = exc.read(), exc.code
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def workers(gw: str, key: str | None) -> list[dict[str, Any]]:
    status, body = ask(f"{gw}/workers", key)
    if status != 200 or not isinstance(body, dict):
        raise Failed(f"GET /workers: HTTP {status}")
    return [w for w in body.get("workers", []) if isinstance(w, dict)]


def _same(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def register(gw: str, key: str | None, backend: str, model: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    # A worker still draining at this URL (removed moments ago) would refuse the URL with 409
    # until smg drops it after its settle time: wait for that first.
    while True:
        mine = [w for w in workers(gw, key) if _same(str(w.get("url", "")), backend)]
        if not mine or any(w.get("status") != "draining" for w in mine):
            break
        if time.monotonic() > deadline:
            raise Failed(f"{backend} still draining at the gateway after {timeout_s:.0f} s")
        time.sleep(0.2)
    if not mine:
        spec: dict[str, Any] = {"url": backend}
        if key:
            spec["api_key"] = key  # engines and gateway share serve.api_key_env
        status, body = ask(f"{gw}/workers", key, "POST", spec)
        if status not in (200, 201, 202, 409):  # 409: registered meanwhile (the unit's rebuild)
            raise Failed(f"POST /workers {backend}: HTTP {status} {str(body)[:200]}")
    last = "not listed"
    while True:
        for w in workers(gw, key):
            if not _same(str(w.get("url", "")), backend):
                continue
            served = w.get("model_id") or ""
            if served and served != model:
                deregister(gw, key, backend)
                raise Failed(f"{backend} serves {served!r}, not {model!r}: removed from the gateway again")
            last = f"status {w.get('status')}"
            if w.get("status") == "ready" and w.get("is_healthy", True) and served == model:
                return f"{backend} registered, serving {model}"
        if time.monotonic() > deadline:
            raise Failed(f"{backend} not ready at the gateway within {timeout_s:.0f} s ({last})")
        time.sleep(0.2)


def deregister(gw: str, key: str | None, backend: str) -> int:
    n = 0
    for w in workers(gw, key):
        if _same(str(w.get("url", "")), backend) and w.get("status") != "draining":
            status, body = ask(f"{gw}/workers/{w['id']}", key, "DELETE")
            if status not in (200, 202, 204, 404):
                raise Failed(f"DELETE /workers/{w['id']}: HTTP {status} {str(body)[:200]}")
            n += 1
    return n


def metric_sum(text: str, names: list[str]) -> float | None:
    """The sum of every sample of ``names`` in Prometheus text; None if none is there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for name in names:
            if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
                try:
                    total += float(line.rsplit(None, 1)[-1])
                    seen = True
                except ValueError:
                    pass
    return total if seen else None


def in_flight(backend: str, key: str | None, metrics: list[str], slots: bool) -> float:
    """What the engine reports in flight (running + waiting). 0 when it does not answer at all."""
    try:
        if metrics:
            status, body = ask(f"{backend}/metrics", key)
            if status == 200 and isinstance(body, str):
                value = metric_sum(body, metrics)
                if value is not None:
                    return value
            if not slots:
                raise Failed(f"{backend}/metrics: HTTP {status}, none of {', '.join(metrics)}")
        if slots:
            status, body = ask(f"{backend}/slots", key)
            if status == 200 and isinstance(body, list):
                return float(sum(1 for s in body if isinstance(s, dict) and s.get("is_processing")))
            raise Failed(f"{backend}/slots: HTTP {status}")
        raise Failed("no in-flight gauge for this engine")
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, ConnectionRefusedError) \
                or isinstance(exc, ConnectionRefusedError):
            return 0.0  # nothing listens: nothing in flight
        raise Failed(f"{backend}: {type(exc).__name__}: {exc}") from None


def drain(gw: str, key: str | None, backends: list[str], metrics: list[str], slots: bool, timeout_s: float) -> str:
    """Remove every backend first (none takes new requests while another still drains), then wait for each."""
    removed = 0
    for backend in backends:
        try:
            removed += deregister(gw, key, backend)
        except (OSError, http.client.HTTPException) as exc:
            # the gateway is down: it routes nothing to anyone; the engine's gauges still decide
            print(f"gateway not answering ({type(exc).__name__}); waiting on the engines alone", file=sys.stderr)
    t0 = time.monotonic()
    idle = {b: 0 for b in backends}
    last: dict[str, float] = {}
    while True:
        for b in backends:
            if idle[b] < 2:
                last[b] = in_flight(b, key, metrics, slots)
                idle[b] = idle[b] + 1 if last[b] == 0 else 0
        if all(n >= 2 for n in idle.values()):
            return (f"{', '.join(backends)}: removed {removed} worker(s), nothing in flight after "
                    f"{time.monotonic() - t0:.1f} s")
        if time.monotonic() - t0 > timeout_s:
            busy = ", ".join(f"{b}: {last[b]:g}" for b in backends if idle[b] < 2)
            raise Failed(f"still in flight after {timeout_s:.0f} s ({busy})")
        time.sleep(POLL_S)


# --------------------------------------------------------------------------- the record


def read_records(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run record the gateway serves from: the one reader (per-stack records go here)."""
    out = []
    for pattern in cfg.get("records", []):
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path, encoding="utf-8") as fh:
                    rec = json.load(fh)
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def live_backends(records: list[dict[str, Any]], node: str | None = None) -> list[tuple[str, str]]:
    """(url, served name) of every backend of every stack recorded serving (through the gateway on ``node``)."""
    out = []
    for rec in records:
        gw = rec.get("gateway") or {}
        if rec.get("state") != "serving" or (node and gw.get("node") and gw.get("node") != node):
            continue
        for b in gw.get("backends", []):
            out.append((str(b["url"]), str(b.get("model") or rec.get("served_name"))))
    return out


def wait_gateway(gw: str, key: str | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            workers(gw, key)
            return
        except (OSError, http.client.HTTPException, Failed):
            if time.monotonic() > deadline:
                raise Failed(f"the gateway at {gw} did not answer within {timeout_s:.0f} s") from None
            time.sleep(0.2)


def rebuild(cfg: dict[str, Any], key: str | None, timeout_s: float) -> str:
    gw = cfg["url"]
    wait_gateway(gw, key, timeout_s)
    done, failed = [], []
    for url, model in live_backends(read_records(cfg), cfg.get("node")):
        try:
            register(gw, key, url, model, timeout_s)
            done.append(url)
        except (Failed, OSError, http.client.HTTPException) as exc:
            failed.append(f"{url}: {exc}")
    if failed:
        raise Failed(f"rebuilt {len(done)}, failed {len(failed)}: " + "; ".join(failed))
    return f"rebuilt {len(done)} backend(s) from the record"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="gateway_ctl.py")
    ap.add_argument("command", choices=("register", "deregister", "drain", "rebuild", "list", "wait"))
    ap.add_argument("--config", required=True)
    ap.add_argument("--backend", action="append", default=[])
    ap.add_argument("--model", default="")
    ap.add_argument("--metric", action="append", default=[])
    ap.add_argument("--slots", action="store_true")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--key-stdin", action="store_true", help="read the key from stdin (status: the operator's "
                    "key), not from the env file")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(a.config)
        key = (sys.stdin.readline().strip() or None) if a.key_stdin else api_key(cfg)
        gw = cfg["url"]
        if a.command == "register":
            msg = "; ".join(register(gw, key, b, a.model, a.timeout) for b in a.backend)
        elif a.command == "deregister":
            msg = f"removed {sum(deregister(gw, key, b) for b in a.backend)} worker(s)"
        elif a.command == "drain":
            msg = drain(gw, key, a.backend, a.metric, a.slots, a.timeout)
        elif a.command == "wait":
            wait_gateway(gw, key, a.timeout)
            msg = f"the gateway at {gw} answers"
        elif a.command == "rebuild":
            msg = rebuild(cfg, key, a.timeout)
        else:
            msg = json.dumps(workers(gw, key), indent=2, sort_keys=True)
    except (Failed, OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        detail = str(exc)
        key_now = locals().get("key")
        if key_now:
            detail = detail.replace(key_now, "***")
        print(f"gateway_ctl {a.command}: {type(exc).__name__ if not isinstance(exc, Failed) else ''}"
              f"{': ' if not isinstance(exc, Failed) else ''}{detail}".replace(":: ", ": "), file=sys.stderr)
        return 3
    print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
