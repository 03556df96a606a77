"""Readiness from the operator's side: where an endpoint is asked, with which key.

The verdict itself is :func:`sparkctl.remote.endpoint_probe.probe_endpoint`, the
one probe (standard library only) that the head's runner asks in a supervised
switch too; here it is asked directly or through an SSH forward (:func:`probe_via`).

It owns where an endpoint is asked (:func:`operator_route`, :func:`on_node_host`:
serve.bind decides the address the engine listens on) and the operator's key
(:func:`operator_key`: read from the variable serve.api_key_env names, never
printed). ``status`` and ``bench`` use the same three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sparkctl.errors import SparkctlError
from sparkctl.model.record import Route
from sparkctl.remote.endpoint_probe import mask, probe_endpoint
from sparkctl.transport.base import Transport
from sparkctl.transport.forward import forward


@dataclass(frozen=True)
class OperatorKey:
    """The endpoint's key as the operator's environment holds it. ``key`` is the secret
    (send it, never show it); ``problem`` the one line to show when it is missing."""

    env: str | None
    key: str | None = None

    @property
    def problem(self) -> str | None:
        return f"needs key: set ${self.env}" if self.env and not self.key else None

    def __repr__(self) -> str:  # a dataclass repr would print the key into a traceback or a log
        return f"OperatorKey(env={self.env!r}, key={'***' if self.key else None})"


def operator_key(env: str | None, environ: Mapping[str, str] | None = None) -> OperatorKey:
    """The key from the operator's variable ``env`` (serve.api_key_env, or the record's)."""
    if not env:
        return OperatorKey(None)
    return OperatorKey(env, (os.environ if environ is None else environ).get(env) or None)


def api_key_from_env(spec: Mapping[str, str]) -> str | None:
    """The endpoint's key from the operator's environment (the ready step names the variable, never the key)."""
    return os.environ.get(spec.get("env", "")) or None


def probe_via(transport: Transport, via: str, url: str, served_name: str, tokens_metric: str | None,
              smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """:func:`probe_endpoint` of ``url``, an address only ``via`` reaches (serve.bind: fabric),
    through an SSH forward over ``via``'s connection. An SSH forward rather than running the
    probe on the head: the same probe as every other bind, no key on the head's
    command lines, and ``bench`` needs the same path for its load anyway."""
    u = urlsplit(url)
    try:
        with forward(transport, via, u.hostname or "", u.port or 80) as (host, port):
            ok, detail = probe_endpoint(f"http://{host}:{port}", served_name, tokens_metric, smoke=smoke,
                                        api_key=api_key)
    except SparkctlError as exc:
        return False, mask(exc.one_line(), api_key)
    return ok, detail


def probe_route(transport: Transport, route: Route, served_name: str, tokens_metric: str | None,
                smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """:func:`probe_endpoint` where :func:`operator_route` says the endpoint is reached."""
    if route.via:
        return probe_via(transport, route.via, route.url, served_name, tokens_metric, smoke, api_key)
    return probe_endpoint(route.url, served_name, tokens_metric, smoke=smoke, api_key=api_key)

