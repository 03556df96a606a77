"""The head's status page: one read-only page and its JSON document, in the head's exporter.

One process serves ``/metrics`` (Prometheus, on the management address) and, on a second
listener, ``/`` (the page: nodes, laws, ranks, memory and power per node over the last
minutes, requests and tokens per second) and ``/status.json`` (what the page shows). The
second listener follows the endpoint's rules as the record keeps them: it listens where the
engine listens (the record's ``listen`` for the head: serve.bind; the management address
while nothing was started) and, when the record names a key variable (serve.api_key_env),
answers only a request carrying the endpoint's key (``Authorization: Bearer KEY``, or HTTP
Basic with the key as password, what a browser sends), read from the head's 0600 env file.

A sampler thread asks every node's exporter for its ``/node.json`` every ``interval_s`` and
keeps ``window_s`` of samples in a ring buffer. A node's row has the fields and values of
``sparkctl status --json`` (:func:`sparkctl.facts.statusrow.node_row`), drift the part a
node's own facts decide (:func:`sparkctl.facts.statusrow.rank_drift`). The page loads no
external asset: its script and style are inline, its plots SVG drawn by that script.
"""

from __future__ import annotations

import base64
import hmac
import json
import shlex
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import datetime
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client.core import Metric

from sparkctl.facts.statusrow import rank_drift
from sparkctl.node import headstate
from sparkctl.node.metrics import head_families
from sparkctl.node.pagehtml import PAGE  # noqa: F401 - re-exported
from sparkctl.node.reading import REUSE_S, node_document

PEER_TIMEOUT_S = 20.0  # a peer's /node.json runs its probe: seconds on a loaded box
WILDCARD, LOOPBACK = "0.0.0.0", "127.0.0.1"  # sparkctl.model.record (not imported: no pydantic on a node)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def env_value(path: str, var: str) -> str | None:
    """``var``'s value in a rendered env file (``KEY=<sh-quoted value>`` lines; engine.env.j2)."""
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                k, eq, v = line.strip().partition("=")
                if eq and k == var:
                    words = shlex.split(v)
                    return words[0] if words else ""
    except (OSError, ValueError):
        return None
    return None


def _since(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(iso)).timestamp() if iso else None
    except ValueError:
        return None


def metric_sum(text: str, name: str) -> float | None:
    """The sum of ``name``'s samples in Prometheus text (as sparkctl.remote.endpoint_probe.metric_value)."""
    total = None
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):][:1] in (" ", "{"):
            try:
                total = (total or 0.0) + float(line.rsplit(None, 1)[-1])
            except ValueError:
                pass
    return total


class Head:
    def __init__(self, exporter: Any, cfg: Mapping[str, Any]) -> None:
        self.exporter, self.cfg = exporter, cfg
        self.interval_s = float(cfg.get("interval_s", 5))
        self.samples: deque[dict[str, Any]] = deque(maxlen=max(2, int(float(cfg.get("window_s", 600)) / self.interval_s)))
        self.doc: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._page: ThreadingHTTPServer | None = None
        self._page_addr: str | None = None

    # ----------------------------------------------------------------- what the record says

    def record(self) -> dict[str, Any] | None:
        rec = _read_json(self.cfg["record"])
        return rec if isinstance(rec, dict) else None

    def laws(self) -> dict[str, Any] | None:
        """The default stack's verdicts (the one file before stacks)."""
        laws = _read_json(self.cfg["laws"])
        return laws if isinstance(laws, dict) else None

    def laws_by_stack(self) -> dict[str, dict[str, Any]]:
        return headstate.laws(self.cfg)

    def gateways(self) -> list[dict[str, Any]]:
        """The gateways the records name, read now (the sampler's; a scrape shows the last sample's)."""
        recs = headstate.records(self.cfg)
        keyed = any(r.get("api_key_env") for r in recs.values())
        # the gateway's own env file when it runs here, else the engine's (they share serve.api_key_env)
        key = ((env_value(self.cfg["gateway_env_file"], self.cfg["key_var"]) if self.cfg.get("gateway_env_file")
                else None) or env_value(self.cfg["env_file"], self.cfg["key_var"])) if keyed else None
        return headstate.read_gateways(recs, self.exporter.node, self.cfg.get("hosts") or {}, key)

    def families(self) -> Iterator[Metric]:
        rec = self.record()
        with self._lock:
            drift = self.doc.get("drift") if self.doc else None
            gws = self.doc.get("gateways") if self.doc else None
        yield from head_families(rec, self.laws_by_stack(), _since(rec.get("updated_at")) if rec else None, drift,
                                 gws)

    # ----------------------------------------------------------------- sampling

    def _fetch(self, url: str, headers: Mapping[str, str] | None = None, timeout: float = 3.0) -> bytes:
        req = urllib.request.Request(url, headers=dict(headers or {}))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy: nodes only
        with opener.open(req, timeout=timeout) as r:
            body: bytes = r.read()
            return body

    def _node(self, name: str) -> dict[str, Any]:
        if name == self.exporter.node:
            return node_document(name, self.exporter.reader.read(REUSE_S))
        doc: dict[str, Any] = json.loads(self._fetch(f"http://{self.cfg['peers'][name]}/node.json",
                                                     timeout=PEER_TIMEOUT_S))
        return doc

    def _endpoint(self, rec: Mapping[str, Any], head: str) -> dict[str, Any]:
        """The head's endpoint asked on the head (the bound address), as status's endpoint entry."""
        listen = (rec.get("listen") or {}).get(head)
        host = LOOPBACK if not listen or listen == WILDCARD else listen
        base = f"http://{host}:{int(rec.get('port', 0))}"
        key = env_value(self.cfg["env_file"], self.cfg["key_var"]) if rec.get("api_key_env") else None
        hdrs = {"Authorization": f"Bearer {key}"} if key else {}
        out: dict[str, Any] = {}
        try:
            models = [m.get("id") for m in json.loads(self._fetch(f"{base}/v1/models", hdrs)).get("data", [])]
            text = self._fetch(f"{base}/metrics", hdrs).decode("utf-8", "replace")
        except Exception as exc:  # noqa: BLE001 - down is a state, never a crash of the page
            return {"state": "key refused" if "401" in str(exc) else "down", "error": type(exc).__name__}
        eng = str(rec.get("engine"))
        tm, rm = (self.cfg.get("tokens_metric") or {}).get(eng), (self.cfg.get("requests_metric") or {}).get(eng)
        out.update({"state": "serving" if rec.get("served_name") in models else "not serving", "models": models,
                    "serves_record": rec.get("served_name") in models,
                    "tokens_generated": metric_sum(text, tm) if tm else None,
                    "requests_finished": metric_sum(text, rm) if rm else None})
        return out

    def _all_nodes(self) -> dict[str, Any]:
        """Every node's /node.json at once (each runs its own probe); an exception where one failed."""
        from concurrent.futures import ThreadPoolExecutor

        def one(name: str) -> Any:
            try:
                return self._node(name)
            except Exception as exc:  # noqa: BLE001 - kept as the node's value
                return exc

        names = list(self.cfg["nodes"])
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            return dict(zip(names, pool.map(one, names)))

    def sample(self) -> dict[str, Any]:
        rec = self.record()
        t = time.time()
        rows, drift = [], []
        got = self._all_nodes()
        for name in self.cfg["nodes"]:
            nr = (rec or {}).get("nodes", {}).get(name)
            try:
                d = got[name]
                if isinstance(d, Exception):
                    raise d
                row: dict[str, Any] = {"node": name, "reachable": True, "error": None, **d["row"]}
            except Exception as exc:  # noqa: BLE001 - an exporter that does not answer is a row, not a crash
                rows.append({"node": name, "reachable": False, "error": f"exporter: {type(exc).__name__}"})
                if nr:
                    drift.append(f"{name}: unreachable (exporter: {type(exc).__name__})")
                continue
            if nr and rec:
                row.update({"rank": nr.get("rank"), "replica": nr.get("replica"), "engine": rec.get("engine")})
                u = d.get("engine_unit") or {}
                drift += rank_drift(name, int(nr.get("rank", 0)), row, str(rec.get("state")), rec.get("clock_cap_mhz"),
                                    u.get("result"), int(u.get("restarts") or 0))
            row["_mem"] = {"total_kib": d.get("mem_total_kib"), "free_kib": d.get("mem_free_kib"),
                           "cached_kib": d.get("mem_cached_kib")}
            rows.append(row)
        endpoint = {h: self._endpoint(rec, h) for h in (rec or {}).get("heads", [])} if rec else {}
        gateways = self.gateways()
        tokens = sum(e.get("tokens_generated") or 0 for e in endpoint.values()) if endpoint else None
        reqs: list[float] = [e["requests_finished"] for e in endpoint.values() if e.get("requests_finished") is not None]
        s = {"t": t, "nodes": {r["node"]: {"mem_available_gib": r.get("mem_available_gib"), "power_w": r.get("power_w")}
                               for r in rows if r.get("reachable")},
             "tokens": tokens, "requests": sum(reqs) if reqs else None}
        with self._lock:
            prev = self.samples[-1] if self.samples else None
            self.samples.append(s)
            rates = {"tokens_per_s": None, "requests_per_s": None}
            if prev is not None and s["t"] > prev["t"]:
                for k, out in (("tokens", "tokens_per_s"), ("requests", "requests_per_s")):
                    if s[k] is not None and prev[k] is not None and s[k] >= prev[k]:
                        rates[out] = round((s[k] - prev[k]) / (s["t"] - prev["t"]), 2)
            self.doc = {"at": t, "record": rec, "nodes": [{k: v for k, v in r.items() if k != "_mem"} for r in rows],
                        "memory": {r["node"]: r["_mem"] for r in rows if "_mem" in r}, "endpoint": endpoint,
                        "drift": drift, "laws": self.laws(), "laws_by_stack": self.laws_by_stack(),
                        "gateways": gateways, "rates": rates, "interval_s": self.interval_s,
                        "history": list(self.samples)}
        return self.doc

    def document(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.doc)

    # ----------------------------------------------------------------- the page's listener

    def page_address(self) -> str:
        """Where the engine listens (the record's ``listen``: serve.bind); the management address before any run."""
        rec = self.record() or {}
        return str((rec.get("listen") or {}).get(self.exporter.node) or self.exporter.config["listen"])

    def key(self) -> str | None:
        rec = self.record() or {}
        if not rec.get("api_key_env"):
            return None
        return env_value(self.cfg["env_file"], self.cfg["key_var"]) or "\0no key on this node\0"

    def authorized(self, header: str | None) -> bool:
        key = self.key()
        if key is None:
            return True
        scheme, _, cred = (header or "").partition(" ")
        if scheme.lower() == "bearer":
            given = cred.strip()
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(cred.strip()).decode("utf-8", "replace").partition(":")[2]
            except ValueError:
                return False
        else:
            return False
        return hmac.compare_digest(given.encode(), key.encode())

    def _rebind(self) -> None:
        addr = self.page_address()
        if addr == self._page_addr and self._page is not None:
            return
        if self._page is not None:
            self._page.shutdown()
            self._page.server_close()
            self._page = None
        from sparkctl.node.pageserve import page_handler

        try:
            srv = ThreadingHTTPServer((addr, int(self.cfg["page_port"])), page_handler(self))
        except OSError as exc:
            print(f"sparkctl exporter: status page cannot listen on {addr}:{self.cfg['page_port']}: {exc}", flush=True)
            self._page_addr = None
            return
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, name="status-page", daemon=True).start()
        self._page, self._page_addr = srv, addr
        print(f"sparkctl exporter: status page on {addr}:{self.cfg['page_port']}", flush=True)

    def _loop(self) -> None:
        while True:
            t0 = time.monotonic()
            try:
                self.sample()
                self._rebind()
            except Exception as exc:  # noqa: BLE001 - the sampler keeps going
                print(f"sparkctl exporter: sample failed: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(max(0.5, self.interval_s - (time.monotonic() - t0)))

    def start(self) -> None:
        threading.Thread(target=self._loop, name="sampler", daemon=True).start()


__all__ = ["Head", "PAGE", "env_value"]
