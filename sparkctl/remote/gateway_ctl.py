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
  backends of every stack recorded ``serving`` (or ``degraded``), and those a
  rolling switch under way records as serving (:func:`live_backends`).
* ``hold`` / ``release``: a switch where no replica can stay up keeps the served
  name(s) registered-but-draining at smg (a stand-in worker on loopback, removed
  with a long settle time) so clients get 503 + Retry-After, never 404, until
  the new replicas are registered; ``release`` removes the stand-ins.
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


def register(gw: str, key: str | None, backend: str, model: str, timeout_s: float,
             labels: dict[str, str] | None = None) -> str:
    deadline = time.monotonic() + timeout_s
    # A gateway restarting (its unit's Restart=, a kill mid-switch) answers again within seconds:
    # wait for it inside this timeout rather than fail the switch's step
    listed = wait_gateway(gw, key, timeout_s)
    # A worker still draining at this URL (removed moments ago) would refuse the URL with 409
    # until smg drops it after its settle time: wait for that first.
    while True:
        mine = [w for w in listed if _same(str(w.get("url", "")), backend)]
        if not mine or any(w.get("status") != "draining" for w in mine):
            break
        if time.monotonic() > deadline:
            raise Failed(f"{backend} still draining at the gateway after {timeout_s:.0f} s")
        time.sleep(0.2)
        listed = workers(gw, key)
    if not mine:
        spec: dict[str, Any] = {"url": backend, **({"labels": labels} if labels else {})}
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
    # smg answers the DELETE (202) before it marks the worker Draining: until it does, it may still
    # route a request there, so the engine's gauges count only from then
    t0 = time.monotonic()
    while removed and time.monotonic() - t0 < 10:
        try:
            if not any(_same(str(w.get("url", "")), b) and w.get("status") != "draining"
                       for w in workers(gw, key) for b in backends):
                break
        except (OSError, http.client.HTTPException, Failed):
            break
        time.sleep(0.05)
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


# --------------------------------------------------------------------------- the outage: hold a name at 503

HOLD_LABEL = "sparkctl_hold"  # the label smg keeps on a holder worker (GET /workers lists labels)


def _holder(model: str) -> Any:
    """A stand-in backend on this node's loopback, alive only while it is registered: it answers
    /health and /v1/models (what smg asks before it registers a worker: docs/gateway.md) with
    ``model``, and anything else 503 + Retry-After: 1 (smg's own answer while it drains)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def _send(self, code: int, body: Any, extra: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(extra or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            if self.path.startswith("/health"):
                self._send(200, {})
            elif self.path.startswith("/v1/models"):
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "sparkctl"}]})
            else:
                self._unavailable()

        def do_POST(self) -> None:  # noqa: N802
            self._unavailable()

        def _unavailable(self) -> None:
            self._send(503, {"error": {"type": "server_error", "code": "no_available_workers",
                                       "message": f"{model} is being switched"}}, {"Retry-After": "1"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def hold(gw: str, key: str | None, models: list[str], settle_s: int, timeout_s: float) -> str:
    """Keep ``models`` registered-but-draining at smg for ``settle_s``: requests for them get 503 with
    Retry-After: 1 (``no_available_workers``) instead of 404 while no replica serves them.

    smg 1.13.0, seen on loopback: a worker removed (DELETE) is Draining for its own
    ``drain_settle_secs`` (PATCH ``{"health": {"drain_settle_secs": N}}``), and while a model's
    only workers drain smg answers 503 + Retry-After: 1, even once the drained backend is gone
    and its health checks fail; a DELETE of a worker already draining removes it at once."""
    out = []
    for model in models:
        server = _holder(model)
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            register(gw, key, url, model, timeout_s, labels={HOLD_LABEL: "1"})
            wid = next(str(w["id"]) for w in workers(gw, key) if _same(str(w.get("url", "")), url))
            status, body = ask(f"{gw}/workers/{wid}", key, "PATCH", {"health": {"drain_settle_secs": int(settle_s)}})
            if status not in (200, 202):
                raise Failed(f"PATCH /workers/{wid}: HTTP {status} {str(body)[:200]}")
            deadline = time.monotonic() + timeout_s
            while True:  # the update is applied in the background: the removal must see it
                _, w = ask(f"{gw}/workers/{wid}", key)
                job = (w or {}).get("job_status") if isinstance(w, dict) else None
                if not job or job.get("job_type") != "UpdateWorker" or job.get("status") != "processing":
                    break
                if time.monotonic() > deadline:
                    raise Failed(f"the gateway did not apply the holder's settle time within {timeout_s:.0f} s")
                time.sleep(0.05)
            status, body = ask(f"{gw}/workers/{wid}", key, "DELETE")
            if status not in (200, 202, 204):
                raise Failed(f"DELETE /workers/{wid}: HTTP {status} {str(body)[:200]}")
            while not any(_same(str(w.get("url", "")), url) and w.get("status") == "draining"
                          for w in workers(gw, key)):
                if time.monotonic() > deadline:
                    raise Failed(f"the holder of {model} is not draining at the gateway")
                time.sleep(0.05)
            out.append(model)
        finally:
            server.shutdown()
            server.server_close()
    return f"holding {', '.join(out)} at 503 + Retry-After for up to {settle_s} s"


def release(gw: str, key: str | None, models: list[str]) -> str:
    """Remove the holders of ``models`` (every holder when none is named): a DELETE of a draining
    worker removes it at once; a replica registered for the model serves it from then on."""
    n = 0
    for w in workers(gw, key):
        if (w.get("labels") or {}).get(HOLD_LABEL) and (not models or w.get("model_id") in models):
            status, body = ask(f"{gw}/workers/{w['id']}", key, "DELETE")
            if status not in (200, 202, 204, 404):
                raise Failed(f"DELETE /workers/{w['id']}: HTTP {status} {str(body)[:200]}")
            n += 1
    return f"released {n} holder(s)"


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


# The record states whose gateway backends serve: "degraded" (a rolling switch's way back failed part
# way) lists exactly the replicas left serving (sparkctl.model.record, which this stdlib file cannot import).
SERVING_STATES = ("serving", "degraded")


def live_backends(records: list[dict[str, Any]], node: str | None = None) -> list[tuple[str, str]]:
    """(url, served name) of every backend of every stack recorded serving or degraded (through the gateway
    on ``node``), and of a rolling switch under way its gateway entry's ``serving`` (the replicas that
    serve between two of its steps: sparkctl.plan.switchplan._serving_after)."""
    out = []
    for rec in records:
        gw = rec.get("gateway") or {}
        if node and gw.get("node") and gw.get("node") != node:
            continue
        if rec.get("state") in SERVING_STATES:
            live = gw.get("backends", [])
        elif rec.get("state") == "starting":
            live = gw.get("serving", [])  # absent from any other starting record: nothing serves yet
        else:
            continue
        for b in live:
            out.append((str(b["url"]), str(b.get("model") or rec.get("served_name"))))
    return out


def wait_gateway(gw: str, key: str | None, timeout_s: float) -> list[dict[str, Any]]:
    """The gateway's workers, once it answers (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return workers(gw, key)
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
    ap.add_argument("command", choices=("register", "deregister", "drain", "rebuild", "list", "wait", "hold",
                                        "release"))
    ap.add_argument("--config", required=True)
    ap.add_argument("--backend", action="append", default=[])
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--settle", type=int, default=600)
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
            msg = "; ".join(register(gw, key, b, (a.model or [""])[0], a.timeout) for b in a.backend)
        elif a.command == "deregister":
            msg = f"removed {sum(deregister(gw, key, b) for b in a.backend)} worker(s)"
        elif a.command == "drain":
            msg = drain(gw, key, a.backend, a.metric, a.slots, a.timeout)
        elif a.command == "wait":
            wait_gateway(gw, key, a.timeout)
            msg = f"the gateway at {gw} answers"
        elif a.command == "hold":
            msg = hold(gw, key, a.model, a.settle, a.timeout)
        elif a.command == "release":
            msg = release(gw, key, a.model)
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
