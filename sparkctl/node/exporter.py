"""The node's exporter: Prometheus metrics read at scrape time through sparkctl's fact parsers.

Runs on every node as ``sparkctl-exporter.service`` (``python3 -m sparkctl.node.exporter
CONFIG``, with sparkctl's zip and the pinned prometheus_client wheel on ``PYTHONPATH``),
bound to the node's management address. Each scrape of ``/metrics`` runs the probe script
the operator rendered into the configuration (``sparkctl.facts.batch.fact_script``: the
same facts and commands ``sparkctl status`` reads) and parses it with
:func:`sparkctl.facts.batch.parse_batch`; ``/node.json`` is the node's ``status`` row
(:func:`sparkctl.facts.statusrow.node_row`). On the head (``head`` in the configuration)
it adds the record and the laws' last verdicts, and serves the status page
(:mod:`sparkctl.node.statuspage`). Read-only: it changes nothing on the node.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sparkctl.node.metrics import node_families
from sparkctl.node.reading import REUSE_S, NodeReader, node_document


class NodeCollector:
    """prometheus_client's custom collector: reads at scrape time."""

    def __init__(self, reader: NodeReader, head: Any = None) -> None:
        self.reader, self.head = reader, head

    def collect(self) -> Iterator[Metric]:
        r = self.reader.read()
        yield from node_families(r.facts, r.kills, r.seconds)
        if self.head is not None:
            yield from self.head.families()

    def describe(self) -> list[Metric]:
        return []  # no read at registration (prometheus_client calls collect() when describe is missing)


class Handler(BaseHTTPRequestHandler):
    server_version = "sparkctl-exporter"
    app: "Exporter"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.app.registry))
        elif path == "/node.json":
            doc = node_document(self.app.node, self.app.reader.read(REUSE_S))
            self._send(200, "application/json", json.dumps(doc, sort_keys=True).encode())
        elif path == "/":
            self._send(200, "text/plain; charset=utf-8", b"sparkctl exporter: /metrics, /node.json\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, ctype: str, body: bytes, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # a scrape every 15 s is not worth a journal line


class Exporter:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.node = str(config["node"])
        self.reader = NodeReader(self.node, str(config["script"]))
        self.head = None
        if config.get("head"):
            from sparkctl.node.statuspage import Head

            self.head = Head(self, config["head"])
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(self.reader, self.head))

    def serve(self) -> None:
        handler = type("BoundHandler", (Handler,), {"app": self})
        httpd = ThreadingHTTPServer((str(self.config["listen"]), int(self.config["port"])), handler)
        httpd.daemon_threads = True
        if self.head is not None:
            self.head.start()
        print(f"sparkctl exporter for {self.node} on {self.config['listen']}:{self.config['port']}", flush=True)
        httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m sparkctl.node.exporter CONFIG.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        config = json.load(fh)
    try:
        Exporter(config).serve()
    except OSError as exc:  # the address is not (yet) on this node, the port is taken
        print(f"sparkctl exporter: cannot listen on {config.get('listen')}:{config.get('port')}: {exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
