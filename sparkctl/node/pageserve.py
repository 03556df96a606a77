"""The status page's HTTP handler: ``/`` (the page), ``/status.json`` (its document). Read-only.

Every request is checked against the endpoint's key first (:meth:`Head.authorized`); a
request without it gets 401 with ``WWW-Authenticate: Basic`` (a browser then asks for it:
any user name, the key as password). Nothing but GET and HEAD is answered.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from sparkctl.node.pagehtml import render


def page_handler(head: Any) -> type[BaseHTTPRequestHandler]:
    class PageHandler(BaseHTTPRequestHandler):
        server_version = "sparkctl-status"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not head.authorized(self.headers.get("Authorization")):
                self._send(401, "text/plain; charset=utf-8", b"this page needs the endpoint's key\n",
                           {"WWW-Authenticate": 'Basic realm="sparkctl", charset="UTF-8"'})
                return
            path = self.path.split("?", 1)[0]
            doc = head.document()
            if path == "/status.json":
                self._send(200, "application/json", json.dumps(doc, sort_keys=True).encode())
            elif path == "/":
                self._send(200, "text/html; charset=utf-8", render(doc).encode())
            elif path == "/favicon.ico":  # every browser asks; a 404 is a console error in Chromium
                self._send(204, "image/x-icon", b"")
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def _send(self, code: int, ctype: str, body: bytes, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            # no asset from anywhere: the page's own policy says so too
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return PageHandler
