"""Readiness: does an endpoint serve its model? The probe the executor's ready steps call.

Runs on the operator's side with httpx; ``sparkctl/remote/planrun.py`` carries the
same probe in the standard library for the head.

Also owns where an endpoint is asked (:func:`operator_route`, :func:`on_node_host`:
serve.bind decides the address the engine listens on) and the operator's key
(:func:`operator_key`: read from the variable serve.api_key_env names, never
printed). ``status`` and ``bench`` use the same three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from sparkctl.errors import SparkctlError
from sparkctl.model.record import (  # noqa: F401
    LOOPBACK,
    WILDCARD,
    Route,
    on_node_host,
    operator_route,
)
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


def mask(text: str, key: str | None) -> str:
    """``text`` with the key replaced by ``***`` (an exception's text may quote a header)."""
    return text.replace(key, "***") if key else text


def api_key_from_env(spec: Mapping[str, str]) -> str | None:
    """The endpoint's key from the operator's environment (the ready step names the variable, never the key)."""
    return os.environ.get(spec.get("env", "")) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What vLLM's AuthenticationMiddleware (and SGLang's, llama-server's) checks: a Bearer token."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}

def metric_value(text: str, name: str) -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name):]
            if rest[:1] in (" ", "{"):
                try:
                    total = (total or 0.0) + float(line.rsplit(None, 1)[-1])
                except ValueError:
                    pass
    return total


def probe_endpoint(url: str, served_name: str, tokens_metric: str | None, timeout_s: float = 5.0,
                   smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """One readiness probe: /v1/models lists the name, a 1-token completion, the counter advances.

    ``api_key``: sent as ``Authorization: Bearer``; never in a returned detail."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, headers=auth_headers(api_key)) as c:
            listing = c.get(f"{url}/v1/models")
            if listing.status_code == 401:
                return False, ("/v1/models: HTTP 401, the key was refused" if api_key
                               else "/v1/models: HTTP 401, the endpoint needs a key (serve.api_key_env)")
            models = [m.get("id") for m in listing.json().get("data", [])]
            if served_name not in models:
                return False, f"/v1/models lists {models or 'nothing'}, not {served_name!r}"
            if not smoke:
                return True, "model listed"
            before = metric_value(c.get(f"{url}/metrics").text, tokens_metric) if tokens_metric else None
            r = c.post(f"{url}/v1/completions", json={"model": served_name, "prompt": "ping", "max_tokens": 1,
                                                      "temperature": 0})
            if r.status_code != 200:
                return False, f"1-token completion: HTTP {r.status_code} {mask(r.text[:120], api_key)}"
            body = r.json()
            usage = body.get("usage")
            finish = ((body.get("choices") or [{}])[0] or {}).get("finish_reason")
            if not usage:
                return False, "1-token completion carried no usage block"
            if int(usage.get("completion_tokens", 0)) < 1 and finish != "stop":
                return False, "1-token completion returned no tokens (a wedged engine answers 200 with nothing)"
            if tokens_metric:
                after = metric_value(c.get(f"{url}/metrics").text, tokens_metric)
                if after is None or before is None or after <= before:
                    return False, f"generated-token counter {tokens_metric} did not advance"
            return True, "serving"
    except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
        detail = mask(str(exc), api_key)[:120]
        return False, f"{type(exc).__name__}: {detail or 'no answer'}"


def probe_via(transport: Transport, via: str, url: str, served_name: str, tokens_metric: str | None,
              smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """:func:`probe_endpoint` of ``url``, an address only ``via`` reaches (serve.bind: fabric),
    through an SSH forward over ``via``'s connection. An SSH forward rather than running the
    probe on the head: the same httpx probe as every other bind, no key on the head's
    command lines, and ``bench`` needs the same path for its load anyway."""
    u = httpx.URL(url)
    try:
        with forward(transport, via, u.host, u.port or 80) as (host, port):
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

